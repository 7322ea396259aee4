"""What the unit tests that run a head daemon's real program on this machine share (HAProxy:
test_gateway_haproxy.py, Prometheus: test_monitoring.py, Alertmanager: test_alertmanager.py):
connections to loopback only, and Debian's binaries, which the tier never skips without.

A module imports `no_network` to use it: the name overrides tests/unit/conftest.py's, which
refuses every connection.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from hostscripts.paths import StackNames
from tests.stand_in import python_stand_in


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Loopback only: the module talks to its own daemon and fake servers on 127.0.0.1 (the unit
    tier's rule, tests/unit/conftest.py, refuses every connection; here: all but loopback)."""
    connect = socket.socket.connect

    def loopback_only(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "localhost"):
            raise AssertionError(f"unit tests must not open network connections ({host})")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)


def debian_binary(name: str, missing: str) -> str:
    """Debian's `name` (on PATH or in /usr/bin); without it the test fails with `missing`
    (formatted with the name: how to install it), it never skips."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK)
                                  else None)
    if path is None:
        pytest.fail(missing.format(name), pytrace=False)
    return path


# A stand-in `docker` for a daemon's scripts. `docker run ... -v <src>:<dst>:ro ...
# --entrypoint $FAKE_ENTRY <image> <args>` (the daemon's check of its configuration): it copies
# each mounted folder to where the container would see it (under a temporary folder), points
# the copied `.yml` files' paths there ($FAKE_ROOT, when set: the root the files name), and
# runs the host's $FAKE_CHECK with the args, their paths under $FAKE_MOUNT moved likewise.
# `docker inspect` answers from $FAKE_DOCKER_PID (a running container's main process) or "not
# running". Every call is logged to $FAKE_DOCKER_LOG; anything else (`docker kill` above all)
# fails.
STAND_IN = r"""
import os, shutil, subprocess, sys, tempfile
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
pid = os.environ.get("FAKE_DOCKER_PID")
if args[0] == "inspect":
    fmt = args[args.index("-f") + 1]
    if "Running" in fmt:
        print("true" if pid else "false")
    elif "Pid" in fmt and pid:
        print(pid)
    else:
        sys.exit("stand-in docker: no such container")
    sys.exit(0)
if args[0] != "run":
    sys.exit("stand-in docker: not expected here: " + " ".join(args))
mount, root = os.environ["FAKE_MOUNT"], os.environ.get("FAKE_ROOT")
i = args.index("--entrypoint")
opts, entry, rest = args[1:i], args[i + 1], args[i + 3:]
assert "--rm" in opts and opts[opts.index("--network") + 1] == "none", opts
assert opts[opts.index("--user") + 1] == "0" and entry == os.environ["FAKE_ENTRY"], args
top = tempfile.mkdtemp()
try:
    for flag, value in zip(opts, opts[1:]):
        if flag == "-v":
            src, dst, mode = value.split(":")
            assert mode == "ro", value
            shutil.copytree(src, top + dst, symlinks=True)
    for d, _, names in os.walk(top):
        for n in names:
            p = os.path.join(d, n)
            if root and n.endswith(".yml"):
                with open(p) as f:
                    text = f.read()
                with open(p, "w") as f:
                    f.write(text.replace(root + "/", top + mount + "/"))
    argv = [a.replace(mount + "/", top + mount + "/") for a in rest]
    sys.exit(subprocess.run([os.environ["FAKE_CHECK"], *argv]).returncode)
finally:
    shutil.rmtree(top)
"""


class Head:
    """The head's folders under `tmp/node`: the stack's (`names.dir`), the daemon's (`folder`,
    as `d`) and any of `more` (a path of the head: its place here); scripts run with the
    stand-in `docker` (STAND_IN, which logs to `docker_log`) first on PATH, the daemon's
    container seeing its folder at `mount`, its check `entry` run as the host's `check`, and
    `env` beside them."""

    def __init__(self, tmp: Path, names: StackNames, folder: str, mount: str, entry: str,
                 check: str, env: Mapping[str, str] | None = None,
                 more: Sequence[str] = ()) -> None:
        self.tmp = tmp
        self.stack_dir = tmp / "node" / names.dir.lstrip("/")
        self.d = tmp / "node" / folder.lstrip("/")
        self.places = {names.dir: str(self.stack_dir),
                       **{p: str(tmp / "node" / p.lstrip("/")) for p in more}}
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        python_stand_in(bin_dir / "docker", STAND_IN)
        self.docker_log = tmp / "docker.log"
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                    "FAKE_DOCKER_LOG": str(self.docker_log), "FAKE_MOUNT": mount,
                    "FAKE_ENTRY": entry, "FAKE_CHECK": check, **(env or {})}

    def run(self, script: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        """`script` with the head's absolute paths under this test's folder."""
        for path, here in self.places.items():
            script = script.replace(path, here)
        return subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, text=True,
                              env={**self.env, **env}, timeout=120)


def stop(proc: subprocess.Popen[bytes], log: Path) -> str:
    """A daemon this test started, stopped (killed after 20 s); returns its log."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return log.read_text()
