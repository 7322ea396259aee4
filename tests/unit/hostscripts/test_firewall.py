"""The node's firewall (issue 45) with the real nft, iptables and systemctl, in namespaces of
this test's own: nothing of this machine's network, /etc or /var/lib, nor the lab's, is touched.

A "node" holds a network namespace and a mount namespace (tmpfs over /var/lib and
/etc/systemd/system, where the apply writes the stack's files and unit), with a management link
and a fabric link to a "peer" namespace, which speaks from several addresses: a stack node on
the fabric, the head on the fabric, an outsider on the fabric subnet, a management address (IPv4
and IPv6). Listeners on `::` (dual stack, as Ray's and torch's servers bind) stand in for the
stack's ports; one for an operator's service the stack does not own; one on the node's fabric
address at an ephemeral port for the data plane (gloo's, vLLM's message queues').

Proved: the apply's table is what `nft -c` accepts; after it each port answers exactly its
sources (sshd and the public port everyone, the stack's ports loopback and the stack's fabric
addresses, a service's only the head's, the data plane the stack's), the operator's service
everyone, IPv6 only where IPv4 would; the drop counters count; the launcher's probe passes with
the table and refuses without it; recon's check reads the digests and the record; a second apply
changes nothing, a changed port leaves nothing behind; a table nft refuses changes nothing; the
unit is enabled and systemd's own verifier accepts it; the old iptables rendezvous guard is
removed by the apply; destroy removes the table, the unit and the files; without nft the apply
fails saying so.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from hostscripts import firewall as fw
from hostscripts import paths
from hostscripts.common import payload
from inspection.parsers import parse_firewall
from inspection.status import FirewallError, parse_drops

NAMES = paths.StackNames("dev")
MGMT_NODE, MGMT_PEER = "10.99.0.11", "10.99.0.12"
V6_NODE, V6_PEER = "fd99::11", "fd99::12"
FAB_NODE = "192.168.177.11"
WORKER, HEAD, OUTSIDER = "192.168.177.12", "192.168.177.13", "192.168.177.99"
SSH, PUBLIC, RAY, VLLM, SERVICE, OPERATOR, DATA, STORE, PROBE = (
    2222, 8080, 6379, 8000, 8001, 9999, 40000, 40001, 20008)
STACK = (FAB_NODE, WORKER, HEAD)
SPEC = fw.TableSpec(
    stack="dev", node="spark-2", ssh_port=SSH, public=(PUBLIC,),
    rules=(fw.Rule("ray", (RAY, (20100, 20199)), STACK),
           fw.Rule("vllm", (VLLM,), ()),
           fw.Rule("service-embed", (SERVICE,), (HEAD,))),
    data_plane=fw.DataPlane((32768, 60999), STACK),
    probe=PROBE)


@pytest.fixture(autouse=True)
def _tools():
    """Root and the tools, or the test fails saying what is missing (never a skip)."""
    missing = [t for t in ("unshare", "nsenter", "ip", "nft", "iptables", "ip6tables",
                           "systemctl", "systemd-analyze") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        pytest.fail("the firewall's test needs root and unshare, nsenter, ip, nft, iptables, "
                    "systemctl and systemd-analyze; not root: "
                    f"{os.geteuid() != 0}, missing: {missing} (Debian: apt-get install -y "
                    "nftables iptables iproute2 systemd; make setup installs them)")


def _in(pid: int, *argv: str, mount: bool = False, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", "-t", str(pid), "-n", *(["-m"] if mount else []), *argv],
                          capture_output=True, text=True, timeout=60, **kw)


def _sh(pid: int, script: str, **kw) -> subprocess.CompletedProcess[str]:
    return _in(pid, "sh", "-c", script, mount=True, **kw)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


@pytest.fixture
def netns() -> Iterator[tuple[int, int]]:
    """(node pid, peer pid): the node in a network and mount namespace of its own (tmpfs over
    /var/lib and /etc/systemd/system), the peer in a network namespace."""
    node = subprocess.Popen(["unshare", "--net", "--mount", "--propagation", "private", "sh",
                             "-c", "mount -t tmpfs svl-test /var/lib && "
                             "mount -t tmpfs svl-test /etc/systemd/system && exec sleep 300"])
    peer = subprocess.Popen(["unshare", "--net", "sleep", "300"])
    try:
        time.sleep(0.3)
        n, p = node.pid, peer.pid
        for link, a, b, extra in (("mg", MGMT_NODE, MGMT_PEER, []),
                                  ("fab", FAB_NODE, WORKER, [HEAD, OUTSIDER])):
            _ok(_in(n, "ip", "link", "add", f"{link}0", "type", "veth", "peer", "name",
                    f"{link}1", "netns", str(p)))
            for pid, dev, ip, more in ((n, f"{link}0", a, []), (p, f"{link}1", b, extra)):
                for cmd in ([["ip", "addr", "add", f"{x}/24", "dev", dev] for x in (ip, *more)]
                            + [["ip", "link", "set", dev, "up"], ["ip", "link", "set", "lo",
                                                                   "up"]]):
                    _ok(_in(pid, *cmd))
        for pid, ip in ((n, V6_NODE), (p, V6_PEER)):
            _ok(_in(pid, "ip", "addr", "add", f"{ip}/64", "dev", f"mg{0 if pid == n else 1}",
                    "nodad"))
        yield n, p
    finally:
        for proc in (node, peer):
            proc.kill()
            proc.wait()


LISTEN = """
import socket, sys
host = sys.argv[1]
socks = []
for port in sys.argv[2:]:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if ":" in host:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(64)
    socks.append(s)
print("up", flush=True)
import select
while True:
    for s in select.select(socks, [], [])[0]:
        c, _ = s.accept()
        c.close()
"""
CONNECT = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def one(t):
    src, dst, port = t
    s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET)
    s.settimeout(1.0)
    try:
        if src != "-":
            s.bind((src, 0))
        s.connect((dst, port))
        return "reached"
    except OSError:
        return "blocked"
    finally:
        s.close()
todo = json.loads(sys.argv[1])
with ThreadPoolExecutor(64) as pool:
    print(json.dumps(list(pool.map(one, todo))))
"""


def _reach_all(pid: int, todo: list[tuple[str, str, int]]) -> list[str]:
    """Each (source, destination, port): `reached` or `blocked` (1 s), all at once."""
    return json.loads(_ok(_in(pid, sys.executable, "-c", CONNECT, json.dumps(todo))))


def _reach(pid: int, src: str, dst: str, port: int) -> str:
    return _reach_all(pid, [(src, dst, port)])[0]


@pytest.fixture
def listening(netns) -> Iterator[tuple[int, int]]:
    node, peer = netns
    procs = [subprocess.Popen(["nsenter", "-t", str(node), "-n", sys.executable, "-c", LISTEN,
                               host, *map(str, ports)], stdout=subprocess.PIPE, text=True)
             for host, ports in (("::", (SSH, PUBLIC, RAY, VLLM, SERVICE, OPERATOR, 20150, STORE)),
                                 (FAB_NODE, (DATA,)))]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "up"
        yield node, peer
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _reachability(node: int, peer: int) -> dict[str, dict[int, str]]:
    """Who reaches which port of the node: {source: {port: reached|blocked}}."""
    ports = (SSH, PUBLIC, RAY, VLLM, SERVICE, OPERATOR, 20150, STORE)
    plan = {
        "management": (MGMT_PEER, MGMT_NODE, ports),
        "ipv6": (V6_PEER, V6_NODE, ports),
        "worker": (WORKER, FAB_NODE, (*ports, DATA)),
        "head": (HEAD, FAB_NODE, (RAY, SERVICE, DATA)),
        "outsider": (OUTSIDER, FAB_NODE, (*ports, DATA)),
    }
    todo = [(src, dst, p) for src, dst, ps in plan.values() for p in ps]
    got = iter(_reach_all(peer, todo))
    out = {who: {p: next(got) for p in ps} for who, (_, _, ps) in plan.items()}
    local = (RAY, VLLM, SERVICE, STORE)
    out["loopback"] = dict(zip(local, _reach_all(node, [("-", "127.0.0.1", p) for p in local]),
                               strict=True))
    return out


def _check(node: int):
    return parse_firewall(_ok(_in(node, "bash", "-c", fw.check_script(NAMES), mount=True)))


def test_each_port_answers_exactly_its_sources(listening):
    node, peer = listening
    before = _reachability(node, peer)
    assert set(before["management"].values()) == {"reached"}  # nothing filtered yet
    assert _check(node).table is None

    out = _sh(node, fw.apply_script(SPEC))
    assert _ok(out).strip().endswith(
        "firewall spark-2: table inet spark-vllm-dev loaded (3 port rules), "
        "spark-vllm-dev-firewall.service enabled"), out.stdout
    r = _reachability(node, peer)
    print(json.dumps(r, indent=1))
    B, R = "blocked", "reached"
    everyone = {SSH: R, PUBLIC: R, OPERATOR: R}
    # STORE: a socket on every address at a port the kernel picked (the torch store of Ray's V2
    # executor): the data plane's rule, on the management network too
    assert r["management"] == {**everyone, RAY: B, VLLM: B, SERVICE: B, 20150: B, STORE: B}
    assert r["ipv6"] == r["management"]  # the inet table: IPv6 as IPv4
    assert r["worker"] == {**everyone, RAY: R, VLLM: B, SERVICE: B, 20150: R, STORE: R, DATA: R}
    assert r["head"] == {RAY: R, SERVICE: R, DATA: R}  # a service admits the head only
    assert r["outsider"] == {**everyone, RAY: B, VLLM: B, SERVICE: B, 20150: B, STORE: B,
                             DATA: B}
    assert r["loopback"] == {RAY: R, VLLM: R, SERVICE: R, STORE: R}

    # every drop counted, per rule: what `spark-vllm status` reads and shows
    drops = parse_drops(_ok(_in(node, "sh", "-c", fw.counters_script(NAMES))))
    assert set(drops) == {"ray", "vllm", "service-embed", "data-plane"}, drops
    assert all(n > 0 for n in drops.values()), drops

    # the launcher's probe: the table answers it, and only the table
    probe = [sys.executable, "-c", payload("firewall_probe.py"), fw.probe_target(NAMES, PROBE)]
    other = [sys.executable, "-c", payload("firewall_probe.py"),
             fw.probe_target(paths.StackNames("staging"), PROBE)]
    assert _in(node, *other).returncode == 1  # another stack's probe: not this table's
    assert _in(node, *probe).returncode == 0
    facts = _check(node)
    assert facts.table and facts.record == (facts.file, facts.table) and facts.enabled
    assert facts.unit == fw.unit_sha256(NAMES)

    gone = _sh(node, fw.remove_script(NAMES, "spark-2"))
    assert _ok(gone).strip() == "firewall spark-2: table inet spark-vllm-dev removed"
    assert _reachability(node, peer) == before
    refused = _in(node, *probe)
    assert refused.returncode == 1 and "ECONNREFUSED" in refused.stderr, refused.stderr
    assert _check(node) == parse_firewall("table absent\nfile absent\nunit absent\n"
                                          "enabled no\nrecord absent\n")
    with pytest.raises(FirewallError, match="not loaded"):
        parse_drops(_ok(_in(node, "sh", "-c", fw.counters_script(NAMES))))
    left = _ok(_sh(node, "ls -A /etc/systemd/system /var/lib; ls /var/lib/spark-vllm/stacks/dev "
                         "2>&1 || true"))
    assert "spark-vllm-dev" not in left and "firewall" not in left, left


def test_reapply_update_refusal_and_a_hand_edit(netns):
    node, _ = netns
    _ok(_sh(node, fw.apply_script(SPEC)))
    first = _check(node)
    _ok(_sh(node, fw.apply_script(SPEC)))  # again: the same table, once
    assert _check(node) == first
    assert _ok(_in(node, "nft", "list", "tables")).count("spark-vllm-dev") == 1

    moved = replace(SPEC, rules=(fw.Rule("ray", (RAY + 1, (20100, 20199)), STACK),
                                 *SPEC.rules[1:]))
    _ok(_sh(node, fw.apply_script(moved)))
    listed = _ok(_in(node, "nft", "list", "table", "inet", "spark-vllm-dev"))
    assert f"dport {{ {RAY + 1}, 20100-20199 }}" in listed and f"{RAY}," not in listed
    second = _check(node)
    assert second.table != first.table and second.record == (second.file, second.table)

    # a table the node's nft refuses: nothing changes, the loaded table stays
    bad = fw.apply_script(moved).replace("policy accept;", "policy acceptable;")
    out = _sh(node, bad)
    assert out.returncode == 1 and "nft refused the table, nothing was changed" in out.stderr
    assert _check(node) == second

    # edited by hand: the kernel's table is no longer what the last load recorded
    _ok(_in(node, "nft", "add", "rule", "inet", "spark-vllm-dev", "input", "tcp", "dport",
            "4444", "accept"))
    edited = _check(node)
    assert edited.table != second.table and edited.record == second.record


def test_the_unit_is_enabled_and_systemd_accepts_it(netns, tmp_path):
    node, _ = netns
    _ok(_sh(node, fw.apply_script(SPEC)))
    unit = _ok(_sh(node, f"cat {fw.unit_path(NAMES)}"))
    assert unit == fw.render_unit(NAMES)
    for line in ("Before=network-pre.target docker.service", "DefaultDependencies=no",
                 f"ExecStart=/usr/sbin/nft -f {fw.ruleset_path(NAMES)}",
                 "After=local-fs.target nftables.service"):
        assert line in unit.splitlines()
    links = _ok(_sh(node, "ls /etc/systemd/system/docker.service.wants "
                          "/etc/systemd/system/multi-user.target.wants"))
    assert links.count(fw.unit_name(NAMES)) == 2, links
    # systemd's own verifier: every line understood, ExecStart's binary there
    path = tmp_path / fw.unit_name(NAMES)
    path.write_text(fw.render_unit(NAMES))
    verify = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr
    # and what it runs loads the table the apply wrote, in a fresh namespace
    fresh = _sh(node, f"unshare --net sh -c '{fw.NFT} -f {fw.ruleset_path(NAMES)} && "
                      "nft list tables'")
    assert "table inet spark-vllm-dev" in _ok(fresh)


def test_the_old_rendezvous_guard_is_removed_by_the_apply(netns):
    """The iptables chain of issue 31's guard as its script made it; the apply takes it away."""
    node, _ = netns
    chain = fw.legacy_chain(NAMES)
    for ipt in ("iptables", "ip6tables"):
        for cmd in (["-N", chain], ["-A", chain, "-i", "lo", "-j", "RETURN"],
                    ["-A", chain, "-j", "DROP"],
                    ["-I", "INPUT", "-p", "tcp", "--dport", "29501", "-j", chain]):
            _ok(_in(node, ipt, "-w", *cmd))
    out = _ok(_sh(node, fw.apply_script(SPEC)))
    assert f"removed the old rendezvous guard (iptables chain {chain})" in out
    for ipt in ("iptables", "ip6tables"):
        assert chain not in _ok(_in(node, ipt, "-w", "-S")), ipt
    assert "removed the old" not in _ok(_sh(node, fw.apply_script(SPEC)))  # once


def test_without_nft_the_apply_fails_and_changes_nothing(netns):
    node, _ = netns
    out = _sh(node, f"mount --bind /dev/null {fw.NFT} && "
                    f"PATH=/usr/bin:/bin sh -c {shlex.quote(fw.apply_script(SPEC))}")
    assert out.returncode == 1
    assert "nft is not installed, so the stack's ports would answer on every address" \
        in out.stderr
    assert _ok(_sh(node, "ls -A /var/lib /etc/systemd/system")).split() == [
        "/etc/systemd/system:", "/var/lib:"]  # both empty


def test_every_stack_name_is_a_table_and_a_unit():
    for stack in ("dev", "0day", "a.b_c-d", "x" * 100):
        names = paths.StackNames(stack)
        spec = replace(SPEC, stack=stack)
        done = subprocess.run(["unshare", "--net", "nft", "-c", "-f", "-"],
                              input=fw.render(spec), capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (stack, done.stderr)
        assert fw.table_name(names).startswith("spark-vllm-")
    with pytest.raises(ValueError):
        fw.render(replace(SPEC, rules=(fw.Rule("ray", (), STACK),)))
    with pytest.raises(ValueError):
        fw.render(replace(SPEC, rules=(fw.Rule("ray; drop", (RAY,), STACK),)))
