"""Chaos verbs: sshd stop/start, fabric cut/restore, kill a named container."""
import subprocess

import pytest

pytestmark = pytest.mark.lab


def _ssh_ok(lab, node):
    p = subprocess.run(lab.ssh_argv(node, "true"), capture_output=True, timeout=30, check=False)
    return p.returncode == 0


def test_sshd_stop_and_start(lab):
    node = list(lab.nodes)[-1]
    lab.cli("sshd-stop", node)
    try:
        p = subprocess.run(lab.ssh_argv(node, "true"), capture_output=True, text=True, timeout=30,
                           check=False)
        assert p.returncode == 255 and "refused" in p.stderr, p.stderr
        # the node itself keeps running: its dockerd still answers (checked via another path)
        st = lab.cli("status").stdout
        rows = [line for line in st.splitlines() if line.startswith(node + " ")]
        assert f"{node} " in st and "sshd=DOWN" in rows[0]
    finally:
        lab.cli("sshd-start", node)
    assert _ssh_ok(lab, node)


def test_fabric_cut_and_restore(lab):
    a, b = next(iter(lab.nodes)), list(lab.nodes)[-1]
    ip_b = lab.nodes[b]["fabric"][0]["ip"]
    lab.cli("fabric-cut", b)
    try:
        assert lab.ssh(a, f"ping -c 1 -W 1 {ip_b}", check=False).returncode != 0
        # carrier is gone on the node's own interfaces (admin state stays UP), ibdev2netdev
        # follows it
        for f in lab.nodes[b]["fabric"]:
            assert "NO-CARRIER" in lab.ssh(b, f"ip link show {f['interface']}").stdout
        assert lab.ssh(b, "ibdev2netdev").stdout.count("(Down)") == len(lab.nodes[b]["fabric"])
        # management network is unaffected
        assert _ssh_ok(lab, b)
    finally:
        lab.cli("fabric-restore", b)
    lab.wait_until(lambda: lab.ssh(b, "ibdev2netdev").stdout.count("(Up)") == 2, 20,
                   what="carrier back")
    ping = f"ping -c 1 -W 1 -M do -s 8972 {ip_b}"
    lab.wait_until(lambda: lab.ssh(a, ping, check=False).returncode == 0,
                   20, what="fabric ping after restore")


def test_kill_named_container(lab):
    node = list(lab.nodes)[-1]
    lab.ssh(node, "docker rm -f lab-chaos-victim >/dev/null 2>&1; "
                  f"docker run -d --name lab-chaos-victim {lab.image} sleep infinity", timeout=900)
    try:
        lab.cli("kill", node, "lab-chaos-victim")
        fmt = "'{{.State.Running}} {{.State.ExitCode}}'"
        state = lab.ssh(node, f"docker inspect -f {fmt} lab-chaos-victim").stdout
        assert state.split()[0] == "false" and state.split()[1] == "137", state
    finally:
        lab.ssh(node, "docker rm -f lab-chaos-victim", check=False)
