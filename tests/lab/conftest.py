"""Fixtures for tests of the lab itself (tests/lab). Marked `lab`; skipped with a reason when not
root or when the lab is not up. LAB_AUTO=1 lets the session fixture run `lab.py up` first."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_PY = os.path.join(REPO, "lab", "lab.py")
CACHE = "/root/.cache/spark-vllm/lab"
STACK_JSON = os.path.join(CACHE, "stack.json")
IDENTITY = os.path.join(REPO, "lab", "identity")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "lab: needs root and the simulated Spark lab (python3 lab/lab.py up)")


def lab_cli(*args, check=True, timeout=1800):
    p = subprocess.run([sys.executable, LAB_PY, *args], capture_output=True, text=True,
                       timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise AssertionError(
            f"lab.py {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def _lab_is_up() -> str | None:
    """None when usable, else the reason it is not."""
    if not os.path.exists(STACK_JSON):
        return f"{STACK_JSON} missing"
    try:
        urllib.request.urlopen("http://10.77.0.1:5000/v2/", timeout=2)
    except Exception as e:
        return f"lab registry not reachable ({e})"
    st = lab_cli("status", check=False).stdout
    if " DOWN" in st:
        return "some lab component is DOWN:\n" + st
    return None


class Lab:
    def __init__(self):
        with open(STACK_JSON) as f:
            self.cfg = json.load(f)
        self.nodes = {n["name"]: n for n in self.cfg["nodes"]}
        self.image = self.cfg["image"]["ref"]
        self.known_hosts = os.path.join(CACHE, "known_hosts")
        with open(self.known_hosts, "w") as f:
            f.writelines(f"{n['host']} {n['hostKey']}\n" for n in self.cfg["nodes"])

    @staticmethod
    def fixture(name: str) -> str:
        return fixture_body(name)

    @staticmethod
    def wait_until(pred, timeout=60, interval=1.0, what="condition"):
        return wait_until(pred, timeout, interval, what)

    @staticmethod
    def cli(*args, check=True, timeout=1800):
        return lab_cli(*args, check=check, timeout=timeout)

    def ssh_argv(self, node: str, cmd: str) -> list:
        n = self.nodes[node]
        return ["ssh", "-i", self.cfg["sshKeyPath"], "-p", str(n.get("port", 22)),
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
                f"root@{n['host']}", cmd]

    def ssh(self, node: str, cmd: str, check=True, timeout=600) -> subprocess.CompletedProcess:
        p = subprocess.run(self.ssh_argv(node, cmd), capture_output=True, text=True,
                           timeout=timeout, check=False)
        if check and p.returncode != 0:
            raise AssertionError(f"[{node}] {cmd!r} exited {p.returncode}\n"
                                 f"stdout:{p.stdout}\nstderr:{p.stderr}")
        return p


def fixture_body(name: str) -> str:
    with open(os.path.join(IDENTITY, name)) as f:
        return f.read().split("\n", 1)[1]




@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0:
        pytest.skip("lab tests need root (network namespaces, bridges, dockerd)")
    from lab.deployments import lock_lab  # re-entrant: e2e may run in the same session

    held = lock_lab()
    reason = _lab_is_up()
    if reason and os.environ.get("LAB_AUTO") == "1":
        lab_cli("up")
        reason = _lab_is_up()
    if reason:
        pytest.skip(f"the lab is not up ({reason}); run `python3 lab/lab.py up` or set LAB_AUTO=1")
    lab = Lab()
    # A stack left running on the lab (`make demo`) holds Ray's host ports: clear it first.
    for node in lab.nodes:
        lab_cli("ssh", node, "sh", "-c",
                "docker ps -aq --filter label=spark-vllm.managed=true | xargs -r docker rm -f",
                check=False)
    configure_fabric(lab)
    yield lab
    held.close()


def configure_fabric(lab: Lab) -> None:
    """The lab leaves the nodes' ConnectX-7 ports unconfigured, as a fresh Spark has them (a
    stack with fabric.manage configures them). The lab tier, which runs Ray, vLLM and pings
    over the fabric without a stack, configures it with the stack's own script
    (hostscripts/fabric_config.py, under the stack name `lab-tier`), as `pulumi up` would."""
    import ipaddress

    from hostscripts.fabric_config import InterfaceSpec, apply_script

    nets = [ipaddress.IPv4Network(s) for s in lab.cfg["fabricSubnets"]]
    for name, node in lab.nodes.items():
        for fab in node["fabric"]:
            net = next(n for n in nets if ipaddress.IPv4Address(fab["ip"]) in n)
            spec = InterfaceSpec(node=name, stack="lab-tier", interface=fab["interface"],
                                 address=f"{fab['ip']}/{net.prefixlen}", mtu=lab.cfg["mtu"])
            p = subprocess.run(lab.ssh_argv(name, "sh -s"), input=apply_script(spec),
                               capture_output=True, text=True, timeout=60, check=False)
            if p.returncode != 0:
                raise AssertionError(f"[{name}] configuring {fab['interface']} failed:\n"
                                     f"{p.stdout}{p.stderr}")


def wait_until(pred, timeout=60, interval=1.0, what="condition"):
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            last = pred()
            if last:
                return last
        except Exception as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
