"""A node that survives memory exhaustion, on the lab (issue 48): the guard the stack keeps on
every node (components/guard.py), against a real memory exhaustion of a node.

Each lab node has 8 GiB of its own (its memory cgroup's limit, which its /proc/meminfo shows:
lab/memory.py) and sees its own processes only (its PID namespace), so earlyoom in it acts on
the node's figures and the node's processes, as on a Spark. On the session's shared stack
(tests/e2e/conftest.py; the dev stack file's guard: earlyoom at the OS reserve of 1 GiB, vLLM's
oom_score_adj 1000, vLLM started again 5 s after an OOM kill). In order:

1. the guard is in place: the stack's drop-ins on every node, earlyoom running in each node
   with the stack's command line, the head's vLLM processes at oom_score_adj 1000 and its
   watchdog reading the node's kill record;
2. drift: on the worker the ssh drop-in removed and earlyoom stopped by hand: the preview
   replaces exactly those two commands of the worker's guard, the up restores both, and a
   preview after it wants nothing;
3. monitoring on (the alert needs Prometheus; off again at the module's end, as the modules
   before left it), then the head pushed below its reserve from inside vLLM's container (an
   allocation in it, bounded by the node's 8 GiB, never by the machine's): earlyoom kills vLLM
   (a vLLM process, never sshd: an ssh round trip to the head every second through the whole
   case never fails, and sshd and dockerd keep their PIDs), vLLM serves again with no `up`,
   `spark-vllm status` says OOM-killed with the node's available memory then, Prometheus fires
   SparkVllmOomKilled for the head, and the next preview's preflight warns with the figure and
   wants no change.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
import time

import pytest

from hostscripts import guard as g
from inspection.parsers import parse_oom_kills
from inspection.preflight import gib, oom_text
from lab.deployments import complete
from lab.layout import KNOWN_HOSTS, LAB_KEY, NODE_MEMORY_BYTES
from tests import reporting

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
SERVE = "spark-vllm-dev-serve"
RESERVE = 1 << 30  # Pulumi.dev.yaml preflight.osReserveBytes
DATA = "/var/lib/spark-vllm/stacks/dev/prometheus-data"
PROM = "http://127.0.0.1:9090"
DROPIN = {u: f"/etc/systemd/system/{u}.d/50-spark-vllm-dev.conf"
          for u in ("ssh.service", "docker.service", "earlyoom.service")}
SPEC = g.GuardSpec(node=HEAD, stack="dev", killer="earlyoom", reserve_bytes=RESERVE,
                   protect_score_adj=-900)


def _wait(pred, timeout: float, what: str, interval: float = 2.0):
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            last = pred()
            if last:
                return last
        except Exception as e:  # the last error is reported on timeout
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def _meminfo(d, node: str) -> dict[str, int]:
    out = d.ssh(node, "cat /proc/meminfo")
    return {m.group(1): int(m.group(2)) * 1024
            for m in re.finditer(r"^(\w+):\s+(\d+) kB$", out, re.M)}


def test_the_guard_is_in_place_on_every_node(stack):
    d = stack
    argv = " ".join(g.earlyoom_argv(SPEC))
    for node in (HEAD, WORKER):
        for path in DROPIN.values():
            assert d.ssh(node, f"cat {path}").startswith("# spark-vllm stack dev: "), path
        running = d.ssh(node, "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value "
                              "earlyoom.service)/cmdline")
        assert running.strip() == argv, running
        # it reads the node's memory: its own figures, as its log's first lines say
        assert f"mem total: {NODE_MEMORY_BYTES >> 20} MiB" in d.ssh(
            node, "journalctl -u earlyoom.service -o cat | grep 'mem total' | tail -n 1")
    # the head's vLLM raised its own oom_score_adj; its watchdog keeps the container's
    top = d.ssh(HEAD, f"docker top {SERVE} -eo pid,args")
    pids = {int(line.split()[0]): line for line in top.splitlines()[1:] if line.strip()}
    adj = {pid: int(d.ssh(HEAD, f"cat /proc/{pid}/oom_score_adj")) for pid in pids}
    # the watchdog (python3 -c <its payload> ... vllm serve ...) and what vLLM started: its
    # API server (vllm serve ...), its processes (VLLM::...), their helpers (python3 -c ...)
    watchdog = [p for p, line in pids.items() if "spark-vllm-liveness" in line]
    vllm = [p for p in pids if p not in watchdog]
    assert len(watchdog) == 1 and adj[watchdog[0]] == 0, (pids, adj)
    assert [p for p in vllm if "vllm serve" in pids[p] or "VLLM::" in pids[p]], pids
    assert vllm and all(adj[p] == 1000 for p in vllm), (pids, adj)
    assert d.ssh(HEAD, f"docker exec {SERVE} test -f /run/spark-vllm-guard/kills && echo ok"
                 ).strip() == "ok"


def test_a_drift_behind_the_stack_is_repaired_by_the_next_up(stack):
    d = stack
    d.ssh(WORKER, f"rm -f {DROPIN['ssh.service']}; systemctl stop earlyoom.service")
    d.run("preview")
    ops = {k: v for k, v in d.ops().items() if not k.startswith("spark-vllm-")}
    assert ops == {"guard-spark-2-daemons": "replace", "guard-spark-2-earlyoom": "replace"}, ops
    ops = d.timed_up("the worker's guard changed by hand")
    assert {k: v for k, v in ops.items() if not k.startswith("spark-vllm-")} == {
        "guard-spark-2-daemons": "replace", "guard-spark-2-earlyoom": "replace"}, ops
    assert d.ssh(WORKER, f"cat {DROPIN['ssh.service']}").startswith("# spark-vllm stack dev")
    assert d.ssh(WORKER, "systemctl is-active earlyoom.service").strip() == "active"
    d.run("preview", expect_no_changes=True)


@pytest.fixture(scope="module")
def monitored(stack):
    """Monitoring on for the OOM case's alert, off again after it (its data folder removed),
    as test_monitoring.py left the stack."""
    d = stack
    d.set("monitoring.enabled", True)
    d.timed_up("monitoring on for the guard's alert")
    yield d
    d.set("monitoring.enabled", False)
    try:
        d.timed_up("monitoring off again")
    finally:
        d.ssh(HEAD, f"rm -rf {DATA}", check=False)


class SshEverySecond:
    """An ssh round trip to a node every second (its own ssh, not the lab CLI: one process per
    trip), each within 10 s; every failure kept."""

    def __init__(self, host: str) -> None:
        self.argv = ["ssh", "-i", LAB_KEY, "-o", f"UserKnownHostsFile={KNOWN_HOSTS}",
                     "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                     "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR", f"root@{host}", "true"]
        self.trips, self.failures = 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                rc = subprocess.run(self.argv, capture_output=True, timeout=10).returncode
            except subprocess.TimeoutExpired:
                rc = -1
            self.trips += 1
            if rc != 0:
                self.failures.append((time.strftime("%H:%M:%S"), rc))
            self.stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

    def __enter__(self) -> SshEverySecond:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


# In vLLM's container: take `n` bytes, 64 MiB at a time about 16 times a second (earlyoom polls
# at least every 100 ms as memory runs low), each page touched; then hold them. Killed with the
# container when vLLM goes; ends by itself after 5 minutes.
ALLOCATE = ("import sys, time\n"
            "n, held = int(sys.argv[1]), []\n"
            "while n > 0:\n"
            "    held.append(bytearray(b'\\x01') * min(n, 64 << 20))\n"
            "    n -= 64 << 20\n"
            "    time.sleep(0.06)\n"
            "time.sleep(300)\n")


def _kills(d) -> list[str]:
    return [line for line in d.ssh(HEAD, f"cat {g.KILLS}").splitlines() if line.strip()]


def _alerts(d) -> list[dict]:
    code = ("import json,sys,urllib.request;"
            "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())")
    return json.loads(d.ssh(HEAD, f"python3 -c '{code}' '{PROM}/api/v1/alerts'"))["data"][
        "alerts"]


def test_vllm_out_of_memory_is_killed_first_and_serves_again_with_no_up(monitored):
    d = monitored
    assert complete(d)
    pids = {what: d.ssh(HEAD, f"cat /run/{f}").strip()
            for what, f in (("sshd", "sshd.pid"), ("dockerd", "docker.pid"))}
    restarts = int(d.ssh(HEAD, f"docker inspect -f '{{{{.RestartCount}}}}' {SERVE}"))
    before = _kills(d)
    cgroup = f"/sys/fs/cgroup/memory/svl-lab/{HEAD}"
    with open(f"{cgroup}/memory.limit_in_bytes") as f:
        assert int(f.read()) == NODE_MEMORY_BYTES  # the allocation's bound: the node's
    avail = _meminfo(d, HEAD)["MemAvailable"]
    take = avail - RESERVE + (256 << 20)  # 256 MiB below the reserve: earlyoom's SIGTERM
    assert take > 0, avail
    with SshEverySecond("10.77.0.11") as trips:
        t0 = time.monotonic()
        code = base64.b64encode(ALLOCATE.encode()).decode()
        d.ssh(HEAD, f"docker exec -d {SERVE} python3 -c 'import base64; "
                    f"exec(base64.b64decode(\"{code}\"))' {take}")
        killed = _wait(lambda: _kills(d)[len(before):], 120, "earlyoom's kill on the head", 1)
        kill_s = time.monotonic() - t0
        served = _wait(lambda: complete(d), 300, "vLLM serving again", 3)
        back_s = time.monotonic() - t0
    reporting.record("guard: an allocation in vLLM's container to earlyoom's kill", kill_s)
    reporting.record("guard: to vLLM serving again, no up", back_s)
    assert served
    # earlyoom's first kill: a vLLM process, with the node's memory below the reserve when it
    # acted; none of its kills (one more, the allocation itself, if vLLM's memory was not
    # enough) took a process it avoids
    assert killed
    kills = _kills(d)[len(before):]
    line = kills[0]
    t, available, total, _pid, victim = line.split()
    assert re.match(g.PREFER, victim), line
    assert int(available) < RESERVE and int(total) == NODE_MEMORY_BYTES, line
    assert not [k for k in kills if re.match(g.AVOID, k.split()[4])], kills
    # sshd never went: every round trip answered, and the node's sshd and dockerd are the same
    assert trips.trips >= 10 and trips.failures == [], (trips.trips, trips.failures)
    assert {what: d.ssh(HEAD, f"cat /run/{f}").strip()
            for what, f in (("sshd", "sshd.pid"), ("dockerd", "docker.pid"))} == pids
    # Docker restarted vLLM's container (the watchdog ended with vLLM); the memory is back
    assert int(d.ssh(HEAD, f"docker inspect -f '{{{{.RestartCount}}}}' {SERVE}")) > restarts
    assert _meminfo(d, HEAD)["MemAvailable"] > RESERVE
    # the watchdog recorded it and waited longer before the next start
    logs = d.ssh(HEAD, f"docker logs {SERVE} 2>&1 | grep 'spark-vllm liveness' | tail -n 20")
    assert "vLLM was OOM-killed at " in logs and "(guard.oomBackoffSeconds)" in logs, logs
    # `spark-vllm status`: serving, and when it was OOM-killed with how much the node had
    code, data = d.status()
    (main,) = [m for m in data["models"] if m["kind"] == "main"]
    assert code == 0 and main["state"] == "serving", data
    # the watchdog's record of the kill that ended its vLLM: one of earlyoom's kills of a vLLM
    # process, said with the node's memory then
    said = {oom_text(k): k for k in parse_oom_kills("\n".join(kills) + "\n")
            if re.match(g.PREFER, k.name)}
    assert main["oom"] in said, (main["oom"], list(said))
    k = said[main["oom"]]
    assert k.available_bytes is not None and k.available_bytes < RESERVE
    assert f"(node available {gib(k.available_bytes)} of {gib(NODE_MEMORY_BYTES)}; " \
        f"earlyoom killed {k.name})" in main["oom"], main["oom"]
    assert victim in [k["name"] for k in data["nodes"][HEAD]["oomKills"]]
    # Prometheus: SparkVllmOomKilled fires for the head
    fired = _wait(lambda: [a for a in _alerts(d) if a["labels"]["alertname"] ==
                           "SparkVllmOomKilled" and a["state"] == "firing"], 120,
                  "SparkVllmOomKilled firing", 5)
    assert {a["labels"]["node"] for a in fired} >= {HEAD}, fired
    # the next preview: no change to make, and preflight's warning with the figure
    r = d.run("preview")
    assert d.ops() == {}, d.ops()
    warned = [ln for ln in r.stdout.splitlines() if "OOM-killed at" in ln]
    assert warned and "earlyoom killed " in warned[0] and HEAD in warned[0], r.stdout[-3000:]
    assert int(t) > 0
