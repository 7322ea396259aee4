"""The collective gate's arithmetic and verdict (inspection/collective.py, issue 51).

The bandwidths are checked on nccl-tests' own published lines (tests/fixtures/nccl-tests,
INDEX.md: sources): size, time, algbw and busbw as nccl-tests printed them, recomputed here from
size, time and ranks with the formula of its doc/PERFORMANCE.md, to the digits it printed. The
payload the ranks run (hostscripts/payloads/collective_bench.py) computes the same figures for
its own table: both are checked against the same lines.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hostscripts.collective import FAILED
from inspection import collective as c
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "nccl-tests"
NCCL_LOGS = ROOT / "tests" / "fixtures" / "nccl"


def _bench():
    """The payload as a module (its torch import is inside main(): importing it runs nothing)."""
    path = ROOT / "hostscripts" / "payloads" / "collective_bench.py"
    spec = importlib.util.spec_from_file_location("collective_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def published(name: str) -> list[tuple[int, int, float, float, float, float, float, float]]:
    """(size, count, out-of-place time us, algbw, busbw, in-place time us, algbw, busbw) of each
    result line of a fixture (the lines that do not start with '#')."""
    rows = []
    for line in (FIXTURES / name).read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = line.split()
        rows.append((int(f[0]), int(f[1]), float(f[5]), float(f[6]), float(f[7]), float(f[9]),
                     float(f[10]), float(f[11])))
    assert rows, name
    return rows


CASES = [
    ("all-gather-two-sparks-playbooks-issue25.txt", "all_gather", 2, 4),
    ("all-reduce-two-sparks-playbooks-pr103.txt", "all_reduce", 2, 4),
    ("all-gather-two-gpus-nccl-issue1435.txt", "all_gather", 2, 2),
    ("all-reduce-eight-ranks-mooncake-pr3484.txt", "all_reduce", 8, 4),
]


@pytest.mark.parametrize(("name", "op", "ranks", "element"), CASES)
def test_bandwidths_reproduce_nccl_tests_published_figures(name, op, ranks, element):
    bench = _bench()
    for size, count, t_out, alg_out, bus_out, t_in, alg_in, bus_in in published(name):
        # all_gather's size is what each rank sends x the ranks; all_reduce's its buffer
        assert size == count * element * (ranks if op == "all_gather" else 1)
        for t_us, algbw, busbw in ((t_out, alg_out, bus_out), (t_in, alg_in, bus_in)):
            mine = c.bandwidths(op, size, t_us * 1e-6, ranks)
            # nccl-tests prints two decimals of figures computed from the unrounded time; the
            # time it prints is rounded too (4 significant digits at least)
            assert mine[0] == pytest.approx(algbw, abs=0.006, rel=1e-3), (name, size)
            assert mine[1] == pytest.approx(busbw, abs=0.006, rel=1e-3), (name, size)
            assert bench.bandwidths(op, size, t_us * 1e-6, ranks) == pytest.approx(mine)


def test_the_bus_factor_is_nccl_tests_summary():
    assert c.bus_factor("all_reduce", 2) == 1.0
    assert c.bus_factor("all_reduce", 8) == 1.75
    assert c.bus_factor("all_gather", 2) == 0.5
    assert c.bus_factor("all_gather", 3) == pytest.approx(2 / 3)
    # one rank moves nothing across: bus bandwidth 0, as nccl-tests prints for one GPU
    assert c.bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        c.bus_factor("broadcast", 2)
    with pytest.raises(ValueError, match="at least 1"):
        c.bus_factor("all_gather", 0)
    bench = _bench()
    for op in ("all_gather", "all_reduce"):
        for n in (1, 2, 3, 8):
            assert bench.bus_factor(op, n) == c.bus_factor(op, n)


def test_the_payload_splits_all_gather_like_nccl_tests():
    """nccl-tests' AllGatherGetCollByteCount: the count per rank is the size / ranks, aligned to
    16 bytes; the whole collective is that x the ranks."""
    bench = _bench()
    assert bench.counts("all_gather", 1 << 20, 2) == (131072, 1 << 20)
    assert bench.counts("all_gather", 1 << 20, 3) == (87380, 87380 * 4 * 3)
    assert bench.counts("all_reduce", 1 << 20, 3) == (262144, 1 << 20)
    assert bench.peak_bytes("all_gather", 1 << 20, 2) == (1 << 20) + (1 << 19)


def test_the_sweep_grows_by_four_and_stays_within_the_free_memory():
    assert c.sweep(1 << 20, 1 << 30) == [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]
    assert c.sweep(65536, 4 << 20, [20 << 30]) == [65536, 1 << 18, 1 << 20, 1 << 22]
    # 16 GiB free on the smaller node: buffers of twice a size within an eighth of it -> 1 GiB
    assert c.sweep(1 << 20, 1 << 30, [100 << 30, 16 << 30])[-1] == 1 << 30
    # 10 GiB free: 1 GiB would need 2 GiB of buffers, more than 1.25 GiB -> 256 MiB
    assert c.sweep(1 << 20, 1 << 30, [10 << 30, None])[-1] == 1 << 28
    # nothing fits: the smallest size still, which the ranks then skip by themselves
    assert c.sweep(1 << 20, 1 << 30, [1 << 20]) == [1 << 20]


def rank(rank: int = 0, world: int = 2, results=None, **kw) -> dict:
    out = {"rank": rank, "world": world, "backend": "gloo", "device": "cpu", "host": "h",
           "torch": "2.13.0+cu130", "ncclVersion": None, "results": results if results is not None
           else [{"op": "all_gather", "bytes": 1 << 20, "count": 131072, "iters": 5,
                  "seconds": 0.001}, {"op": "all_reduce", "bytes": 1 << 20, "count": 262144,
                                      "iters": 5, "seconds": 0.002}],
           "skipped": [], "stopped": None, "memoryAvailable": 1 << 34, "ncclLog": [],
           "seconds": 3.5}
    out.update(kw)
    return out


def line(obj: dict) -> str:
    return json.dumps(obj)


def test_parse_rank_reads_the_last_json_line_and_refuses_a_failed_rank():
    text = "a warning from torch\n" + line(rank())
    r = c.parse_rank("spark-1", text)
    assert r.world == 2 and r.results[0].op == "all_gather"
    failed = line(rank(stopped="DistBackendError: timed out")) + \
        f"\n{FAILED} exit 1\nstderr: Traceback\nstderr: DistBackendError: timed out\n"
    with pytest.raises(c.CollectiveError, match=r"spark-2: collective rank failed: exit 1 "
                                                r"\| stderr: Traceback"):
        c.parse_rank("spark-2", failed)
    with pytest.raises(c.CollectiveError, match="printed no answer: docker: no such image"):
        c.parse_rank("spark-2", "docker: no such image\n")
    with pytest.raises(c.CollectiveError, match="not readable"):
        c.parse_rank("spark-2", '{"rank": -1}')


def test_a_fabric_at_speed_passes_and_says_its_figures():
    # 1 MiB all_gather in 1 ms over two ranks: algbw 1.049 GB/s, busbw 0.524 GB/s
    v = c.judge({"spark-1": c.parse_rank("spark-1", line(rank())),
                 "spark-2": c.parse_rank("spark-2", line(rank(1)))},
                threshold=0.5, enforce=True, rdma=False)
    assert v.problems == [] and v.warnings == []
    assert v.lines[0] == ("collective gate passed: all_gather 0.524 GB/s against 0.5 GB/s; "
                          "all_reduce 0.524 GB/s")
    assert "all_gather busbw: 1 MiB 0.524 GB/s" in v.lines
    assert v.summary["verdict"] == "passed" and v.summary["stopped"] is False
    assert v.summary["allGatherBusGBps"] == pytest.approx(0.5243, abs=1e-4)
    assert v.summary["busbw"]["all_gather"] == {str(1 << 20): pytest.approx(0.5243, abs=1e-4)}
    record = c.parse_record(json.dumps(v.summary))
    assert record.line() == ("passed: all_gather 0.524 GB/s against 0.5 GB/s, all_reduce "
                             "0.524 GB/s (2 ranks, gloo)")


def test_below_the_threshold_stops_where_enforced_naming_figure_threshold_and_causes():
    reports = {"spark-1": c.parse_rank("spark-1", line(rank())),
               "spark-2": c.parse_rank("spark-2", line(rank(1)))}
    nodes = {"spark-1": c.NodeFabric(env={"NCCL_IB_HCA": "rocep1s0f1"}, twins=2, twins_up=2),
             "spark-2": c.NodeFabric(env={"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1"}, twins=2,
                                     twins_up=1)}
    v = c.judge(reports, threshold=21.875, enforce=True, rdma=True, mtu=1500, nodes=nodes)
    assert len(v.problems) == 1 and v.warnings == []
    p = v.problems[0]
    assert p.startswith("all_gather bus bandwidth 0.524 GB/s (the best of the sweep, at 1 MiB) "
                        "is below the threshold 21.875 GB/s (spark-vllm:fabric.collective."
                        "minBusGBps); the up stops before vLLM changes. Likely causes: "), p
    assert "spark-1: NCCL_IB_HCA names rocep1s0f1: 1 of its 2 cabled twins unused" in p
    assert "spark-2: 1 of its 2 fabric twins without carrier (one twin unused)" in p
    assert "the fabric MTU is 1500, not 9000" in p
    assert p.endswith(c.CHECKLIST)
    assert v.summary["verdict"] == "below threshold" and v.summary["stopped"] is True
    # in dev (not enforced) the same figure is a warning and the up goes on
    v = c.judge(reports, threshold=21.875, enforce=False, rdma=False)
    assert v.problems == [] and len(v.warnings) == 1
    assert "nccl.rdma is false: NCCL runs over TCP sockets" in v.warnings[0]
    assert "the up stops" not in v.warnings[0]
    assert v.lines[0].endswith("(not enforced here)")
    assert v.summary["stopped"] is False and v.summary["verdict"] == "below threshold"


def test_a_gate_that_cannot_measure_fails_closed_where_enforced():
    ok = c.parse_rank("spark-1", line(rank()))
    why = "spark-2: collective rank failed: exit 3 | stderr: past its deadline of 300 s"
    v = c.judge({"spark-1": ok, "spark-2": why}, threshold=1.0, enforce=True, rdma=False)
    assert v.problems == [
        "the collective bandwidth could not be measured, so the fabric's speed is not proven: "
        f"{why}; the up stops before vLLM changes"]
    assert v.summary["verdict"] == "not measured"
    assert v.summary["allGatherBusGBps"] == pytest.approx(0.5243, abs=1e-4)
    # every rank answered but none measured all_gather (its sizes all skipped)
    empty = c.parse_rank("spark-1", line(rank(results=[], stopped="no memory")))
    v = c.judge({"spark-1": empty, "spark-2": empty}, threshold=1.0, enforce=True, rdma=False)
    assert "no all_gather figure (no memory)" in v.problems[0]
    v = c.judge({}, threshold=1.0, enforce=True, rdma=False)
    assert "no rank answered" in v.problems[0]
    v = c.judge({"spark-1": why}, threshold=1.0, enforce=False, rdma=False)
    assert v.problems == [] and v.warnings[0].startswith("the collective bandwidth could not")


def _log(name: str) -> list[str]:
    return [ln for ln in (NCCL_LOGS / name).read_text().splitlines()[1:] if "NCCL INFO" in ln]


def test_the_causes_read_the_ranks_own_nccl_log():
    """A rank's ncclLog is NCCL's own INFO lines (recorded real logs here,
    tests/fixtures/nccl/INDEX.md): a TCP fallback and GPU Direct RDMA off are named."""
    socket = c.parse_rank("spark-2", line(rank(1, ncclLog=_log(
        "nccl-no-ib-device-socket-2.19.3.txt"))))
    gdr_off = c.parse_rank("spark-1", line(rank(0, ncclLog=_log(
        "ray-socket-gdr-disabled-ray40850.txt"))))
    v = c.judge({"spark-1": gdr_off, "spark-2": socket}, threshold=10.0, enforce=True, rdma=True)
    p = v.problems[0]
    assert "spark-2: NCCL fell back to TCP sockets (spark-2: Socket TCP FALLBACK" in p, p
    assert "spark-1: GPU Direct RDMA off" in p, p
    assert any(ln.startswith("spark-2: NCCL spark-2: Socket TCP FALLBACK") for ln in v.lines)
    assert "spark-2" in v.summary["transport"]


def test_one_twin_unused_is_read_from_the_hcas_nccl_used():
    used = ["host:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB "
            "enp1s0f1np1:192.168.177.11<0>", "host:1:1 [0] NCCL INFO Using network IB"]
    r = c.parse_rank("spark-1", line(rank(0, ncclLog=used)))
    nodes = {"spark-1": c.NodeFabric(env={"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1"}, twins=2,
                                     twins_up=2)}
    v = c.judge({"spark-1": r}, threshold=10.0, enforce=True, rdma=True, nodes=nodes)
    assert ("spark-1: NCCL used rocep1s0f1 only of NCCL_IB_HCA rocep1s0f1,roceP2p1s0f1 (one "
            "twin unused)") in v.problems[0]


def test_the_record_is_refused_when_it_is_not_one():
    with pytest.raises(ValueError, match="not a collective gate record"):
        c.parse_record("{}")
    with pytest.raises(ValueError, match="not a collective gate record"):
        c.parse_record("garbage")


def test_fixtures_are_indexed():
    index = (FIXTURES / "INDEX.md").read_text()
    for path in sorted(Path(FIXTURES).glob("*.txt")):
        assert f"| {path.name} |" in index, path.name
        assert path.read_text().startswith("# source: https://github.com/"), path.name


LAB = ROOT / "tests" / "fixtures" / "collective"


def _lab(name: str) -> str:
    return (LAB / name).read_text().split("\n", 1)[1]


def test_the_labs_gloo_run_passes_the_labs_threshold():
    """Both ranks of a real gate on the lab (tests/fixtures/collective/INDEX.md), judged as the
    lab's dev stack judges them (Pulumi.dev.yaml: 0.05 GB/s, enforced)."""
    reports = {n: c.parse_rank(n, _lab(f"gloo-lab-rank-{n}.txt")) for n in ("spark-1", "spark-2")}
    assert [r.rank for r in reports.values()] == [0, 1]
    assert all(r.backend == "gloo" and r.world == 2 and r.nccl_log == [] for r in reports.values())
    # the ranks agree on every figure: each time is the average over both ranks
    assert reports["spark-1"].results == reports["spark-2"].results
    v = c.judge(reports, threshold=0.05, enforce=True, rdma=False, mtu=9000)
    assert v.problems == [] and v.summary["verdict"] == "passed"
    assert v.summary["allGatherBusGBps"] == pytest.approx(0.4095, abs=1e-3)
    assert list(v.summary["busbw"]["all_gather"]) == ["65536", "262144", "1048576", "4194304"]
    # the payload's own busbw column is the same formula: it agrees with the recomputed one
    for m, f in zip(reports["spark-1"].results, c.figures(reports["spark-1"]), strict=True):
        raw = json.loads(_lab("gloo-lab-rank-spark-1.txt"))["results"]
        mine = next(x for x in raw if x["op"] == m.op and x["bytes"] == m.bytes)
        assert mine["busbw"] == pytest.approx(f.busbw, abs=1e-4)


def test_the_labs_throttled_run_is_refused_naming_the_figure_and_the_threshold():
    reports = {n: c.parse_rank(n, _lab(f"gloo-lab-throttled-rank-{n}.txt"))
               for n in ("spark-1", "spark-2")}
    v = c.judge(reports, threshold=0.05, enforce=True, rdma=False, mtu=9000)
    assert v.summary["verdict"] == "below threshold" and v.summary["stopped"] is True
    assert v.problems[0].startswith("all_gather bus bandwidth 0.006")
    assert "is below the threshold 0.05 GB/s" in v.problems[0]
    # the per-size time budget cut the iterations at the large sizes, every rank alike
    iters = {(m.op, m.bytes): m.iters for m in reports["spark-2"].results}
    assert iters[("all_gather", 65536)] == 20 and iters[("all_gather", 4194304)] == 3
