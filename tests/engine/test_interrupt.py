"""Ctrl-C during `pulumi up` (the plain CLI, program through the language host) cancels cleanly.

A tiny local project: one `local.Command` of Pulumi's own command plugin that sleeps long enough
to be interrupted mid-apply. SIGINT goes to the CLI's whole process group, as a terminal's
Ctrl-C does. Expected: the up fails, the stack's lock is released (no `pulumi cancel` needed),
and the next up converges.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

PROGRAM = textwrap.dedent(
    """
    import pulumi
    from pulumi_command import local

    seconds = pulumi.Config().require("seconds")
    local.Command("slow", create=f"touch started; sleep {seconds}; echo done",
                  triggers=[seconds])
    """
)


def _project(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    venv = Path(sys.executable).parent.parent
    (work / "Pulumi.yaml").write_text(
        f"name: spark-vllm-interrupt\nruntime:\n  name: python\n  options:\n"
        f"    virtualenv: {venv}\n"
    )
    (work / "__main__.py").write_text(PROGRAM)


def _up(work: Path, env: dict, seconds: str, interrupt: bool) -> tuple[int, str]:
    subprocess.run(["pulumi", "config", "set", "seconds", seconds, "-s", "interrupt"],
                   cwd=work, env=env, check=True, capture_output=True)
    p = subprocess.Popen(["pulumi", "up", "--yes", "-s", "interrupt"], cwd=work, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    if interrupt:
        deadline = time.monotonic() + 120
        while not (work / "started").exists():
            assert p.poll() is None, p.stdout.read() if p.stdout else ""
            assert time.monotonic() < deadline, "the slow command never started"
            time.sleep(0.2)
        time.sleep(1)
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, _ = p.communicate(timeout=300)
    return p.returncode, out


def test_ctrl_c_mid_up_releases_the_lock_and_the_next_up_converges(engine_env, require_plugin,
                                                                    tmp_path):
    require_plugin("command", "1.2.1")
    work = tmp_path / "project"
    _project(work)
    env = {**os.environ, **engine_env}
    subprocess.run(["pulumi", "stack", "init", "interrupt"], cwd=work, env=env, check=True,
                   capture_output=True)
    # long enough that the interrupt (1 s after the command started) lands while it runs, short
    # enough not to hold the tier: the CLI waits for the in-flight command before it exits
    code, out = _up(work, env, "12", interrupt=True)
    assert code != 0, out
    state = Path(engine_env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    lock_dir = state / ".pulumi" / "locks"
    locks = list(lock_dir.rglob("*.json")) if lock_dir.exists() else []
    assert locks == [], f"the interrupted up left the stack locked: {locks}\n{out}"
    (work / "started").unlink()
    code, out = _up(work, env, "1", interrupt=False)
    assert code == 0, out
    assert (work / "started").exists(), "the next up did not run the command"
