"""Fixtures for the promotion tests: a project folder on a file backend, a verified `dev`
stack (the fake program, see fakestack.py) and a runner for tools/promote.py.

The engine needs only the `pulumi` CLI (and `pulumi-resource-pulumi-python` for the dynamic
provider, shipped next to it); without it these tests skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN_BIN = Path.home() / ".cache" / "spark-vllm" / "toolchain" / "bin"
if (TOOLCHAIN_BIN / "pulumi").exists() and str(TOOLCHAIN_BIN) not in os.environ.get("PATH", ""):
    os.environ["PATH"] = f"{TOOLCHAIN_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
from tests.promote.fakestack import SOURCE_SECRETS, Project, dev_config  # noqa: E402
from tools import promote  # noqa: E402


def _need_engine() -> None:
    if shutil.which("pulumi") is None:
        pytest.skip("the pulumi CLI is not on PATH (make setup)")
    if shutil.which("pulumi-resource-pulumi-python") is None:
        pytest.skip("pulumi-resource-pulumi-python (dynamic providers) is not on PATH")


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    _need_engine()
    return Project(tmp_path_factory.mktemp("promote"), ROOT, sys.executable)


# the services Pulumi.prod.yaml declares, verified under the same names in the source
DEV_SERVICES = [
    {"name": "embed", "repo": "Qwen/Qwen3-Embedding-0.6B", "task": "embed", "port": 8001,
     "gpuMemoryUtilization": 0.05},
    {"name": "rerank", "repo": "Qwen/Qwen3-Reranker-0.6B", "task": "score", "port": 8002,
     "gpuMemoryUtilization": 0.05},
]


@pytest.fixture(scope="module")
def verified_dev(project):
    """`dev`: the lab config (digest, resolved commit), dev secrets, one successful `up`."""
    project.write_config("dev", dev_config(ROOT, services=DEV_SERVICES))
    st = project.stack("dev")
    project.set_secrets(st, SOURCE_SECRETS)
    r = st.up()
    assert r.summary.result == "succeeded"
    return st


@pytest.fixture
def run_promote(project, capsys):
    def run(source: str, target: str, *, yes=True, dry_run=False, refresh_only=False,
            confirm=None) -> Result:
        lines: list[str] = []
        o = promote.Options(
            source=source, target=target, yes=yes, dry_run=dry_run, refresh_only=refresh_only,
            work_dir=project.dir, program=project.programs.get(source), env=dict(project.env),
            out=lines.append, confirm=confirm,
        )
        capsys.readouterr()
        code = promote.run(o)
        err = capsys.readouterr().err
        res = Result(code, "\n".join(lines), err)
        print(f"--- promote {source} -> {target}: exit {code}\n{res.out}\n{res.err}")
        return res

    return run
