#!/usr/bin/env python3
"""spark-vllm lab: simulated DGX Spark (GB10) hosts on one Linux machine.

Stdlib only (runs before any venv exists). Must run as root.
    python3 lab/lab.py up [--nodes N] | down | status | config
    python3 lab/lab.py seed | hf-bytes [--json] | ssh NODE [CMD...]
    python3 lab/lab.py sshd-stop|sshd-start|fabric-cut|fabric-restore NODE | kill NODE CONTAINER
See lab/README.md for what is real and what is simulated.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
LAB = "/var/lib/spark-vllm-lab"          # lab state: removed by `down`
CACHE = "/root/.cache/spark-vllm/lab"     # caches + lab key + stack.json: kept by `down`
CG_ROOT = "svl-lab"                       # cgroup (v1) sub-tree that holds every lab process

MGMT_BR, MGMT_NET, MGMT_IP = "svl-mgmt", "10.77.0", "10.77.0.1"
BUILD_IP = "10.77.0.2"
# (host bridge, node interface name, /24 prefix, RoCE HCA name shown by ibdev2netdev)
FABRIC = [("svl-fab1", "enp1s0f1np1", "192.168.177", "rocep1s0f1"),
          ("svl-fab2", "enP2p1s0f1np1", "192.168.178", "roceP2p1s0f1")]
MGMT_IF = "enP7s7"                        # the Spark's 10GbE management NIC name
FAB_MTU = 9000
REGISTRY = f"{MGMT_IP}:5000"
IMAGE_REPO = "spark-lab/vllm-spark"
HF_PORT, OLAH_PORT = 8090, 8091
HF_ENDPOINT = f"http://{MGMT_IP}:{HF_PORT}"
HF_REPO = "spark-lab/tiny-moe"
LAB_KEY = os.path.join(CACHE, "id_ed25519")
STACK_JSON = os.path.join(CACHE, "stack.json")
KNOWN_HOSTS = os.path.join(CACHE, "known_hosts")

SUITE = "bookworm"
DEB_MIRROR = "http://deb.debian.org/debian"
ROOTFS_PKGS = ["python3", "python3-venv", "ca-certificates"]
IMAGE_REQS = ["ray[default]==2.60.0", "huggingface_hub==2.4.0", "safetensors==0.8.0"]
OLAH_REQ = "olah==0.5.4"
APT_PKGS = {"dockerd": "docker.io", "debootstrap": "debootstrap", "docker-registry": "docker-registry",
            "sshd": "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client",
            "ip": "iproute2", "ping": "iputils-ping", "ethtool": "ethtool", "git": "git",
            "nsenter": "util-linux", "iptables": "iptables"}
FIXTURES = os.path.join(HERE, "identity")

VERBOSE = os.environ.get("LAB_VERBOSE") == "1"


# --------------------------------------------------------------------------- small helpers
def log(msg: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def warn(msg: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] warning: {msg}", file=sys.stderr, flush=True)


def die(msg: str, code: int = 1) -> None:
    print(f"lab: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def run(cmd, check=True, capture=False, input=None, env=None, quiet=False, timeout=None):
    if isinstance(cmd, str):
        cmd = ["/bin/sh", "-c", cmd]
    if VERBOSE:
        print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    p = subprocess.run(cmd, input=input, env=env, timeout=timeout,
                       stdout=subprocess.PIPE if (capture or quiet) else None,
                       stderr=subprocess.PIPE if (capture or quiet) else None,
                       text=isinstance(input, str) or input is None)
    if check and p.returncode != 0:
        err = (p.stderr or "").strip() if (capture or quiet) else ""
        raise RuntimeError(f"command failed ({p.returncode}): {' '.join(cmd)}\n{err}")
    return p


class progress:
    """Heartbeat for long steps: prints elapsed time every 15 s while the block runs."""

    def __init__(self, label: str):
        self.label = label

    def __enter__(self):
        import threading
        self.t0 = time.time()
        self.stop = threading.Event()

        def beat():
            while not self.stop.wait(15):
                log(f"  ... {self.label}: {time.time() - self.t0:.0f}s")
        self.th = threading.Thread(target=beat, daemon=True)
        self.th.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        return False


def out(cmd, check=True) -> str:
    return run(cmd, check=check, capture=True).stdout


def ok(cmd) -> bool:
    return run(cmd, check=False, quiet=True).returncode == 0


def write(path: str, text, mode: int | None = None) -> None:
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def short_hash(*parts) -> str:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:16]


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def read_pid(path: str) -> int | None:
    try:
        pid = int(open(path).read().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def wait_for(pred, timeout: float, what: str, interval: float = 0.3):
    end = time.time() + timeout
    while time.time() < end:
        try:
            r = pred()
        except Exception:
            r = None
        if r:
            return r
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def http_get(url: str, timeout=5, headers=None, method="GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    return urllib.request.urlopen(req, timeout=timeout)


def node_name(i: int) -> str:
    return f"spark-{i}"


def node_index(name: str) -> int:
    m = re.fullmatch(r"spark-(\d+)", name)
    if not m:
        die(f"unknown node {name!r} (expected spark-N)")
    return int(m.group(1))


def node_dir(name: str) -> str:
    return os.path.join(LAB, name)


def netns(name: str) -> str:
    return f"svl-{name}"


def mgmt_ip(i: int) -> str:
    return f"{MGMT_NET}.1{i}" if i < 10 else f"{MGMT_NET}.{10 + i}"


def fab_ip(prefix: str, i: int) -> str:
    return f"{prefix}.1{i}" if i < 10 else f"{prefix}.{10 + i}"


# --------------------------------------------------------------------------- prerequisites
def require_root() -> None:
    if os.geteuid() != 0:
        die("the lab must run as root (it creates network namespaces, bridges, mounts and "
            "daemons); re-run with sudo", 77)


def ensure_prereqs(extra=()) -> None:
    need = sorted({pkg for binary, pkg in list(APT_PKGS.items()) + list(extra)
                   if shutil.which(binary) is None and not os.path.exists(f"/usr/sbin/{binary}")})
    import importlib.util
    if importlib.util.find_spec("pip") is None and not ok(["/usr/bin/python3", "-c", "import pip"]):
        need.append("python3-pip")
    if not ok(["/usr/bin/python3", "-c", "import venv, ensurepip"]):
        need.append("python3-venv")
    if not need:
        return
    log(f"installing Debian prerequisites: {' '.join(need)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # no service may start on install (the lab starts its own registry/sshd/dockerd)
    policy = "/usr/sbin/policy-rc.d"
    made_policy = not os.path.exists(policy)
    if made_policy:
        write(policy, "#!/bin/sh\nexit 101\n", 0o755)
    try:
        if run(["apt-get", "install", "-y", "--no-install-recommends", *need], check=False,
               env=env, quiet=True).returncode != 0:
            run(["apt-get", "update"], env=env, quiet=True)
            run(["apt-get", "install", "-y", "--no-install-recommends", *need], env=env, quiet=True)
    finally:
        if made_policy:
            os.unlink(policy)


def host_pip() -> list:
    for py in (sys.executable, "/usr/bin/python3"):
        if ok([py, "-m", "pip", "--version"]):
            return [py, "-m", "pip"]
    die("no pip available on the host")


# --------------------------------------------------------------------------- cgroups (v1)
def cg_dirs(sub: str) -> list:
    """cgroup directories for a lab sub-path in every mounted v1 hierarchy we use."""
    res = []
    for ctrl in ("pids", "memory", "cpu", "cpuacct", "blkio", "devices", "freezer", "cpuset", "systemd",
                 "unified"):
        base = f"/sys/fs/cgroup/{ctrl}"
        if os.path.isdir(base):
            res.append(os.path.join(base, CG_ROOT, sub))
    return res


def cg_track(sub: str) -> str:
    """Create the tracking cgroup (pids hierarchy) and return its cgroup.procs path."""
    d = f"/sys/fs/cgroup/pids/{CG_ROOT}/{sub}"
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, "cgroup.procs")


def cg_pids(sub: str) -> list:
    pids = set()
    for d in cg_dirs(sub):
        for root, _dirs, files in os.walk(d):
            if "cgroup.procs" in files:
                try:
                    pids.update(int(x) for x in open(os.path.join(root, "cgroup.procs")).read().split())
                except OSError:
                    pass
    return sorted(pids)


def cg_kill_remove(sub: str, timeout: float = 10, settle: float = 30) -> list:
    """SIGTERM every process in the lab cgroup sub-tree, SIGKILL what is left after `timeout`,
    then remove the cgroups, retrying for up to `settle` seconds: a process may still be exiting
    or a daemon may fork one more child while it dies, and rmdir refuses a cgroup with tasks.
    Returns what could not be removed (empty when the sub-tree is gone)."""
    for p in cg_pids(sub):
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.time() + timeout
    while time.time() < end and any(pid_alive(p) for p in cg_pids(sub)):
        time.sleep(0.2)
    end = time.time() + settle
    while True:
        for p in cg_pids(sub):
            if pid_alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for d in cg_dirs(sub):
            if os.path.isdir(d):
                for root, _dirs, _files in sorted(os.walk(d, topdown=False), key=lambda t: -len(t[0])):
                    try:
                        os.rmdir(root)
                    except OSError:
                        pass
        left = [d for d in cg_dirs(sub) if os.path.isdir(d)]
        if not left or time.time() >= end:
            break
        time.sleep(0.3)
    problems = []
    for d in left:
        pids = []
        for root, _dirs, files in os.walk(d):
            if "cgroup.procs" in files:
                try:
                    pids += open(os.path.join(root, "cgroup.procs")).read().split()
                except OSError:
                    pass
        what = ", ".join(f"{p} {proc_desc(int(p))}" for p in pids) or "no tasks listed"
        problems.append(f"cgroup {d} not removable after {settle:.0f}s ({what})")
    for msg in problems:
        warn(msg)
    return problems


def proc_desc(pid: int) -> str:
    """State and command line of a process, for messages about processes that will not die."""
    try:
        state = next((l.split(":", 1)[1].strip() for l in open(f"/proc/{pid}/status")
                      if l.startswith("State:")), "?")
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        return f"[{state}] {cmd[:100].strip()}"
    except OSError:
        return "[gone]"


def spawn(argv: list, logfile: str, cg_sub: str, env=None) -> int:
    """Start a background process (own session, survives us) inside the lab cgroup sub-tree."""
    procs = cg_track(cg_sub)
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    wrapper = ["/bin/sh", "-c", f'echo $$ > {shlex.quote(procs)} && exec "$@"', "lab-spawn", *argv]
    with open(logfile, "ab") as lf:
        # cwd: the log's folder, never the caller's (olah writes ./logs wherever it starts)
        p = subprocess.Popen(wrapper, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT,
                             start_new_session=True, env=env, close_fds=True,
                             cwd=os.path.dirname(logfile))
    return p.pid


# --------------------------------------------------------------------------- networking
def link_exists(name: str, ns: str | None = None) -> bool:
    cmd = ["ip"] + (["-n", ns] if ns else []) + ["link", "show", name]
    return ok(cmd)


def ensure_bridge(name: str, mtu: int, addr: str | None) -> None:
    if not link_exists(name):
        run(["ip", "link", "add", name, "type", "bridge"])
    run(["ip", "link", "set", name, "mtu", str(mtu)])
    if addr and addr.split("/")[0] not in out(["ip", "-o", "addr", "show", "dev", name]):
        run(["ip", "addr", "add", addr, "dev", name])
    run(["ip", "link", "set", name, "up"])


def ensure_veth(host_if: str, bridge: str, ns: str, node_if: str, mtu: int, addr: str,
                mac: str | None = None) -> None:
    if not link_exists(node_if, ns):
        if link_exists(host_if):
            run(["ip", "link", "del", host_if])
        run(["ip", "link", "add", host_if, "mtu", str(mtu), "type", "veth", "peer", "name", "svltmp0", "mtu", str(mtu)])
        run(["ip", "link", "set", "svltmp0", "netns", ns])
        run(["ip", "-n", ns, "link", "set", "svltmp0", "name", node_if])
    run(["ip", "link", "set", host_if, "master", bridge, "mtu", str(mtu), "up"])
    if mac:   # stable across re-creation, so peers' neighbour caches stay valid after a recovery
        run(["ip", "-n", ns, "link", "set", node_if, "address", mac])
    run(["ip", "-n", ns, "link", "set", node_if, "mtu", str(mtu), "up"])
    if addr.split("/")[0] not in out(["ip", "-n", ns, "-o", "addr", "show", "dev", node_if]):
        run(["ip", "-n", ns, "addr", "add", addr, "dev", node_if])


def host_ifs(i: int) -> dict:
    return {"mgmt": f"svm-s{i}", "svl-fab1": f"svf1-s{i}", "svl-fab2": f"svf2-s{i}"}


def ensure_host_net() -> None:
    ensure_bridge(MGMT_BR, 1500, f"{MGMT_IP}/24")
    for br, _if, _pfx, _hca in FABRIC:
        ensure_bridge(br, FAB_MTU, None)
    # lab bridges must forward even if br_netfilter + a restrictive FORWARD policy exist
    if ok(["iptables", "-S", "FORWARD"]):
        for br in [MGMT_BR] + [f[0] for f in FABRIC]:
            rule = ["FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"]
            if not ok(["iptables", "-C", *rule]):
                run(["iptables", "-I", *rule])


def ensure_ns_net(name: str, i: int, with_fabric: bool = True, ip: str | None = None) -> None:
    ns = netns(name)
    if ns not in out(["ip", "netns", "list"]).split():
        run(["ip", "netns", "add", ns])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    hifs = host_ifs(i) if i > 0 else {"mgmt": "svm-build"}
    # MACs follow the Spark pattern: enP7s7 = base, enp1s0f1np1 = base+2, enP2p1s0f1np1 = base+6
    base = f"02:5b:00:00:{i:02x}:"
    ensure_veth(hifs["mgmt"], MGMT_BR, ns, MGMT_IF, 1500, f"{ip or mgmt_ip(i)}/24", base + "00")
    if with_fabric:
        for (br, nif, pfx, _hca), off in zip(FABRIC, ("02", "06")):
            ensure_veth(hifs[br], br, ns, nif, FAB_MTU, f"{fab_ip(pfx, i)}/24", base + off)
    if "default" not in out(["ip", "-n", ns, "route", "show", "default"]):
        run(["ip", "-n", ns, "route", "add", "default", "via", MGMT_IP])


def remove_ns_net(name: str, i: int) -> None:
    ns = netns(name)
    if ns in out(["ip", "netns", "list"], check=False).split():
        run(["ip", "netns", "del", ns], check=False)
    hifs = list(host_ifs(i).values()) if i > 0 else ["svm-build"]
    for h in hifs:
        if link_exists(h):
            run(["ip", "link", "del", h], check=False)


# --------------------------------------------------------------------------- a simulated host
def holder_pid(name: str) -> int | None:
    pid = read_pid(os.path.join(node_dir(name), "holder.pid"))
    if pid is None:
        return None
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return None
    if not cmd.startswith(b"sleep\0"):
        return None
    # never hand out a process that still shares the host's namespaces
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt") or \
                os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            return None
    except OSError:
        return None
    return pid


def in_node(name: str, argv: list, pid: int | None = None) -> list:
    """argv to run a command inside the node's net + mount + uts namespaces."""
    pid = holder_pid(name)
    if not pid:
        raise RuntimeError(f"{name} is not running (no namespace holder)")
    return ["nsenter", f"--target={pid}", "--net", "--mount", "--uts", "--", *argv]


def node_docker(name: str) -> list:
    return ["docker", "-H", f"unix://{node_dir(name)}/run/docker.sock"]


def stop_host(name: str, i: int, keep_data: bool = True) -> list:
    """Stop a node's processes and remove its namespace; returns cgroups that would not go."""
    problems = cg_kill_remove(name)
    d = node_dir(name)
    for f in ("holder.pid", "dockerd.pid", "sshd.pid"):
        try:
            os.unlink(os.path.join(d, f))
        except FileNotFoundError:
            pass
    if os.path.isdir(os.path.join(d, "run")):
        shutil.rmtree(os.path.join(d, "run"), ignore_errors=True)
    remove_ns_net(name, i)
    if not keep_data and os.path.isdir(d):
        rmtree_robust(d)
    return problems


def rmtree_robust(path: str) -> None:
    # overlay/dockerd data may still be a mount point if someone entered the namespace; they are
    # private to the node namespace (already gone), so a plain rmtree suffices here.
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        run(["rm", "-rf", "--one-file-system", path], check=False)


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
        "name": name, "index": i, "uuid_fixture": uuid_files[(i - 1) % len(uuid_files)], "uuid": uuid,
        "fabric": [{"interface": nif, "hca": hca} for _br, nif, _p, hca in FABRIC]}))
    data = {"node": json.load(open(os.path.join(idd, "node.json"))),
            "files": {f: _fixture_body(f) for f in os.listdir(FIXTURES) if f.startswith("nvidia-smi")}}
    src = open(os.path.join(HERE, "standins", "nvidia-smi")).read().replace("@DATA@", repr(json.dumps(data)))
    write(os.path.join(bindir, "nvidia-smi"), src, 0o755)
    src = open(os.path.join(HERE, "standins", "ibdev2netdev")).read().replace("@IDENTITY@", idd)
    write(os.path.join(bindir, "ibdev2netdev"), src, 0o755)
    write(os.path.join(bindir, "nvidia-container-runtime-hook"),
          open(os.path.join(HERE, "standins", "nvidia-container-runtime-hook")).read(), 0o755)
    up = os.path.join(d, "etc-upper")
    os.makedirs(os.path.join(d, "etc-work"), exist_ok=True)
    write(os.path.join(up, "dgx-release"), _fixture_body("dgx-release-sionna-rk.txt"))
    write(os.path.join(up, "hostname"), name + "\n")
    hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    for j in range(1, n_nodes + 1):
        hosts += f"{mgmt_ip(j)}\t{node_name(j)}\n"
    write(os.path.join(up, "hosts"), hosts)


def _fixture_body(fname: str) -> str:
    with open(os.path.join(FIXTURES, fname)) as f:
        return f.read().split("\n", 1)[1]   # line 1 is the '# source:' header


def ssh_setup(name: str, i: int) -> bool:
    """Write host key, authorized_keys and sshd_config; True when an existing config changed."""
    sd = os.path.join(node_dir(name), "ssh")
    os.makedirs(sd, mode=0o700, exist_ok=True)
    # host keys are generated once per machine and node and kept in the cache, so the pins written
    # into Pulumi.dev.yaml stay valid across down/up (delete the cache dir to get new ones)
    key = host_key_path(name)
    os.makedirs(os.path.dirname(key), mode=0o700, exist_ok=True)
    if not os.path.exists(key):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", key])
    ensure_lab_key()
    shutil.copyfile(LAB_KEY + ".pub", os.path.join(sd, "authorized_keys"))
    os.chmod(os.path.join(sd, "authorized_keys"), 0o600)
    cfg_path = os.path.join(sd, "sshd_config")
    before = open(cfg_path).read() if os.path.exists(cfg_path) else None
    text = f"""# spark-vllm lab sshd for {name}
ListenAddress {mgmt_ip(i)}:22
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
    write(cfg_path, text)
    return before is not None and before != text


def ensure_lab_key() -> None:
    if not os.path.exists(LAB_KEY):
        os.makedirs(CACHE, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "spark-vllm-lab", "-f", LAB_KEY])
    os.chmod(LAB_KEY, 0o600)


def start_holder(name: str) -> int:
    d = node_dir(name)
    for sub in ("run/sshd", "hf", "docker", "logs", "sysfs", "etc-upper", "etc-work"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    os.makedirs("/root/.cache/huggingface", exist_ok=True)  # mount point only; stays empty on the host
    q = shlex.quote
    setup = " && ".join([
        "set -e",
        f"hostname {q(name)}",
        f"mount --bind {q(d + '/run')} /run",
        f"mount -t overlay lab-etc -o lowerdir=/etc,upperdir={q(d + '/etc-upper')},workdir={q(d + '/etc-work')} /etc",
        f"mount --bind {q(d + '/bin')} /usr/local/sbin",
        f"mount --bind {q(d + '/hf')} /root/.cache/huggingface",
        # a sysfs of this network namespace, so /sys/class/net shows the node's own interfaces
        # (the host /sys, and with it /sys/fs/cgroup, stays in place for dockerd)
        f"mount -t sysfs lab-sysfs {q(d + '/sysfs')}",
        f"mount --bind {q(d + '/sysfs/class/net')} /sys/class/net",
        f"mount --bind {q(d + '/sysfs/devices/virtual/net')} /sys/devices/virtual/net",
        "exec sleep infinity",
    ])
    argv = ["nsenter", f"--net=/var/run/netns/{netns(name)}", "unshare", "--mount", "--uts",
            "--propagation", "private", "--", "/bin/sh", "-c", setup]
    pid = spawn(argv, os.path.join(d, "logs", "holder.log"), name + "/daemons")
    write(os.path.join(d, "holder.pid"), f"{pid}\n")
    wait_for(lambda: holder_pid(name) == pid, 10, f"{name} namespace holder (see {d}/logs/holder.log)")
    return pid


def start_dockerd(name: str, i: int, hpid: int) -> None:
    d = node_dir(name)
    if read_pid(os.path.join(d, "dockerd.pid")) and os.path.exists(f"{d}/run/docker.sock") and \
            ok([*node_docker(name), "version"]):
        return
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    argv = in_node(name, ["dockerd", "--data-root", f"{d}/docker", "--pidfile", "/run/docker.pid",
                          "-H", "unix:///run/docker.sock", "--insecure-registry", REGISTRY,
                          "--exec-opt", "native.cgroupdriver=cgroupfs",
                          "--cgroup-parent", f"/{CG_ROOT}/{name}/containers",
                          "--bip", f"172.31.{i if i > 0 else 250}.1/24", "--storage-driver", "overlay2",
                          "--log-level", "warn"], hpid)
    pid = spawn(argv, os.path.join(d, "logs", "dockerd.log"), name + "/daemons", env=env)
    write(os.path.join(d, "dockerd.pid"), f"{pid}\n")
    wait_for(lambda: ok([*node_docker(name), "version"]), 60,
             f"dockerd of {name} (see {d}/logs/dockerd.log)")


def sshd_running(name: str) -> int | None:
    return read_pid(os.path.join(node_dir(name), "sshd.pid"))


def start_sshd(name: str, i: int) -> None:
    if sshd_running(name):
        return
    d = node_dir(name)
    os.makedirs(f"{d}/run/sshd", exist_ok=True)
    argv = in_node(name, ["/usr/sbin/sshd", "-D", "-e", "-f", f"{d}/ssh/sshd_config"])
    pid = spawn(argv, os.path.join(d, "logs", "sshd.log"), name + "/daemons",
                env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    write(os.path.join(d, "sshd.pid"), f"{pid}\n")
    wait_for(lambda: _tcp_open(mgmt_ip(i), 22), 15, f"sshd of {name} (see {d}/logs/sshd.log)")


def stop_sshd(name: str) -> None:
    pid = sshd_running(name)
    if pid:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(pid), 10, f"sshd of {name} to stop")
    try:
        os.unlink(os.path.join(node_dir(name), "sshd.pid"))
    except FileNotFoundError:
        pass


def _tcp_open(host: str, port: int) -> bool:
    import socket
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def ensure_host(name: str, i: int, n_nodes: int, sshd: bool = True) -> None:
    """Create or repair one simulated host. Anything half-dead is torn down and rebuilt."""
    d = node_dir(name)
    hpid = holder_pid(name)
    healthy = hpid is not None and ok(["ip", "netns", "pids", netns(name)]) and \
        os.path.exists(f"/var/run/netns/{netns(name)}")
    if not healthy:
        if os.path.exists(d) or netns(name) in out(["ip", "netns", "list"], check=False):
            log(f"{name}: recovering (stale namespace/processes)")
        stop_host(name, i, keep_data=True)
    if i > 0:
        write_identity(name, i, n_nodes)
        if ssh_setup(name, i) and sshd_running(name):
            log(f"{name}: sshd configuration changed, restarting sshd")
            stop_sshd(name)
    else:
        os.makedirs(os.path.join(d, "bin"), exist_ok=True)
        write(os.path.join(d, "bin", "nvidia-container-runtime-hook"), "#!/bin/sh\ncat >/dev/null\nexit 0\n", 0o755)
    ensure_ns_net(name, i, with_fabric=i > 0, ip=None if i > 0 else BUILD_IP)
    if not healthy:
        hpid = start_holder(name)
    start_dockerd(name, i, hpid)
    if sshd and i > 0:
        start_sshd(name, i)


# --------------------------------------------------------------------------- registry
def registry_running() -> bool:
    try:
        return http_get(f"http://{REGISTRY}/v2/", timeout=2).status == 200
    except Exception:
        return False


def ensure_registry() -> None:
    if registry_running():
        return
    cg_kill_remove("registry")
    storage = os.path.join(CACHE, "registry")   # content-addressed: kept across down/up
    os.makedirs(storage, exist_ok=True)
    cfg = os.path.join(LAB, "registry", "config.yml")
    write(cfg, f"""version: 0.1
log:
  level: info
  fields: {{service: registry}}
storage:
  filesystem: {{rootdirectory: {storage}}}
  delete: {{enabled: true}}
http:
  addr: {REGISTRY}
""")
    spawn(["docker-registry", "serve", cfg], os.path.join(LAB, "registry", "registry.log"), "registry")
    wait_for(registry_running, 20, f"registry on {REGISTRY} (see {LAB}/registry/registry.log)")


def registry_digest(tag: str) -> str | None:
    try:
        r = http_get(f"http://{REGISTRY}/v2/{IMAGE_REPO}/manifests/{tag}", method="HEAD",
                     headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        return r.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError:
        return None


STACK_TAG = "lab"   # the tag Pulumi.dev.yaml names; the program resolves it to the digest


def registry_retag(src_tag: str, dst_tag: str) -> None:
    """Point `dst_tag` at the manifest `src_tag` names (the registry API; no image moves)."""
    mtype = "application/vnd.docker.distribution.manifest.v2+json"
    url = f"http://{REGISTRY}/v2/{IMAGE_REPO}/manifests"
    with urllib.request.urlopen(urllib.request.Request(f"{url}/{src_tag}", headers={"Accept": mtype}),
                                timeout=30) as r:
        body, ctype = r.read(), r.headers.get("Content-Type", mtype)
    req = urllib.request.Request(f"{url}/{dst_tag}", data=body, method="PUT", headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=30):
        pass


# --------------------------------------------------------------------------- image build
def standin_wheel(dest_dir: str) -> str:
    """Build the vLLM stand-in wheel (deterministic zip, stdlib only)."""
    import zipfile
    import base64
    src = os.path.join(HERE, "vllm_standin")
    meta = json.load(open(os.path.join(src, "wheel.json")))
    name, ver = meta["name"], meta["version"]
    dist = f"{name}-{ver}.dist-info"
    files = []
    pkg_root = os.path.join(src, "src")
    for root, dirs, fnames in os.walk(pkg_root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for fn in sorted(fnames):
            if fn.endswith(".pyc"):
                continue
            full = os.path.join(root, fn)
            files.append((os.path.relpath(full, pkg_root), open(full, "rb").read()))
    files.append((f"{dist}/METADATA", (f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n"
                                       f"Summary: {meta['summary']}\n").encode()))
    files.append((f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: spark-vllm-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    eps = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in meta["console_scripts"].items())
    files.append((f"{dist}/entry_points.txt", eps.encode()))
    record = ""
    for path, data in files:
        dg = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={dg},{len(data)}\n"
    record += f"{dist}/RECORD,,\n"
    files.append((f"{dist}/RECORD", record.encode()))
    whl = os.path.join(dest_dir, f"{name}-{ver}-py3-none-any.whl")
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return whl


def ensure_rootfs_tar() -> str:
    key = short_hash(SUITE, "minbase", ",".join(ROOTFS_PKGS), DEB_MIRROR)
    tar = os.path.join(CACHE, f"rootfs-{SUITE}-minbase-{key}.tar")
    if os.path.exists(tar):
        return tar
    work = os.path.join(CACHE, "tmp", f"rootfs-{key}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(work), exist_ok=True)
    log(f"debootstrap {SUITE} minbase (+{','.join(ROOTFS_PKGS)}) -> {tar} (1-3 min)")
    t0 = time.time()
    # a private mount namespace so debootstrap's /proc mounts never leak to the host
    with progress("debootstrap"):
        run(["unshare", "--mount", "--propagation", "private", "--", "debootstrap", "--variant=minbase",
             f"--include={','.join(ROOTFS_PKGS)}", SUITE, work, DEB_MIRROR], quiet=not VERBOSE)
    run(["tar", "-C", work, "-cf", tar + ".tmp", "--numeric-owner", "."])
    os.replace(tar + ".tmp", tar)
    shutil.rmtree(work, ignore_errors=True)
    log(f"rootfs cached ({os.path.getsize(tar) >> 20} MiB, {time.time() - t0:.0f}s)")
    return tar


def ensure_wheels() -> str:
    key = short_hash("cp311", "manylinux_x86_64", *IMAGE_REQS)
    wd = os.path.join(CACHE, f"wheels-{key}")
    if os.path.exists(os.path.join(wd, ".complete")):
        return wd
    log(f"pip download {' '.join(IMAGE_REQS)} for cp311/manylinux x86_64 -> {wd}")
    t0 = time.time()
    os.makedirs(wd, exist_ok=True)
    with progress("pip download"):
        run([*host_pip(), "download", "--disable-pip-version-check", "--progress-bar", "off", "--dest", wd,
             "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
             "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
             "--platform", "manylinux_2_28_x86_64", "--platform", "linux_x86_64", *IMAGE_REQS],
            quiet=not VERBOSE)
    write(os.path.join(wd, ".complete"), json.dumps(IMAGE_REQS))
    log(f"{len(os.listdir(wd)) - 1} wheels cached ({time.time() - t0:.0f}s)")
    return wd


def image_key() -> tuple:
    rootfs = ensure_rootfs_tar()
    wheels = ensure_wheels()
    tmpd = os.path.join(CACHE, "tmp", "standin-wheel")
    shutil.rmtree(tmpd, ignore_errors=True)
    os.makedirs(tmpd)
    whl = standin_wheel(tmpd)
    key = short_hash(os.path.basename(rootfs), os.path.basename(wheels), sha256_file(whl), IMAGE_ENV)
    return key, rootfs, wheels, whl


IMAGE_ENV = ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "VIRTUAL_ENV=/opt/venv", "LANG=C.UTF-8", "HF_HOME=/root/.cache/huggingface"]


def build_image_tar(key, rootfs, wheels, whl, tar_out: str) -> None:
    work = os.path.join(CACHE, "tmp", f"image-{key}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t0 = time.time()
    log("image: unpacking rootfs")
    run(["tar", "-C", work, "-xf", rootfs, "--numeric-owner"])
    os.makedirs(f"{work}/tmp/wheels", exist_ok=True)
    for f in os.listdir(wheels):
        if f.endswith(".whl"):
            shutil.copyfile(os.path.join(wheels, f), f"{work}/tmp/wheels/{f}")
    shutil.copyfile(whl, f"{work}/tmp/wheels/{os.path.basename(whl)}")
    reqs = " ".join(shlex.quote(r) for r in IMAGE_REQS)
    script = f"""set -e
mount -t proc proc {work}/proc
mount --bind /dev {work}/dev
chroot {work} /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 /bin/sh -c '
set -e
python3 -m venv /opt/venv
/opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index --find-links /tmp/wheels {reqs} /tmp/wheels/{os.path.basename(whl)}
/opt/venv/bin/vllm --version
/opt/venv/bin/ray --version
'
"""
    log("image: python3 -m venv /opt/venv + pip install --no-index (ray, huggingface_hub, safetensors, vllm stand-in)")
    with progress("pip install in the image"):
        run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script], quiet=not VERBOSE)
    shutil.rmtree(f"{work}/tmp/wheels")
    write(f"{work}/etc/spark-vllm-lab-image", f"lab serving image {key}: Debian {SUITE} + Ray + vLLM stand-in (no GPU engine)\n")
    log(f"image: rootfs ready ({time.time() - t0:.0f}s); docker import")
    return work


def ensure_image() -> str:
    """Make sure the registry holds the lab image under its key and under the tag the dev stack
    names (STACK_TAG); return its reference WITH digest."""
    ref = push_image()
    digest = ref.split("@", 1)[1]
    if registry_digest(STACK_TAG) != digest:
        registry_retag(ref.split("@", 1)[1], STACK_TAG)
        log(f"image: {REGISTRY}/{IMAGE_REPO}:{STACK_TAG} -> {digest}")
    return ref


def push_image() -> str:
    key, rootfs, wheels, whl = image_key()
    tag = key
    dg = registry_digest(tag)
    if dg:
        return f"{REGISTRY}/{IMAGE_REPO}@{dg}"
    img_tar = os.path.join(CACHE, "images", f"lab-image-{key}.tar")
    name = f"{REGISTRY}/{IMAGE_REPO}:{tag}"
    log("image: starting a build dockerd (namespace svl-build)")
    ensure_host("build", 0, 0, sshd=False)
    dk = node_docker("build")
    try:
        if os.path.exists(img_tar):
            log(f"image: loading cached {img_tar}")
            run([*dk, "load", "-i", img_tar], quiet=True)
        else:
            work = build_image_tar(key, rootfs, wheels, whl, img_tar)
            changes = []
            for e in IMAGE_ENV:
                changes += ["-c", f"ENV {e}"]
            changes += ["-c", "WORKDIR /", "-c", 'CMD ["/bin/bash"]',
                        "-c", f"LABEL org.opencontainers.image.title=spark-vllm-lab-serving spark-vllm.lab.key={key}"]
            tarp = subprocess.Popen(["tar", "-C", work, "--numeric-owner", "--exclude=./proc/*",
                                     "--exclude=./sys/*", "--exclude=./dev/*", "-c", "."], stdout=subprocess.PIPE)
            with progress("docker import"):
                subprocess.run([*dk, "import", *changes, "-", name], stdin=tarp.stdout, check=True,
                               stdout=subprocess.DEVNULL)
            tarp.wait()
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(os.path.dirname(img_tar), exist_ok=True)
            log(f"image: caching {img_tar}")
            run([*dk, "save", "-o", img_tar + ".tmp", name])
            os.replace(img_tar + ".tmp", img_tar)
            for old in os.listdir(os.path.dirname(img_tar)):      # keep only the current image tarball
                if old.startswith("lab-image-") and old != os.path.basename(img_tar):
                    os.unlink(os.path.join(os.path.dirname(img_tar), old))
        log(f"image: pushing {name}")
        with progress("docker push"):
            run([*dk, "push", name], quiet=True)
    finally:
        log("image: stopping the build dockerd")
        stop_host("build", 0, keep_data=False)
    dg = registry_digest(tag)
    if not dg:
        die("image push did not land in the registry")
    return f"{REGISTRY}/{IMAGE_REPO}@{dg}"


# --------------------------------------------------------------------------- HF endpoint (olah)
def ensure_olah_venv() -> str:
    venv = os.path.join(CACHE, "olah-venv-" + OLAH_REQ.split("==")[1])
    if os.path.exists(os.path.join(venv, ".complete")):
        return venv
    log(f"installing {OLAH_REQ} into {venv}")
    shutil.rmtree(venv, ignore_errors=True)
    run(["/usr/bin/python3", "-m", "venv", venv])
    run([f"{venv}/bin/pip", "install", "--disable-pip-version-check", "-q", OLAH_REQ], quiet=not VERBOSE)
    write(os.path.join(venv, ".complete"), OLAH_REQ)
    return venv


def hf_running() -> bool:
    try:
        return http_get(f"{HF_ENDPOINT}/api/models/{HF_REPO}/revision/main", timeout=3).status == 200
    except Exception:
        return False


def ensure_hf() -> None:
    mirror = os.path.join(LAB, "hub")
    sys.path.insert(0, HERE)
    import hfmodel  # noqa: E402  (lab-local module)
    commits = hfmodel.ensure_repo(os.path.join(mirror, "models", HF_REPO))
    write(os.path.join(LAB, "hf", "commits.json"), json.dumps(commits, indent=1))
    if hf_running():
        return
    cg_kill_remove("hf")
    venv = ensure_olah_venv()
    hd = os.path.join(LAB, "hf")
    cfg = os.path.join(hd, "olah.toml")
    write(cfg, f"""[basic]
host = "127.0.0.1"
port = {OLAH_PORT}
repos-path = "{hd}/repos"
mirror-scheme = "http"
mirror-netloc = "{MGMT_IP}:{HF_PORT}"
mirror-lfs-netloc = "{MGMT_IP}:{HF_PORT}"
mirrors-path = ["{mirror}"]

[accessibility]
offline = true
""")
    spawn([f"{venv}/bin/olah-cli", "-c", cfg], os.path.join(hd, "olah.log"), "hf",
          env=dict(os.environ, OLAH_LOG_PATH=os.path.join(hd, "logs")))
    spawn(["/usr/bin/python3", os.path.join(HERE, "hfproxy.py"), "--listen", f"{MGMT_IP}:{HF_PORT}",
           "--upstream", f"127.0.0.1:{OLAH_PORT}", "--log", os.path.join(hd, "access.jsonl")],
          os.path.join(hd, "proxy.log"), "hf")
    wait_for(hf_running, 60, f"HF endpoint {HF_ENDPOINT} (see {hd}/olah.log, proxy.log)")


# --------------------------------------------------------------------------- state + config
def state() -> dict:
    try:
        return json.load(open(os.path.join(LAB, "lab.json")))
    except (FileNotFoundError, ValueError):
        return {}


def save_state(st: dict) -> None:
    write(os.path.join(LAB, "lab.json"), json.dumps(st, indent=1))


def host_key_path(name: str) -> str:
    return os.path.join(CACHE, "hostkeys", name, "ssh_host_ed25519_key")


def host_key(name: str) -> str:
    pub = open(host_key_path(name) + ".pub").read().split()
    return f"{pub[0]} {pub[1]}"


def stack_config() -> dict:
    st = state()
    if not st.get("nodes"):
        die("the lab is not up (run: python3 lab/lab.py up)")
    nodes = []
    for i in range(1, st["nodes"] + 1):
        name = node_name(i)
        nodes.append({"name": name, "host": mgmt_ip(i), "port": 22, "user": "root",
                      "hostKey": host_key(name),
                      "fabric": [{"interface": nif, "ip": fab_ip(pfx, i), "hca": hca}
                                 for _br, nif, pfx, hca in FABRIC]})
    commits = {}
    try:
        commits = json.load(open(os.path.join(LAB, "hf", "commits.json")))
    except (FileNotFoundError, ValueError):
        pass
    return {"nodes": nodes, "sshKeyPath": LAB_KEY, "knownHostsFile": KNOWN_HOSTS,
            "image": {"ref": st.get("image"), "tag": f"{REGISTRY}/{IMAGE_REPO}:{STACK_TAG}",
                      "source": "registry"},
            "registry": REGISTRY, "hfEndpoint": HF_ENDPOINT,
            "model": {"repo": HF_REPO, "commits": commits},
            "fabricSubnets": [f"{pfx}.0/24" for _b, _n, pfx, _h in FABRIC], "mtu": FAB_MTU, "rdma": False}


def write_known_hosts() -> None:
    """The nodes' host keys in OpenSSH form: what Pulumi.dev.yaml pins (ssh.knownHostsFile)."""
    n = state().get("nodes") or 0
    write(KNOWN_HOSTS, "".join(f"{mgmt_ip(j)} {host_key(node_name(j))}\n" for j in range(1, n + 1)))


# --------------------------------------------------------------------------- verbs
def cmd_up(args) -> None:
    require_root()
    t0 = time.time()
    n = args.nodes or state().get("nodes") or 2
    if n < 1 or n > 9:
        die("--nodes must be 1..9")
    os.makedirs(LAB, exist_ok=True)
    old = state().get("nodes") or 0
    for j in range(n + 1, max(old, n) + 1):     # shrinking: remove surplus nodes
        log(f"{node_name(j)}: removing (lab shrinks to {n} nodes)")
        stop_host(node_name(j), j, keep_data=False)
    save_state({**state(), "nodes": n})
    ensure_host_net()
    ensure_registry()
    log("registry up on " + REGISTRY)
    ref = ensure_image()
    st = state()
    st["image"] = ref
    save_state(st)
    log(f"image {ref}")
    ensure_hf()
    log(f"HF endpoint up on {HF_ENDPOINT} serving {HF_REPO}")
    for i in range(1, n + 1):
        ensure_host(node_name(i), i, n)
        log(f"{node_name(i)} up: ssh root@{mgmt_ip(i)} (fabric {', '.join(fab_ip(p, i) for _b, _n, p, _h in FABRIC)})")
    write_known_hosts()
    cfg = stack_config()
    write(STACK_JSON, json.dumps(cfg, indent=1))
    log(f"stack config -> {STACK_JSON}; host keys -> {KNOWN_HOSTS}")
    log(f"lab up with {n} node(s) in {time.time() - t0:.1f}s")


def cmd_down(args) -> None:
    require_root()
    n = max(state().get("nodes") or 0, 9)
    problems = []
    for i in range(1, n + 1):
        name = node_name(i)
        if os.path.exists(node_dir(name)) or link_exists(host_ifs(i)["mgmt"]) or \
                netns(name) in out(["ip", "netns", "list"], check=False):
            log(f"{name}: stopping and removing")
        problems += stop_host(name, i, keep_data=False)
    problems += stop_host("build", 0, keep_data=False)
    problems += cg_kill_remove("hf")
    problems += cg_kill_remove("registry")
    problems += cg_kill_remove("")
    for br in [MGMT_BR] + [f[0] for f in FABRIC]:
        if ok(["iptables", "-S", "FORWARD"]):
            while ok(["iptables", "-C", "FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"]):
                run(["iptables", "-D", "FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"], check=False)
        if link_exists(br):
            run(["ip", "link", "del", br], check=False)
    if os.path.isdir(LAB):
        rmtree_robust(LAB)
    if problems:
        die("lab down: everything else is removed, but " + "; ".join(problems) +
            " -- run `lab.py down` again once those processes have exited")
    log("lab down: namespaces, bridges, processes, cgroups and " + LAB + " removed (caches kept in " + CACHE + ")")


def cmd_status(args) -> None:
    st = state()
    n = st.get("nodes") or 0
    print(f"lab: {n} node(s); image {st.get('image')}")
    print(f"registry {REGISTRY}: {'up' if registry_running() else 'DOWN'}")
    print(f"HF endpoint {HF_ENDPOINT}: {'up' if hf_running() else 'DOWN'}")
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
              f"sshd={'up' if sshd_running(name) else 'DOWN'} {' '.join(links)} containers={','.join(ctrs) or '-'}")


def cmd_config(args) -> None:
    require_root()
    write_known_hosts()
    cfg = stack_config()
    write(STACK_JSON, json.dumps(cfg, indent=1))
    print(json.dumps(cfg, indent=1))


def ssh_argv(name: str, cmd: list | None = None, tty: bool = False) -> list:
    i = node_index(name)
    try:
        write_known_hosts()
    except FileNotFoundError:
        pass
    argv = ["ssh", "-i", LAB_KEY, "-o", f"UserKnownHostsFile={KNOWN_HOSTS}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"]
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
    (start_sshd if start else (lambda n, _i: stop_sshd(n)))(args.node, i)
    log(f"{args.node}: sshd {'started' if start else 'stopped'}")


def cmd_fabric(args, up: bool) -> None:
    require_root()
    i = node_index(args.node)
    for br, nif, _p, _h in FABRIC:
        # the host end goes down: the node's own interface stays admin-up but loses carrier,
        # as when the QSFP cable is pulled (one cable carries both twins)
        run(["ip", "link", "set", host_ifs(i)[br], "up" if up else "down"])
    log(f"{args.node}: fabric {'restored' if up else 'cut'}")


def cmd_kill(args) -> None:
    require_root()
    run([*node_docker(args.node), "kill", args.container])
    log(f"{args.node}: killed container {args.container}")


def cmd_seed(args) -> None:
    require_root()
    st = state()
    if not st.get("image"):
        die("the lab is not up")
    sys.path.insert(0, HERE)
    import seed  # noqa: E402
    seed.seed(node_docker("spark-1"), st["image"], HF_ENDPOINT, HF_REPO, log,
              hf_dir=os.path.join(node_dir("spark-1"), "hf"))


def cmd_hf_bytes(args) -> None:
    path = os.path.join(LAB, "hf", "access.jsonl")
    agg = {}
    total = 0
    if os.path.exists(path):
        for line in open(path):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("method") != "GET":
                continue
            k = e["path"]
            a = agg.setdefault(k, {"requests": 0, "bytes": 0})
            a["requests"] += 1
            a["bytes"] += e.get("bytes", 0)
            total += e.get("bytes", 0)
    if args.json:
        print(json.dumps({"total": total, "paths": agg}, indent=1))
        return
    for k in sorted(agg):
        print(f"{agg[k]['bytes']:>12} {agg[k]['requests']:>4}  {k}")
    print(f"{total:>12} total")


def take_lock(verb: str) -> None:
    """One mutating lab.py at a time (several sessions/tests may drive the same lab)."""
    import fcntl
    os.makedirs(CACHE, exist_ok=True)
    global _LOCK_FD
    _LOCK_FD = open(os.path.join(CACHE, ".lab.lock"), "a+")
    try:
        fcntl.flock(_LOCK_FD, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(f"{verb}: waiting for another lab.py run to finish (lock {CACHE}/.lab.lock)")
        fcntl.flock(_LOCK_FD, fcntl.LOCK_EX)


_LOCK_FD = None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="lab.py", description=__doc__.split("\n")[0])
    sp = p.add_subparsers(dest="verb", required=True)
    s = sp.add_parser("up")
    s.add_argument("--nodes", type=int, default=None)
    sp.add_parser("down")
    sp.add_parser("status")
    s = sp.add_parser("config")
    sp.add_parser("seed")
    s = sp.add_parser("hf-bytes")
    s.add_argument("--json", action="store_true")
    s = sp.add_parser("ssh")
    s.add_argument("node")
    s.add_argument("cmd", nargs=argparse.REMAINDER)
    for v in ("sshd-stop", "sshd-start", "fabric-cut", "fabric-restore"):
        sp.add_parser(v).add_argument("node")
    s = sp.add_parser("kill")
    s.add_argument("node")
    s.add_argument("container")
    a = p.parse_args(argv)
    if a.verb not in ("hf-bytes",):
        require_root()
    if a.verb not in ("hf-bytes", "status", "ssh", "config"):
        take_lock(a.verb)
    if a.verb != "hf-bytes":
        ensure_prereqs()
    try:
        {"up": cmd_up, "down": cmd_down, "status": cmd_status, "config": cmd_config, "seed": cmd_seed,
         "hf-bytes": cmd_hf_bytes, "ssh": cmd_ssh, "kill": cmd_kill,
         "sshd-stop": lambda x: cmd_sshd(x, False), "sshd-start": lambda x: cmd_sshd(x, True),
         "fabric-cut": lambda x: cmd_fabric(x, False), "fabric-restore": lambda x: cmd_fabric(x, True),
         }[a.verb](a)
    except RuntimeError as e:
        die(str(e))


if __name__ == "__main__":
    main()
