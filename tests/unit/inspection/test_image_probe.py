"""Issue 17: the image probe's answer is read strictly and judged before Ray starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hostscripts.common import payload
from hostscripts.images import image_check
from inspection.image_probe import (
    ImageProbe,
    ImageProbeError,
    judge,
    nccl_findings,
    parse_probe,
    version_tuple,
)
from tests.conftest import ROOT

GOOD = ImageProbe(python="3.12.3", torch="2.13.0", torch_cuda="13.0", vllm="0.32.0",
                  ray="2.60.0", libibverbs=True)


def test_the_payload_runs_and_its_answer_parses():
    """The real payload, run by this machine's python (no torch/vllm/ray here: all null)."""
    out = subprocess.run([sys.executable, "-c", payload("image_probe.py")], capture_output=True,
                         text=True, timeout=60, check=True)
    probe = parse_probe("here", "a warning the image printed first\n" + out.stdout)
    assert probe.python == ".".join(map(str, sys.version_info[:3]))
    assert set(json.loads(out.stdout)) == {"python", "torch", "torchCuda", "vllm", "ray",
                                           "libibverbs", "fastsafetensors",
                                           "fastsafetensorsCluster"}


def test_good_images_pass_and_the_line_says_what_they_carry():
    assert judge({"spark-1": GOOD, "spark-2": GOOD}, rdma=True) == []
    assert GOOD.line() == ("python 3.12.3, torch 2.13.0 (CUDA 13.0), vllm 0.32.0, ray 2.60.0, "
                           "libibverbs yes")
    cpu = GOOD.model_copy(update={"torch_cuda": None, "libibverbs": False})
    assert "(no CUDA)" in cpu.line() and judge({"a": cpu}, rdma=False) == []


@pytest.mark.parametrize(("change", "rdma", "expected"), [
    ({"ray": None}, False, "spark-2: the image has no Ray"),
    ({"ray": "2.49.1"}, False, "spark-2: the image's Ray 2.49.1 cannot do token authentication "
                               "(needs Ray >= 2.52)"),
    ({"vllm": None}, False, "spark-2: the image has no vLLM"),
    ({"libibverbs": False}, True, "spark-2: nccl.rdma is true but the image cannot load "
                                  "libibverbs"),
    ({"vllm": "0.31.0"}, False, "the images carry different vllm versions (spark-1=0.32.0, "
                                "spark-2=0.31.0)"),
    ({"ray": "2.61.0"}, False, "the images carry different ray versions (spark-1=2.60.0, "
                               "spark-2=2.61.0)"),
])
def test_each_problem_is_named(change, rdma, expected):
    problems = judge({"spark-1": GOOD, "spark-2": GOOD.model_copy(update=change)}, rdma=rdma)
    assert any(p.startswith(expected) for p in problems), problems


def test_no_libibverbs_is_fine_without_rdma():
    assert judge({"a": GOOD.model_copy(update={"libibverbs": False})}, rdma=False) == []


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"ray": "2.60.0"}',
                                  '{"python": 3}', "Traceback (most recent call last):\n  x"])
def test_an_unreadable_answer_is_an_error_naming_the_node(text):
    with pytest.raises(ImageProbeError, match=r"^spark-2: the image probe printed no readable"):
        parse_probe("spark-2", text)


def test_versions_compare_numerically():
    assert version_tuple("2.60.0") > version_tuple("2.52.0") > version_tuple("2.9.3")
    assert version_tuple("0.32.0+cpu") == (0, 32, 0)
    assert version_tuple("2.52.0rc1") == (2, 52, 0)


def test_the_check_script_reports_and_fails_only_on_problems():
    ok = image_check(["spark-1: python 3.12.3"], [])
    done = subprocess.run(["sh", "-c", ok], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and done.stdout == "spark-1: python 3.12.3\n"
    bad = image_check(["spark-1: x"], ["spark-2: the image has no Ray; $(touch /tmp/pwned)"])
    done = subprocess.run(["sh", "-c", bad], capture_output=True, text=True, timeout=10)
    assert done.returncode == 1
    assert done.stderr == "image check failed: spark-2: the image has no Ray; $(touch /tmp/pwned)\n"


def test_fastsafetensors_across_nodes_warns_unless_the_image_carries_the_patch():
    from inspection.image_probe import warnings

    stock = GOOD.model_copy(update={"fastsafetensors": "0.1.15", "fastsafetensors_cluster": False})
    patched = stock.model_copy(update={"fastsafetensors_cluster": True})
    missing = GOOD  # no fastsafetensors package
    assert warnings({"a": stock, "b": stock}, load_format="auto", nodes=2) == []
    assert warnings({"a": patched, "b": patched}, load_format="fastsafetensors", nodes=2) == []
    assert warnings({"a": stock}, load_format="fastsafetensors", nodes=1) == []
    [w] = warnings({"a": stock}, load_format="fastsafetensors", nodes=2)
    assert w.startswith("a: loadFormat fastsafetensors across 2 nodes with an image not known to "
                        "carry the cluster patch (its loader is stock")
    [w] = warnings({"a": missing}, load_format="fastsafetensors", nodes=2)
    assert "the image has no fastsafetensors package" in w
    assert stock.line().endswith("fastsafetensors 0.1.15 (multi-node patch: no)")


def test_the_probe_tells_a_stock_loader_from_a_patched_one(tmp_path):
    """The payload reads vLLM's weight_utils.py without importing vLLM."""
    pkg = tmp_path / "vllm"
    loader = pkg / "model_executor" / "model_loader"
    loader.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    stock = ("def fastsafetensors_weights_iterator(files):\n"
             "    if torch.distributed.is_initialized():\n"
             "        pg = torch.distributed.group.WORLD\n\ndef other():\n"
             "    world = get_world_group()\n")
    for text, expected in ((stock, False),
                           (stock.replace("torch.distributed.group.WORLD",
                                          "get_world_group().device_group"), True),
                           ("def something_else(): pass\n", None)):
        (loader / "weight_utils.py").write_text(text)
        out = subprocess.run([sys.executable, "-c", payload("image_probe.py")],
                             capture_output=True, text=True, timeout=60, check=True,
                             env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert json.loads(out.stdout)["fastsafetensorsCluster"] is expected, text


# ---------------------------------------------------------------- issue 51: the NCCL vLLM loads
LAB_PROBE = (ROOT / "tests" / "fixtures" / "collective" / "image-probe-lab-spark-1.txt")


def _lab_probe() -> ImageProbe:
    return parse_probe("spark-1", LAB_PROBE.read_text().split("\n", 1)[1])


def test_the_labs_probe_names_the_nccl_its_vllm_loads():
    """The lab image's probe (tests/fixtures/collective/INDEX.md): pip's nvidia-nccl-cu13."""
    p = _lab_probe()
    assert p.nccl is not None and p.nccl.vllm is not None
    lib = p.nccl.vllm
    assert (lib.source, lib.package, lib.version) == ("pip", "nvidia-nccl-cu13", "2.29.7")
    assert lib.real_path.endswith("/site-packages/nvidia/nccl/lib/libnccl.so.2")
    assert len(lib.build or "") == 40 and lib.size and lib.size > 100_000_000
    assert [t.identity for t in p.nccl.torch] == [lib.identity]  # torch's is the same file
    assert p.line().endswith(f"; vLLM loads NCCL 2.29.7 (pip's nvidia-nccl-cu13, build "
                             f"{lib.build[:12]})")
    assert nccl_findings({"spark-1": p, "spark-2": p}, strict=True) == ([], [])


def test_nodes_loading_different_nccl_builds_are_refused():
    p = _lab_probe()
    assert p.nccl is not None and p.nccl.vllm is not None
    other = p.nccl.vllm.model_copy(update={"build": "c0db9360" + "0" * 32, "source": "system",
                                          "package": "libnccl2", "real_path":
                                          "/usr/lib/aarch64-linux-gnu/libnccl.so.2.29.7"})
    q = p.model_copy(update={"nccl": p.nccl.model_copy(update={"vllm": other})})
    problems, warnings = nccl_findings({"spark-1": p, "spark-2": q}, strict=False)
    assert warnings == [] and len(problems) == 1
    assert problems[0].startswith("the nodes' vLLM load different NCCL builds (spark-1: NCCL "
                                  "2.29.7 (pip's nvidia-nccl-cu13, build ")
    assert "spark-2: NCCL 2.29.7 (the system's libnccl2, build c0db93600000)" in problems[0]


def test_an_nccl_the_probe_could_not_establish_fails_closed_outside_dev():
    p = _lab_probe()
    assert p.nccl is not None
    unknown = p.model_copy(update={"nccl": p.nccl.model_copy(update={
        "vllm": None, "reason": "the NCCL check did not answer within 120 s"})})
    probes = {"spark-1": p, "spark-2": unknown}
    problems, warnings = nccl_findings(probes, strict=True)
    assert warnings == []
    assert problems == ["spark-2: the NCCL the image's vLLM loads is unknown (the NCCL check did "
                        "not answer within 120 s), so the nodes' NCCL builds cannot be compared"]
    assert nccl_findings(probes, strict=False) == ([], problems)
    # a CPU build of torch loads no NCCL: nothing to compare, nothing wrong
    cpu = p.model_copy(update={"nccl": p.nccl.model_copy(update={
        "vllm": None, "reason": "a torch without CUDA: vLLM loads no NCCL"})})
    assert nccl_findings({"a": cpu, "b": cpu}, strict=True) == ([], [])
    # probes not asked for NCCL (the serve check's) are left out
    assert nccl_findings({"a": GOOD, "b": p}, strict=True) == ([], [])
