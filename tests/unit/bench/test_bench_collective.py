"""make bench's collective gate row (bench/bench.py collective_section, issue 51): the figures a
run measured, rendered beside the raw TCP stream on the same twin. The figures here are the
lab's real Gloo run (tests/fixtures/collective), as bench_collective would keep them."""

from __future__ import annotations

from bench.bench import collective_section
from inspection import collective
from tests.conftest import ROOT


def test_the_row_shows_busbw_per_size_and_the_ratio_to_raw_tcp():
    lab = ROOT / "tests" / "fixtures" / "collective" / "gloo-lab-rank-spark-1.txt"
    report = collective.parse_rank("spark-1", lab.read_text().split("\n", 1)[1])
    busbw = {op: {str(f.bytes): round(f.busbw, 4) for f in collective.figures(report)
                  if f.op == op} for op in collective.OPS}
    fan = {"one": {"raw_gbit": 4.4}, "collective": {
        "busbw": busbw, "wall_s": [5.2, 5.4], "reps": 2,
        "all_gather_best": max(busbw["all_gather"].values()),
        "all_reduce_best": max(busbw["all_reduce"].values())}}
    text = "\n".join(collective_section(fan))
    assert "| collective | 64 KiB | 256 KiB | 1 MiB | 4 MiB |" in text
    assert "| all_gather busbw | 0.0236 | 0.1031 | 0.2411 | 0.4095 |" in text
    # 0.4095 GB/s x 8 = 3.28 Gb/s against 4.4 Gb/s raw on the same twin
    assert "Best all_gather bus bandwidth 0.4095 GB/s, 0.74 of the raw TCP stream" in text
    assert "the runs took 5.2, 5.4 s" in text
    assert collective_section({"one": {"raw_gbit": 4.4}}) == []  # not measured: no row
