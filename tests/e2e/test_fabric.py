"""The fabric as code on the lab (issue 33, components/fabric.py), on the shared stack.

The shared stack's up from empty configured every node's ConnectX-7 ports from nothing
(tests/e2e/conftest.py flushes them first; test_lab_stack asserts the result). Here:
- an address removed and the MTU lowered behind the stack on the worker's second twin: the
  preview replaces exactly that interface's command (and re-runs the fabric checks and the
  collective gate), the up repairs it, the model serves. The second twin, because the first carries Ray's and NCCL's
  sockets (removing its address would take the serving engine down, which is the self-healing
  module's subject, not this one's);
- a config naming the head's management interface as a fabric interface is refused by
  preflight before any change, naming the key;
- a change the worker's netplan rejects (a broken netplan file of somebody else's there) fails
  the up naming the node and interface, and leaves the worker's previous state (addresses, MTU,
  the stack's files) in place; once the file is gone the next up converges.
"""

from __future__ import annotations

import pulumi.automation as auto
import pytest

from lab.deployments import complete

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
TWIN = "enP2p1s0f1np1"  # the worker's second twin, 192.168.178.12
FILE = f"/etc/netplan/40-spark-vllm-dev-{TWIN}.yaml"


def port(d, node: str, iface: str = TWIN) -> tuple[str, str]:
    """(its IPv4 addresses, its MTU) as the node shows them."""
    out = d.ssh(node, f"ip -o -4 addr show dev {iface} | awk '{{print $4}}' | tr '\\n' ' '; "
                      f"echo; cat /sys/class/net/{iface}/mtu").splitlines()
    return out[0].strip(), out[1].strip()


def test_a_fabric_changed_behind_the_stack_is_repaired_touching_only_that_interface(stack):
    d = stack
    before = d.snapshot()
    assert port(d, WORKER) == ("192.168.178.12/24", "9000")
    d.ssh(WORKER, f"ip addr flush dev {TWIN}; ip link set dev {TWIN} mtu 1500")
    d.run("preview")
    ops = d.ops()
    fabric = {k: v for k, v in ops.items() if k.startswith("fabric-")}
    assert fabric == {f"fabric-{WORKER}-{TWIN}": "replace"}, ops
    # besides it, only the fabric checks and the collective gate (issue 51: its ranks measure
    # again after a fabric change, and its check judges the new figures)
    assert set(ops) - set(fabric) <= {f"nccl-fabric-{HEAD}", f"nccl-fabric-{WORKER}",
                                      f"collective-rank-{HEAD}", f"collective-rank-{WORKER}",
                                      "collective-check"}, ops
    assert f"collective-rank-{WORKER}" in ops, ops  # the fabric changed: it measures again
    d.run("up")
    assert port(d, WORKER) == ("192.168.178.12/24", "9000")
    assert d.ssh(WORKER, f"stat -c %a {FILE}").strip() == "600"
    assert d.snapshot() == before  # no container restarted
    assert complete(d)
    d.run("preview")
    assert d.ops() == {}


def test_the_management_interface_named_as_fabric_is_refused_before_any_change(stack):
    d = stack
    before = d.snapshot()
    d.set("nodes[0].fabric[1].interface", "enP7s7")
    try:
        with pytest.raises(auto.CommandError) as err:
            d.run("preview")
    finally:
        d.set("nodes[0].fabric[1].interface", "enP2p1s0f1np1")
    text = str(err.value)
    assert "spark-vllm:nodes[0].fabric[1].interface: enP7s7 carries the management address " \
           "10.77.0.11" in text, text[-2000:]
    assert d.snapshot() == before
    assert port(d, HEAD, "enP7s7")[0] == "10.77.0.11/24"


def test_a_change_the_nodes_netplan_rejects_leaves_the_previous_state(stack):
    d = stack
    files = d.ssh(WORKER, "cat /etc/netplan/40-spark-vllm-dev-*.yaml")
    d.ssh(WORKER, "printf 'network:\\n  version: 2\\n  ethernets:\\n    eth9:\\n      "
                  "addresses: [1.2.3.4/33]\\n' > /etc/netplan/30-broken.yaml; "
                  "chmod 600 /etc/netplan/30-broken.yaml")
    d.set("fabric.mtu", 9001)
    try:
        with pytest.raises(auto.CommandError) as err:
            d.run("up")
        text = str(err.value)
        assert f"fabric {WORKER} enp1s0f1np1: the node's netplan rejects the configuration" in \
            text, text[-3000:]
        assert "invalid prefix length in address '1.2.3.4/33'" in text
        # the worker as it was: addresses, MTU, the stack's files
        assert port(d, WORKER) == ("192.168.178.12/24", "9000")
        assert port(d, WORKER, "enp1s0f1np1") == ("192.168.177.12/24", "9000")
        assert d.ssh(WORKER, "cat /etc/netplan/40-spark-vllm-dev-*.yaml") == files
    finally:
        d.ssh(WORKER, "rm -f /etc/netplan/30-broken.yaml")
        d.set("fabric.mtu", 9000)
    d.run("up")  # the head's ports, which took 9001, back to 9000
    assert port(d, HEAD) == ("192.168.178.11/24", "9000")
    assert complete(d)
    d.run("preview")
    assert d.ops() == {}
