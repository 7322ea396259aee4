"""The policy pack as a standard CrossGuard pack: `pulumi preview --policy-pack policies` runs
it through the Python language host (policies/PulumiPolicy.yaml, `runtime: python`, the pack's
own virtualenv). A tiny local program registers a VllmServer component with the props the
program gives it: with an API key the preview passes; without one in staging the mandatory
`vllm-api-key` rule fails the preview and names itself. No host and no plugin is involved.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent(
    """
    import pulumi

    class VllmServer(pulumi.ComponentResource):
        def __init__(self, name, props):
            super().__init__("spark-vllm:vllm_server:VllmServer", name, props)
            self.register_outputs(props)

    cfg = pulumi.Config()
    props = {"environment": "staging", "tensorParallelSize": 2, "pipelineParallelSize": 1,
             "clusterGpus": 2, "host": "127.0.0.1", "port": 8000}
    if cfg.get_bool("withKey"):
        props["apiKey"] = pulumi.Output.secret("sk-policy-pack-cli-test")
    VllmServer("vllm", props)
    """
)


def _preview(work: Path, env: dict, with_key: bool) -> subprocess.CompletedProcess:
    subprocess.run(["pulumi", "config", "set", "withKey", str(with_key).lower(), "-s", "pack"],
                   cwd=work, env=env, check=True, capture_output=True)
    return subprocess.run(
        ["pulumi", "preview", "-s", "pack", "--policy-pack", str(ROOT / "policies"),
         "--policy-pack-config", str(ROOT / "policies" / "config.dev.json")],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )


def test_passing_and_failing_pack_through_the_language_host(engine_env, tmp_path):
    assert (ROOT / "policies" / "PulumiPolicy.yaml").read_text().count("runtime:") == 1
    assert not (ROOT / "policies" / "run-pack").exists(), "the pack runs as a standard pack"
    work = tmp_path / "project"
    work.mkdir()
    venv = Path(sys.executable).parent.parent
    (work / "Pulumi.yaml").write_text(
        f"name: spark-vllm\nruntime:\n  name: python\n  options:\n    virtualenv: {venv}\n")
    (work / "__main__.py").write_text(PROGRAM)
    env = {**os.environ, **engine_env}
    subprocess.run(["pulumi", "stack", "init", "pack"], cwd=work, env=env, check=True,
                   capture_output=True)

    ok = _preview(work, env, with_key=True)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    assert "spark-vllm@v0.1.0" in ok.stdout or "spark-vllm" in ok.stdout

    bad = _preview(work, env, with_key=False)
    assert bad.returncode != 0, bad.stdout[-3000:]
    out = bad.stdout + bad.stderr
    assert "vllm-api-key" in out and "mandatory" in out, out[-3000:]
    assert "environment 'staging': vLLM serves without an API key" in out, out[-3000:]
