"""The mp rendezvous port reachable from the fabric only (issue 31, item 5), with the real
iptables and ip6tables in network namespaces of this test's own (`unshare --net`: nothing of
this machine's network, nor the lab's, is touched).

A "head" namespace has a management link and a fabric link to a "peer" namespace; a listener on
`::` (dual stack, as torch's TCPStore binds) stands in for vLLM's rendezvous. Before the guard
the peer reaches it on both addresses; with it, only over the fabric (and the head over its
loopback), while another port of the head stays reachable from both; after the unguard, on
both again. Recon's check says absent, present, absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from hostscripts import firewall, paths

NAMES = paths.StackNames("dev")
PORT = 29511
OTHER = 8080
MGMT_HEAD, MGMT_PEER = "10.99.0.11", "10.99.0.12"
FAB_HEAD, FAB_PEER = "192.168.177.11", "192.168.177.12"
SOURCES = [firewall.FabricSource("fab0", "192.168.177.0/24")]

@pytest.fixture(autouse=True)
def _network_namespaces():
    """Root and the tools, or the test fails saying what is missing (never a skip: `make test`
    runs as root, and a missing tool is a setup fault to fix, not a reason to prove nothing)."""
    missing = [t for t in ("unshare", "nsenter", "ip", "iptables", "ip6tables")
               if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        pytest.fail("the rendezvous guard's test needs root and unshare, nsenter, ip, iptables "
                    f"and ip6tables (network namespaces); not root: {os.geteuid() != 0}, "
                    f"missing: {missing} (Debian: apt-get install -y iptables iproute2)")


def _in(pid: int, *argv: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", "-t", str(pid), "-n", *argv], capture_output=True,
                          text=True, timeout=30, **kw)


@pytest.fixture
def netns() -> Iterator[tuple[int, int]]:
    """(head pid, peer pid): two processes, each holding a network namespace of its own."""
    procs = [subprocess.Popen(["unshare", "--net", "sleep", "120"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        head, peer = (p.pid for p in procs)
        for link, a, b in (("mg", MGMT_HEAD, MGMT_PEER), ("fab", FAB_HEAD, FAB_PEER)):
            out = _in(head, "ip", "link", "add", f"{link}0", "type", "veth", "peer", "name",
                      f"{link}1", "netns", str(peer))
            assert out.returncode == 0, out.stderr
            for pid, dev, ip in ((head, f"{link}0", a), (peer, f"{link}1", b)):
                for cmd in (["ip", "addr", "add", f"{ip}/24", "dev", dev],
                            ["ip", "link", "set", dev, "up"], ["ip", "link", "set", "lo", "up"]):
                    done = _in(pid, *cmd)
                    assert done.returncode == 0, (cmd, done.stderr)
        yield head, peer
    finally:
        for p in procs:
            p.kill()
            p.wait()


LISTEN = """
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1])))
s.listen(16)
print("up", flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), 1.5).close()
    print("reached")
except OSError as e:
    print("blocked", type(e).__name__)
"""


def _reach(pid: int, ip: str, port: int = PORT) -> str:
    return _in(pid, sys.executable, "-c", CONNECT, ip, str(port)).stdout.split()[0]


def test_the_master_port_answers_on_the_fabric_and_loopback_only(netns):
    head, peer = netns
    listener = subprocess.Popen(["nsenter", "-t", str(head), "-n", sys.executable, "-c", LISTEN,
                                 str(PORT)], stdout=subprocess.PIPE, text=True)
    # another port of the head (the gateway's, say): the guard leaves it alone
    other = subprocess.Popen(["nsenter", "-t", str(head), "-n", sys.executable, "-c", LISTEN,
                              str(OTHER)], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "up"
        assert other.stdout.readline().strip() == "up"
        check = firewall.master_port_guard_check(NAMES, PORT)
        assert _in(head, "bash", "-c", check).stdout.strip() == "absent"
        # vLLM 0.32 as it is: every address answers, the management network's too
        assert (_reach(peer, MGMT_HEAD), _reach(peer, FAB_HEAD)) == ("reached", "reached")

        guard = _in(head, "sh", "-c", firewall.master_port_guard(NAMES, PORT, SOURCES))
        assert guard.returncode == 0, guard.stderr
        assert guard.stdout.strip() == (f"master port {PORT}: fabric only (lo, fab0 from "
                                        "192.168.177.0/24)")
        assert _reach(peer, MGMT_HEAD) == "blocked"
        assert _reach(peer, FAB_HEAD) == "reached"
        assert _reach(peer, MGMT_HEAD, OTHER) == "reached"  # only the master port
        assert _reach(head, "127.0.0.1") == "reached" and _reach(head, FAB_HEAD) == "reached"
        assert _in(head, "bash", "-c", check).stdout.strip() == "present"
        # again (an update, a changed port): the same rules once, never twice
        assert _in(head, "sh", "-c", firewall.master_port_guard(NAMES, PORT, SOURCES)) \
            .returncode == 0
        rules = _in(head, "iptables", "-S", "INPUT").stdout
        assert rules.count(firewall.guard_chain(NAMES)) == 1, rules
        moved = _in(head, "sh", "-c", firewall.master_port_guard(NAMES, PORT + 1, SOURCES))
        assert moved.returncode == 0
        rules = _in(head, "iptables", "-S", "INPUT").stdout
        assert f"--dport {PORT + 1} " in rules and f"--dport {PORT} " not in rules, rules
        assert _in(head, "bash", "-c", check).stdout.strip() == "absent"  # not this port

        off = _in(head, "sh", "-c", firewall.master_port_unguard(NAMES))
        assert off.returncode == 0, off.stderr
        assert firewall.guard_chain(NAMES) not in _in(head, "iptables", "-S").stdout
        assert firewall.guard_chain(NAMES) not in _in(head, "ip6tables", "-S").stdout
        assert _reach(peer, MGMT_HEAD) == "reached"
    finally:
        for p in (listener, other):
            p.kill()
            p.wait()


def test_the_guard_refuses_to_pretend_without_its_tools(tmp_path):
    """Without ip6tables (or iptables) the script fails: the port would stay open."""
    for tool in ("sh", "awk", "sed", "grep", "tail", "iptables"):
        if shutil.which(tool):
            os.symlink(shutil.which(tool), tmp_path / tool)
    out = subprocess.run(["/bin/sh", "-c", firewall.master_port_guard(NAMES, PORT, SOURCES)],
                         capture_output=True, text=True, timeout=30,
                         env={"PATH": str(tmp_path)})
    assert out.returncode == 1
    assert "ip6tables is not installed on the head" in out.stderr


def test_the_chain_is_the_stacks_own_and_short_enough():
    dev, prod = paths.StackNames("dev"), paths.StackNames("x" * 100)
    assert firewall.guard_chain(dev) != firewall.guard_chain(prod)
    assert len(firewall.guard_chain(prod)) <= 28
    with pytest.raises(ValueError):
        firewall.master_port_guard(dev, PORT, [])
