"""The lab's processes: started inside the cgroup (v1) sub-tree svl-lab/, found and killed there.

Every lab daemon (namespace holders, dockerd, sshd, registry, HF endpoint) is spawned into a
sub-cgroup of the pids hierarchy, so `down` and the recovery path find every process the lab
started, including ones whose pid files are gone.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time

from lab.layout import CG_ROOT
from lab.util import pid_alive, warn

CONTROLLERS = ("pids", "memory", "cpu", "cpuacct", "blkio", "devices", "freezer", "cpuset",
               "systemd", "unified")


def cg_dirs(sub: str) -> list:
    """cgroup directories for a lab sub-path in every mounted v1 hierarchy we use."""
    res = []
    for ctrl in CONTROLLERS:
        base = f"/sys/fs/cgroup/{ctrl}"
        if os.path.isdir(base):
            res.append(os.path.join(base, CG_ROOT, sub))
    return res


def cg_track(sub: str) -> str:
    """Create the tracking cgroup (pids hierarchy) and return its cgroup.procs path."""
    d = f"/sys/fs/cgroup/pids/{CG_ROOT}/{sub}"
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, "cgroup.procs")


def _procs_in(d: str) -> list:
    """The pids (as text) listed in every cgroup.procs under directory `d`."""
    pids = []
    for root, _dirs, files in os.walk(d):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(root, "cgroup.procs")) as f:
                    pids += f.read().split()
            except OSError:
                pass
    return pids


def cg_pids(sub: str) -> list:
    pids = set()
    for d in cg_dirs(sub):
        pids.update(int(x) for x in _procs_in(d))
    return sorted(pids)


def cg_kill_remove(sub: str, timeout: float = 10, settle: float = 30) -> list:
    """SIGTERM every process in the lab cgroup sub-tree, SIGKILL what is left after `timeout`,
    then remove the cgroups, retrying for up to `settle` seconds: a process may still be exiting
    or a daemon may fork one more child while it dies, and rmdir refuses a cgroup with tasks.
    Returns what could not be removed (empty when the sub-tree is gone)."""
    for p in cg_pids(sub):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    end = time.time() + timeout
    while time.time() < end and any(pid_alive(p) for p in cg_pids(sub)):
        time.sleep(0.2)
    end = time.time() + settle
    while True:
        for p in cg_pids(sub):
            if pid_alive(p):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
        for d in cg_dirs(sub):
            if os.path.isdir(d):
                for root, _dirs, _files in sorted(os.walk(d, topdown=False),
                                                  key=lambda t: -len(t[0])):
                    with contextlib.suppress(OSError):
                        os.rmdir(root)
        left = [d for d in cg_dirs(sub) if os.path.isdir(d)]
        if not left or time.time() >= end:
            break
        time.sleep(0.3)
    problems = []
    for d in left:
        what = ", ".join(f"{p} {proc_desc(int(p))}" for p in _procs_in(d)) or "no tasks listed"
        problems.append(f"cgroup {d} not removable after {settle:.0f}s ({what})")
    for msg in problems:
        warn(msg)
    return problems


def proc_desc(pid: int) -> str:
    """State and command line of a process, for messages about processes that will not die."""
    try:
        with open(f"/proc/{pid}/status") as f:
            state = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("State:")), "?")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        return f"[{state}] {cmd[:100].strip()}"
    except OSError:
        return "[gone]"


def spawn(argv: list, logfile: str, cg_sub: str, env=None, memory_procs: str | None = None) -> int:
    """Start a background process (own session, survives us) inside the lab cgroup sub-tree;
    `memory_procs`: also into that memory cgroup (a node's: lab/memory.py)."""
    procs = cg_track(cg_sub)
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    join = f"echo $$ > {shlex.quote(procs)}"
    if memory_procs is not None:
        join += f" && echo $$ > {shlex.quote(memory_procs)}"
    wrapper = ["/bin/sh", "-c", f'{join} && exec "$@"', "lab-spawn", *argv]
    with open(logfile, "ab") as lf:
        # cwd: the log's folder, never the caller's (olah writes ./logs wherever it starts)
        p = subprocess.Popen(wrapper, stdin=subprocess.DEVNULL, stdout=lf,
                             stderr=subprocess.STDOUT, start_new_session=True, env=env,
                             close_fds=True, cwd=os.path.dirname(logfile))
    return p.pid
