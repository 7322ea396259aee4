"""inspection/status.py: the status script a node runs, its output read back, and each model's
state, on outputs recorded on the lab (tests/fixtures/status) and assembled ones."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import threading

import pytest

from config import validate_config
from hostscripts.paths import LIVENESS_STARTS, StackNames
from inspection import recon
from inspection import status as st
from tests.conftest import ROOT, config_raw
from tests.unit.inspection.recon_helpers import NONCE, assemble, fixture

NAMES = StackNames("dev")
FIXTURES = ROOT / "tests" / "fixtures" / "status"


def config(**sections):
    """The lab's dev stack (Pulumi.dev.yaml: tiny-moe, the dev liveness settings), its guard off
    unless asked: the recorded outputs (tests/fixtures/status) predate the guard (0.20), so they
    are read as the stack they came from; the guard's part has tests of its own below."""
    sections.setdefault("guard", {"enabled": False})
    return validate_config(config_raw(**sections))


# the head's `gateway` section: what the payload printed against Debian's HAProxy 2.6 running
# the rendered configuration (tests/fixtures/status/README.md)
GATEWAY_STATS = (FIXTURES / "gateway-stats-haproxy-2.6.txt").read_text()


def with_gateway(head: str) -> str:
    """A head's recorded output (which predates the `gateway` section) with that section."""
    return head + assemble({"gateway": GATEWAY_STATS})


def _recorded() -> dict[str, str]:
    out = {n: (FIXTURES / f"lab-dev-{n}-serving.txt").read_text() for n in ("spark-1", "spark-2")}
    out["spark-1"] = with_gateway(out["spark-1"])
    return out


# the head's firewall as `nft -j list table` printed it on the lab (tests/fixtures/status/README.md)
RECORDED_FIREWALL = recon.split_sections(_recorded()["spark-1"], NONCE)["firewall"].stdout


def _nodes(cfg, outputs: dict[str, str]) -> dict[str, st.NodeStatus]:
    return {n.name: st.parse_node(cfg, NAMES, n, outputs[n.name], NONCE) for n in cfg.nodes}


def test_the_script_is_valid_bash_and_reads_only():
    cfg = config()
    for node in cfg.nodes:
        script = st.node_script(cfg, NAMES, node, NONCE)
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
        # nothing that changes a container: only inspect, ps, exec of the probe, cp out
        code = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
        verbs = set(re.findall(r"docker (\w+)", code))
        assert verbs <= {"ps", "inspect", "exec", "cp"}, verbs
    head = st.node_script(cfg, NAMES, cfg.head, NONCE)
    # the probe runs in the API container with the key on stdin from the root-only file
    assert "docker exec -i spark-vllm-dev-serve python3 -c" in head
    assert f"< {NAMES.vllm_key_file}" in head
    assert f"spark-vllm-dev-serve {LIVENESS_STARTS}" in head
    worker = st.node_script(cfg, NAMES, cfg.nodes[1], NONCE)
    assert "state:spark-vllm-dev-ray-worker" in worker and "probe:" not in worker


def test_the_recorded_lab_outputs_read_as_serving_with_figures():
    # recorded before the dev stack turned monitoring on: read as the stack they came from
    cfg = config(monitoring={"enabled": False})
    nodes = _nodes(cfg, _recorded())
    assert all(not n.problems and not n.error for n in nodes.values()), nodes
    assert all(n.alerts is None for n in nodes.values())  # not asked: no alerts, no problem
    head = nodes["spark-1"]
    assert head.memory_total and head.memory_available and head.memory_total > head.memory_available
    assert set(head.memory) == {NAMES.serve, NAMES.ray_head, NAMES.gateway}
    assert head.memory[NAMES.serve] and head.memory[NAMES.serve] > 1024**3
    assert set(nodes["spark-2"].memory) == {NAMES.ray_worker}
    serve = head.containers[NAMES.serve]
    # no starts file: the container predates the watchdog's record
    assert serve.restarts_in_window is None and serve.exists and serve.status == "running"
    (main,) = st.model_states(cfg, NAMES, nodes)
    assert main.state == "serving", main
    assert main.name == "tiny-moe" and main.running == 0 and main.waiting == 0
    assert main.kv_cache == 0 and main.tokens_per_second is not None and main.restarts == 0
    assert main.since.startswith("2026-12-02T20:25:17")
    assert main.ranks == {"spark-1/spark-vllm-dev-serve": "running",
                          "spark-1/spark-vllm-dev-ray-head": "running",
                          "spark-2/spark-vllm-dev-ray-worker": "running"}


def _state(count: int, status: str, code: int = 0) -> str:
    return f"{count} " + json.dumps({"Status": status, "ExitCode": code,
                                     "StartedAt": "2026-12-02T20:25:17.68Z"})


def _probe(health, models=("tiny-moe",), running=0.0, waiting=0.0, kv=0.0, gen=(10, 30)):
    samples = [{"t": 1000.0 + i, "m": {"vllm:num_requests_running": running,
                                       "vllm:num_requests_waiting": waiting,
                                       "vllm:kv_cache_usage_perc": kv,
                                       "vllm:generation_tokens_total": float(g),
                                       "vllm:prompt_tokens_total": 5.0}}
               for i, g in enumerate(gen)]
    return json.dumps({"health": health, "models": list(models), "samples": samples})


def _head(**override) -> str:
    sections = {
        "clock": "2000.5",
        "meminfo": "MemTotal: 1000 kB\nMemAvailable: 500 kB\n",
        "docker_ps": "", "container_memory": "",
        f"state:{NAMES.serve}": _state(0, "running"),
        f"starts:{NAMES.serve}": "",
        f"probe:{NAMES.serve}": _probe(200),
        f"state:{NAMES.ray_head}": _state(0, "running"),
        f"state:{NAMES.gateway}": _state(0, "running"),
        "gateway": GATEWAY_STATS,
        "firewall": RECORDED_FIREWALL,
        # the stack's Alertmanager (monitoring on: Pulumi.dev.yaml), as recorded
        "am_alerts": AM_ALERTS, "am_metrics": AM_METRICS,
    }
    sections.update(override)
    return assemble({k: v for k, v in sections.items() if v is not None})


def _worker(status="running") -> str:
    return assemble({"clock": "2000.5", "meminfo": "MemTotal: 1000 kB\nMemAvailable: 500 kB\n",
                     "docker_ps": "", "container_memory": "",
                     f"state:{NAMES.ray_worker}": _state(0, status),
                     "firewall": RECORDED_FIREWALL})


def _main(head: str, worker: str | None = None) -> st.ModelStatus:
    cfg = config()
    nodes = _nodes(cfg, {"spark-1": head, "spark-2": worker or _worker()})
    return st.model_states(cfg, NAMES, nodes)[0]


def test_figures_running_waiting_kv_cache_and_tokens_per_second():
    m = _main(_head(**{f"probe:{NAMES.serve}": _probe(200, running=2, waiting=3, kv=0.25,
                                                      gen=(100, 160))}))
    assert (m.state, m.running, m.waiting, m.kv_cache) == ("serving", 2, 3, 0.25)
    assert m.tokens_per_second == 60.0  # 60 generated tokens in the 1 s between the samples


def test_more_restarts_than_the_limit_in_the_window_is_a_crash_loop():
    # dev: crashLoopRestarts 2 in crashLoopWindowSeconds 300; the node's clock is 2000.5
    starts = "".join(f"{t} start\n" for t in (1690, 1800, 1900, 1950, 1990))
    m = _main(_head(**{f"state:{NAMES.serve}": _state(4, "running"),
                       f"starts:{NAMES.serve}": starts,
                       f"probe:{NAMES.serve}": ("", 1, "Error: connection refused")}))
    assert m.state == "crash-looping", m
    # each start after the first is a restart: 1800 restarted the one of 1690 (out of the window)
    assert m.restarts_in_window == 4 and m.restarts == 4
    assert "4 restarts in the last 300 s (more than 2)" in m.why


def test_restarts_at_the_limit_are_not_a_crash_loop():
    starts = "1800 start\n1900 serving\n1950 start\n1990 start\n"
    m = _main(_head(**{f"starts:{NAMES.serve}": starts,
                       f"probe:{NAMES.serve}": _probe("URLError: refused")}))
    assert m.state == "starting" and m.restarts_in_window == 2, m
    assert "/health URLError: refused" in m.why


def test_serving_wins_over_past_restarts():
    starts = "".join(f"{t} start\n" for t in (1800, 1900, 1950, 1990)) + "1995 serving\n"
    m = _main(_head(**{f"starts:{NAMES.serve}": starts}))
    assert m.state == "serving" and m.restarts_in_window == 3


def test_a_rank_not_running_is_not_serving():
    m = _main(_head(), _worker("exited"))
    assert m.state == "starting" and "spark-2/spark-vllm-dev-ray-worker is exited" in m.why
    assert m.ranks["spark-2/spark-vllm-dev-ray-worker"] == "exited"


def test_a_model_not_listed_by_vllm_is_not_serving():
    m = _main(_head(**{f"probe:{NAMES.serve}": _probe(200, models=("other",))}))
    assert m.state == "starting", m


def test_missing_stopped_and_unreadable():
    gone = ("", 1, "Error: No such object: spark-vllm-dev-serve")
    m = _main(_head(**{f"state:{NAMES.serve}": gone}))
    assert m.state == "missing" and "no container spark-vllm-dev-serve on spark-1" in m.why
    m = _main(_head(**{f"state:{NAMES.serve}": _state(0, "exited", 137)}))
    assert m.state == "stopped" and "exited (exit code 137)" in m.why
    # docker did not answer: nothing is known, and nothing is taken for good news
    m = _main(_head(**{f"state:{NAMES.serve}": ("", 124, "")}))
    assert m.state == "unknown" and "docker inspect: exit code 124" in m.why
    m = _main(_head(**{f"state:{NAMES.serve}": None}))
    assert m.state == "unknown" and "no answer" in m.why


def test_a_node_that_cannot_be_reached_makes_its_models_unknown():
    cfg = config()
    nodes = {"spark-1": st.NodeStatus("spark-1", error="unreachable: refused"),
             "spark-2": st.parse_node(cfg, NAMES, cfg.nodes[1], _worker(), NONCE)}
    (m,) = st.model_states(cfg, NAMES, nodes)
    assert m.state == "unknown" and "spark-1: unreachable: refused" in m.why


def test_services_and_mp_ranks_are_watched_where_they_run():
    cfg = config(vllm={"executor": "mp"}, services=[{
        "name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8100,
        "gpuMemoryUtilization": 0.1, "nodes": ["spark-2"]}])
    head = [w.container for w in st.watched(cfg, NAMES, cfg.head)]
    worker = st.watched(cfg, NAMES, cfg.nodes[1])
    assert head == [NAMES.serve, NAMES.gateway]
    assert [w.container for w in worker] == [NAMES.serve, NAMES.service("embed")]
    assert worker[0].url == "" and worker[1].url == "http://192.168.177.12:8100"
    assert worker[1].key_file == NAMES.service_key_file("embed")
    main, embed = st.models(cfg, NAMES)
    assert main.needs == (("spark-2", NAMES.serve),) and embed.api == ("spark-2", NAMES.service("embed"))


def test_the_next_up_warns_of_a_crash_loop_from_recons_record():
    """Recon reads the same starts file (section `starts:<container>`, in the node's clock) and
    preflight warns of a container restarted more than crashLoopRestarts times in the window;
    a container with no record (Docker: no such file) is no news."""
    from inspection import preflight, recon
    from tests.unit.inspection.recon_helpers import parse, spark_sections

    cfg = config()
    head = cfg.head
    script = recon.recon_script(cfg, head, NONCE, NAMES)
    assert f"sv_bg starts:{NAMES.serve} " in script
    assert "starts:" not in recon.recon_script(cfg, cfg.nodes[1], NONCE, NAMES)
    # the node's clock is 1764480000.1-.9; offset about +0.5 s from the control machine
    now_node = 1764480000.5
    record = "".join(f"{now_node - age:.3f} start\n" for age in (250, 200, 120, 60, 10))
    sections = spark_sections(1, **{f"starts:{NAMES.serve}": record,
                                    "starts:spark-vllm-dev-embed": ("", 1, "Could not find")})
    facts = parse(assemble(sections), sent_at=now_node - 0.3, received_at=now_node + 0.3)
    assert list(facts.liveness_starts) == [NAMES.serve]
    (warning,) = preflight.check_crash_loops(cfg, facts, now=now_node)
    assert warning.check == "crash_loop" and warning.node == "spark-1"
    assert "spark-vllm-dev-serve is crash-looping: 4 restarts in the last 300 s (more than 2)" \
        in warning.fact
    # two restarts are within the limit; and restarts older than the window do not count
    assert preflight.check_crash_loops(cfg, facts, now=now_node + 190) == []


# --------------------------------------------------------------------------- alerts (issue 35)

ALERTS = fixture("prometheus/alerts-firing-pending.txt")  # Prometheus's /api/v1/alerts answer
AM_ALERTS = fixture("alertmanager/alerts-active-suppressed.txt")  # its /api/v2/alerts answer
AM_METRICS = fixture("alertmanager/metrics-two-sent.txt")  # its /metrics


def test_the_alerts_section_only_on_the_head_of_a_stack_with_monitoring():
    """The head asks its Prometheus with its own python3 (no curl), where Prometheus listens:
    the loopback (monitoring.listen: loopback) or the head's first fabric address (fabric)."""
    cfg = config()  # the lab's dev stack: monitoring on, loopback, 9090
    head = st.node_script(cfg, NAMES, cfg.head, NONCE)
    assert "sv_bg alerts 15 python3 -c " in head and "curl" not in head
    assert "' http://127.0.0.1:9090/api/v1/alerts\n" in head  # the section's argument
    # and its Alertmanager's alerts and notification counters
    assert "' http://127.0.0.1:9093/api/v2/alerts\n" in head
    assert "' http://127.0.0.1:9093/metrics\nsv_bg gateway " in head
    worker = st.node_script(cfg, NAMES, cfg.nodes[1], NONCE)
    assert "sv_bg alerts" not in worker and "sv_bg am_" not in worker
    fabric = config(monitoring={"listen": "fabric", "port": 9191, "alertmanagerPort": 9193})
    assert st.prometheus_url(fabric) == "http://192.168.177.11:9191"
    assert st.alertmanager_url(fabric) == "http://192.168.177.11:9193"
    assert "' http://192.168.177.11:9191/api/v1/alerts\n" in st.node_script(
        fabric, NAMES, fabric.head, NONCE)
    # nothing changes for a stack without monitoring
    off = config(monitoring={"enabled": False})
    for node in off.nodes:
        script = st.node_script(off, NAMES, node, NONCE)
        assert "alerts" not in script and "9090" not in script
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


class _Prometheus(http.server.BaseHTTPRequestHandler):
    """A FAKE Prometheus API: /api/v1/alerts answers `body`."""

    body = ALERTS

    def do_GET(self) -> None:
        code, body = (200, self.body) if self.path == "/api/v1/alerts" else (404, "not found")
        self.send_response(code)
        self.send_header("Content-Length", str(len(body.encode())))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def _run_alerts_section(port: int, env: dict[str, str]) -> st.NodeStatus:
    """The head script's `alerts` section, run for real by bash in recon's frame (everything
    else of the script is left out: it would ask Docker), and read back by parse_node."""
    cfg = config(monitoring={"port": port})
    script = st.node_script(cfg, NAMES, cfg.head, NONCE)
    section = script[script.index("sv_bg alerts "):script.index("\nwait\n")]
    run = "\n".join([f"SV_NONCE={NONCE}", recon.snippet("survey.sh"), section, "wait",
                     'cat "$SV_DIR"/out.*', 'rm -rf "$SV_DIR"', ""])
    done = subprocess.run(["bash"], input=run, text=True, capture_output=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return st.parse_node(cfg, NAMES, cfg.head, done.stdout, NONCE)


def test_the_alerts_section_asks_prometheus_with_python3_and_no_proxy():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # a proxy in the environment is not used: Prometheus is the head's own address
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        env.update(http_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
        ns = _run_alerts_section(server.server_address[1], env)
    finally:
        server.shutdown()
        server.server_close()
    assert [(a.name, a.state, a.node) for a in ns.alerts or []] == [
        ("SparkVllmModelNotServing", "firing", ""), ("SparkNodeMemoryLow", "pending", "spark-1"),
        ("SparkNodeMemoryLow", "pending", "spark-2")]
    assert not [pr for pr in ns.problems if pr.startswith("alerts")], ns.problems
    # Prometheus down: the section fails with the reason, a problem, never "no alerts"
    port = _closed_port()
    ns = _run_alerts_section(port, dict(os.environ))
    assert ns.alerts is None
    (problem,) = [pr for pr in ns.problems if pr.startswith("alerts")]
    assert problem.startswith(f"alerts: http://127.0.0.1:{port}/api/v1/alerts: URLError("), problem
    assert "refused" in problem


def _closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_firing_and_pending_alerts_with_their_model_and_node():
    cfg = config()
    ns = st.parse_node(cfg, NAMES, cfg.head, _head(alerts=ALERTS), NONCE)
    assert ns.problems == [], ns.problems
    assert ns.alerts == [
        st.Alert("SparkVllmModelNotServing", "firing", model="tiny-moe",
                 active_at="2026-12-03T07:45:16.039866763Z",
                 summary="Model tiny-moe is not serving (stack dev)"),
        *(st.Alert("SparkNodeMemoryLow", "pending", node=n,
                   active_at="2026-12-03T07:45:41.039866763Z",
                   summary=f"Node {n} is low on memory (stack dev)")
          for n in ("spark-1", "spark-2")),
    ]  # firing first
    # only the head asks; and an alert is Prometheus's view: the model's state is status's own
    assert st.parse_node(cfg, NAMES, cfg.nodes[1], _worker(), NONCE).alerts is None
    nodes = {"spark-1": ns, "spark-2": st.parse_node(cfg, NAMES, cfg.nodes[1], _worker(), NONCE)}
    assert st.model_states(cfg, NAMES, nodes)[0].state == "serving"
    # none pending or firing: an empty list, and no problem
    empty = st.parse_node(cfg, NAMES, cfg.head,
                          _head(alerts='{"status":"success","data":{"alerts":[]}}'), NONCE)
    assert empty.alerts == [] and empty.problems == []


def _alerts_problem(section) -> str:
    cfg = config()
    ns = st.parse_node(cfg, NAMES, cfg.head, _head(alerts=section), NONCE)
    assert ns.alerts is None, ns.alerts  # never an empty list
    (problem,) = ns.problems
    return problem


def test_alerts_that_cannot_be_read_are_a_problem_never_an_empty_list():
    refused = ("http://127.0.0.1:9090/api/v1/alerts: URLError(ConnectionRefusedError(111, "
               "'Connection refused'))")
    assert _alerts_problem(("", 1, refused + "\n")) == f"alerts: {refused}"
    assert _alerts_problem(("", 124, "")) == "alerts: exit code 124"  # timed out
    assert _alerts_problem(("", 127, "python3: command not found")) == \
        "alerts: python3: command not found"
    assert _alerts_problem(None) == "alerts: no answer"  # the section is missing


@pytest.mark.parametrize("text, why", [
    ("<html>502 Bad Gateway</html>", "Prometheus's answer is not JSON"),
    (ALERTS[:200], "Prometheus's answer is not JSON"),  # cut short
    ("", "Prometheus's answer is not JSON"),
    ("[" * 100000, "Prometheus's answer is not JSON"),  # too deep for the parser
    ("[]", "Prometheus's answer is not a JSON object"),
])
def test_malformed_json_is_a_problem(text, why):
    assert _alerts_problem(text).startswith(f"alerts: {why}")


def test_a_status_other_than_success_is_a_problem():
    error = json.dumps({"status": "error", "errorType": "internal",
                        "error": "rule manager not ready\u001b[2J"})
    assert _alerts_problem(error) == ("alerts: Prometheus answered status 'error': rule manager "
                                      "not ready\\x1b[2J")
    assert _alerts_problem('{"data": {"alerts": []}}') == "alerts: Prometheus answered status None"


def _one(**alert) -> str:
    base = {"labels": {"alertname": "SparkVllmCrashLoop", "model": "tiny-moe"},
            "annotations": {"summary": "s"}, "state": "firing",
            "activeAt": "2026-12-03T04:31:12Z", "value": "3e+00"}
    return json.dumps({"status": "success", "data": {"alerts": [{**base, **alert}]}})


@pytest.mark.parametrize("text, why", [
    ('{"status": "success", "data": {"alerts": {}}}', "Prometheus's answer has no data.alerts"),
    ('{"status": "success", "data": []}', "Prometheus's answer has no data.alerts"),
    ('{"status": "success", "data": {"alerts": ["SparkVllmCrashLoop"]}}', "alert 0 is not an"),
    (_one(labels=["alertname"]), "alert 0: its labels or annotations are not an object"),
    (_one(annotations="s"), "alert 0: its labels or annotations are not an object"),
    (_one(labels={"alertname": 7}), "alert 0's label alertname is int, not a string"),
    (_one(labels={"model": "tiny-moe"}), "alert 0 has no alertname"),
    (_one(labels={"alertname": "A", "model": ["tiny-moe"]}), "alert 0's label model is list"),
    (_one(labels={"alertname": "A", "node": None}), "alert 0's label node is NoneType"),
    (_one(state="inactive"), "alert 0 (SparkVllmCrashLoop) is 'inactive', neither firing nor"),
    (_one(state=None), "alert 0 (SparkVllmCrashLoop) is None, neither firing nor pending"),
    (_one(activeAt=1764735072), "alert 0 activeAt is int, not a string"),
    (_one(annotations={"summary": {"text": "s"}}), "alert 0's annotation summary is dict"),
])
def test_what_prometheus_answers_is_checked_for_its_types(text, why):
    assert _alerts_problem(text).startswith(f"alerts: {why}")


def test_alerts_are_printable_and_capped():
    evil = "\u001b]0;owned\u0007[red]x" + "y" * 1000
    ns = st.parse_node(config(), NAMES, config().head, _head(alerts=_one(
        labels={"alertname": evil, "model": evil, "node": evil},
        annotations={"summary": evil}, activeAt=evil)), NONCE)
    (a,) = ns.alerts or []
    for text, limit in ((a.name, 100), (a.model, 128), (a.node, 64), (a.active_at, 40),
                        (a.summary, 200)):
        assert len(text) <= limit and "\x1b" not in text and "\x07" not in text, text
        assert text.startswith("\\x1b]0;owned\\x07[red]x"), text
    many = json.dumps({"status": "success", "data": {"alerts": [
        {"labels": {"alertname": f"A{i:03d}"}, "state": "pending"} for i in range(150)]}})
    ns = st.parse_node(config(), NAMES, config().head, _head(alerts=many), NONCE)
    assert len(ns.alerts or []) == st.ALERTS_KEPT == 100 and ns.alerts_omitted == 50
    assert ns.problems == []


# ------------------------------------------------------------- issue 51: the collective gate
def _gate_summary() -> str:
    """The record the gate's check leaves on the head: the summary of the lab's real run."""
    from inspection.collective import judge, parse_rank

    lab = ROOT / "tests" / "fixtures" / "collective"
    reports = {n: parse_rank(n, (lab / f"gloo-lab-rank-{n}.txt").read_text().split("\n", 1)[1])
               for n in ("spark-1", "spark-2")}
    return json.dumps(judge(reports, threshold=0.05, enforce=True, rdma=False).summary)


def test_the_head_reads_the_collective_gates_record_with_its_time():
    cfg = config()
    head = st.node_script(cfg, NAMES, cfg.head, NONCE)
    assert "sv_bg collective 15 bash -c " in head and head.rstrip().endswith("exit 0")
    assert f" _ {NAMES.collective_record}\n" in head
    assert "collective" not in st.node_script(cfg, NAMES, cfg.nodes[1], NONCE)
    node = _nodes(cfg, {"spark-1": _head(collective=f"1765000000\n{_gate_summary()}"),
                        "spark-2": _worker()})["spark-1"]
    assert node.collective is not None and node.collective_at == 1765000000.0
    assert node.collective.line() == ("passed: all_gather 0.410 GB/s against 0.05 GB/s, "
                                      "all_reduce 0.512 GB/s (2 ranks, gloo)")
    # no record (a gate that never ran), and one that cannot be read: said, never "passed"
    node = _nodes(cfg, {"spark-1": _head(collective="absent"), "spark-2": _worker()})["spark-1"]
    assert node.collective is None and node.collective_problem.startswith("no record")
    node = _nodes(cfg, {"spark-1": _head(collective="x\n{}"), "spark-2": _worker()})["spark-1"]
    assert node.collective is None
    assert node.collective_problem.startswith("the collective gate's record: ")
    node = _nodes(cfg, {"spark-1": _head(), "spark-2": _worker()})["spark-1"]
    assert node.collective_problem == "could not read the collective gate's record: no answer"


def test_the_gate_record_section_runs_in_bash(tmp_path):
    record = tmp_path / "collective-gate.json"
    out = subprocess.run(["bash", "-c", st.GATE_RECORD, "_", str(record)], capture_output=True,
                         text=True, check=True).stdout
    assert out == "absent\n"
    record.write_text(_gate_summary() + "\n")
    first, second = subprocess.run(["bash", "-c", st.GATE_RECORD, "_", str(record)],
                                   capture_output=True, text=True, check=True).stdout.splitlines()
    assert abs(float(first) - record.stat().st_mtime) < 2 and json.loads(second)["verdict"] == \
        "passed"

# --------------------------------------------------------------------------- the gateway

def test_the_gateway_section_reads_the_stats_socket_on_the_head_only():
    cfg = config()
    head = st.node_script(cfg, NAMES, cfg.head, NONCE)
    assert f"sv_bg gateway {st.STATE_TIMEOUT} python3 -c " in head
    assert f" {NAMES.gateway_run_dir}/stats.sock" in head
    assert "sv_bg gateway" not in st.node_script(cfg, NAMES, cfg.nodes[1], NONCE)


def test_the_gateway_counters_as_haproxy_answered():
    """The recorded answer (tests/fixtures/status/README.md): 4 answers 401 to 127.0.0.2, its
    fifth connection refused, past its limit (3 a minute) now."""
    g = st.parse_gateway(GATEWAY_STATS, 64, 3)
    assert (g.connections, g.connection_limit, g.refused, g.sources, g.unauthorized) == \
        (0, 512, 1, 3, 4)
    assert g.over_limit == ("127.0.0.2",) and g.connections_total == 7
    assert st.parse_gateway(GATEWAY_STATS, 64, 30).over_limit == ()
    cfg = config()
    ns = st.parse_node(cfg, NAMES, cfg.head, _head(), NONCE)
    assert ns.gateway is not None and not [pr for pr in ns.problems if pr.startswith("gateway")]


@pytest.mark.parametrize("text,why", [
    ("", "lacks `show stat` or `show table`"),
    ("== show stat\n# pxname,svname,scur\n== show table api\n# table: api, type: ip",
     "no row for the frontend api"),
    (GATEWAY_STATS.replace("# table: api, type: ip, size:100000, used:3",
                           "# contents not dumped due to insufficient privileges"),
     "`show table api` answered"),
    (GATEWAY_STATS.replace("gpc0=4", "gpc0=\x1b[2J"), "has a line"),
])
def test_gateway_counters_that_cannot_be_read_are_a_problem(text, why):
    with pytest.raises(st.GatewayError, match=re.escape(why)):
        st.parse_gateway(text, 64, 30)
    cfg = config()
    ns = st.parse_node(cfg, NAMES, cfg.head, _head(gateway=text or None), NONCE)
    assert ns.gateway is None
    (problem,) = [pr for pr in ns.problems if pr.startswith("gateway: ")]
    assert "\x1b" not in problem
# ------------------------------------------------------------------ the firewall's drops


def test_each_rule_of_the_firewall_counts_what_it_dropped():
    """Issue 45: the head's table as the lab's nft printed it, read for each rule's drops (the
    two data-plane rules, IPv4 and IPv6, summed), with nothing else a problem."""
    cfg = config()
    nodes = _nodes(cfg, _recorded())
    assert nodes["spark-1"].dropped == {"ray": 223, "vllm": 2, "vllm-internal": 32,
                                        "seeders": 4, "data-plane": 34304}
    assert set(nodes["spark-2"].dropped or {}) >= {"ray", "vllm-internal", "data-plane"}
    assert "sv_bg firewall 10 bash -c " in st.node_script(cfg, NAMES, cfg.head, NONCE)
    off = config(firewall={"enabled": False})
    assert "sv_bg firewall" not in st.node_script(off, NAMES, off.head, NONCE)
    assert st.parse_node(off, NAMES, off.head, _head(firewall=None), NONCE).dropped is None


@pytest.mark.parametrize(("section", "why"), [
    ("absent", "firewall: the stack's table is not loaded (nft lists no such table)"),
    ("{not json", "firewall: nft -j printed something else"),
    ('{"nftables": {}}', "firewall: nft -j printed something else"),
    ('{"nftables": [{"rule": {"comment": "ray", "expr": [{"drop": null}]}}]}',
     "firewall: a drop rule of the stack's table has no packet counter"),
    (("", 1, "Error: Operation not permitted"), "firewall: Error: Operation not permitted"),
    (None, "firewall: no answer"),
])
def test_a_table_not_loaded_or_not_read_is_a_problem_never_no_drops(section, why):
    cfg = config()
    ns = st.parse_node(cfg, NAMES, cfg.head, _head(firewall=section), NONCE)
    assert ns.dropped is None
    assert any(p.startswith(why) for p in ns.problems), ns.problems
# ------------------------------------------------- model.drafter (issue 44, item 4)
DRAFTER_COMMIT = "d" * 40


def _drafter_cfg(revision: str = "main"):
    raw = config_raw()
    raw["model"] = {**raw["model"], "drafter": {"repo": "spark-lab/tiny-drafter",
                                                "revision": revision}}
    raw["vllm"] = {**raw["vllm"], "speculativeConfig": {
        "method": "draft_model", "model": "spark-lab/tiny-drafter", "num_speculative_tokens": 2}}
    return validate_config(raw)


def _cache_listing(tmp_path, with_snapshot: bool) -> str:
    """What the node's hf_cache.sh prints for a drafter cache made here (run for real)."""
    repo = tmp_path / "hub" / "models--spark-lab--tiny-drafter"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(DRAFTER_COMMIT)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "w").write_bytes(b"w" * 100)
    if with_snapshot:
        snap = repo / "snapshots" / DRAFTER_COMMIT
        snap.mkdir(parents=True)
        (snap / "model.safetensors").symlink_to("../../blobs/w")
        (snap / "config.json").symlink_to("../../blobs/w")
    done = subprocess.run(["bash", "-c", recon.snippet("hf_cache.sh"), "_", str(tmp_path),
                           "", "models--spark-lab--tiny-drafter"], capture_output=True, text=True,
                          check=True, timeout=30)
    return done.stdout


def test_status_names_the_drafter_and_where_its_commit_is(tmp_path):
    cfg = _drafter_cfg()
    script = st.node_script(cfg, NAMES, cfg.nodes[1], NONCE)
    assert "sv_bg drafter" in script and "models--spark-lab--tiny-drafter" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    present = _cache_listing(tmp_path / "a", with_snapshot=True)
    missing = _cache_listing(tmp_path / "b", with_snapshot=False)
    nodes = _nodes(cfg, {"spark-1": _head(drafter=present),
                         "spark-2": assemble({"clock": "2000.5", "drafter": missing})})
    states = st.drafter_states(cfg, nodes)
    assert [(d.node, d.state, d.commit, d.files) for d in states] == [
        ("spark-1", "present", DRAFTER_COMMIT, 2), ("spark-2", "missing", DRAFTER_COMMIT, 0)]
    assert states[1].why == f"no snapshot of {DRAFTER_COMMIT[:12]}"
    # a pinned revision is looked for as it is; an unreadable listing is unknown, never present
    pinned = _drafter_cfg("e" * 40)
    nodes = _nodes(pinned, {"spark-1": _head(drafter=present), "spark-2": _worker()})
    assert [(d.state, d.why) for d in st.drafter_states(pinned, nodes)] == [
        ("missing", f"no snapshot of {'e' * 12}"), ("unknown", "no answer")]
    assert "drafter: no answer" in nodes["spark-2"].problems
    # without a drafter: nothing asked, nothing said
    assert st.drafter_states(config(), _nodes(config(), {"spark-1": _head(),
                                                          "spark-2": _worker()})) == []
    assert "sv_bg drafter" not in st.node_script(config(), NAMES, config().head, NONCE)
# ---------------------------------------------------------------------------- deployments (issue 49)


def _deployment_outputs(tmp_path) -> tuple[str, str]:
    """payloads/deployment.py run for real against a FAKE Docker API (tests/fake_docker_api.py):
    a pass recorded (`gate`, `final`), then `status` (the last verified one runs); then the
    container replaced by another argv (an up that failed with health.onFailure keep) and
    `status` again. -> (the first answer, the second)."""
    import sys

    from hostscripts.deployment import DEPLOYMENT_PY, Held, NodeDeployment
    from tests.fake_docker_api import FakeDocker

    image = "sha256:" + "1" * 64
    fake = FakeDocker(str(tmp_path / "docker.sock"))
    fake.images[image] = {"Id": image, "RepoDigests": ["reg/vllm@sha256:" + "a" * 64]}
    env = {**os.environ, "DOCKER_HOST": f"unix://{fake.path}"}
    part = NodeDeployment(str(tmp_path / "record"), (Held(NAMES.serve),))

    def call(command: str, args: dict, *extra: str) -> str:
        done = subprocess.run([sys.executable, "-c", DEPLOYMENT_PY, command, json.dumps(args),
                               *extra], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        cid = fake.add(NAMES.serve, {"Image": image, "Cmd": ["vllm", "serve", "m"],
                                     "Env": ["VLLM_X=1"]}, {"NetworkMode": "host"})
        (tmp_path / "probe").write_text('{"health": "ok", "seconds": 21.5}\n')
        gate = json.loads(call("gate", part.args(restore=None, api=NAMES.serve), "ok",
                               str(tmp_path / "probe"), "", "/dev/null"))
        call("final", part.args(mode="ok", deployment=gate["deployment"], container=NAMES.serve,
                                facts={"model": {"repo": "org/m", "commit": "c" * 40}}))
        status = {"dir": part.dir, "container": NAMES.serve}
        first = call("status", status)
        del fake.containers[cid]
        fake.add(NAMES.serve, {"Image": image, "Cmd": ["vllm", "serve", "m", "--bad"],
                               "Env": ["VLLM_X=1"]}, {"NetworkMode": "host"})
        return first, call("status", status)
    finally:
        fake.close()


def test_the_head_reads_the_main_models_deployment_record_with_its_python3():
    cfg = config()
    head = st.node_script(cfg, NAMES, cfg.head, NONCE)
    assert f"deployment:{NAMES.serve}" in head
    assert " status " in head and NAMES.deployment_dir() in head
    worker = st.node_script(cfg, NAMES, cfg.nodes[1], NONCE)
    assert "deployment:" not in worker  # a rank has no API of its own: its model's is read


def test_what_runs_is_the_last_verified_deployment_or_not(tmp_path):
    first, second = _deployment_outputs(tmp_path)
    verified = st.parse_deployment(first)
    assert verified["matches"] is True
    assert verified["verified"]["model"] == "org/m" and verified["verified"]["commit"] == "c" * 40
    assert verified["verified"]["gateSeconds"] == 21.5
    assert verified["verified"]["repoDigest"] == "reg/vllm@sha256:" + "a" * 64
    assert re.fullmatch(r"[0-9a-f]{16}", verified["verified"]["deployment"])
    other = st.parse_deployment(second)
    assert other["matches"] is False and other["verified"] == verified["verified"]
    main = _main(_head(**{f"deployment:{NAMES.serve}": second}))
    assert main.deployment == other and main.as_json()["deployment"] == other


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"verified": null}',
                                  '{"matches": "yes"}'])
def test_a_deployment_answer_that_cannot_be_read_is_said_so(text):
    with pytest.raises(ValueError, match="not JSON with `matches`"):
        st.parse_deployment(text)
    main = _main(_head(**{f"deployment:{NAMES.serve}": text}))
    assert main.deployment is None and "not JSON" in main.deployment_why


def test_a_deployment_record_is_printable_whatever_the_node_wrote():
    text = json.dumps({"matches": False, "current": None, "verified": {
        "deployment": "\u001b[2J", "model": {"repo": "x\u0007y", "commit": 5}}})
    d = st.parse_deployment(text)
    assert "\x1b" not in d["verified"]["deployment"] and "\x07" not in d["verified"]["model"]
    assert d["verified"]["commit"] == ""  # not a string: not shown
# --------------------------------------------------------------------------- Alertmanager (issue 50)


def test_what_alertmanager_holds_and_sent():
    """The recorded answers (tests/fixtures/alertmanager): the node's alert goes to `oncall`,
    the main model's is held back by it (the model runs on that node), the service's replica on
    the head goes out; two webhook notifications sent, none failed (integrations that never
    sent are left out)."""
    cfg = config()
    ns = st.parse_node(cfg, NAMES, cfg.head, _head(alerts=ALERTS), NONCE)
    assert ns.problems == [], ns.problems
    n = ns.notifications
    assert n is not None and n.sent == {"webhook": {"attempted": 2, "failed": 0}}
    assert [(a.name, a.state, a.model, a.replica, a.node, a.receivers, a.inhibited)
            for a in n.alerts] == [
        ("SparkNodeExporterDown", "active", "", "", "spark-2", ("oncall",), False),
        ("SparkVllmModelNotServing", "active", "tiny-embed", "spark-1", "", ("oncall",), False),
        ("SparkVllmModelNotServing", "suppressed", "tiny-moe", "spark-1", "", ("oncall",),
         True)]
    assert n.alerts[0].starts_at.startswith("2026-12-06T") and n.alerts[0].updated_at


@pytest.mark.parametrize("am_alerts, am_metrics, why", [
    (None, AM_METRICS, "notifications: no answer"),
    (AM_ALERTS, ("", 1, "http://127.0.0.1:9093/metrics: URLError(refused)\n"),
     "notifications: http://127.0.0.1:9093/metrics: URLError(refused)"),
    ("{}", AM_METRICS, "notifications: Alertmanager's answer is not a JSON list"),
    ('[{"labels": {"alertname": "A"}, "status": {"state": "firing"}}]', AM_METRICS,
     "notifications: alert 0: no alertname, or state 'firing'"),
    ("[]", "up 1\n", "notifications: Alertmanager's metrics have no "
                     "alertmanager_notifications_total"),
])
def test_alertmanager_that_cannot_be_read_is_a_problem_never_nothing(am_alerts, am_metrics,
                                                                      why):
    cfg = config()
    ns = st.parse_node(cfg, NAMES, cfg.head, _head(alerts=ALERTS, am_alerts=am_alerts,
                                                   am_metrics=am_metrics), NONCE)
    assert ns.notifications is None and ns.problems == [why], ns.problems
