"""Each simulated node's own memory: a memory cgroup with a limit, and its /proc/meminfo.

A DGX Spark has 128 GB of its own; the lab's nodes share this machine's. So that what reads a
node's memory reads the node's figures (recon and `spark-vllm status` over ssh, the node
exporter, the early OOM killer of the stack's guard), every process of a node lives in the
memory cgroup (v1) `svl-lab/<node>` limited to NODE_MEMORY_BYTES: its namespace holder, sshd
and everything sshd starts, dockerd and, through dockerd's `--cgroup-parent`, its containers
(`svl-lab/<node>/containers/<id>`). The limit bounds the node: a process that allocates past it
is the kernel's OOM kill inside that node's cgroup (never the machine's, never a test's).

/proc/meminfo in the node is lxcfs's (Debian's lxcfs, one instance for the lab: LXCFS_DIR),
bound over the node's own /proc/meminfo. lxcfs answers each reader with the memory of the cgroup
of the init process of the reader's PID namespace: the node's (lab/hosts.py gives each node a
PID namespace of its own, whose init lives in the node's cgroup), so MemTotal is the node's limit
and MemAvailable what is left of it (the limit, less what the node's cgroup uses, plus its page
cache). A container in its own PID namespace reads its own /proc (Docker mounts one): the lab's
vLLM sees the machine's memory, as before. What lxcfs does not cover, the lab does not fake:
/proc/vmstat, /proc/pressure and the kernel's OOM counters stay the machine's.
"""

from __future__ import annotations

import contextlib
import os
import re

from lab.cgroups import cg_kill_remove, spawn
from lab.layout import CG_ROOT, LAB, LXCFS_DIR, NODE_MEMORY_BYTES
from lab.util import log, read_pid, run, wait_for

LXCFS_PID = os.path.join(LAB, "lxcfs.pid")
MEMINFO = os.path.join(LXCFS_DIR, "proc", "meminfo")  # lxcfs's, bound over a node's


def node_cgroup(name: str) -> str:
    """The node's memory cgroup, made with its limit (set again when it differs)."""
    d = f"/sys/fs/cgroup/memory/{CG_ROOT}/{name}"
    os.makedirs(d, exist_ok=True)
    limit = os.path.join(d, "memory.limit_in_bytes")
    with open(limit) as f:
        now = int(f.read().strip())
    if now != NODE_MEMORY_BYTES:
        with open(limit, "w") as f:
            f.write(str(NODE_MEMORY_BYTES))
    return d


def node_cgroup_procs(name: str) -> str:
    """cgroup.procs of the node's memory cgroup (lab.cgroups.spawn writes a process there)."""
    return os.path.join(node_cgroup(name), "cgroup.procs")


def _mounted(path: str) -> str | None:
    """The file system type mounted at `path` in this mount namespace, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            a, b = line.split(" - ", 1)
            if a.split()[4] == path:
                return b.split()[0]
    return None


def lxcfs_running() -> bool:
    return read_pid(LXCFS_PID) is not None and _mounted(LXCFS_DIR) == "fuse.lxcfs" and \
        os.path.exists(MEMINFO)


def ensure_lxcfs() -> bool:
    """lxcfs on LXCFS_DIR for every node; True when it was (re)started (the nodes' binds of the
    old one then read nothing: `up` rebuilds them)."""
    if lxcfs_running():
        return False
    stop_lxcfs()
    os.makedirs(LXCFS_DIR, exist_ok=True)
    # -f: in the foreground (spawn keeps it); -u: swap not virtualized (no swap here)
    spawn(["lxcfs", "-f", "-u", "-p", LXCFS_PID, LXCFS_DIR],
          os.path.join(LAB, "logs", "lxcfs.log"), "lxcfs")
    wait_for(lxcfs_running, 15, f"lxcfs on {LXCFS_DIR} (see {LAB}/logs/lxcfs.log)")
    log(f"lxcfs up on {LXCFS_DIR}: each node's /proc/meminfo is its own")
    return True


def stop_lxcfs() -> list:
    """lxcfs stopped and its mount point unmounted; returns what would not go."""
    problems = cg_kill_remove("lxcfs")
    if _mounted(LXCFS_DIR) is not None:
        run(["umount", "-l", LXCFS_DIR], check=False, quiet=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(LXCFS_PID)
    return problems


def meminfo_total(text: str) -> int | None:
    m = re.search(r"^MemTotal:\s+(\d+) kB$", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def node_sees_its_memory(in_node_argv: list) -> str | None:
    """None when `cat /proc/meminfo` in the node (argv from lab.hosts.in_node) reads the node's
    limit as MemTotal; else what it reads."""
    p = run([*in_node_argv, "cat", "/proc/meminfo"], check=False, capture=True)
    if p.returncode != 0:
        return f"/proc/meminfo unreadable ({(p.stderr or '').strip()[:100]})"
    total = meminfo_total(p.stdout)
    if total != NODE_MEMORY_BYTES:
        return f"/proc/meminfo says MemTotal {total}, not the node's {NODE_MEMORY_BYTES}"
    return None
