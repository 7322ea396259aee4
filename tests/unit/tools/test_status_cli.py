"""`spark-vllm status` end to end with the ssh round trip replaced by the outputs the lab's nodes
recorded (tests/fixtures/status): the tables, --json, the exit codes; and the alerts of the
stack's Prometheus (tests/fixtures/prometheus) in the head's output."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from tests.conftest import ROOT, dev_project
from tests.unit.inspection.recon_helpers import assemble, fixture
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
    from tests.unit.inspection.test_status import with_gateway

    text = (FIXTURES / f"lab-dev-{node}-serving.txt").read_text()
    return 0, with_gateway(text) if node == "spark-1" else text, ""


def _stack_file(tmp_path, **sections) -> None:
    """Pulumi.dev.yaml in tmp_path, its guard off: the recorded outputs (tests/fixtures/status)
    predate the guard (0.20), so they are read as the stack they came from; `sections` patch
    more of it."""
    dev_project(tmp_path, **{"guard": {"enabled": False}, **sections})


@pytest.fixture
def in_repo(monkeypatch, tmp_path):
    _stack_file(tmp_path)
    monkeypatch.chdir(tmp_path)


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


# --------------------------------------------------------------------------- alerts (issue 35)


def _head_with_alerts(section, am_alerts=None, am_metrics=None) -> tuple[int, str, str]:
    """The head's recorded output (recorded before the dev stack turned monitoring on) with an
    `alerts` section in the same frame, as the head prints it after the other sections, and
    its Alertmanager's (tests/fixtures/alertmanager, recorded)."""
    rc, out, err = _recorded("spark-1")
    return rc, out + assemble({"alerts": section, "am_alerts": am_alerts or AM_ALERTS,
                               "am_metrics": am_metrics or AM_METRICS},
                              nonce=RECORDED_NONCE), err


ALERTS = fixture("prometheus/alerts-firing-pending.txt")
AM_ALERTS = fixture("alertmanager/alerts-active-suppressed.txt")
AM_METRICS = fixture("alertmanager/metrics-two-sent.txt")


def test_the_alerts_prometheus_has_pending_or_firing_table_and_json(in_repo, monkeypatch):
    """Pulumi.dev.yaml has monitoring on: the head's alerts follow the models; a firing alert
    does not change the exit code (every model serves: 0)."""
    run, _ = _runner({"10.77.0.11": _head_with_alerts(ALERTS), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "alerts (Prometheus on spark-1)" in result.output
    firing = next(i for i, ln in enumerate(lines) if "SparkVllmModelNotServing" in ln)
    pending = [i for i, ln in enumerate(lines) if "SparkNodeMemoryLow" in ln]
    assert len(pending) == 2 and firing < min(pending)  # firing first
    for text in ("firing", "tiny-moe", "2026-12-03 07:45:16",
                 "Model tiny-moe is not serving (stack dev)"):
        assert text in lines[firing], lines[firing]
    for i, node in zip(pending, ("spark-1", "spark-2"), strict=True):
        for text in ("pending", node, "2026-12-03 07:45:41", f"Node {node} is low on memory"):
            assert text in lines[i], lines[i]
    # (the recording predates the collective gate's section: only its line may say so)
    assert not [ln for ln in result.output.splitlines()
                if "could not read" in ln and not ln.startswith("fabric: ")]

    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["serving"] is True and data["nodes"]["spark-1"]["problems"] == []
    assert data["alerts"] == [
        {"name": "SparkVllmModelNotServing", "state": "firing", "model": "tiny-moe", "node": "",
         "active_at": "2026-12-03T07:45:16.039866763Z",
         "summary": "Model tiny-moe is not serving (stack dev)"},
        *({"name": "SparkNodeMemoryLow", "state": "pending", "model": "", "node": n,
           "active_at": "2026-12-03T07:45:41.039866763Z",
           "summary": f"Node {n} is low on memory (stack dev)"} for n in ("spark-1", "spark-2"))]
    assert data["alertsOmitted"] == 0


def test_no_alerts_is_one_line(in_repo, monkeypatch):
    none = '{"status":"success","data":{"alerts":[]}}'
    run, _ = _runner({"10.77.0.11": _head_with_alerts(none), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    assert "alerts: none pending or firing" in result.output
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"])
    assert json.loads(result.output)["alerts"] == []


def test_alerts_that_cannot_be_read_are_said_so_not_taken_for_none(in_repo, monkeypatch):
    """Prometheus down (and, below, the recorded output with no alerts section at all): the
    alerts are unknown, the head's problem says why; JSON has null, not []."""
    down = ("", 1, "http://127.0.0.1:9090/api/v1/alerts: URLError(ConnectionRefusedError(111, "
            "'Connection refused'))\n")
    for head, why in ((_head_with_alerts(down), "Connection refused"),
                      (_recorded("spark-1"), "no answer")):
        run, _ = _runner({"10.77.0.11": head, "10.77.0.12": _recorded("spark-2")})
        monkeypatch.setattr(tool, "RUNNER", [run])
        result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
        assert result.exit_code == 0, result.output  # the exit code is the models'
        assert "alerts: unknown, could not be read on spark-1 (" in result.output
        assert "none pending or firing" not in result.output
        assert "could not read alerts: " in result.output and why in result.output
        result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"])
        data = json.loads(result.output)
        assert data["alerts"] is None
        (problem,) = [pr for pr in data["nodes"]["spark-1"]["problems"]
                      if pr.startswith("alerts: ")]
        assert why in problem


def test_a_stack_without_monitoring_shows_no_alerts(tmp_path, monkeypatch):
    """The recorded outputs, of the dev stack before it turned monitoring on: no alerts section
    asked, none shown, no problem; JSON "alerts": null."""
    _stack_file(tmp_path, monitoring={"enabled": False})
    monkeypatch.chdir(tmp_path)
    scripts: list[str] = []
    run, _ = _runner({"10.77.0.11": _recorded("spark-1"), "10.77.0.12": _recorded("spark-2")})

    def recording(argv, script, timeout):
        scripts.append(script)
        return run(argv, script, timeout)

    monkeypatch.setattr(tool, "RUNNER", [recording])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    # (the recording predates the collective gate's section: only its line may say so)
    assert "alerts" not in result.output and not [
        ln for ln in result.output.splitlines()
        if "could not read" in ln and not ln.startswith("fabric: ")]
    assert len(scripts) == 2 and not any("alerts" in s for s in scripts)
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"])
    data = json.loads(result.output)
    assert data["alerts"] is None and data["nodes"]["spark-1"]["problems"] == []


def test_a_recorded_outage_with_monitoring_on_exits_1_with_why_and_the_alerts(in_repo,
                                                                               monkeypatch):
    """The lab's nodes as they printed status 40 s into an outage (tests/fixtures/status/
    README.md): the worker's Ray container stopped, the machine's memory held down. The head's
    own `alerts` section is Prometheus's real answer; status and Prometheus agree."""
    def recorded(node: str) -> tuple[int, str, str]:
        from tests.unit.inspection.test_status import with_gateway

        text = (FIXTURES / f"lab-dev-{node}-alerts.txt").read_text()
        return 0, with_gateway(text) if node == "spark-1" else text, ""

    run, _ = _runner({"10.77.0.11": recorded("spark-1"), "10.77.0.12": recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"])
    assert result.exit_code == 1, result.output  # a model does not serve
    data = json.loads(result.output)
    assert data["serving"] is False
    (model,) = data["models"]
    assert model["state"] != "serving"
    assert model["why"] == "spark-2/spark-vllm-dev-ray-worker is exited"
    assert [(a["name"], a["state"], a["model"] or a["node"]) for a in data["alerts"]] == [
        ("SparkVllmModelNotServing", "firing", "tiny-moe"),
        ("SparkNodeMemoryLow", "pending", "spark-1"), ("SparkNodeMemoryLow", "pending", "spark-2")]
    # the monitoring containers are the stack's: Prometheus on the head, an exporter on each
    assert {"spark-vllm-dev-prometheus", "spark-vllm-dev-node-exporter"} <= set(
        data["nodes"]["spark-1"]["containers"])
    assert set(data["nodes"]["spark-2"]["containers"]) == {"spark-vllm-dev-node-exporter"}
    assert all(3 << 30 > n["memoryAvailable"] > 2 << 30 for n in data["nodes"].values())
    # recorded before the stack had an Alertmanager: its part is unknown, and says so
    assert data["nodes"]["spark-1"]["problems"] == ["notifications: no answer"]
    assert data["nodes"]["spark-2"]["problems"] == [] and data["notifications"] is None
    assert data["gateway"] == {"connections": 0, "connectionLimit": 512, "connectionsTotal": 7,
                               "refused": 1, "sources": 3, "unauthorized": 4, "overLimit": []}
    table = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert table.exit_code == 1 and "alerts (Prometheus on spark-1)" in table.output
    assert "1 refused as they arrived" in table.output and "4 answered 401" in table.output


def test_the_fabric_line_shows_the_gates_last_record(in_repo, monkeypatch):
    """issue 51: the head's record of the collective gate, added to the recorded head output as
    the `collective` section would print it."""
    from tests.unit.inspection.test_status import _gate_summary

    rc, head, err = _recorded("spark-1")
    head += assemble({"collective": f"1765000000\n{_gate_summary()}"}, nonce=RECORDED_NONCE)
    run, _ = _runner({"10.77.0.11": (rc, head, err), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    line = next(ln for ln in result.output.splitlines() if ln.startswith("fabric:"))
    assert line.startswith("fabric: collective gate passed: all_gather 0.410 GB/s against 0.05 "
                           "GB/s, all_reduce 0.512 GB/s (2 ranks, gloo), measured "), line
    data = json.loads(CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"]).output)
    assert data["collectiveGate"]["record"]["verdict"] == "passed"
    assert data["collectiveGate"]["measuredAt"] == 1765000000.0
    # the recorded outputs predate the gate: no record there, and status says so
    run, _ = _runner({"10.77.0.11": _recorded("spark-1"), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert "fabric: could not read the collective gate's record: no answer" in result.output


def test_what_each_nodes_firewall_dropped_table_and_json(in_repo, monkeypatch):
    """Issue 45: each rule's drops since its table was loaded, per node (the lab's recorded
    tables), as a table after the nodes' memory and as `nodes.<node>.dropped` in --json."""
    run, _ = _runner({"10.77.0.11": _recorded("spark-1"), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    assert "nodes: firewall (packets dropped since the table was loaded)" in result.output
    row = next(ln for ln in result.output.splitlines() if "data-plane" in ln and "spark-1" in ln)
    assert "ray 223" in row and "data-plane 34304" in row, row
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"])
    data = json.loads(result.output)
    assert data["nodes"]["spark-1"]["dropped"]["ray"] == 223
    assert not [p for p in data["nodes"]["spark-1"]["problems"] if p.startswith("firewall")]


def test_the_drafter_is_named_with_where_its_commit_is(tmp_path, monkeypatch):
    """model.drafter (issue 44, item 4): a line after the models (and `drafter` in --json) says
    per node whether the drafter's snapshot is there; a node whose listing is missing is
    unknown, never present. The exit code stays the models'."""
    dev_project(
        tmp_path,
        model={"drafter": {"repo": "spark-lab/tiny-drafter", "revision": "d" * 40}},
        vllm={"speculativeConfig": {"method": "draft_model", "model": "spark-lab/tiny-drafter",
                                    "num_speculative_tokens": 2}})
    monkeypatch.chdir(tmp_path)
    listing = ("repo\tmodels--spark-lab--tiny-drafter\nlisted\n"
               f"snapshot\t{'d' * 40}\nfile\t{'d' * 40}\tconfig.json\t20\n"
               f"file\t{'d' * 40}\tmodel.safetensors\t1000\nblobs\t1020\n")
    rc, head, err = _recorded("spark-1")
    head += assemble({"drafter": listing}, nonce=RECORDED_NONCE)
    run, _ = _runner({"10.77.0.11": (rc, head, err), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("drafter "))
    assert line == ("drafter spark-lab/tiny-drafter: spark-1 present (dddddddddddd, 2 files), "
                    "spark-2 unknown (no answer)")
    data = json.loads(CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"]).output)
    assert data["drafter"]["repo"] == "spark-lab/tiny-drafter"
    assert data["drafter"]["nodes"]["spark-1"]["state"] == "present"
    assert data["drafter"]["nodes"]["spark-2"]["state"] == "unknown"


@pytest.mark.parametrize("which", ["verified", "other", "none"])
def test_the_deployments_table_says_whether_the_last_verified_one_runs(in_repo, monkeypatch,
                                                                       tmp_path, which):
    """Issue 49: the running deployment against the last verified one (the head's record, read
    by payloads/deployment.py: tests/unit/inspection/test_status.py makes its answers)."""
    from tests.unit.inspection.test_status import _deployment_outputs

    rc, head, err = _recorded("spark-1")
    if which != "none":
        first, second = _deployment_outputs(tmp_path)
        head += assemble({"deployment:spark-vllm-dev-serve":
                          first if which == "verified" else second}, nonce=RECORDED_NONCE)
    run, _ = _runner({"10.77.0.11": (rc, head, err), "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output  # serving: what was verified does not count
    assert "deployments: what runs now, the last verified one" in result.output
    row = next(ln for ln in result.output.splitlines()
               if "tiny-moe" in ln and ("verified" in ln or "unknown" in ln))
    if which == "none":  # recorded before 0.20: the section is not there
        assert "unknown (no answer)" in row, row
        return
    assert ("the last verified" if which == "verified" else "not verified") in row, row
    assert "org/m@cccccccccccc" in row and "21.5 s" in row, row
    data = json.loads(CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"]).output)
    assert data["models"][0]["deployment"]["matches"] is (which == "verified")


# --------------------------------------------------------------------------- Alertmanager (issue 50)


def test_what_alertmanager_sent_and_held_back_table_and_json(in_repo, monkeypatch):
    """Alertmanager's recorded answers (tests/fixtures/alertmanager/README.md): the node's and
    the service replica's alerts sent to `oncall`, the main model's held back (its node is
    down), two webhook notifications sent; the exit code is the models' (0)."""
    run, _ = _runner({"10.77.0.11": _head_with_alerts(ALERTS),
                      "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "notifications (Alertmanager on spark-1)" in result.output
    assert "notifications: webhook 2 sent (0 failed)" in result.output
    node = next(ln for ln in lines if "SparkNodeExporterDown" in ln)
    assert "spark-2" in node and "oncall" in node and "2026-12-06" in node, node
    held = next(ln for ln in lines if "tiny-moe on spark-1" in ln)
    assert "held back: its node is down" in held, held
    sent = next(ln for ln in lines if "tiny-embed on spark-1" in ln)
    assert "oncall" in sent, sent
    data = json.loads(CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"]).output)
    n = data["notifications"]
    assert n["sent"] == {"webhook": {"attempted": 2, "failed": 0}} and n["alertsOmitted"] == 0
    assert [(a["name"], a["state"], a["receivers"], a["inhibited"]) for a in n["alerts"]] == [
        ("SparkNodeExporterDown", "active", ["oncall"], False),
        ("SparkVllmModelNotServing", "active", ["oncall"], False),
        ("SparkVllmModelNotServing", "suppressed", ["oncall"], True)]


def test_alertmanager_unreadable_is_said_so(in_repo, monkeypatch):
    down = ("", 1, "http://127.0.0.1:9093/api/v2/alerts: URLError(ConnectionRefusedError(111, "
            "'Connection refused'))\n")
    run, _ = _runner({"10.77.0.11": _head_with_alerts(ALERTS, am_alerts=down),
                      "10.77.0.12": _recorded("spark-2")})
    monkeypatch.setattr(tool, "RUNNER", [run])
    result = CliRunner().invoke(cli.main, ["status", "-s", "dev"])
    assert result.exit_code == 0, result.output
    assert "notifications: unknown, could not be read on spark-1 (" in result.output
    assert "Connection refused" in result.output
    data = json.loads(CliRunner().invoke(cli.main, ["status", "-s", "dev", "--json"]).output)
    assert data["notifications"] is None
