"""The fabric proven at speed on the lab (issue 51, components/collective.py), on the shared stack.

The shared stack's up ran the collective gate: the serving image's torch.distributed, one rank per
simulated Spark, Gloo (the lab has no GPU) over the primary twin, against Pulumi.dev.yaml's
threshold (fabric.collective.minBusGBps 0.05 GB/s, enforced on the lab). Here:
- what it measured is a stack output, the head's record `spark-vllm status` shows, and the NCCL
  build each node's vLLM loads shows in recon's report for every node;
- the threshold is a fraction of the raw TCP stream the lab carries between its nodes on the same
  twin, measured here (a quarter at most, so the lab's own speed never trips it);
- one lab link throttled with tc below the threshold (the bridge end of spark-2's primary twin,
  lab/net.py): `spark-vllm fabric test` says so and exits 1, and an up with an NCCL environment
  change (which would replace Ray and vLLM) stops at the gate, naming the figure and the
  threshold, with no container replaced; the link restored, the same up passes and serves.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time

import pulumi.automation as auto
import pytest

from lab.deployments import LAB, complete
from tests import reporting

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
PORT = "svf1-s2"  # lab/net.py host_ifs(2)["svl-fab1"]: spark-2's enp1s0f1np1 at the bridge
RECORD = "/var/lib/spark-vllm/stacks/dev/collective-gate.json"
THROTTLE = "50mbit"  # 6.25 MB/s: far below the lab's 0.05 GB/s threshold
# an NCCL environment change (Ray and vLLM would be replaced): NCCL's sockets on IPv4 only, which
# the lab's fabric is anyway (a value that is no number: `config set --path` would make it one)
EXTRA, VALUE = "NCCL_SOCKET_FAMILY", "AF_INET"

_RECV = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); t0 = time.monotonic(); n = 0
while True:
    b = c.recv(1 << 22)
    if not b:
        break
    n += len(b)
print(n, time.monotonic() - t0, flush=True)
"""
_SEND = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
buf = b"x" * (1 << 22)
for _ in range(int(sys.argv[3]) // len(buf)):
    c.sendall(buf)
c.close()
"""


def raw_tcp_gbps(dst: str, size: int = 256 << 20, runs: int = 3) -> float:
    """The median of `runs` plain TCP streams from the head to `dst` (the worker's primary twin),
    GB/s: one Python stream, as make bench's raw figure."""
    rates = []
    for i in range(runs):
        recv = subprocess.Popen([*LAB, "ssh", WORKER, "python3", "-c", _RECV, dst,
                                 str(29581 + i)], stdout=subprocess.PIPE, text=True)
        assert recv.stdout is not None and recv.stdout.readline().strip() == "listening"
        subprocess.run([*LAB, "ssh", HEAD, "python3", "-c", _SEND, dst, str(29581 + i),
                        str(size)], check=True, timeout=300)
        n, secs = recv.stdout.readline().split()
        recv.wait(timeout=60)
        assert int(n) == size
        rates.append(size / float(secs) / 1e9)
    return statistics.median(rates)


def gate(d) -> dict:
    return d.stack.outputs()["collectiveGate"].value


def test_the_up_ran_the_gate_over_gloo_and_its_figures_are_everywhere(stack, shared):
    d = stack
    assert shared.first_up is not None
    ops = shared.first_up.ops
    assert {f"collective-rank-{HEAD}", f"collective-rank-{WORKER}", "collective-check"} <= \
        set(ops), ops
    out = gate(d)
    print(f"[observed] collective gate: {json.dumps(out)}")
    assert out["verdict"] == "passed" and out["backend"] == "gloo" and out["ranks"] == 2
    assert out["enforced"] is True and out["thresholdGBps"] == 0.05
    assert out["allGatherBusGBps"] >= 0.05
    assert set(out["busbw"]["all_gather"]) == {"65536", "262144", "1048576", "4194304"}
    record = json.loads(d.ssh(HEAD, f"cat {RECORD}"))
    assert record == out
    status = d.cli("status", "-s", "dev")
    line = next(ln for ln in status.stdout.splitlines() if ln.startswith("fabric:"))
    assert line.startswith("fabric: collective gate passed: all_gather "), status.stdout
    assert "against 0.05 GB/s" in line and "(2 ranks, gloo)" in line
    # the NCCL each node's vLLM loads: the image's pip wheel (the lab image's torch is PyPI's
    # CUDA build), in recon's report for every node, and the host's (none on the lab)
    r = d.cli("recon", "-s", "dev", "--no-hub", "--no-last-up", timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for node in (HEAD, WORKER):
        m = re.search(rf"^nccl {node}: vLLM loads NCCL (\S+) \(pip's nvidia-nccl-cu13, build "
                      r"([0-9a-f]{12})\); the host's: none", r.stdout, re.M)
        assert m, r.stdout[-3000:]
        print(f"[observed] {m.group(0)}")
    assert re.search(r"^  nccl \(vLLM\)\s+2\.29\.7 pip nvidia-nccl-cu13 [0-9a-f]{8}\s+"
                     r"2\.29\.7 pip nvidia-nccl-cu13 [0-9a-f]{8}$", r.stdout, re.M), r.stdout


def test_the_threshold_is_a_fraction_of_the_raw_tcp_between_the_nodes(stack):
    d = stack
    raw = raw_tcp_gbps(d.cfg["nodes"][1]["fabric"][0]["ip"])
    threshold = gate(d)["thresholdGBps"]
    print(f"[observed] raw TCP on the primary twin {raw:.3f} GB/s; gate threshold {threshold}; "
          f"gloo all_gather busbw {gate(d)['allGatherBusGBps']}")
    assert threshold <= raw / 4, (threshold, raw)


def test_a_throttled_link_stops_the_up_before_vllm_and_the_restored_link_passes(stack):
    d = stack
    before = d.snapshot()
    subprocess.run(["tc", "qdisc", "add", "dev", PORT, "root", "tbf", "rate", THROTTLE,
                    "burst", "64kb", "latency", "400ms"], check=True)
    try:
        t0 = time.monotonic()
        cli = d.cli("fabric", "test", "-s", "dev", timeout=600)
        reporting.record("spark-vllm fabric test on a throttled link", time.monotonic() - t0)
        assert cli.returncode == 1, cli.stdout[-2000:] + cli.stderr[-2000:]
        assert re.search(r"collective gate failed: all_gather bus bandwidth 0\.0[0-4]\d+ GB/s "
                         r".* is below the threshold 0\.05 GB/s", cli.stderr), cli.stderr
        # an NCCL environment change: the gate runs again before Ray and vLLM would be replaced
        d.set(f"nccl.extraEnv.{EXTRA}", VALUE)
        t0 = time.monotonic()
        with pytest.raises(auto.CommandError) as err:
            d.run("up")
        reporting.record("up stopped by the collective gate (throttled link)",
                         time.monotonic() - t0)
        text = str(err.value)
        m = re.search(r"collective gate failed: all_gather bus bandwidth (\d+\.\d+) GB/s \(the "
                      r"best of the sweep, at [0-9]+ [KM]iB\) is below the threshold 0\.05 GB/s "
                      r"\(spark-vllm:fabric\.collective\.minBusGBps\); the up stops before vLLM "
                      r"changes\. Likely causes: nccl\.rdma is false", text)
        assert m, text[-3000:]
        print(f"[observed] {m.group(0)}")
        assert float(m.group(1)) < 0.05
        ops = d.ops()
        assert not any(k.startswith(("ray-", "vllm-")) and v != "same" for k, v in ops.items()
                       if k not in ("vllm",)), ops
        assert d.snapshot() == before, "a container changed although the gate failed"
        assert json.loads(d.ssh(HEAD, f"cat {RECORD}"))["stopped"] is True
        assert complete(d)  # the old vLLM still serves
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", PORT, "root"], check=False)
    try:
        t0 = time.monotonic()
        r = d.run("up")
        reporting.record("up after the link is restored (gate, Ray and vLLM)",
                         time.monotonic() - t0)
        assert r.summary.result == "succeeded"
        ops = d.ops()
        assert ops.get(f"collective-rank-{WORKER}") == "replace", ops
        assert ops.get("vllm-serve") == "replace", ops  # the NCCL change went through
        out = gate(d)
        assert out["verdict"] == "passed" and out["allGatherBusGBps"] >= 0.05, out
        assert json.loads(d.ssh(HEAD, f"cat {RECORD}"))["stopped"] is False
        assert complete(d)
    finally:
        d.stack.remove_config(f"spark-vllm:nccl.extraEnv.{EXTRA}", path=True)
    d.run("up")
    assert cli_passes(d)
    d.run("preview", expect_no_changes=True)


def cli_passes(d) -> bool:
    r = d.cli("fabric", "test", "-s", "dev", timeout=600)
    print(f"[observed] fabric test: {r.stdout.splitlines()[:1]}")
    return r.returncode == 0 and r.stdout.startswith("collective gate passed: all_gather ")
