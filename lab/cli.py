"""spark-vllm lab: simulated DGX Spark (GB10) hosts on one Linux machine.

Stdlib only (runs before any venv exists). Must run as root.
    python3 lab/lab.py up [--nodes N] | down | status | config
    python3 lab/lab.py seed | hf-bytes [--json] | ssh NODE [CMD...]
    python3 lab/lab.py sshd-stop|sshd-start|fabric-cut|fabric-restore NODE | kill NODE CONTAINER
    python3 lab/lab.py crash NODE CONTAINER | dockerd-restart NODE
See lab/README.md for what is real and what is simulated.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import sys
import time

from lab import hub
from lab.cgroups import cg_kill_remove
from lab.deb_images import DEB_IMAGES
from lab.hosts import (
    ensure_host,
    forget_rules,
    holder_pid,
    in_node,
    node_docker,
    retire_docker,
    shm_dev,
    sshd_running,
    start_dockerd,
    start_sshd,
    stop_host,
    stop_sshd,
)
from lab.image import Builder, base_key, ensure_deb_image, ensure_image
from lab.layout import (
    BUILD,
    CACHE,
    FABRIC,
    HF_ENDPOINT,
    HF_REPO,
    HF_REPOS,
    KNOWN_HOSTS,
    LAB,
    LAB_KEY,
    MAX_NODES,
    OUTSIDER_NS,
    REGISTRY,
    SESSION_ENV,
    SESSION_LOCK,
    STACK_JSON,
    mgmt_ip,
    netns,
    node_dir,
    node_name,
)
from lab.memory import ensure_lxcfs, stop_lxcfs
from lab.net import (
    ensure_host_net,
    ensure_outsider,
    host_ifs,
    link_exists,
    remove_host_net,
    remove_outsider,
    set_fabric_carrier,
)
from lab.registry import ensure_registry, ensure_stack_tag, registry_running
from lab.state import save_state, state, write_known_hosts, write_stack_json
from lab.util import (
    die,
    ensure_prereqs,
    log,
    ok,
    out,
    pid_alive,
    read_pid,
    require_root,
    rmtree_robust,
    run,
    session_held_by_parent,
    wait_for,
)


def node_index(name: str) -> int:
    m = re.fullmatch(r"spark-(\d+)", name)
    if not m:
        die(f"unknown node {name!r} (expected spark-N)")
    return int(m.group(1))


# --------------------------------------------------------------------------- lifecycle
def cmd_up(args) -> None:
    require_root()
    t0 = time.time()
    n = args.nodes or state().get("nodes") or 2
    if n < 1 or n > MAX_NODES:
        die(f"--nodes must be 1..{MAX_NODES}")
    os.makedirs(LAB, exist_ok=True)
    old = state().get("nodes") or 0
    keep = base_key()
    for j in range(n + 1, max(old, n) + 1):  # shrinking: remove surplus nodes (as `down` does)
        log(f"{node_name(j)}: removing (lab shrinks to {n} nodes)")
        retire_docker(node_name(j), keep)
        stop_host(node_name(j), j, keep_data=False)
    save_state({**state(), "nodes": n})
    ensure_host_net()
    ensure_lxcfs()  # each node's /proc/meminfo (lab/memory.py); a new one rebuilds the nodes
    ensure_registry()
    log("registry up on " + REGISTRY)
    with Builder() as b:  # the build dockerd starts only if something must be built
        ref = ensure_image(b)
        ensure_stack_tag(ref)
        st = state()
        st["image"] = ref
        # the gateway's, Prometheus's and Alertmanager's images (lab.deb_images DEB_IMAGES), each by
        # the same tag
        for field, img in DEB_IMAGES.items():
            st[field] = ensure_deb_image(img, b)
            ensure_stack_tag(st[field])
        save_state(st)
        log(f"image {ref}")
        for field, img in DEB_IMAGES.items():
            log(f"{img.label} image {st[field]}")
        hub.ensure_hf(b)
    log(f"HF endpoint up on {HF_ENDPOINT} serving {', '.join(HF_REPOS)}")
    shm = {}
    for i in range(1, n + 1):
        name = node_name(i)
        ensure_host(name, i, n, keep_base=keep)
        dev = shm_dev(holder_pid(name))
        if dev in shm:  # each tmpfs is its own device: equal means a broken mount
            log(f"{name}: /dev/shm is the same as {shm[dev]}'s: rebuilding it")
            stop_host(name, i, keep_data=True)
            ensure_host(name, i, n, keep_base=keep)
            dev = shm_dev(holder_pid(name))
        shm[dev] = name
        fabric = ", ".join(nif for _b, nif, _p, _h in FABRIC)
        log(f"{name} up: ssh root@{mgmt_ip(i)} (fabric {fabric}: configured by the stack)")
    ensure_outsider()
    log(f"outsider on the fabric: netns {OUTSIDER_NS} (no node, no stack address)")
    write_known_hosts()
    write_stack_json()
    log(f"stack config -> {STACK_JSON}; host keys -> {KNOWN_HOSTS}")
    log(f"lab up with {n} node(s) in {time.time() - t0:.1f}s")


def cmd_down(args) -> None:
    require_root()
    n = max(state().get("nodes") or 0, MAX_NODES)
    keep = base_key()
    problems = []
    for i in range(1, n + 1):
        name = node_name(i)
        if os.path.exists(node_dir(name)) or link_exists(host_ifs(i)["mgmt"]) or \
                netns(name) in out(["ip", "netns", "list"], check=False):
            log(f"{name}: stopping and removing (its pulled image layers stay in the cache)")
        retire_docker(name, keep)
        problems += stop_host(name, i, keep_data=False)
    problems += stop_host(BUILD, 0, keep_data=False)
    problems += stop_lxcfs()
    problems += cg_kill_remove("hf")
    problems += cg_kill_remove("registry")
    problems += cg_kill_remove("")
    remove_outsider()
    remove_host_net()
    if os.path.isdir(LAB):
        rmtree_robust(LAB)
    with contextlib.suppress(OSError):  # the nodes' mount point of their own /var/lib/spark-vllm
        os.rmdir("/var/lib/spark-vllm")  # (empty on the host; left alone if anything is in it)
    if problems:
        die("lab down: everything else is removed, but " + "; ".join(problems) +
            " -- run `lab.py down` again once those processes have exited")
    log("lab down: namespaces, bridges, processes, cgroups and " + LAB +
        " removed (caches kept in " + CACHE + ")")


def cmd_status(args) -> None:
    st = state()
    n = st.get("nodes") or 0
    print(f"lab: {n} node(s); image {st.get('image')}")
    print(f"registry {REGISTRY}: {'up' if registry_running() else 'DOWN'}")
    missing = hub.hf_missing()
    hf = "DOWN" if len(missing) == len(HF_REPOS) else "up" if not missing else \
        f"up, not serving {', '.join(missing)} (made by an older lab: run up)"
    print(f"HF endpoint {HF_ENDPOINT}: {hf}")
    for i in range(1, n + 1):
        name = node_name(i)
        h = holder_pid(name)
        dk = "DOWN"
        ctrs = ""
        if h and ok([*node_docker(name), "version"]):
            dk = "up"
            ctrs = out([*node_docker(name), "ps", "--format", "{{.Names}}"], check=False).split()
        links = []
        for _br, nif, _p, _h in FABRIC:
            o = out(["ip", "-n", netns(name), "-br", "link", "show", nif], check=False).split()
            links.append(f"{nif}:{o[1] if len(o) > 1 else '?'}")
        print(f"{name} {mgmt_ip(i)}: ns={'up' if h else 'DOWN'} dockerd={dk} "
              f"sshd={'up' if sshd_running(name) else 'DOWN'} {' '.join(links)} "
              f"containers={','.join(ctrs) or '-'}")


def cmd_config(args) -> None:
    require_root()
    write_known_hosts()
    cfg = write_stack_json()
    print(json.dumps(cfg, indent=1))


# --------------------------------------------------------------------------- using the nodes
def ssh_argv(name: str, cmd: list | None = None, tty: bool = False) -> list:
    i = node_index(name)
    with contextlib.suppress(FileNotFoundError):
        write_known_hosts()
    argv = ["ssh", "-i", LAB_KEY, "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR"]
    if tty:
        argv.append("-t")
    return argv + [f"root@{mgmt_ip(i)}"] + (cmd or [])


def cmd_ssh(args) -> None:
    # one argument is a shell command line (as with ssh); several are an argv, quoted word by word
    # so `lab.py ssh spark-1 sh -c 'docker ps | wc -l'` keeps its words
    cmd = args.cmd
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if len(cmd) > 1:
        cmd = [" ".join(shlex.quote(c) for c in cmd)]
    argv = ssh_argv(args.node, cmd, tty=not cmd and sys.stdin.isatty())
    os.execvp(argv[0], argv)


def cmd_sshd(args, start: bool) -> None:
    require_root()
    i = node_index(args.node)
    if not holder_pid(args.node):
        die(f"{args.node} is not running")
    if start:
        start_sshd(args.node, i)
    else:
        stop_sshd(args.node)
    log(f"{args.node}: sshd {'started' if start else 'stopped'}")


def cmd_fabric(args, up: bool) -> None:
    require_root()
    set_fabric_carrier(node_index(args.node), up)
    log(f"{args.node}: fabric {'restored' if up else 'cut'}")


def cmd_kill(args) -> None:
    require_root()
    run([*node_docker(args.node), "kill", args.container])
    log(f"{args.node}: killed container {args.container}")


def cmd_crash(args) -> None:
    """A crash, not a stop: SIGKILL to the container's main process, sent inside the node (whose
    PID namespace Docker's pid is of). `docker kill`/`docker stop` count as a manual stop, after
    which Docker's restart policy leaves the container stopped; a process that dies of a signal
    is restarted by it."""
    require_root()
    node_index(args.node)
    dk = node_docker(args.node)
    fmt = "{{.State.Pid}} {{.State.Status}} {{.RestartCount}} {{.HostConfig.RestartPolicy.Name}}"
    got = run([*dk, "inspect", "-f", fmt, args.container], check=False, capture=True)
    if got.returncode != 0:
        die(f"{args.node}: no container {args.container}: {got.stderr.strip()}")
    pid_s, status, restarts, policy = [*got.stdout.split(), "", "", "", ""][:4]
    pid = int(pid_s or 0)
    if status != "running" or pid <= 0:
        die(f"{args.node}: {args.container} is {status}, not running: nothing to crash")
    run(in_node(args.node, ["kill", "-KILL", str(pid)]))
    wait_for(lambda: not ok(in_node(args.node, ["kill", "-0", str(pid)])), 30,
             f"pid {pid} of {args.container} to die")
    log(f"{args.node}: crashed {args.container}: kill -9 of its main process (pid {pid} in the "
        f"node); restart count was {restarts}, restart policy {policy or 'no'}")


def cmd_dockerd_restart(args) -> None:
    """The node's restart (a reboot, as far as the stack can tell): its dockerd stopped
    (SIGTERM: it stops its containers as a shutdown does), the node's nftables ruleset emptied
    (a reboot forgets the kernel's rules), then what the boot does before Docker: the units
    wanted by docker.service run (FAKED: the lab has no systemd, see hosts.play_boot_units),
    and dockerd started again the way `up` starts it; returns once it answers. Containers whose
    restart policy applies (not stopped by hand) are started again by dockerd itself."""
    require_root()
    i = node_index(args.node)
    hpid = holder_pid(args.node)
    if not hpid:
        die(f"{args.node} is not running")
    pidfile = os.path.join(node_dir(args.node), "dockerd.pid")
    pid = read_pid(pidfile)
    t0 = time.time()
    if pid:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(pid), 180, f"dockerd (pid {pid}) of {args.node} to exit")
        log(f"{args.node}: dockerd (pid {pid}) got SIGTERM and exited after "
            f"{time.time() - t0:.1f}s")
    else:
        log(f"{args.node}: dockerd was not running")
    forget_rules(args.node)  # a reboot empties the kernel's rules, the stack's table too
    t1 = time.time()
    # FAKE: the lab has no systemd; start_dockerd plays its part first (play_boot_units)
    start_dockerd(args.node, i, hpid, base_key())  # waits until `docker version` answers
    log(f"{args.node}: dockerd started again (pid {read_pid(pidfile)}), answering after "
        f"{time.time() - t1:.1f}s")


def cmd_seed(args) -> None:
    require_root()
    st = state()
    if not st.get("image"):
        die("the lab is not up")
    from lab import seed

    seed.seed(node_docker("spark-1"), st["image"], HF_ENDPOINT, HF_REPO, log,
              hf_dir=os.path.join(node_dir("spark-1"), "root", ".cache", "huggingface"))


def cmd_hf_bytes(args) -> None:
    total, agg = hub.served_bytes()
    if args.json:
        print(json.dumps({"total": total, "paths": agg}, indent=1))
        return
    for k in sorted(agg):
        print(f"{agg[k]['bytes']:>12} {agg[k]['requests']:>4}  {k}")
    print(f"{total:>12} total")


# --------------------------------------------------------------------------- command line
_LOCK_FD = None


def take_lock(verb: str) -> None:
    """One mutating lab.py at a time (several sessions/tests may drive the same lab)."""
    global _LOCK_FD
    os.makedirs(CACHE, exist_ok=True)
    _LOCK_FD = open(os.path.join(CACHE, ".lab.lock"), "a+")  # noqa: SIM115  (held until exit)
    try:
        fcntl.flock(_LOCK_FD, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(f"{verb}: waiting for another lab.py run to finish (lock {CACHE}/.lab.lock)")
        fcntl.flock(_LOCK_FD, fcntl.LOCK_EX)


def take_session_lock(verb: str) -> None:
    """The lab session lock (layout.SESSION_LOCK), unless a parent of this process holds it.

    A test run or `make demo` holds it for its whole session and runs lab.py itself; a `lab.py
    down` from another shell meanwhile (`make lab-down`) waits instead of removing the lab under
    it. Held until this process exits."""
    global _SESSION_FD
    if session_held_by_parent(SESSION_ENV):
        return
    _SESSION_FD = open(SESSION_LOCK, "a")  # noqa: SIM115  (held until exit)
    try:
        fcntl.flock(_SESSION_FD, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(f"{verb}: waiting for the lab: another session (a test run, make demo) holds "
            f"{SESSION_LOCK}")
        fcntl.flock(_SESSION_FD, fcntl.LOCK_EX)


_SESSION_FD = None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lab.py", description=__doc__.split("\n")[0])
    sp = p.add_subparsers(dest="verb", required=True)
    s = sp.add_parser("up")
    s.add_argument("--nodes", type=int, default=None)
    sp.add_parser("down")
    sp.add_parser("status")
    sp.add_parser("config")
    sp.add_parser("seed")
    s = sp.add_parser("hf-bytes")
    s.add_argument("--json", action="store_true")
    s = sp.add_parser("ssh")
    s.add_argument("node")
    s.add_argument("cmd", nargs=argparse.REMAINDER)
    for v in ("sshd-stop", "sshd-start", "fabric-cut", "fabric-restore"):
        sp.add_parser(v).add_argument("node")
    for v in ("kill", "crash"):
        s = sp.add_parser(v)
        s.add_argument("node")
        s.add_argument("container")
    sp.add_parser("dockerd-restart").add_argument("node")
    return p


VERBS = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "config": cmd_config,
         "seed": cmd_seed, "hf-bytes": cmd_hf_bytes, "ssh": cmd_ssh, "kill": cmd_kill,
         "crash": cmd_crash, "dockerd-restart": cmd_dockerd_restart,
         "sshd-stop": lambda a: cmd_sshd(a, False), "sshd-start": lambda a: cmd_sshd(a, True),
         "fabric-cut": lambda a: cmd_fabric(a, False),
         "fabric-restore": lambda a: cmd_fabric(a, True)}


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    if a.verb not in ("hf-bytes",):
        require_root()
    if a.verb not in ("hf-bytes", "status", "ssh", "config"):
        take_session_lock(a.verb)
        take_lock(a.verb)
    if a.verb != "hf-bytes":
        ensure_prereqs()
    try:
        VERBS[a.verb](a)
    except RuntimeError as e:
        die(str(e))
