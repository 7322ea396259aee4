"""Small helpers every lab module uses: messages, commands, files, waiting, prerequisites."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

VERBOSE = os.environ.get("LAB_VERBOSE") == "1"

# binary -> Debian package that provides it (installed on first use, see ensure_prereqs)
APT_PKGS = {"dockerd": "docker.io", "debootstrap": "debootstrap",
            "docker-registry": "docker-registry", "sshd": "openssh-server",
            "ssh": "openssh-client", "ssh-keygen": "openssh-client", "ip": "iproute2",
            "ping": "iputils-ping", "ethtool": "ethtool", "git": "git", "nsenter": "util-linux",
            "iptables": "iptables", "unpigz": "pigz",  # unpigz: dockerd's fast layer unpacking
            # the nodes share this machine's /usr: the stack's firewall loads its table with the
            # node's nft (hostscripts/firewall.py), and the lab's boot replays its unit; each
            # node's init (tini), its /proc/meminfo (lxcfs: lab/memory.py) and the OOM killer
            # the stack's guard configures on a node (earlyoom: installed here; never started
            # here: lab/standins/systemctl starts it inside a node)
            "nft": "nftables", "systemctl": "systemd",
            "tini": "tini", "lxcfs": "lxcfs", "earlyoom": "earlyoom"}
# the packages whose service must never run on the machine itself (only inside a node, or not at
# all): their boot links are removed after the install (policy-rc.d already keeps them stopped)
NO_SERVICE = ("earlyoom", "lxcfs")


# --------------------------------------------------------------------------- the session lock
def ancestors() -> set[int]:
    """The pids of this process's parents, up to init."""
    found, pid = set(), os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.add(pid)
    return found


def session_held_by_parent(env_name: str) -> bool:
    """True when the lab session lock is held by a parent of this process: it names itself in
    the environment variable `env_name` (layout.SESSION_ENV) and is one of our ancestors (a
    stale value inherited from elsewhere does not count)."""
    holder = os.environ.get(env_name, "")
    return holder.isdigit() and int(holder) in ancestors()


# --------------------------------------------------------------------------- messages
def log(msg: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def warn(msg: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] warning: {msg}", file=sys.stderr, flush=True)


def die(msg: str, code: int = 1) -> None:
    print(f"lab: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


class progress:
    """Heartbeat for long steps: prints elapsed time every 15 s while the block runs."""

    def __init__(self, label: str):
        self.label = label

    def __enter__(self):
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


# --------------------------------------------------------------------------- commands
def run(cmd, check=True, capture=False, input=None, env=None, quiet=False, timeout=None):
    if isinstance(cmd, str):
        cmd = ["/bin/sh", "-c", cmd]
    if VERBOSE:
        print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    p = subprocess.run(cmd, input=input, env=env, timeout=timeout,
                       stdout=subprocess.PIPE if (capture or quiet) else None,
                       stderr=subprocess.PIPE if (capture or quiet) else None,
                       text=isinstance(input, str) or input is None, check=False)
    if check and p.returncode != 0:
        err = (p.stderr or "").strip() if (capture or quiet) else ""
        raise RuntimeError(f"command failed ({p.returncode}): {' '.join(cmd)}\n{err}")
    return p


def out(cmd, check=True) -> str:
    return run(cmd, check=check, capture=True).stdout


def ok(cmd) -> bool:
    return run(cmd, check=False, quiet=True).returncode == 0


# --------------------------------------------------------------------------- files and hashes
def write(path: str, text, mode: int | None = None) -> None:
    """Write atomically (temporary file + rename), creating the parent folders."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def rmtree_robust(path: str) -> None:
    # overlay/dockerd data may still be a mount point if someone entered the namespace; they are
    # private to the node namespace (already gone), so a plain rmtree suffices here.
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        run(["rm", "-rf", "--one-file-system", path], check=False)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def short_hash(*parts) -> str:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- processes, waiting
def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            pid = int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def wait_for(pred, timeout: float, what: str, interval: float = 0.3):
    end = time.time() + timeout
    while time.time() < end:
        try:
            r = pred()
        except Exception:  # not yet: try again until the timeout
            r = None
        if r:
            return r
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def http_get(url: str, timeout=5, headers=None, method="GET"):
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    return urllib.request.urlopen(req, timeout=timeout)


def tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- prerequisites
def require_root() -> None:
    if os.geteuid() != 0:
        die("the lab must run as root (it creates network namespaces, bridges, mounts and "
            "daemons); re-run with sudo", 77)


def ensure_prereqs(extra=()) -> None:
    need = sorted({pkg for binary, pkg in list(APT_PKGS.items()) + list(extra)
                   if shutil.which(binary) is None and not os.path.exists(f"/usr/sbin/{binary}")})
    if importlib.util.find_spec("pip") is None and \
            not ok(["/usr/bin/python3", "-c", "import pip"]):
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
            run(["apt-get", "install", "-y", "--no-install-recommends", *need], env=env,
                quiet=True)
    finally:
        if made_policy:
            os.unlink(policy)
    for pkg in NO_SERVICE:
        if pkg in need:
            run(["deb-systemd-helper", "disable", f"{pkg}.service"], check=False, quiet=True)
            run(["update-rc.d", pkg, "disable"], check=False, quiet=True)


def host_pip() -> list:
    for py in (sys.executable, "/usr/bin/python3"):
        if ok([py, "-m", "pip", "--version"]):
            return [py, "-m", "pip"]
    die("no pip available on the host")
