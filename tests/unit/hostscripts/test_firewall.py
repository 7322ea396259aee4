"""hostscripts/firewall.py: vLLM's rendezvous port (mp on several nodes) kept off every
interface but loopback and the fabric.

The scripts run for real in two private network namespaces made for the test (a "server" with
a fabric and a management link to a "client"): nothing of this machine's own filter or network
is touched. Root only (network namespaces); `make test` runs as root, so it always runs there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from hostscripts.firewall import guard_port, unguard
from hostscripts.paths import StackNames

CHAIN = StackNames("dev").guard_chain
PORT, OTHER = 29501, 29502
SERVE = f"""
import socket, threading, time
for port in ({PORT}, {OTHER}):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16)
    threading.Thread(target=lambda s=s: [s.accept()[0].close() for _ in iter(int, 1)],
                     daemon=True).start()
time.sleep(120)
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("error", e)
"""


def test_the_scripts_take_only_a_stack_chain_and_fabric_names():
    assert CHAIN.startswith("SVLLM-") and len(CHAIN) <= 28  # iptables' limit
    assert StackNames("side").guard_chain != CHAIN
    for bad_chain in ("INPUT", "SVLLM-x; reboot", ""):
        with pytest.raises(ValueError):
            guard_port(bad_chain, PORT, ["fab0"])
        with pytest.raises(ValueError):
            unguard(bad_chain)
    for bad in ([], ["lo"], ["a b"], ["$(id)"]):
        with pytest.raises(ValueError):
            guard_port(CHAIN, PORT, bad)
    script = guard_port(CHAIN, PORT, ["enp1s0f1np1", "enP2p1s0f1np1"])
    assert f"--dport {PORT} -j REJECT --reject-with tcp-reset" in script
    assert "guard ip6tables" in script  # the store listens on IPv6 too


def _ns() -> subprocess.Popen[bytes]:
    """A process alone in a new network namespace (its pid names the namespace)."""
    return subprocess.Popen(["unshare", "--net", "--", "sleep", "120"])


def _in(pid: int, *argv: str, check: bool = True) -> str:
    done = subprocess.run(["nsenter", "-t", str(pid), "-n", *argv], capture_output=True,
                          text=True, timeout=30)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv}: {done.stderr}")
    return done.stdout


@pytest.fixture
def namespaces() -> Iterator[tuple[int, int]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (make test runs as root)")
    for tool in ("unshare", "nsenter", "ip", "iptables"):
        assert shutil.which(tool), f"{tool} is missing"
    server, client = _ns(), _ns()
    procs = [server, client]
    try:
        s, c = server.pid, client.pid
        time.sleep(0.2)
        for link, net in (("fab", "10.91.0"), ("mgmt", "10.92.0")):
            subprocess.run(["ip", "link", "add", f"{link}S", "netns", str(s), "type", "veth",
                            "peer", "name", f"{link}C", "netns", str(c)], check=True)
            for pid, end, host in ((s, "S", 1), (c, "C", 2)):
                _in(pid, "ip", "addr", "add", f"{net}.{host}/24", "dev", f"{link}{end}")
                _in(pid, "ip", "link", "set", f"{link}{end}", "up")
        for pid in (s, c):
            _in(pid, "ip", "link", "set", "lo", "up")
        listener = subprocess.Popen(["nsenter", "-t", str(s), "-n", sys.executable, "-c", SERVE])
        procs.append(listener)
        time.sleep(0.5)
        yield s, c
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _connect(client: int, host: str, port: int) -> str:
    return _in(client, sys.executable, "-c", CONNECT, host, str(port)).strip()


def test_the_guard_resets_the_port_from_the_management_link_only(namespaces):
    server, client = namespaces
    assert _connect(client, "10.92.0.1", PORT) == "open"  # unguarded: every address
    out = _in(server, "sh", "-c", guard_port(CHAIN, PORT, ["fabS"]))
    assert out.strip() == f"port {PORT}: only lo, fabS ({CHAIN})"
    assert _connect(client, "10.91.0.1", PORT) == "open"  # over the fabric
    assert _connect(client, "10.92.0.1", PORT) == "refused"  # over management: reset at once
    assert _connect(client, "10.92.0.1", OTHER) == "open"  # only that port
    assert _in(server, sys.executable, "-c", CONNECT, "127.0.0.1", str(PORT)).strip() == "open"
    # idempotent: a second run (a new port, the same chain) leaves one jump
    _in(server, "sh", "-c", guard_port(CHAIN, PORT, ["fabS"]))
    rules = _in(server, "iptables", "-S", "INPUT")
    assert rules.count(f"-j {CHAIN}") == 1
    # recon's question (inspection/recon.py CHAIN_PRESENCE) and the removal
    assert _in(server, "iptables", "-w", "-S", CHAIN, check=False)
    _in(server, "sh", "-c", unguard(CHAIN))
    assert f"-j {CHAIN}" not in _in(server, "iptables", "-S", "INPUT")
    assert _connect(client, "10.92.0.1", PORT) == "open"
    _in(server, "sh", "-c", unguard(CHAIN))  # twice is fine
