"""Chaos verbs: sshd stop/start, fabric cut/restore, kill a named container."""
import os
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


def test_dockerd_restart_is_a_reboot_before_which_the_boot_units_run(lab):
    """`dockerd-restart` is the lab's node restart (issue 45): the node's nftables ruleset is
    emptied (a reboot forgets the kernel's rules), then, FAKING systemd (the nodes run none),
    the ExecStart of each enabled unit docker.service waits for runs before dockerd starts; the
    order is in the node's boot log."""
    node = list(lab.nodes)[-1]
    unit = "/etc/systemd/system/lab-boot-probe.service"
    lab.ssh(node, f"printf '%s\\n' '[Unit]' 'Before=docker.service' '[Service]' "
                  "'Type=oneshot' 'ExecStart=/usr/sbin/nft add table inet lab-boot-probe' "
                  f"'[Install]' 'WantedBy=docker.service' > {unit} && "
                  "systemctl enable --quiet lab-boot-probe.service && "
                  "nft add table inet lab-reboot-forgets")
    log = f"/var/lib/spark-vllm-lab/{node}/logs/boot.log"
    before = len(open(log).read().splitlines()) if os.path.exists(log) else 0
    try:
        lab.cli("dockerd-restart", node)
        tables = lab.ssh(node, "nft list tables").stdout
        assert "lab-boot-probe" in tables and "lab-reboot-forgets" not in tables, tables
        lines = open(log).read().splitlines()[before:]
        events = [ln.split(" ", 1)[1] for ln in lines]
        # (on a lab where a stack runs, its own boot units, e.g. the firewall's, run too)
        assert events[0] == "nftables ruleset flushed (the reboot)", events
        started = events.index("dockerd starts")
        assert all(e.split(": ", 1)[0].endswith(".service") and ": ExecStart=" in e
                   for e in events[1:started]), events
        assert any(e.startswith("lab-boot-probe.service: ExecStart=/usr/sbin/nft add table "
                                "inet lab-boot-probe rc=0") for e in events[1:started]), events
        assert lab.ssh(node, "docker version --format '{{.Server.Version}}'").stdout.strip()
    finally:
        lab.ssh(node, "systemctl disable --quiet lab-boot-probe.service; "
                      f"rm -f {unit}; nft delete table inet lab-boot-probe; "
                      "nft delete table inet lab-reboot-forgets", check=False)


def test_the_outsider_is_on_the_fabric_and_no_node(lab):
    """A host on the fabric subnets that is not a node (netns svl-outsider, .250): it reaches
    every node's fabric addresses and has no other network."""
    def outsider(*argv):
        return subprocess.run(["ip", "netns", "exec", "svl-outsider", *argv],
                              capture_output=True, text=True, timeout=30, check=False)

    addrs = outsider("ip", "-4", "-o", "addr", "show").stdout
    assert "192.168.177.250/24" in addrs and "192.168.178.250/24" in addrs, addrs
    assert "10.77.0." not in addrs and outsider("ip", "route", "show", "default").stdout == ""
    for n in lab.nodes.values():
        for f in n["fabric"]:
            done = outsider("ping", "-c", "1", "-W", "2", f["ip"])
            assert done.returncode == 0, (f["ip"], done.stdout, done.stderr)
