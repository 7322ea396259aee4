"""`spark-vllm reconcile -s STACK --install | --uninstall`: a systemd timer and service of the
stack's own on the control machine, as units of the user who runs it
(~/.config/systemd/user/spark-vllm-reconcile-<stack>.{service,timer}; `systemctl --user`
reads, enables, stops and removes them: https://www.freedesktop.org/software/systemd/man/
latest/systemd.timer.html).

The service runs `spark-vllm reconcile -s STACK --once` in the folder of the stack file, with
the environment the run needs written into the unit: the Pulumi backend, the toolchain's PATH
and the passphrase's FILE (never the passphrase: a unit file is readable by its user and shown
by `systemctl cat`; --install refuses a passphrase given only as PULUMI_CONFIG_PASSPHRASE). Its
output, the run's one line, goes to the user's journal (`journalctl --user -u ...`). The timer
starts it every interval after the previous run (OnUnitActiveSec) and a minute after the user's
manager starts; a run that outlasts the interval delays the next one (systemd never starts a
running oneshot service twice), and the run's own lock (tools/reconcile.py) keeps a hand-run
`reconcile` from overlapping it. To run while the user is logged out: `loginctl enable-linger`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

UNIT_DIR = Path("~/.config/systemd/user")
# the environment the service passes on (values as this shell has them), never a secret
PASSED_ON = ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE_FILE", "PULUMI_HOME",
             "SPARK_VLLM_HOME", "PULUMI_SKIP_UPDATE_CHECK",
             "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION")
# (argv) -> (exit code, output): systemctl --user; tests replace it
Runner = Callable[[list[str]], tuple[int, str]]


class InstallError(Exception):
    """Why the units cannot be written (a usage problem)."""


def unit_name(stack: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", stack):
        raise InstallError(f"not a stack name: {stack!r}")
    return f"spark-vllm-reconcile-{stack}"


def _escape(value: str) -> str:
    """A value as systemd reads it in Environment= and ExecStart= (quoted, `%` doubled, no
    newline)."""
    if "\n" in value or "\r" in value:
        raise InstallError(f"a value with a line break cannot go into a unit: {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def _path(value: str) -> str:
    """A path as WorkingDirectory= takes it: absolute, unquoted (spaces are the path's), `%`
    doubled."""
    if not value.startswith("/") or "\n" in value or "\r" in value:
        raise InstallError(f"not an absolute path for a unit: {value!r}")
    return value.replace("%", "%%")


@dataclass(frozen=True)
class Units:
    service: str
    timer: str


def render(stack: str, *, exe: str, work_dir: str, every_seconds: int,
           env: Mapping[str, str]) -> Units:
    """The service and timer units. `exe`: the spark-vllm console script; `work_dir`: the
    folder of Pulumi.<stack>.yaml; `env`: the values of PASSED_ON to write (and PATH)."""
    name = unit_name(stack)
    if every_seconds < 60:
        raise InstallError("--every: at least 1m for a timer (a run takes tens of seconds)")
    if "PULUMI_CONFIG_PASSPHRASE" in env:
        raise InstallError("the passphrase itself cannot go into a unit file")
    lines = [
        "# written by `spark-vllm reconcile --install` (tools/reconcile_timer.py); remove with",
        f"# `spark-vllm reconcile -s {stack} --uninstall`",
        "[Unit]",
        f"Description=spark-vllm: repair the stack {stack}'s drift, report the rest",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=oneshot",
        f"WorkingDirectory={_path(work_dir)}",
        *(f"Environment={_escape(f'{k}={v}')}" for k, v in sorted(env.items())),
        f"ExecStart={_escape(exe)} reconcile -s {shlex.quote(stack)} --once "
        f"--every {every_seconds}s",
        "TimeoutStartSec=2h",
        "Nice=5",
    ]
    timer = [
        "# written by `spark-vllm reconcile --install` (tools/reconcile_timer.py)",
        "[Unit]",
        f"Description=spark-vllm: reconcile the stack {stack} every {every_seconds} s",
        "",
        "[Timer]",
        "OnStartupSec=1min",
        f"OnUnitActiveSec={every_seconds}s",
        "AccuracySec=10s",
        f"Unit={name}.service",
        "",
        "[Install]",
        "WantedBy=timers.target",
    ]
    return Units("\n".join(lines) + "\n", "\n".join(timer) + "\n")


def environment(stack: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the service needs of this shell's environment (PASSED_ON and PATH), after the same
    defaults a hand run takes (tools/promote._default_env: ~/.spark-vllm's state and
    passphrase file)."""
    from tools.promote import _default_env

    src = dict(os.environ if base is None else base)
    if src.get("PULUMI_CONFIG_PASSPHRASE") and not src.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        raise InstallError("PULUMI_CONFIG_PASSPHRASE is set and PULUMI_CONFIG_PASSPHRASE_FILE is "
                           "not: a unit file must not hold the passphrase; put it in a file "
                           "only you can read and export PULUMI_CONFIG_PASSPHRASE_FILE")
    for k, v in _default_env().items():
        src.setdefault(k, v)
    if not src.get("PULUMI_BACKEND_URL"):
        raise InstallError("PULUMI_BACKEND_URL is not set (the service must find the state)")
    out = {k: src[k] for k in PASSED_ON if src.get(k)}
    path = src.get("PATH", "/usr/bin:/bin")
    toolchain = Path.home() / ".cache" / "spark-vllm" / "toolchain" / "bin"
    if (toolchain / "pulumi").exists() and str(toolchain) not in path.split(os.pathsep):
        path = f"{toolchain}{os.pathsep}{path}"  # the CLI the run drives (make setup's)
    out["PATH"] = path
    return out


def systemctl(argv: list[str]) -> tuple[int, str]:
    """LIVE PATH: `systemctl --user ...`."""
    try:
        done = subprocess.run(["systemctl", "--user", *argv], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def install(stack: str, units: Units, *, unit_dir: Path, run: Runner,
            out: Callable[[str], None]) -> int:
    """Write the units (0644: the user reads them, `systemctl --user cat` shows them), reload
    the user's manager and enable and start the timer. The units stay when systemctl cannot
    (no user manager here): the message says what to run."""
    name = unit_name(stack)
    unit_dir.mkdir(parents=True, exist_ok=True)
    for suffix, text in (("service", units.service), ("timer", units.timer)):
        path = unit_dir / f"{name}.{suffix}"
        path.write_text(text)
        path.chmod(0o644)
        out(f"wrote {path}")
    for argv in (["daemon-reload"], ["enable", "--now", f"{name}.timer"]):
        rc, text = run(argv)
        if rc != 0:
            out(f"systemctl --user {' '.join(argv)} failed: {text or f'exit code {rc}'}")
            out(f"the units are written; once a user manager runs: systemctl --user "
                f"daemon-reload && systemctl --user enable --now {name}.timer")
            return 1
    out(f"enabled {name}.timer: `systemctl --user list-timers {name}.timer` shows the next "
        f"run, `journalctl --user -u {name}` each run's line")
    return 0


def uninstall(stack: str, *, unit_dir: Path, run: Runner, out: Callable[[str], None]) -> int:
    """Stop and disable the timer, remove both units, reload the user's manager."""
    name = unit_name(stack)
    run(["disable", "--now", f"{name}.timer"])
    run(["stop", f"{name}.service"])
    removed = []
    for suffix in ("timer", "service"):
        path = unit_dir / f"{name}.{suffix}"
        if path.exists():
            path.unlink()
            removed.append(str(path))
    run(["daemon-reload"])
    out(f"removed {', '.join(removed)}" if removed else f"no units of {name} were installed")
    return 0
