"""The fabric's configuration script (hostscripts/fabric_config.py) run for real: in a network
namespace of its own (a veth named like a ConnectX-7 port, one like the management port) and a
mount namespace whose /etc/netplan is a scratch folder, with this machine's iproute2, netplan
(Debian's netplan.io, `make setup`) and python3. SSH_CONNECTION is set as sshd sets it, the
control machine at 10.99.0.1 reaching the node's management address 10.99.0.11.

Proved: the declared address, MTU and link, and the stack's netplan file (0600), a second run
changing nothing; the management interface and a subnet that holds the control machine are
refused with nothing changed; a configuration the node's netplan rejects changes nothing; a
step that fails after the first change restores the previous file, MTU and addresses; the
removal takes the stack's file and address, and keeps an address another stack's file declares.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hostscripts.fabric_config import InterfaceSpec, apply_script, netplan_sha256, remove_script

pytestmark = pytest.mark.lab

NS = "svl-fabtest"
IFACE, MGMT = "enp1s0f1np1", "enP7s7"
SPEC = InterfaceSpec(node="spark-2", stack="dev", interface=IFACE, address="192.168.177.12/24",
                     mtu=9000)
SSH = "10.99.0.1 50000 10.99.0.11 22"


def ip(*args: str) -> str:
    return subprocess.run(["ip", "-n", NS, *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def node(tmp_path):
    """A fresh namespace: the fabric port unconfigured (MTU 1500, no address), the management
    port with 10.99.0.11/24; /etc/netplan is `tmp_path/netplan` inside the script's mounts."""
    if os.geteuid() != 0:
        pytest.fail("needs root (network and mount namespaces)")
    subprocess.run(["ip", "netns", "del", NS], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    for name, peer in ((IFACE, "fabpeer"), (MGMT, "mgmtpeer")):
        ip("link", "add", name, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "up")
    ip("addr", "add", "10.99.0.11/24", "dev", MGMT)
    ip("link", "set", MGMT, "up")
    ip("link", "set", "lo", "up")
    netplan = tmp_path / "netplan"
    netplan.mkdir()
    yield netplan
    subprocess.run(["ip", "netns", "del", NS], capture_output=True, check=False)


def run(netplan: Path, script: str, path: str | None = None) -> subprocess.CompletedProcess:
    """The script as the node's sshd would run it (`sh`, SSH_CONNECTION set), `path` first on
    PATH when given (a stand-in tool)."""
    env = {"SSH_CONNECTION": SSH, "PATH": f"{path + ':' if path else ''}/usr/sbin:/usr/bin:"
                                          "/sbin:/bin"}
    inner = f"mount --bind {netplan} /etc/netplan && exec sh -s"
    return subprocess.run(["ip", "netns", "exec", NS, "unshare", "-m", "sh", "-c", inner],
                          input=script, capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def state() -> tuple[list[str], str]:
    addrs = [line.split()[3] for line in ip("-o", "-4", "addr", "show", "dev", IFACE).splitlines()]
    mtu = ip("link", "show", IFACE).split(" mtu ")[1].split()[0]
    return addrs, mtu


def test_apply_brings_the_port_to_the_declared_state_and_a_second_run_changes_nothing(node):
    assert state() == ([], "1500")
    done = run(node, apply_script(SPEC))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"fabric spark-2 {IFACE}: 192.168.177.12/24 mtu 9000 "
                                   f"(/etc/netplan/40-spark-vllm-dev-{IFACE}.yaml)")
    assert state() == (["192.168.177.12/24"], "9000")
    file = node / f"40-spark-vllm-dev-{IFACE}.yaml"
    assert oct(file.stat().st_mode & 0o777) == "0o600"
    import hashlib

    assert hashlib.sha256(file.read_bytes()).hexdigest() == netplan_sha256(SPEC)  # recon's view
    again = run(node, apply_script(SPEC))
    assert again.returncode == 0 and state() == (["192.168.177.12/24"], "9000")
    # another address on the port is not the stack's: the apply leaves exactly the declared one
    ip("addr", "add", "192.168.177.99/24", "dev", IFACE)
    assert run(node, apply_script(SPEC)).returncode == 0
    assert state() == (["192.168.177.12/24"], "9000")


def test_the_management_port_and_the_control_machines_subnet_are_refused(node):
    mgmt = InterfaceSpec(node="spark-2", stack="dev", interface=MGMT, address="192.168.177.12/24",
                         mtu=9000)
    done = run(node, apply_script(mgmt))
    assert done.returncode == 1
    assert (f"fabric spark-2 {MGMT}: carries the management address 10.99.0.11 (this SSH "
            "session's)") in done.stderr and "nothing changed" in done.stderr
    wide = InterfaceSpec(node="spark-2", stack="dev", interface=IFACE, address="10.99.0.12/16",
                         mtu=9000)
    done = run(node, apply_script(wide))
    assert done.returncode == 1
    assert "10.99.0.12/16's subnet holds the control machine 10.99.0.1" in done.stderr
    assert state() == ([], "1500") and list(node.iterdir()) == []


def test_what_the_nodes_netplan_rejects_changes_nothing(node):
    assert run(node, apply_script(SPEC)).returncode == 0
    before = (node / f"40-spark-vllm-dev-{IFACE}.yaml").read_text()
    broken = node / "30-broken.yaml"  # somebody else's file the node's netplan rejects
    broken.write_text("network:\n  version: 2\n  ethernets:\n    eth9:\n"
                      "      addresses: [1.2.3.4/33]\n")
    broken.chmod(0o600)
    change = InterfaceSpec(node="spark-2", stack="dev", interface=IFACE,
                           address="192.168.177.22/24", mtu=8000)
    done = run(node, apply_script(change))
    assert done.returncode == 1
    assert f"fabric spark-2 {IFACE}: the node's netplan rejects the configuration" in done.stderr
    assert "invalid prefix length in address '1.2.3.4/33'" in done.stderr
    assert "/tmp/" not in done.stderr  # the scratch copy's path is not the operator's
    assert state() == (["192.168.177.12/24"], "9000")
    assert (node / f"40-spark-vllm-dev-{IFACE}.yaml").read_text() == before


def test_a_step_that_fails_after_the_first_change_restores_the_previous_state(node, tmp_path):
    assert run(node, apply_script(SPEC)).returncode == 0
    before = (node / f"40-spark-vllm-dev-{IFACE}.yaml").read_text()
    # a STAND-IN `ip` that fails one step (removing an address), every other call the real one
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "ip").write_text('#!/bin/sh\n[ "$1 $2" = "addr del" ] && '
                              '{ echo "RTNETLINK answers: Operation not permitted" >&2; exit 2; }\n'
                              'exec /sbin/ip "$@"\n')
    (tools / "ip").chmod(0o755)
    change = InterfaceSpec(node="spark-2", stack="dev", interface=IFACE,
                           address="192.168.177.22/24", mtu=8000)
    done = run(node, apply_script(change), path=str(tools))
    assert done.returncode == 1
    assert (f"fabric spark-2 {IFACE}: cannot remove 192.168.177.12/24; restoring the previous "
            "file, MTU and addresses") in done.stderr
    # the stand-in still refuses `addr del`, so the new address stays beside the old one; the
    # MTU and the file are the previous ones
    addrs, mtu = state()
    assert "192.168.177.12/24" in addrs and mtu == "9000"
    assert (node / f"40-spark-vllm-dev-{IFACE}.yaml").read_text() == before


def test_removal_takes_the_stacks_file_and_address_unless_another_stack_declares_it(node):
    other = InterfaceSpec(node="spark-2", stack="side", interface=IFACE,
                          address="192.168.177.12/24", mtu=9000)
    assert run(node, apply_script(SPEC)).returncode == 0
    assert run(node, apply_script(other)).returncode == 0  # a second stack, the same port
    done = run(node, remove_script(SPEC))
    assert done.returncode == 0 and "kept" in done.stdout
    assert state() == (["192.168.177.12/24"], "9000")
    assert sorted(p.name for p in node.iterdir()) == [f"40-spark-vllm-side-{IFACE}.yaml"]
    done = run(node, remove_script(other))
    assert done.returncode == 0 and "removed" in done.stdout
    assert state() == ([], "9000")  # the MTU is left as it is
    assert list(node.iterdir()) == []


def test_a_link_local_address_is_left_to_whoever_manages_it(node):
    """A 169.254/16 address (the kernel's or NetworkManager's own on an unconfigured port, as
    the GB10 capture ip-br-addr-code-monkeys-hutch.txt shows) is not the stack's to remove."""
    ip("addr", "add", "169.254.127.30/16", "dev", IFACE)
    assert run(node, apply_script(SPEC)).returncode == 0
    assert sorted(state()[0]) == ["169.254.127.30/16", "192.168.177.12/24"]
