"""Issue 52 on the one GPU that was lent (tests/fixtures/collective/INDEX.md and
tests/fixtures/nccl/INDEX.md: an H100 with PyTorch 2.11.0+cu130 and pip's nvidia-nccl-cu13
2.28.9). What a single rank allows: the gate's payload with NCCL as the stack runs it, the NCCL
INFO log of a real 2.28 run without an IB device, and the libnccl probe against what an NCCL
process had mapped. No multi-GPU machine was lent: nothing here is two ranks of NCCL."""

from __future__ import annotations

import json

import pytest

from inspection import collective as c
from inspection.image_probe import parse_probe
from inspection.nccl_transport import parse_transport, verdict
from tests.conftest import ROOT
from tests.unit.inspection.recon_helpers import fixture

COLLECTIVE = ROOT / "tests" / "fixtures" / "collective"


def _body(name: str) -> str:
    return (COLLECTIVE / name).read_text().split("\n", 1)[1]


def test_one_nccl_rank_on_a_gpu_measures_every_size_and_its_bus_bandwidth_is_zero():
    """nccl-tests' bus factors are 2(n-1)/n and (n-1)/n: one rank moves nothing over a bus,
    whatever the algorithm bandwidth (the payload prints 0.00, as nccl-tests does)."""
    r = c.parse_rank("gpu", _body("nccl-one-rank-h100.txt"))
    assert (r.backend, r.world, r.rank, r.device, r.nccl_version) == ("nccl", 1, 0, "cuda:0",
                                                                      "2.28.9")
    sizes = sorted({m.bytes for m in r.results})
    assert sizes == [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]  # the whole sweep
    assert r.skipped == [] and r.stopped is None
    for m, f in zip(r.results, c.figures(r), strict=True):
        assert f.busbw == 0.0
        assert f.algbw == pytest.approx(m.bytes / 1e9 / m.seconds, rel=1e-9)
    # the payload's own algbw column is the same arithmetic as inspection/collective's
    raw = json.loads(_body("nccl-one-rank-h100.txt"))["results"]
    for m, f in zip(raw, c.figures(r), strict=True):
        assert m["algbw"] == pytest.approx(f.algbw, abs=1e-4) and m["busbw"] == 0.0


def test_the_ranks_nccl_log_is_read_a_socket_net_without_ib():
    """The gate's answer carries NCCL's own lines (NCCL 2.28: `NET/IB : No device found.`, then
    `Initialized NET plugin Socket`, `Using network Socket`)."""
    r = c.parse_rank("gpu", _body("nccl-one-rank-h100.txt"))
    report = parse_transport("\n".join(r.nccl_log), "gpu")
    (node,) = report.nodes
    assert node.transport == "Socket" and node.ib_no_device and node.nets == ["Socket"]


def test_a_real_nccl_2_28_log_without_ib_device_fails_a_strict_rdma_check():
    """The gap tests/fixtures/nccl/INDEX.md named (an NCCL 2.28 log with `NET/IB : No device
    found`), filled by a real run: Socket, a TCP fallback where RDMA is required; in dev (not
    strict) the same finding is a warning, and without RDMA nothing is required."""
    text = fixture("nccl/nccl-2.28.9-one-rank-no-ib-socket-h100.txt")
    report = parse_transport(text, "192.0.2.2")
    (node,) = report.nodes
    assert (node.transport, node.ib_no_device) == ("Socket", True)
    assert [(s.name, s.address) for s in node.socket_ifs] == [("eth0", "192.0.2.2")]
    names = {node.node: "gpu-host"}
    strict = verdict(report, names=names, rdma=True, strict=True, nccl_debug="INFO",
                     expected=["gpu-host"])
    assert strict.problems and strict.problems[0].startswith(
        "gpu-host: NCCL fell back to TCP sockets although nccl.rdma is true")
    loose = verdict(report, names=names, rdma=True, strict=False, nccl_debug="INFO",
                    expected=["gpu-host"])
    assert loose.problems == [] and loose.warnings
    assert verdict(report, names=names, rdma=False, strict=True, nccl_debug="INFO",
                   expected=["gpu-host"]).problems == []


def _probe(name: str) -> dict:
    """A probe answer of nccl_library.py wrapped as the image probe reports it."""
    return {"nccl": json.loads(_body(name))}


def test_the_probe_names_the_library_the_nccl_process_had_mapped():
    """On the GPU machine, a process that ran an NCCL all_reduce had exactly one libnccl mapped
    (pip's nvidia-nccl-cu13 2.28.9); the probe, run in that same process, named that file for
    torch and for vLLM (recorded by the run, INDEX.md); its answer alone names it too."""
    loaded = json.loads(_body("nccl-library-loaded-h100.txt"))
    assert loaded["vllm"]["realPath"].endswith("/site-packages/nvidia/nccl/lib/libnccl.so.2")
    assert (loaded["vllm"]["source"], loaded["vllm"]["package"], loaded["vllm"]["version"]) == (
        "pip", "nvidia-nccl-cu13", "2.28.9")
    assert [t["build"] for t in loaded["torch"]] == [loaded["vllm"]["build"]]
    # VLLM_NCCL_SO_PATH (the fix the advisory names) makes vLLM's handle the system's build,
    # while torch keeps its own: two builds in one process, each named
    so_path = json.loads(_body("nccl-library-loaded-so-path-h100.txt"))
    assert (so_path["vllm"]["source"], so_path["vllm"]["package"], so_path["vllm"]["version"]) \
        == ("system", "libnccl2", "2.28.3")
    assert so_path["vllm"]["build"] != loaded["vllm"]["build"]
    assert [t["build"] for t in so_path["torch"]] == [loaded["vllm"]["build"]]
    host = json.loads(_body("nccl-host-h100.txt"))["libraries"]
    assert [(h["source"], h["version"], h["build"]) for h in host] == [
        ("system", "2.28.3", so_path["vllm"]["build"])]


def test_the_known_bad_pip_build_is_recognised_on_a_real_answer():
    """pip's 2.28.9, the build of vLLM issues 42354 and 41725, as a real probe reports it."""
    base = json.loads((COLLECTIVE / "image-probe-lab-spark-1.txt").read_text().split("\n", 1)[1])
    base["nccl"] = json.loads(_body("nccl-library-loaded-h100.txt"))
    probe = parse_probe("gpu", json.dumps(base))
    assert probe.nccl is not None and probe.nccl.vllm is not None
    assert probe.line().endswith(
        f"; vLLM loads NCCL 2.28.9 (pip's nvidia-nccl-cu13, build {probe.nccl.vllm.build[:12]})")
