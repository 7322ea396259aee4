"""One simulated host: namespace holder, mounts, identity files, dockerd, sshd; create or repair.

A node is a network namespace (svl-spark-i) plus a mount + UTS namespace anchored by a holder
process (`sleep infinity`). Its /run, /etc (overlay), /usr/local/sbin (the stand-ins) and HF cache
are bound from /var/lib/spark-vllm-lab/spark-i. The build host (lab.layout.BUILD, index 0) is the
same without fabric, identity files or sshd.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal

from lab.cgroups import cg_kill_remove, spawn
from lab.layout import (
    BUILD_IP,
    CACHE,
    CG_ROOT,
    FABRIC,
    FIXTURES,
    HERE,
    LAB_KEY,
    REGISTRY,
    host_key_path,
    mgmt_ip,
    netns,
    node_dir,
    node_name,
)
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


def start_holder(name: str) -> int:
    d = node_dir(name)
    for sub in ("run/sshd", "hf", "docker", "logs", "sysfs", "etc-upper", "etc-work"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    # mount point only; stays empty on the host
    os.makedirs("/root/.cache/huggingface", exist_ok=True)
    q = shlex.quote
    etc_opts = f"lowerdir=/etc,upperdir={q(d + '/etc-upper')},workdir={q(d + '/etc-work')}"
    setup = " && ".join([
        "set -e",
        f"hostname {q(name)}",
        f"mount --bind {q(d + '/run')} /run",
        f"mount -t overlay lab-etc -o {etc_opts} /etc",
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
    wait_for(lambda: holder_pid(name) == pid, 10,
             f"{name} namespace holder (see {d}/logs/holder.log)")
    return pid


def stop_host(name: str, i: int, keep_data: bool = True) -> list:
    """Stop a node's processes and remove its namespace; returns cgroups that would not go."""
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
    up = os.path.join(d, "etc-upper")
    os.makedirs(os.path.join(d, "etc-work"), exist_ok=True)
    write(os.path.join(up, "dgx-release"), _fixture_body("dgx-release-sionna-rk.txt"))
    write(os.path.join(up, "hostname"), name + "\n")
    hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    for j in range(1, n_nodes + 1):
        hosts += f"{mgmt_ip(j)}\t{node_name(j)}\n"
    write(os.path.join(up, "hosts"), hosts)


# --------------------------------------------------------------------------- dockerd
def start_dockerd(name: str, i: int, hpid: int) -> None:
    d = node_dir(name)
    if read_pid(os.path.join(d, "dockerd.pid")) and os.path.exists(f"{d}/run/docker.sock") and \
            ok([*node_docker(name), "version"]):
        return
    env = {"PATH": NODE_PATH, "HOME": "/root"}
    argv = in_node(name, ["dockerd", "--data-root", f"{d}/docker", "--pidfile", "/run/docker.pid",
                          "-H", "unix:///run/docker.sock", "--insecure-registry", REGISTRY,
                          "--exec-opt", "native.cgroupdriver=cgroupfs",
                          "--cgroup-parent", f"/{CG_ROOT}/{name}/containers",
                          "--bip", f"172.31.{i if i > 0 else 250}.1/24",
                          "--storage-driver", "overlay2", "--log-level", "warn"], hpid)
    pid = spawn(argv, os.path.join(d, "logs", "dockerd.log"), name + "/daemons", env=env)
    write(os.path.join(d, "dockerd.pid"), f"{pid}\n")
    wait_for(lambda: ok([*node_docker(name), "version"]), 60,
             f"dockerd of {name} (see {d}/logs/dockerd.log)")


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
    before = _read(cfg_path) if os.path.exists(cfg_path) else None
    text = SSHD_CONFIG.format(name=name, addr=mgmt_ip(i), key=key, sd=sd)
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
    pid = spawn(argv, os.path.join(d, "logs", "sshd.log"), name + "/daemons",
                env={"PATH": NODE_PATH})
    write(os.path.join(d, "sshd.pid"), f"{pid}\n")
    wait_for(lambda: tcp_open(mgmt_ip(i), 22), 15, f"sshd of {name} (see {d}/logs/sshd.log)")


def stop_sshd(name: str) -> None:
    pid = sshd_running(name)
    if pid:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not pid_alive(pid), 10, f"sshd of {name} to stop")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(node_dir(name), "sshd.pid"))


# --------------------------------------------------------------------------- create or repair
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
        write(os.path.join(d, "bin", "nvidia-container-runtime-hook"),
              "#!/bin/sh\ncat >/dev/null\nexit 0\n", 0o755)
    ensure_ns_net(name, i, with_fabric=i > 0, ip=None if i > 0 else BUILD_IP)
    if not healthy:
        hpid = start_holder(name)
    start_dockerd(name, i, hpid)
    if sshd and i > 0:
        start_sshd(name, i)
