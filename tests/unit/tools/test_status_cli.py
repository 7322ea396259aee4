"""`spark-vllm status` end to end with the ssh round trip replaced by the outputs the lab's nodes
recorded (tests/fixtures/status): the tables, --json, the exit codes."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from tests.conftest import ROOT
from tools import cli
from tools import status as tool

FIXTURES = ROOT / "tests" / "fixtures" / "status"
RECORDED_NONCE = "5eed5eed5eed5eed"


def _runner(outputs: dict[str, tuple[int, str, str]]):
    """A FAKE ssh round trip: the node is found by its address in the argv; its recorded output
    is given the nonce of the script it was sent."""
    seen: list[str] = []

    def run(argv: list[str], script: str, timeout: float) -> tuple[int, str, str]:
        host = next(a.split("@", 1)[1] for a in argv if "@" in a)
        seen.append(host)
        nonce = re.search(r"^SV_NONCE=([0-9a-f]+)$", script, re.M).group(1)
        rc, out, err = outputs[host]
        return rc, out.replace(RECORDED_NONCE, nonce), err

    return run, seen


def _recorded(node: str) -> tuple[int, str, str]:
    return 0, (FIXTURES / f"lab-dev-{node}-serving.txt").read_text(), ""


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(ROOT)  # Pulumi.dev.yaml


def test_status_of_the_serving_lab_exits_0_with_every_figure(in_repo, monkeypatch):
    run, seen = _runner({"10.77.0.11": _recorded("spark-1"), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    assert sorted(seen) == ["10.77.0.11", "10.77.0.12"]  # one round trip per node
    row = next(ln for ln in result.output.splitlines() if "tiny-moe" in ln)
    assert "serving" in row and "main" in row and "0.0%" in row, row
    for container in ("spark-vllm-dev-serve", "spark-vllm-dev-ray-head",
                      "spark-vllm-dev-ray-worker", "spark-vllm-dev-gateway"):
        assert container in result.output
    assert "23.5 GiB" in result.output  # the lab node's MemTotal


def test_json_and_a_node_that_cannot_be_reached_exits_1(in_repo, monkeypatch):
    refused = (255, "", "ssh: connect to host 10.77.0.12 port 22: Connection refused\n")
    run, _ = _runner({"10.77.0.11": _recorded("spark-1"), "10.77.0.12": refused})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["serving"] is False
    assert "unreachable" in data["nodes"]["spark-2"]["error"]
    (main,) = data["models"]
    # the worker's Ray container is unknown: so is the model, never taken for serving
    assert main["state"] == "unknown" and main["ranks"]["spark-2/spark-vllm-dev-ray-worker"] == "unknown"
    assert main["why"].startswith("spark-2/spark-vllm-dev-ray-worker: spark-2: unreachable")


def test_what_a_node_says_reaches_the_terminal_as_plain_text(in_repo, monkeypatch):
    """A container's answer (here vLLM's /health error text) with an escape sequence and rich
    markup is printed as one plain line: no control character, no markup error."""
    rc, head, err = _recorded("spark-1")
    evil = r"\u001b]0;owned\u0007\u001b[2J[/][red]x"
    head = head.replace('"health": 200', f'"health": "{evil}"', 1)
    run, _ = _runner({"10.77.0.11": (rc, head, err), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 1, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output, result.output
    assert "[/][red]x" in result.output  # shown as written, not read as markup


def test_an_unknown_stack_and_json_with_watch_are_usage_errors(in_repo):
    result = CliRunner().invoke(cli.main, ["status", "-s", "nosuch"])
    assert result.exit_code == 2 and "Pulumi.nosuch.yaml: no such stack file" in result.output
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json", "--watch"])
    assert result.exit_code == 2 and "--json prints once" in result.output


def test_watch_refreshes_until_interrupted(in_repo, monkeypatch):
    """--watch: a round trip per node per refresh; Ctrl-C ends it with the last state's code."""
    run, seen = _runner({"10.77.0.11": _recorded("spark-1"), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    sleeps: list[float] = []

    def sleep(secs: float) -> None:
        sleeps.append(secs)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(tool.time, "sleep", sleep)
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--watch", "2"])
    assert result.exit_code == 0, result.output
    assert sleeps == [2.0, 2.0, 2.0] and len(seen) == 6
    assert "every 2 s; Ctrl-C ends" in result.output
