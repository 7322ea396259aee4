"""Each simulated node's own memory and processes (issue 48, lab/memory.py, lab/hosts.py): what a
Spark's early OOM killer, its node exporter, recon and `spark-vllm status` need to read the node's
figures and act on the node's processes only.

* /proc/meminfo in a node is its own: MemTotal the node's memory cgroup limit, MemAvailable
  going down by what a process of that node holds (and not by what another node's holds);
* a node sees its own processes only (its PID namespace): neither the other node's sshd nor a
  process of this machine (the test's own marker) is in its /proc;
* so Debian's earlyoom run in a node (dry run: it only says what it would kill) picks a process
  of that node, whatever a process of the machine holds or how high its oom_score_adj;
* the lab's systemctl stand-in starts a unit enabled in the node from its drop-ins there, and a
  node's `crash` still kills a container's main process (its PID is the node's).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.lab

GIB = 1 << 30
NODE_MEMORY = 8 * GIB  # lab/layout.NODE_MEMORY_BYTES


def _meminfo(lab, node: str) -> dict[str, int]:
    out = lab.ssh(node, "cat /proc/meminfo").stdout
    return {m.group(1): int(m.group(2)) * 1024
            for m in re.finditer(r"^(\w+):\s+(\d+) kB$", out, re.M)}


def test_each_node_reads_its_own_memory(lab):
    a, b = list(lab.nodes)[:2]
    for node in (a, b):
        assert _meminfo(lab, node)["MemTotal"] == NODE_MEMORY, node
    before_a, before_b = _meminfo(lab, a)["MemAvailable"], _meminfo(lab, b)["MemAvailable"]
    hold = ("import sys, time; b = bytearray(b'\\x01') * (768 << 20); "
            "sys.stdout.write(open('/proc/meminfo').read()); sys.stdout.flush(); time.sleep(1)")
    out = lab.ssh(a, f"python3 -c \"{hold}\"").stdout
    held = int(re.search(r"^MemAvailable:\s+(\d+) kB$", out, re.M).group(1)) * 1024
    # 768 MiB held by a process of `a`: a's available memory is that much lower; b's is not
    assert before_a - held > 600 << 20, (before_a, held)
    assert abs(_meminfo(lab, b)["MemAvailable"] - before_b) < 400 << 20


def test_a_node_sees_only_its_own_processes(lab):
    a, b = list(lab.nodes)[:2]
    marker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                               "spark-vllm-lab-marker"])
    try:
        listed = lab.ssh(a, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").stdout
        assert "spark-vllm-lab-marker" not in listed
        assert f"/var/lib/spark-vllm-lab/{b}/ssh/sshd_config" not in listed
        assert f"/var/lib/spark-vllm-lab/{a}/ssh/sshd_config" in listed  # its own sshd
        # its init is the node's: PID 1 of its namespace
        assert lab.ssh(a, "cat /proc/1/comm").stdout.strip() == "tini"
    finally:
        marker.kill()
        marker.wait()


def test_earlyoom_in_a_node_picks_among_that_nodes_processes_only(lab):
    """A process of the machine holding 1 GiB with oom_score_adj 1000 would be any killer's
    first choice, were it visible: earlyoom in the node (--dryrun, acting at once: -m 99 while
    a process of the node holds 512 MiB of its 8) chooses a process of the node instead."""
    a = next(iter(lab.nodes))
    bait = subprocess.Popen([sys.executable, "-c",
                             "import time; open('/proc/self/oom_score_adj', 'w').write('1000'); "
                             "b = bytearray(b'\\x01') * (1 << 30); time.sleep(120)"])
    try:
        time.sleep(2)
        hold = "import time; b = bytearray(b'\\x01') * (512 << 20); time.sleep(8)"
        # the victim's command line read in the node (its pid is of the node's namespace)
        out = lab.ssh(a, f"python3 -c \"{hold}\" & sleep 2; "
                         "out=$(timeout 3 earlyoom --dryrun -m 99,99 -s 100,100 -r 0 2>&1); "
                         "echo \"$out\"; pid=$(echo \"$out\" | sed -n 's/.*sending SIG[A-Z]* "
                         "to process \\([0-9]*\\) .*/\\1/p' | head -n 1); echo '=== victim'; "
                         "tr '\\0' ' ' < /proc/$pid/cmdline; wait").stdout
        said, _, victim = out.partition("=== victim\n")
        assert re.search(r"sending SIG\w+ to process \d+ uid \d+ ", said), out
        assert "dryrun" in said
        # a process of the node (the one holding 512 MiB of it), never the machine's bait
        assert victim and "1 << 30" not in victim, out
        assert "512 << 20" in victim, out
    finally:
        bait.kill()
        bait.wait()


def test_the_systemctl_stand_in_runs_earlyoom_in_the_node_from_its_drop_in(lab):
    """A drop-in's ExecStart is what the stand-in starts (restarted after a daemon-reload). On a
    lab where a stack runs (after `make demo`: the node's guard has its own drop-in and earlyoom
    running), the test's drop-in sorts last and earlyoom is put back as it was afterwards."""
    node = list(lab.nodes)[-1]
    dropin = "/etc/systemd/system/earlyoom.service.d/99-lab-test.conf"
    was = lab.ssh(node, "systemctl is-active earlyoom.service", check=False).stdout.strip()
    script = (f"mkdir -p {dropin.rsplit('/', 1)[0]} && printf '[Service]\\nExecStart=\\n"
              "ExecStart=/usr/bin/earlyoom -M 262144 -s 100 -r 3600\\n' > " + dropin +
              " && systemctl daemon-reload && systemctl enable earlyoom.service && "
              "systemctl restart earlyoom.service && systemctl is-active earlyoom.service && "
              "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value earlyoom.service)/cmdline")
    try:
        out = lab.ssh(node, script).stdout.split("\n")
        assert out[0] == "active" and out[1].startswith("/usr/bin/earlyoom -M 262144 "), out
        log = lab.ssh(node, "journalctl -u earlyoom.service -o cat").stdout
        assert "mem total:" in log and "8192 MiB" in log, log  # the node's memory, as it read it
    finally:
        back = ("systemctl restart earlyoom.service" if was == "active"
                else "systemctl disable --now earlyoom.service")
        lab.ssh(node, f"rm -f {dropin}; systemctl daemon-reload; {back}", check=False)
    assert lab.ssh(node, "systemctl is-active earlyoom.service", check=False).stdout.strip() \
        == ("active" if was == "active" else "inactive")


def test_crash_kills_a_containers_main_process_in_the_node(lab):
    node = list(lab.nodes)[-1]
    lab.ssh(node, "docker rm -f lab-crash-victim >/dev/null 2>&1; docker run -d --restart "
                  f"unless-stopped --name lab-crash-victim {lab.image} sleep infinity",
            timeout=900)
    try:
        lab.cli("crash", node, "lab-crash-victim")
        lab.wait_until(lambda: lab.ssh(node, "docker inspect -f '{{.RestartCount}}' "
                                             "lab-crash-victim").stdout.strip() == "1",
                       60, what="Docker to restart the crashed container")
    finally:
        lab.ssh(node, "docker rm -f lab-crash-victim", check=False)
