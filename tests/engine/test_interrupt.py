"""Ctrl-C during an Automation API `up` cancels cleanly when the driver keeps itself alive.

The driver here is a tiny inline program run the way scripts/stackctl.py runs the real one,
with stackctl.keep_alive_on_interrupt() installed; its resource takes long enough to be
interrupted mid-apply. SIGINT goes to the driver's whole process group, as a terminal's Ctrl-C
does. Expected: the operation fails, the stack's lock is released, and the next up works
without `pulumi cancel`.
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
ROOT = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {scripts!r})
    import pulumi, pulumi.automation as auto, pulumi.dynamic as dyn
    import stackctl

    work = Path({work!r})

    class Slow(dyn.ResourceProvider):
        def create(self, props):
            (work / "started").write_text("yes")
            time.sleep(float(props["seconds"]))
            return dyn.CreateResult(id_="slow", outs=dict(props))

    class SlowResource(dyn.Resource):
        def __init__(self, name, seconds):
            super().__init__(Slow(), name, {{"seconds": seconds}})

    def program():
        SlowResource("slow", sys.argv[1])

    stack = auto.create_or_select_stack(
        stack_name="interrupt", project_name="spark-vllm-interrupt", program=program,
        opts=auto.LocalWorkspaceOptions(work_dir=str(work)),
    )
    stackctl.keep_alive_on_interrupt()
    try:
        stack.up(on_output=print)
    except auto.CommandError as e:
        print("UP-FAILED", type(e).__name__, flush=True)
        sys.exit(3)
    print("UP-OK", flush=True)
    """
)


def _run(work: Path, env: dict, seconds: str, interrupt_after_start: bool):
    script = work / "driver.py"
    script.write_text(DRIVER.format(scripts=str(ROOT / "scripts"), work=str(work)))
    p = subprocess.Popen([sys.executable, str(script), seconds], cwd=work, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    if interrupt_after_start:
        deadline = time.monotonic() + 120
        while not (work / "started").exists():
            assert p.poll() is None, p.stdout.read()
            assert time.monotonic() < deadline, "the slow resource never started"
            time.sleep(0.2)
        time.sleep(1)
        os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, _ = p.communicate(timeout=300)
    return p.returncode, out


def test_ctrl_c_mid_up_releases_the_lock_and_the_next_up_converges(engine_env, tmp_path):
    env = {**os.environ, **engine_env}
    code, out = _run(tmp_path, env, "30", interrupt_after_start=True)
    assert code != 0 and "UP-OK" not in out, out
    state = Path(engine_env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    locks = [p for p in (state / ".pulumi" / "locks").rglob("*.json")] if (state / ".pulumi" / "locks").exists() else []
    assert locks == [], f"the interrupted up left the stack locked: {locks}\n{out}"
    (tmp_path / "started").unlink()
    code, out = _run(tmp_path, env, "1", interrupt_after_start=False)
    assert code == 0 and "UP-OK" in out, out
