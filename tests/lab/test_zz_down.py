"""`lab.py down` leaves nothing behind and is safe twice; `up` afterwards restores the lab.
Runs last (file name) because it tears the lab down; it brings it back up at the end."""
import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.lab


def _leftovers() -> list:
    left = []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                        check=False).stdout
    left += [f"netns {line.split()[0]}" for line in ns.splitlines() if line.startswith("svl-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                           check=False).stdout
    for line in links.splitlines():
        name = line.split(": ")[1].split("@")[0]
        if name.startswith(("svl-", "svm-", "svf1-", "svf2-", "svo-")):
            left.append(f"link {name}")
    with open("/proc/self/mountinfo") as mounts:
        mountinfo = mounts.read().splitlines()
    for line in mountinfo:
        f = line.split()
        if "spark-vllm-lab" in line or "/run/netns/svl-" in f[4]:
            left.append(f"mount {f[4]}")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "spark-vllm-lab" in cmd or "hfproxy.py" in cmd or "olah-cli" in cmd:
            left.append(f"process {pid} {cmd[:80]}")
    if os.path.exists("/var/lib/spark-vllm-lab"):
        left.append("dir /var/lib/spark-vllm-lab")
    if os.path.exists("/sys/fs/cgroup/pids/svl-lab"):
        left.append("cgroup svl-lab")
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True,
                           check=False).stdout
    left += [f"iptables {r}" for r in rules.splitlines() if "svl-" in r]
    return left


def test_down_leaves_nothing_and_up_restores(lab):
    n = len(lab.nodes)
    # a container that `down` must remove (the nodes' Docker data is kept, their containers not)
    for name in lab.nodes:
        lab.ssh(name, f"docker pull -q {lab.image} >/dev/null", timeout=1200)
    node = list(lab.nodes)[-1]
    lab.ssh(node, "docker rm -f lab-down-victim >/dev/null 2>&1; "
                  f"docker run -d --name lab-down-victim --restart unless-stopped {lab.image} "
                  "sleep infinity", timeout=900)
    try:
        lab.cli("down")
        assert _leftovers() == []
        lab.cli("down")                                  # safe twice
        assert _leftovers() == []
        assert os.path.exists("/root/.cache/spark-vllm/lab/id_ed25519")   # caches are kept
        for name in lab.nodes:                           # so are the nodes' pulled layers
            assert os.listdir(f"/root/.cache/spark-vllm/lab/nodes/{name}/docker/image")
    finally:
        lab.cli("up", "--nodes", str(n))
    # host keys and the image digest survive down/up, so a stack file written once stays valid
    with open("/root/.cache/spark-vllm/lab/stack.json") as f:
        cfg = json.load(f)
    assert {n["name"]: n["hostKey"] for n in cfg["nodes"]} == \
        {k: v["hostKey"] for k, v in lab.nodes.items()}
    assert cfg["image"]["ref"] == lab.image
    for name in lab.nodes:
        assert subprocess.run(["python3", lab.cli.__globals__["LAB_PY"], "ssh", name, "hostname"],
                              capture_output=True, text=True,
                              check=False).stdout.strip() == name
        # a fresh machine that still has the lab image: no container, nothing to pull again
        assert lab.ssh(name, "docker ps -aq").stdout.strip() == ""
        # and its ConnectX-7 ports as a fresh Spark's: no address, the default MTU (the stack
        # configures them: components/fabric.py), no netplan file of a stack
        for fab in lab.nodes[name]["fabric"]:
            iface = fab["interface"]
            assert lab.ssh(name, f"ip -o -4 addr show dev {iface}").stdout.strip() == ""
            assert lab.ssh(name, f"cat /sys/class/net/{iface}/mtu").stdout.strip() == "1500"
        assert lab.ssh(name, "ls /etc/netplan/ | grep -c spark-vllm || true").stdout.strip() == "0"
        assert lab.ssh(name, f"docker image inspect {lab.image} >/dev/null && echo ok").stdout \
            .strip() == "ok"
