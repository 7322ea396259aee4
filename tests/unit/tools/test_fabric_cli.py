"""`spark-vllm fabric test` (tools/fabric_cli.py, issue 51) end to end through click, with recon
and the ssh round trips replaced: each node answers with what its rank printed on the lab
(tests/fixtures/collective/INDEX.md). The scripts it sends are the stack's own rank scripts."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from inspection.facts import ContainerFacts
from tests.conftest import ROOT, dev_project, gb10_facts
from tools import cli, fabric_cli

LAB = ROOT / "tests" / "fixtures" / "collective"
IMAGE = "sha256:" + "14638ee059096d69deb74203c6810104f71c1606f8f3201ffde99461b14009cb"
HOSTS = {"10.77.0.11": "spark-1", "10.77.0.12": "spark-2"}


def lab(name: str) -> str:
    return (LAB / name).read_text().split("\n", 1)[1]


def facts(serving: bool = True):
    def one(name: str, index: int):
        c = ContainerFacts(id=f"{index}" * 64, name="spark-vllm-dev-ray-head", image=IMAGE,
                           state="running",
                           labels={"spark-vllm.stack": "spark-vllm/dev",
                                   "spark-vllm.role": "ray-head" if index == 1 else "ray-worker"})
        return gb10_facts(name, index=index, containers=[c] if serving else [])

    return lambda cfg, names, key: {"spark-1": one("spark-1", 1), "spark-2": one("spark-2", 2)}


@pytest.fixture
def in_repo(monkeypatch, tmp_path):
    monkeypatch.chdir(dev_project(tmp_path))


def runner(kind: str, sent: dict[str, str]):
    def run(argv: list[str], script: str, timeout: float) -> tuple[int, str, str]:
        node = HOSTS[next(a.split("@", 1)[1] for a in argv if "@" in a)]
        sent[node] = script
        return 0, lab(f"{kind}-{node}.txt"), ""
    return run


def test_a_fabric_at_speed_exits_0_and_runs_the_stacks_own_rank_scripts(in_repo, monkeypatch):
    sent: dict[str, str] = {}
    monkeypatch.setattr(fabric_cli, "SURVEY", [facts()])
    monkeypatch.setattr(fabric_cli, "RUNNER", [runner("gloo-lab-rank", sent)])
    result = CliRunner().invoke(cli.main, ["fabric", "test", "-s", "dev"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == ("collective gate passed: all_gather 0.410 GB/s "
                                             "against 0.05 GB/s; all_reduce 0.512 GB/s")
    # the script is the one the stack's gate builds (hostscripts/collective.py), rank by node
    from hostscripts.collective import FAILED
    assert FAILED in sent["spark-1"]
    assert set(sent) == {"spark-1", "spark-2"}
    assert sent["spark-2"].startswith("set -u\n")
    assert f"--entrypoint python3 {IMAGE} -c " in sent["spark-2"]
    assert re.search(r'"rank": 1, "sizes": \[65536, 262144, 1048576, 4194304\], "world": 2',
                     sent["spark-2"]), sent["spark-2"][-400:]
    result = CliRunner().invoke(cli.main, ["fabric", "test", "-s", "dev", "--json"])
    data = json.loads(result.output)
    assert data["verdict"] == "passed" and data["ranks"] == 2 and data["backend"] == "gloo"


def test_a_throttled_fabric_exits_1_naming_the_figure(in_repo, monkeypatch):
    monkeypatch.setattr(fabric_cli, "SURVEY", [facts()])
    monkeypatch.setattr(fabric_cli, "RUNNER", [runner("gloo-lab-throttled-rank", {})])
    result = CliRunner().invoke(cli.main, ["fabric", "test", "-s", "dev"])
    assert result.exit_code == 1
    assert result.stderr.startswith("collective gate failed: all_gather bus bandwidth 0.006")
    assert "is below the threshold 0.05 GB/s (spark-vllm:fabric.collective.minBusGBps). " \
           "Likely causes: nccl.rdma is false" in result.stderr


def test_without_a_serving_container_it_asks_for_an_image(in_repo, monkeypatch):
    monkeypatch.setattr(fabric_cli, "SURVEY", [facts(serving=False)])
    monkeypatch.setattr(fabric_cli, "RUNNER", [runner("gloo-lab-rank", {})])
    result = CliRunner().invoke(cli.main, ["fabric", "test", "-s", "dev"])
    assert result.exit_code == 2
    assert "spark-1: no container of the stack spark-vllm/dev runs there" in result.stderr
    result = CliRunner().invoke(cli.main, ["fabric", "test", "-s", "dev", "--image", IMAGE])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli.main, ["fabric", "test", "-s", "dev", "--image", "x:latest"])
    assert result.exit_code == 2 and "is not an image ID" in result.output
