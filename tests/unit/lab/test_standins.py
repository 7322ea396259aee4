"""The lab's systemctl stand-in answers as systemctl does where the stack reads its output
(lab/standins/systemctl). `--quiet` prints nothing: the firewall's check (hostscripts/firewall
check_script) reads only the exit code of `systemctl is-enabled --quiet`, and a stand-in that
printed `enabled` there made every lab recon's firewall section unreadable. Read-only here: a
unit this machine never enabled in a lab node's record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STANDIN = Path(__file__).resolve().parents[3] / "lab" / "standins" / "systemctl"
UNIT = "spark-vllm-test-never-enabled.service"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(STANDIN), *args], capture_output=True, text=True,
                          timeout=30)


def test_quiet_prints_nothing_and_keeps_the_exit_code():
    loud, quiet = _run("is-enabled", UNIT), _run("is-enabled", "--quiet", UNIT)
    assert (loud.returncode, loud.stdout) == (1, "disabled\n")
    assert (quiet.returncode, quiet.stdout) == (1, "")
    assert _run("is-active", "-q", UNIT).stdout == ""
    assert _run("is-active", UNIT).stdout == "inactive\n"
