"""`spark-vllm rollback` (tools/rollback.py) with Pulumi's own CLI on a file backend: the stack's
history, `config set-all`/`config rm` into a scratch copy, the diff, the stack file replaced,
`pulumi up`.

The program is a stand-in of the project's (this module writes it: FAKE, it creates no resource)
under the project's name, so the config keys are `spark-vllm:*` as in a real stack file: it
exports the `vllm` object and, like a health gate that fails, fails the update when
`vllm.maxModelLen` is 1048576. Three updates: two that succeed (two verified deployments) and one
that fails; rollback goes back to the last verified one (the default) and, with --to 2, shows the
way back to the first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tools import cli

pytestmark = pytest.mark.engine

PROGRAM = '''"""FAKE stand-in of the spark-vllm program (tests/engine/test_rollback_cli.py)."""
import pulumi

cfg = pulumi.Config()
vllm = cfg.get_object("vllm") or {}
if vllm.get("maxModelLen") == 1048576:
    raise pulumi.RunError("vllm serve exited while the gate waited (a stand-in)")
pulumi.export("vllm", vllm)
'''


@pytest.fixture
def project(tmp_path, engine_env, monkeypatch):
    """A project folder named spark-vllm (this venv's python) with stack `lab`, the CLI's env."""
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump({
        "name": "spark-vllm", "runtime": {"name": "python", "options": {
            "toolchain": "pip", "virtualenv": str(Path(sys.executable).parents[1])}}}))
    (tmp_path / "__main__.py").write_text(PROGRAM)
    for k, v in engine_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    run(tmp_path, "stack", "init", "lab")
    return tmp_path


def run(folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["pulumi", *args], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=os.environ)
    assert done.returncode == 0 or not check, done.stderr
    return done


def config(folder: Path, key: str, value: object) -> None:
    run(folder, "config", "set", "--stack", "lab", "--path", f"spark-vllm:{key}",
        json.dumps(value) if not isinstance(value, str) else value)


def stack_file(folder: Path) -> dict:
    return yaml.safe_load((folder / "Pulumi.lab.yaml").read_text())["config"]


def test_rollback_goes_back_to_the_last_verified_config_and_ups(project):
    config(project, "image.ref", "reg/vllm:one")
    config(project, "vllm.servedModelName", "m")
    config(project, "vllm.maxNumSeqs", 4)
    run(project, "config", "set", "--stack", "lab", "--secret", "spark-vllm:vllmApiKey",
        "sk-rollback-test")
    assert run(project, "up", "--yes", "--stack", "lab").returncode == 0  # deployment 2
    config(project, "vllm.maxModelLen", 4096)
    config(project, "services", [{"name": "embed", "repo": "org/e"}])
    assert run(project, "up", "--yes", "--stack", "lab").returncode == 0  # deployment 1
    run(project, "config", "rm", "--stack", "lab", "spark-vllm:services")
    config(project, "vllm.maxModelLen", 1048576)
    failed = run(project, "up", "--yes", "--stack", "lab", check=False)
    assert failed.returncode != 0 and "a stand-in" in failed.stdout + failed.stderr
    secret_before = stack_file(project)["spark-vllm:vllmApiKey"]

    dry = CliRunner().invoke(cli.main, ["rollback", "-s", "lab", "--to", "2", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    listed = [ln for ln in dry.output.splitlines() if re.match(r" +\d+  \d{4}-", ln)]
    assert len(listed) == 2, dry.output  # the failed update is not a verified deployment
    assert "differs from the stack file in services, vllm.maxModelLen" in listed[0], listed
    assert "differs from the stack file in vllm.maxModelLen" in listed[1], listed
    assert "-    maxModelLen: 1048576" in dry.output and "dry run: nothing written" in dry.output
    assert "note: model.revision 'main' is a branch or tag" in dry.output
    assert stack_file(project)["spark-vllm:vllm"]["maxModelLen"] == 1048576  # nothing written

    result = CliRunner().invoke(cli.main, ["rollback", "-s", "lab", "--yes"])
    assert result.exit_code == 0, result.output
    assert "planned change to Pulumi.lab.yaml (back to deployment 1" in result.output
    assert "+    maxModelLen: 4096" in result.output and "wrote Pulumi.lab.yaml" in result.output
    after = stack_file(project)
    assert after["spark-vllm:vllm"] == {"servedModelName": "m", "maxNumSeqs": 4,
                                        "maxModelLen": 4096}
    assert after["spark-vllm:services"] == [{"name": "embed", "repo": "org/e"}]
    assert after["spark-vllm:vllmApiKey"] == secret_before  # secrets are never touched
    outputs = json.loads(run(project, "stack", "output", "--json", "--stack", "lab").stdout)
    assert outputs["vllm"]["maxModelLen"] == 4096  # the up ran with it and succeeded

    again = CliRunner().invoke(cli.main, ["rollback", "-s", "lab", "--yes"])
    assert again.exit_code == 0, again.output
    assert "already holds deployment 1 and its last update succeeded: nothing to do" in \
        again.output


def test_a_stack_that_never_succeeded_has_nothing_to_go_back_to(project):
    config(project, "vllm.maxModelLen", 1048576)
    assert run(project, "up", "--yes", "--stack", "lab", check=False).returncode != 0
    result = CliRunner().invoke(cli.main, ["rollback", "-s", "lab", "--yes"])
    assert result.exit_code == 3
    assert "has no verified deployment in its history" in result.output
