"""One simulated host: namespace holder, mounts, identity files, dockerd, sshd; create or repair.

A node is a network namespace (svl-spark-i) plus a mount, UTS and PID namespace anchored by a
holder process, the PID namespace's init (`tini`, which reaps what is orphaned in the node,
running `sleep infinity`). The node's processes see only the node's processes (a Spark's early
OOM killer picks among its own: config/guard.py), all of them in the node's memory cgroup, whose
limit /proc/meminfo shows (lab/memory.py). Its /run, /etc (overlay), /usr/local/sbin (the
stand-ins), /tmp and /root (with the HF cache /root/.cache/huggingface in it) and
/var/lib/spark-vllm (the stack's own folder: Ray token, compile caches) are bound from
/var/lib/spark-vllm-lab/spark-i, /dev/shm is its own tmpfs, and its Docker data-root is bound
from the cache (/root/.cache/spark-vllm/lab/nodes/spark-i/docker), so pulled image layers outlive
`down`. `up` checks these mounts on every running node and rebuilds a node whose mounts are wrong.
The build host (lab.layout.BUILD, index 0) is the same without fabric, identity files, sshd,
private /root or cached Docker data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import time

from lab.cgroups import cg_kill_remove, spawn
from lab.deb_images import DEB_IMAGES
from lab.layout import (
    BUILD_IP,
    CACHE,
    CG_ROOT,
    FABRIC,
    FIXTURES,
    HERE,
    IMAGE_REPO,
    LAB_KEY,
    MAX_NODES,
    REGISTRY,
    host_key_path,
    mgmt_ip,
    netns,
    node_cache,
    node_dir,
    node_name,
)
from lab.memory import MEMINFO, node_cgroup_procs, node_sees_its_memory
from lab.net import ensure_ns_net, remove_ns_net
from lab.util import (
    log,
    ok,
    out,
    pid_alive,
    read_pid,
    rmtree_robust,
    run,
    tcp_open,
    wait_for,
    write,
)

NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The folder the stack keeps on each node (hostscripts/paths.py: /var/lib/spark-vllm/...)
STACK_DIR = "/var/lib/spark-vllm"


# --------------------------------------------------------------------------- namespaces
def holder_pid(name: str) -> int | None:
    pid = read_pid(os.path.join(node_dir(name), "holder.pid"))
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return None
    if not cmd.startswith(INIT[0].encode() + b"\0"):
        return None
    # never hand out a process that still shares the host's namespaces
    try:
        if any(os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}")
               for ns in ("mnt", "net", "pid")):
            return None
    except OSError:
        return None
    return pid


# The node's init: PID 1 of its PID namespace (reaps what is orphaned there; Debian's tini, which
# docker.io brings), and its only child, what keeps the node up. The child ignores SIGTERM, which
# tini passes on: stopping a node (stop_host: SIGTERM to all, SIGKILL after 10 s) gives its
# dockerd time to stop its containers before the namespace goes with its init
INIT = ["tini", "-s", "--", "/bin/sh", "-c", "trap '' TERM; exec sleep infinity"]
SBIN = "/usr/local/sbin"  # the node's stand-ins (its own bin folder, bound there)


def in_node(name: str, argv: list, pid: int | None = None) -> list:
    """argv to run a command inside the node's net + mount + uts + pid namespaces."""
    pid = holder_pid(name)
    if not pid:
        raise RuntimeError(f"{name} is not running (no namespace holder)")
    return ["nsenter", f"--target={pid}", "--net", "--mount", "--uts", "--pid", "--", *argv]


def _child(pid: int, what: str) -> int:
    """The one child of `pid` (nsenter's and unshare's with --fork, whose child is the process
    that runs in the node's PID namespace): the process the lab keeps the pid of."""
    def child() -> int | None:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            return None
        return kids[0] if len(kids) == 1 else None
    return wait_for(child, 10, what)


def _memory(name: str, i: int) -> str | None:
    """The node's memory cgroup for what the lab starts in it (the build host has none)."""
    return node_cgroup_procs(name) if i > 0 else None


def node_docker(name: str) -> list:
    return ["docker", "-H", f"unix://{node_dir(name)}/run/docker.sock"]


def start_holder(name: str, i: int) -> int:
    """The node's mount + UTS namespace (in its netns), anchored by `sleep infinity`.

    Every mount below is private to the node. The mount points all exist on any Linux host
    (/run, /etc, /usr/local/sbin, /root, /tmp, /dev/shm) or live in the lab's own state folder,
    so nothing depends on a host folder another program might remove. Order matters: the Docker
    data-root (in the cache, under the host's /root) is bound before the node's own /root covers
    the host's.
    """
    d = node_dir(name)
    for sub in ("run/sshd", "docker", "logs", "sysfs", "etc-upper", "etc-work", "tmp",
                "root/.cache/huggingface", "var-lib-spark-vllm"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    os.chmod(os.path.join(d, "tmp"), 0o1777)
    os.chmod(os.path.join(d, "root"), 0o700)
    q = shlex.quote
    etc_opts = f"lowerdir=/etc,upperdir={q(d + '/etc-upper')},workdir={q(d + '/etc-work')}"
    steps = ["set -e", f"hostname {q(name)}"]
    if i > 0:  # a node's Docker data outlives `down` (image layers are pulled once)
        dd = os.path.join(node_cache(name), "docker")
        os.makedirs(dd, exist_ok=True)
        steps.append(f"mount --bind {q(dd)} {q(d + '/docker')}")
    steps += [
        f"mount --bind {q(d + '/run')} /run",
        f"mount -t overlay lab-etc -o {etc_opts} /etc",
        f"mount --bind {q(d + '/bin')} /usr/local/sbin",
        # its own /dev/shm: what a container with --ipc host puts there (the lab tier's; the
        # stack's containers have IPC namespaces of their own since issue 46, which
        # tests/e2e/test_security.py checks against this one) stays inside the node, as on
        # separate machines
        "mount -t tmpfs -o rw,nosuid,nodev,mode=1777 lab-shm /dev/shm",
        f"mount --bind {q(d + '/tmp')} /tmp",
        # a sysfs of this network namespace, so /sys/class/net shows the node's own interfaces
        # (the host /sys, and with it /sys/fs/cgroup, stays in place for dockerd)
        f"mount -t sysfs lab-sysfs {q(d + '/sysfs')}",
        f"mount --bind {q(d + '/sysfs/class/net')} /sys/class/net",
        f"mount --bind {q(d + '/sysfs/devices/virtual/net')} /sys/devices/virtual/net",
    ]
    if i > 0:  # its memory, as lxcfs reads it for the node (lab/memory.py)
        steps.append(f"mount --bind {q(MEMINFO)} /proc/meminfo")
    if i > 0:  # root's home (and with it the HF cache /root/.cache/huggingface) is the node's own
        steps.append(f"mount --bind {q(d + '/root')} /root")
        # the stack's own folder on a Spark (the Ray token, the compile caches, the records of
        # stopped containers: hostscripts/paths.py) is the node's own too; shared, three nodes
        # writing the token at once raced (seen: `mv: cannot stat .../auth-token.new`)
        steps += [f"mkdir -p {STACK_DIR}",
                  f"mount --bind {q(d + '/var-lib-spark-vllm')} {STACK_DIR}"]
    steps.append("exec " + " ".join(q(w) for w in INIT))
    # --fork --pid: the shell (then the init) is PID 1 of the node's PID namespace; --mount-proc:
    # the node's /proc shows that namespace's processes only
    argv = ["nsenter", f"--net=/var/run/netns/{netns(name)}", "unshare", "--mount", "--uts",
            "--pid", "--fork", "--mount-proc", "--propagation", "private", "--", "/bin/sh", "-c",
            " && ".join(steps)]
    spawned = spawn(argv, os.path.join(d, "logs", "holder.log"), name + "/daemons",
                    memory_procs=_memory(name, i))
    pid = _child(spawned, f"{name}'s init (see {d}/logs/holder.log)")
    write(os.path.join(d, "holder.pid"), f"{pid}\n")
    wait_for(lambda: holder_pid(name) == pid, 10,
             f"{name} namespace holder (see {d}/logs/holder.log)")
    return pid


def _mounts(pid: int) -> dict:
    """mount point -> file system type of the mounts a process sees (the last one wins)."""
    res = {}
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            a, b = line.split(" - ", 1)
            res[a.split()[4]] = b.split()[0]
    return res


def _same(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def mount_problems(name: str, i: int, pid: int) -> list:
    """What is wrong with a running node's private mounts (empty when all is well).

    Paths under /proc/<holder>/root/ resolve in the node's mount namespace, so each bind is
    checked by comparing the inode the node sees with the host folder it must be."""
    d = node_dir(name)
    root = f"/proc/{pid}/root"
    try:
        mounts = _mounts(pid)
        shm = os.stat(root + "/dev/shm").st_dev
    except OSError as e:
        return [f"cannot inspect the namespace ({e})"]
    bad = []
    if mounts.get("/dev/shm") != "tmpfs" or shm == os.stat("/dev/shm").st_dev:
        bad.append("/dev/shm is not the node's own tmpfs")
    if mounts.get("/etc") != "overlay":
        bad.append("/etc is not the node's overlay")
    if mounts.get("/sys/class/net") != "sysfs":
        bad.append("/sys/class/net is not the node's sysfs")
    binds = {"/run": d + "/run", "/usr/local/sbin": d + "/bin", "/tmp": d + "/tmp"}
    if i > 0:
        binds.update({"/root": d + "/root", STACK_DIR: d + "/var-lib-spark-vllm",
                      d + "/docker": os.path.join(node_cache(name), "docker")})
        # the HF cache is the node's own as long as nothing is mounted between /root and it
        for m in ("/root/.cache", "/root/.cache/huggingface", "/root/.cache/huggingface/hub"):
            if m in mounts:
                bad.append(f"{m} is a mount ({mounts[m]}), not the node's own folder")
    for inside, host in binds.items():
        if not _same(root + inside, host):
            bad.append(f"{inside} is not {host}")
    if i > 0:
        if mounts.get("/proc/meminfo") != "fuse.lxcfs":
            bad.append("/proc/meminfo is not lxcfs's")
        else:
            seen = node_sees_its_memory(
                ["nsenter", f"--target={pid}", "--mount", "--pid", "--"])
            if seen:
                bad.append(seen)
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                cgroups = f.read()
        except OSError:
            cgroups = ""
        if f":memory:/{CG_ROOT}/{name}\n" not in cgroups:
            bad.append(f"its init is not in the memory cgroup {CG_ROOT}/{name}")
    return bad


def shm_dev(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/root/dev/shm").st_dev
    except OSError:
        return None


def stop_host(name: str, i: int, keep_data: bool = True) -> list:
    """Stop a node's processes and remove its namespace; returns cgroups that would not go.
    keep_data=False also removes the node's state folder (never its cached Docker data)."""
    problems = cg_kill_remove(name)
    d = node_dir(name)
    for f in ("holder.pid", "dockerd.pid", "sshd.pid"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(d, f))
    if os.path.isdir(os.path.join(d, "run")):
        shutil.rmtree(os.path.join(d, "run"), ignore_errors=True)
    remove_ns_net(name, i)
    if not keep_data and os.path.isdir(d):
        rmtree_robust(d)
    return problems


# --------------------------------------------------------------------------- identity files
def _fixture_body(fname: str) -> str:
    with open(os.path.join(FIXTURES, fname)) as f:
        return f.read().split("\n", 1)[1]  # line 1 is the '# source:' header


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write_identity(name: str, i: int, n_nodes: int) -> None:
    """Per-node bin dir (bound over /usr/local/sbin) and /etc overlay contents."""
    d = node_dir(name)
    bindir = os.path.join(d, "bin")
    os.makedirs(bindir, exist_ok=True)
    idd = os.path.join(d, "identity")
    os.makedirs(idd, exist_ok=True)
    for f in os.listdir(FIXTURES):
        shutil.copyfile(os.path.join(FIXTURES, f), os.path.join(idd, f))
    uuid_files = sorted(f for f in os.listdir(FIXTURES) if f.startswith("nvidia-smi-L-"))
    # spark-1/2 carry the two recorded UUIDs (hutch, starsky); further nodes get a UUID derived
    # from the node name (synthesized, so every simulated GPU stays unique)
    uuid = None
    if i > len(uuid_files):
        h = hashlib.sha256(name.encode()).hexdigest()
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    write(os.path.join(idd, "node.json"), json.dumps({
        "name": name, "index": i, "uuid_fixture": uuid_files[(i - 1) % len(uuid_files)],
        "uuid": uuid, "fabric": [{"interface": nif, "hca": hca} for _br, nif, _p, hca in FABRIC]}))
    data = {"node": json.loads(_read(os.path.join(idd, "node.json"))),
            "files": {f: _fixture_body(f) for f in os.listdir(FIXTURES)
                      if f.startswith("nvidia-smi")}}
    standins = os.path.join(HERE, "standins")
    src = _read(os.path.join(standins, "nvidia-smi")).replace("@DATA@", repr(json.dumps(data)))
    write(os.path.join(bindir, "nvidia-smi"), src, 0o755)
    src = _read(os.path.join(standins, "ibdev2netdev")).replace("@IDENTITY@", idd)
    write(os.path.join(bindir, "ibdev2netdev"), src, 0o755)
    write(os.path.join(bindir, "nvidia-container-runtime-hook"),
          _read(os.path.join(standins, "nvidia-container-runtime-hook")), 0o755)
    # the lab runs no systemd: what the stack asks of systemctl and journalctl (each says)
    for tool in ("systemctl", "journalctl"):
        write(os.path.join(bindir, tool), _read(os.path.join(standins, tool)), 0o755)
    up = os.path.join(d, "etc-upper")
    os.makedirs(os.path.join(d, "etc-work"), exist_ok=True)
    write(os.path.join(up, "dgx-release"), _fixture_body("dgx-release-sionna-rk.txt"))
    write(os.path.join(up, "hostname"), name + "\n")
    hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    # every name the lab can give (1..9 nodes), so growing or shrinking the lab changes no
    # running node's /etc (etc_stale would rebuild it)
    for j in range(1, MAX_NODES + 1):
        hosts += f"{mgmt_ip(j)}\t{node_name(j)}\n"
    write(os.path.join(up, "hosts"), hosts)
    # The lab has no DNS server. The machine's own nameserver is not reachable from a node's
    # network namespace, so every lookup there waited 10 s for it (two 5 s timeouts): vLLM's
    # torch.distributed asks for each peer's name once per rank, 10 s of every vLLM start. A
    # nameserver where nothing listens fails at once, as a site's DNS answering NXDOMAIN does.
    write(os.path.join(up, "resolv.conf"),
          "# spark-vllm lab: no DNS in the lab; lookups fail at once (lab/hosts.py)\n"
          "nameserver 127.0.0.1\n")
    # the node's own ssh host key where a Spark keeps it, so the README's out-of-band check on the
    # host (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`) shows the key its sshd presents,
    # not this machine's (the /etc overlay's lower folder); recon reads the same file
    install_host_key(name, up)


def install_host_key(name: str, etc_upper: str) -> None:
    """The node's ed25519 host key (generated once per machine and node and kept in the cache,
    so the pins the lab writes stay valid across down/up; delete the cache dir to rotate) as
    /etc/ssh/ssh_host_ed25519_key{,.pub} of the node."""
    key = host_key_path(name)
    os.makedirs(os.path.dirname(key), mode=0o700, exist_ok=True)
    if not os.path.exists(key):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", key])
    sd = os.path.join(etc_upper, "ssh")
    os.makedirs(sd, mode=0o755, exist_ok=True)
    node_key = os.path.join(sd, "ssh_host_ed25519_key")
    for src, dst, mode in ((key, node_key, 0o600), (key + ".pub", node_key + ".pub", 0o644)):
        if not os.path.exists(dst) or _read(dst) != _read(src):
            shutil.copyfile(src, dst)
        os.chmod(dst, mode)


# --------------------------------------------------------------------------- the boot
# FAKE: the lab's nodes run no systemd (a node is a namespace, its processes the lab's). What a
# Spark's boot does before Docker starts, the lab does before it starts a node's dockerd: it
# runs the ExecStart of every unit in the node's /etc/systemd/system that is ordered before
# docker.service or wanted by it (`Before=` / `WantedBy=`) and that the node's own systemctl
# says is enabled (`systemctl is-enabled` in the node: the real one reads the links
# `systemctl enable` made; a stand-in of the lab's, where one is installed, its own record).
# The stack's firewall unit (hostscripts/firewall.py) is one. Only that: no ordering graph, no
# other directive, no restart; each run is logged with its time in the node's logs/boot.log,
# which the tests read.
UNIT_DIR = "etc/systemd/system"


def boot_log(name: str) -> str:
    return os.path.join(node_dir(name), "logs", "boot.log")


def _boot(name: str, line: str) -> None:
    with open(boot_log(name), "a") as f:
        f.write(f"{time.time():.6f} {line}\n")


def _before_docker(text: str) -> bool:
    words = [w for ln in text.splitlines() if ln.startswith(("Before=", "WantedBy="))
             for w in ln.split("=", 1)[1].split()]
    return "docker.service" in words


def play_boot_units(name: str, hpid: int) -> None:
    """FAKE systemd (see above): the ExecStart of each enabled unit of the node that Docker's
    start waits for, in the node's namespaces, in name order; a failure is logged and does not
    stop the boot (systemd starts Docker after a failed Wants= unit too)."""
    folder = f"/proc/{hpid}/root/{UNIT_DIR}"
    units = sorted(u for u in os.listdir(folder) if u.endswith(".service")
                   and os.path.isfile(os.path.join(folder, u))
                   and not os.path.islink(os.path.join(folder, u))) if os.path.isdir(folder) else []
    for unit in units:
        try:
            text = _read(os.path.join(folder, unit))
        except OSError as e:
            _boot(name, f"{unit}: unreadable ({e})")
            continue
        enabled = run(in_node(name, ["systemctl", "is-enabled", "--quiet", unit]), check=False,
                      quiet=True, env={"PATH": NODE_PATH}).returncode == 0
        if not _before_docker(text) or not enabled:
            continue
        starts = [ln.split("=", 1)[1] for ln in text.splitlines()
                  if ln.startswith("ExecStart=")]
        for cmd in starts:
            done = run(in_node(name, shlex.split(cmd)), check=False, quiet=True,
                       env={"PATH": NODE_PATH})
            _boot(name, f"{unit}: ExecStart={cmd} rc={done.returncode}")
            log(f"{name}: boot (faked systemd): {unit} ExecStart rc={done.returncode}")


def forget_rules(name: str) -> None:
    """What a reboot does to the node's kernel rules: the nftables ruleset emptied (Docker's
    chains too, which dockerd makes again as it starts)."""
    run(in_node(name, ["nft", "flush", "ruleset"]), check=False, quiet=True)
    _boot(name, "nftables ruleset flushed (the reboot)")


# --------------------------------------------------------------------------- dockerd
def start_dockerd(name: str, i: int, hpid: int, keep_base: str | None = None) -> None:
    d = node_dir(name)
    if read_pid(os.path.join(d, "dockerd.pid")) and os.path.exists(f"{d}/run/docker.sock") and \
            ok([*node_docker(name), "version"]):
        return
    if i > 0:  # FAKE systemd: the units Docker's start waits for (play_boot_units)
        play_boot_units(name, hpid)
        _boot(name, "dockerd starts")
    env = {"PATH": NODE_PATH, "HOME": "/root"}
    argv = in_node(name, ["dockerd", "--data-root", f"{d}/docker", "--pidfile", "/run/docker.pid",
                          "-H", "unix:///run/docker.sock", "--insecure-registry", REGISTRY,
                          "--exec-opt", "native.cgroupdriver=cgroupfs",
                          "--cgroup-parent", f"/{CG_ROOT}/{name}/containers",
                          "--bip", f"172.31.{i if i > 0 else 250}.1/24",
                          "--storage-driver", "overlay2", "--log-level", "warn"], hpid)
    spawned = spawn(argv, os.path.join(d, "logs", "dockerd.log"), name + "/daemons", env=env,
                    memory_procs=_memory(name, i))
    pid = _child(spawned, f"dockerd of {name} (see {d}/logs/dockerd.log)")
    write(os.path.join(d, "dockerd.pid"), f"{pid}\n")
    wait_for(lambda: ok([*node_docker(name), "version"]), 60,
             f"dockerd of {name} (see {d}/logs/dockerd.log)")
    if i > 0:
        unit_started(name, "docker.service")
    marker = os.path.join(node_cache(name), "retired")
    if i > 0 and os.path.exists(marker):  # first start after `down`: a fresh machine again
        scrub_docker(name, keep_base)
        os.unlink(marker)


def retire_docker(name: str, keep_base: str | None) -> None:
    """`down` for a node's Docker data (kept in the cache): no container, volume or network
    survives, and no image but lab images on the current base (see scrub_docker). Done now when
    dockerd answers, and in any case on dockerd's next start (the marker), so a node that died
    first is cleaned up too."""
    cache = node_cache(name)
    if not os.path.isdir(os.path.join(cache, "docker")):
        return
    write(os.path.join(cache, "retired"), "containers are removed on dockerd's next start\n")
    alive = read_pid(os.path.join(node_dir(name), "dockerd.pid"))
    if alive and ok([*node_docker(name), "version"]):
        scrub_docker(name, keep_base)
        os.unlink(os.path.join(cache, "retired"))


def prune_old_lab_images(name: str, keep_base: str) -> None:
    """Lab images on another base than the current one (a base rebuild) that no container uses:
    each holds its own ~7 GB base layer. `docker rmi` without -f leaves images in use alone."""
    dk = node_docker(name)
    ids = out([*dk, "images", "-q", "--no-trunc", "--filter", "label=spark-vllm.lab.base"],
              check=False).split()
    if not ids:
        return
    fmt = '{{.Id}} {{index .Config.Labels "spark-vllm.lab.base"}}'
    for line in out([*dk, "image", "inspect", "-f", fmt, *sorted(set(ids))],
                    check=False).splitlines():
        img, _, base = line.partition(" ")
        if base and base != keep_base and \
                run([*dk, "rmi", img], check=False, quiet=True).returncode == 0:
            log(f"{name}: removed lab image {img[7:19]} (old base {base})")


def scrub_docker(name: str, keep_base: str | None) -> None:
    """Remove every container, volume and network, and every image except the lab images pulled
    from the lab registry whose base layer is the current one (label spark-vllm.lab.base), so the
    ~7 GB base is pulled once per node and base version, and the images of Debian packages (the
    gateway's, Prometheus's, the node exporter's, Alertmanager's: tens of MB each) pulled from
    it. keep_base None keeps every image."""
    small = [f'"{REGISTRY}/{img.repo}@' for img in DEB_IMAGES.values()]
    dk = node_docker(name)
    ids = out([*dk, "ps", "-aq"], check=False).split()
    if ids:
        run([*dk, "rm", "-f", "-v", *ids], check=False, quiet=True)
    if keep_base is not None:
        fmt = '{{.Id}} {{index .Config.Labels "spark-vllm.lab.base"}} {{json .RepoDigests}}'
        imgs = sorted(set(out([*dk, "images", "-q", "--no-trunc"], check=False).split()))
        info = out([*dk, "image", "inspect", "-f", fmt, *imgs], check=False) if imgs else ""
        for line in info.splitlines():
            img, base, digests = [*line.split(" ", 2), "", ""][:3]
            lab_pulled = f'"{REGISTRY}/{IMAGE_REPO}@' in digests
            deb = any(s in digests for s in small)  # small: kept whatever its key
            if not (base == keep_base and lab_pulled) and not deb:
                run([*dk, "rmi", "-f", img], check=False, quiet=True)
    # not `system prune`: an image pulled by digest has no tag, so prune calls it dangling
    run([*dk, "volume", "prune", "-f"], check=False, quiet=True)
    run([*dk, "network", "prune", "-f"], check=False, quiet=True)


# --------------------------------------------------------------------------- sshd
def ensure_lab_key() -> None:
    if not os.path.exists(LAB_KEY):
        os.makedirs(CACHE, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "spark-vllm-lab", "-f", LAB_KEY])
    os.chmod(LAB_KEY, 0o600)


SSHD_CONFIG = """# spark-vllm lab sshd for {name}
ListenAddress {addr}:22
HostKey {key}
PidFile /run/sshd.pid
AuthorizedKeysFile {sd}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM yes
PrintMotd no
AcceptEnv LANG LC_*
MaxSessions 64
MaxStartups 64:30:128
Subsystem sftp /usr/lib/openssh/sftp-server
"""


def ssh_setup(name: str, i: int) -> bool:
    """Write host key, authorized_keys and sshd_config; True when an existing config changed."""
    sd = os.path.join(node_dir(name), "ssh")
    os.makedirs(sd, mode=0o700, exist_ok=True)
    ensure_lab_key()
    for stale in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):  # where it was kept before
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(sd, stale))
    shutil.copyfile(LAB_KEY + ".pub", os.path.join(sd, "authorized_keys"))
    os.chmod(os.path.join(sd, "authorized_keys"), 0o600)
    cfg_path = os.path.join(sd, "sshd_config")
    before = _read(cfg_path) if os.path.exists(cfg_path) else None
    # the node's own /etc/ssh (install_host_key): the key the README's check reads on the host
    text = SSHD_CONFIG.format(name=name, addr=mgmt_ip(i), key="/etc/ssh/ssh_host_ed25519_key",
                              sd=sd)
    write(cfg_path, text)
    return before is not None and before != text


def sshd_running(name: str) -> int | None:
    return read_pid(os.path.join(node_dir(name), "sshd.pid"))


def start_sshd(name: str, i: int) -> None:
    if sshd_running(name):
        return
    d = node_dir(name)
    os.makedirs(f"{d}/run/sshd", exist_ok=True)
    argv = in_node(name, ["/usr/sbin/sshd", "-D", "-e", "-f", f"{d}/ssh/sshd_config"])
    spawned = spawn(argv, os.path.join(d, "logs", "sshd.log"), name + "/daemons",
                    env={"PATH": NODE_PATH}, memory_procs=_memory(name, i))
    pid = _child(spawned, f"sshd of {name} (see {d}/logs/sshd.log)")
    write(os.path.join(d, "sshd.pid"), f"{pid}\n")
    wait_for(lambda: tcp_open(mgmt_ip(i), 22), 15, f"sshd of {name} (see {d}/logs/sshd.log)")
    unit_started(name, "ssh.service")


def unit_started(name: str, unit: str) -> None:
    """What systemd does when it starts `unit` on a Spark, as far as the stack relies on it:
    the unit's OOMScoreAdjust, drop-ins of the stack's guard included, on its main process
    (the node's systemctl stand-in reads them: lab/standins/systemctl)."""
    p = run(in_node(name, [f"{SBIN}/systemctl", "x-lab-started", unit]), check=False,
            capture=True)
    if p.returncode != 0:
        log(f"{name}: {unit} started without its unit's settings: {(p.stderr or '').strip()}")


def boot_units(name: str) -> None:
    """The units enabled in the node (the guard's earlyoom) started, as a Spark's boot does."""
    p = run(in_node(name, [f"{SBIN}/systemctl", "x-lab-boot"]), check=False, capture=True)
    if p.returncode != 0:
        log(f"{name}: its enabled units did not start: {(p.stderr or '').strip()}")


def stop_sshd(name: str) -> None:
    pid = sshd_running(name)
    if pid:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(pid), 10, f"sshd of {name} to stop")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(node_dir(name), "sshd.pid"))


# --------------------------------------------------------------------------- create or repair
def etc_stale(name: str, hpid: int) -> list[str]:
    """The identity files (write_identity) a running node's /etc does not show. They go into
    the overlay's upper folder, which a node mounted before they changed may not show (overlayfs
    caches what it looked up, and a file cannot be copied up over one written there directly):
    such a node is rebuilt."""
    up = os.path.join(node_dir(name), "etc-upper")
    stale = []
    for f in [*sorted(os.listdir(up)), *LAB_ETC_FILES]:
        src = os.path.join(up, f)
        if os.path.isfile(src):
            try:
                same = _read(f"/proc/{hpid}/root/etc/{f}") == _read(src)
            except OSError:
                same = False
            if not same:
                stale.append(f"/etc/{f}")
    return stale


# what the lab writes below the top of a node's /etc (the top level is compared whole)
LAB_ETC_FILES = ("ssh/ssh_host_ed25519_key.pub",)


def ensure_host(name: str, i: int, n_nodes: int, sshd: bool = True,
                keep_base: str | None = None) -> None:
    """Create or repair one simulated host. Anything half-dead, or a node whose private mounts
    are wrong, is torn down and rebuilt (its Docker data and host keys are kept)."""
    d = node_dir(name)
    hpid = holder_pid(name)
    healthy = hpid is not None and ok(["ip", "netns", "pids", netns(name)]) and \
        os.path.exists(f"/var/run/netns/{netns(name)}")
    if healthy:
        bad = mount_problems(name, i, hpid)
        if bad:
            log(f"{name}: rebuilding, its mounts are wrong: {'; '.join(bad)}")
            healthy = False
    if not healthy:
        if os.path.exists(d) or netns(name) in out(["ip", "netns", "list"], check=False):
            log(f"{name}: recovering (stale namespace/processes)")
        stop_host(name, i, keep_data=True)
    if i > 0:
        write_identity(name, i, n_nodes)
        stale = etc_stale(name, hpid) if healthy and hpid is not None else []
        if stale:
            log(f"{name}: rebuilding, its /etc does not show the lab's {', '.join(stale)}")
            stop_host(name, i, keep_data=True)
            healthy = False
        if ssh_setup(name, i) and sshd_running(name):
            log(f"{name}: sshd configuration changed, restarting sshd")
            stop_sshd(name)
    else:
        os.makedirs(os.path.join(d, "bin"), exist_ok=True)
        write(os.path.join(d, "bin", "nvidia-container-runtime-hook"),
              "#!/bin/sh\ncat >/dev/null\nexit 0\n", 0o755)
    ensure_ns_net(name, i, with_fabric=i > 0, ip=None if i > 0 else BUILD_IP)
    if not healthy:
        hpid = start_holder(name, i)
        bad = mount_problems(name, i, hpid)
        if bad:
            raise RuntimeError(f"{name}: mounts wrong right after start: {'; '.join(bad)}")
    start_dockerd(name, i, hpid, keep_base)
    if i > 0 and keep_base:
        prune_old_lab_images(name, keep_base)
    if sshd and i > 0:
        start_sshd(name, i)
        boot_units(name)
