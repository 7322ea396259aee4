"""hostscripts/monitoring.py, checked and run: the rendered configuration and rules through
Debian's own `promtool` (bookworm's Prometheus 2.42, what the lab's image is built from), the
alert rules through `promtool test rules` with series made from the spec's thresholds, a real
`prometheus` scraping a fake gateway and a fake node exporter on loopback with the rendered
files, the head's scripts run for real with a stand-in `docker`, and the gate's payload against
a fake Prometheus API.

Needs the `prometheus` and `promtool` binaries (Debian's `prometheus` package: `make setup` as
root installs it); without them this module fails saying so, it does not skip (make test fails
on skips anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hostscripts import monitoring
from hostscripts.common import RemoteValueError
from hostscripts.monitoring import (
    ALERTS,
    GROUP,
    ModelTarget,
    MonitoringSpec,
    NodeTarget,
    command,
    config_hash,
    config_remove,
    config_write,
    data_remove,
    data_write,
    gate_marker,
    gate_script,
    key_write,
    node_exporter_command,
    node_exporter_entrypoint,
    render,
    rules,
)
from hostscripts.paths import MONITORING_MOUNT, PROMETHEUS_DATA, StackNames
from tests.unit.hostscripts import daemons
from tests.unit.hostscripts.daemons import debian_binary, no_network  # noqa: F401

NAMES = StackNames("t")
IMAGE = "sha256:" + "a" * 64
KEY = "sk-monitoring-test-key-0001"
GIB = 1 << 30
PROMETHEUS_MISSING = (
    "the {} binary is missing: the unit tier checks and runs the monitoring configuration with "
    "Debian's Prometheus 2.42 (the package the lab's Prometheus image is built from). Install "
    "it as root: `make setup` (scripts/host_packages.sh), or `apt-get update && apt-get install "
    "-y --no-install-recommends prometheus`")


def _binary(name: str) -> str:
    return debian_binary(name, PROMETHEUS_MISSING)


def _spec(**over: Any) -> MonitoringSpec:
    """The stack's defaults (config/monitoring.py, health.liveness, preflight.osReserveBytes)."""
    values: dict[str, Any] = dict(
        stack="t", gateway="http://127.0.0.1:8080", models=("tiny-moe", "org/tiny-embed"),
        nodes=(NodeTarget("spark-1", "127.0.0.1:9100"),
               NodeTarget("spark-2", "192.168.177.12:9100")),
        scrape_interval_seconds=15, not_serving_seconds=60, kv_cache_usage=0.9,
        kv_cache_seconds=300, waiting_seconds=60, memory_seconds=120, crash_loop_restarts=3,
        crash_loop_window_seconds=600, os_reserve_bytes=8 * GIB, oom_killed_seconds=3600)
    values.update(over)
    # a served name alone: one replica, on the head
    values["models"] = tuple(m if isinstance(m, ModelTarget) else ModelTarget(m, ("spark-1",))
                             for m in values["models"])
    return MonitoringSpec(**values)


# Other thresholds, every duration that may be 0 at 0: the tests take them from the spec
OTHER = dict(scrape_interval_seconds=5, not_serving_seconds=0, kv_cache_usage=0.5,
             kv_cache_seconds=10, waiting_seconds=0, memory_seconds=30, crash_loop_restarts=1,
             crash_loop_window_seconds=30, os_reserve_bytes=GIB, oom_killed_seconds=60)


def _write(root: Path, files: dict[str, str], key: str | None = KEY) -> None:
    (root / "conf").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / "conf" / name).write_text(text)
    if key is not None:
        (root / "secrets").mkdir(exist_ok=True)
        (root / "secrets" / "api-key").write_text(key + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the files, through promtool -----------------------------------------------------------


@pytest.mark.parametrize("over", [{}, {"gateway": "https://127.0.0.1:8443"}, OTHER])
def test_promtool_accepts_the_rendered_configuration_and_rules(tmp_path, over):
    """`promtool check config` (which loads the rule files it names and needs the key file it
    names) and `promtool check rules` pass on what render() writes: plain and TLS gateways, and
    thresholds with durations of 0 (no `for`)."""
    spec = _spec(**over)
    _write(tmp_path, render(spec, root=str(tmp_path)))
    promtool = _binary("promtool")
    for args in (["check", "config", str(tmp_path / "conf" / "prometheus.yml")],
                 ["check", "rules", str(tmp_path / "conf" / "rules.yml")]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "conf" / "prometheus.yml").read_text()
    assert f'rule_files:\n  - "{tmp_path}/conf/rules.yml"' in text
    assert ("insecure_skip_verify: true" in text) == over.get("gateway", "").startswith("https")
    assert f'credentials_file: "{tmp_path}/secrets/api-key"' in text and KEY not in text
    assert "for:" not in rules(spec).split("SparkVllmCrashLoop")[1].split("- alert")[0]
    if over is OTHER:
        assert rules(spec).count("for:") == 3  # kv cache, memory, the exporter's fixed 2m


def test_promtool_refuses_a_config_without_its_key_file_or_with_a_broken_rule(tmp_path):
    """What config_write's check relies on: the key file and every rule are checked, so these
    are failures it turns into a failed command (not a Prometheus that runs without them)."""
    files = render(_spec(), root=str(tmp_path))
    _write(tmp_path, files, key=None)
    promtool = _binary("promtool")
    cfg = str(tmp_path / "conf" / "prometheus.yml")
    done = subprocess.run([promtool, "check", "config", cfg], capture_output=True, text=True)
    assert done.returncode != 0 and "api-key" in done.stdout + done.stderr
    _write(tmp_path, {**files, "rules.yml": files["rules.yml"].replace("> 0.9", "> > 0.9")})
    done = subprocess.run([promtool, "check", "config", cfg], capture_output=True, text=True)
    assert done.returncode != 0 and "SparkVllmKvCacheFull" in done.stdout + done.stderr


VLLM = {"job": "vllm", "model": "org/tiny-embed", "replica": "spark-2",
        "instance": "org/tiny-embed@spark-2"}
NODE = {"job": "node", "node": "spark-2", "instance": "192.168.177.12:9100"}
HEAD = {"job": "node", "node": "spark-1", "instance": "127.0.0.1:9100"}


def _humanize1024(v: float) -> str:
    """Prometheus's template function humanize1024 (its Go source: %.4g, 1024-based prefix)."""
    if abs(v) <= 1:
        return f"{v:.4g}"
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return f"{v:.4g}{prefix}"


def _expanded(text: str, labels: dict[str, str], value: float) -> str:
    """An annotation as Prometheus expands it, for the templates the rules use; any other
    template left in it fails the test (a new one must be added here)."""
    for k, v in labels.items():
        text = text.replace(f"{{{{ $labels.{k} }}}}", v)
    text = text.replace("{{ $value | humanizePercentage }}", f"{value * 100:.4g}%")
    text = text.replace("{{ $value | humanize1024 }}", _humanize1024(value))
    text = text.replace("{{ $value }}", f"{value:g}")
    assert "{{" not in text, text
    return text


def _series(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _rule_tests(spec: MonitoringSpec, rules_file: str) -> dict[str, Any]:
    """A `promtool test rules` file (https://prometheus.io/docs/prometheus/latest/configuration/
    unit_testing_rules/) from the spec's thresholds: for every alert, series that fire it (its
    labels and expanded annotations expected) and series that do not: at the threshold itself,
    and above it for less than its `for`."""
    i = spec.scrape_interval_seconds
    annotations = {r["alert"]: r["annotations"]
                   for r in yaml.safe_load(rules(spec))["groups"][0]["rules"]}
    severity = {r["alert"]: r["labels"]["severity"]
                for r in yaml.safe_load(rules(spec))["groups"][0]["rules"]}
    kv = spec.kv_cache_usage
    # alert, metric, labels, a value that fires, the threshold's own value (does not), its `for`
    table = [
        ("SparkVllmModelNotServing", "up", VLLM, 0, 1, spec.not_serving_seconds),
        ("SparkVllmKvCacheFull", "vllm:kv_cache_usage_perc", VLLM, (kv + 1) / 2, kv,
         spec.kv_cache_seconds),
        ("SparkVllmRequestsWaiting", "vllm:num_requests_waiting", VLLM, 3, 0,
         spec.waiting_seconds),
        ("SparkNodeMemoryLow", "node_memory_MemAvailable_bytes", NODE,
         spec.os_reserve_bytes // 2, spec.os_reserve_bytes, spec.memory_seconds),
        ("SparkNodeExporterDown", "up", NODE, 0, 1, monitoring.NODE_EXPORTER_DOWN_SECONDS),
        # the reconcile's last result, from the head exporter's textfile folder: 1 fires
        ("SparkVllmDriftNotRepaired", "spark_vllm_reconcile_result",
         {**HEAD, "result": "refused"}, 1, 0, 0),
        ("SparkVllmReconcileFailed", "spark_vllm_reconcile_result",
         {**HEAD, "result": "failed"}, 1, 0, 0),
    ]
    tests = []

    def case(alert: str, series: str, values: list[float], at: int,
             fired: dict[str, Any] | None) -> None:
        tests.append({"interval": f"{i}s",
                      "input_series": [{"series": series,
                                        "values": " ".join(f"{v!r}" for v in values)}],
                      "alert_rule_test": [{"eval_time": f"{at}s", "alertname": alert,
                                           "exp_alerts": [fired] if fired else []}]})

    def fired(alert: str, labels: dict[str, str], value: float) -> dict[str, Any]:
        return {"exp_labels": {**labels, "severity": severity[alert]},
                "exp_annotations": {k: _expanded(v, labels, value)
                                    for k, v in annotations[alert].items()}}

    for alert, metric, labels, fire, edge, lasting in table:
        at = -(-lasting // i) * i + i  # the first evaluation after `for`, and one more
        n = at // i + 3
        series = _series(metric, labels)
        case(alert, series, [fire] * n, at, fired(alert, labels, fire))
        case(alert, series, [edge] * n, at, None)
        if lasting:
            case(alert, series, [fire] * n, (lasting - 1) // i * i, None)
    # a restart is a new process_start_time_seconds; restarts + 1 of them in the window fire
    restarts, window = spec.crash_loop_restarts, spec.crash_loop_window_seconds
    at = (restarts + 1) * i
    assert at < window, "the spec's window holds too few scrapes for this test"
    series = _series("process_start_time_seconds", VLLM)
    case("SparkVllmCrashLoop", series, [1000 + k for k in range(restarts + 2)], at,
         fired("SparkVllmCrashLoop", VLLM, restarts + 1))
    case("SparkVllmCrashLoop", series, [1000 + min(k, restarts) for k in range(restarts + 2)],
         at, None)
    # an OOM kill: the guard's count (earlyoom's, through the node exporter's textfile) or the
    # kernel's (/proc/vmstat) goes up by one; the alert fires for the node at the next
    # evaluation and stops once the kill is older than oom_killed_seconds; a count that stays
    # (kills before the window, none since) fires nothing
    oom = spec.oom_killed_seconds
    for metric in ("spark_vllm_oom_kills_total", "node_vmstat_oom_kill"):
        series = _series(metric, NODE)
        kill = [0.0] * 4 + [1.0] * (oom // i + 6)  # the kill between the 4th and 5th scrape
        case("SparkVllmOomKilled", series, kill, 5 * i, fired("SparkVllmOomKilled", NODE, 1))
        case("SparkVllmOomKilled", series, kill, 4 * i + oom + 2 * i, None)
        case("SparkVllmOomKilled", series, [3.0] * (oom // i + 6), oom + 2 * i, None)
    # the reconcile's last run at 0 s with a 60 s interval: stale once more than 3 intervals
    # have passed without a run, not before
    every, stale = 60, monitoring.RECONCILE_STALE_RUNS * 60
    for at, fires in ((stale + i, True), (stale - i, False)):
        n = at // i + 2
        tests.append({"interval": f"{i}s", "input_series": [
            {"series": _series("spark_vllm_reconcile_last_run_timestamp_seconds", HEAD),
             "values": " ".join(["0"] * n)},
            {"series": _series("spark_vllm_reconcile_interval_seconds", HEAD),
             "values": " ".join([str(every)] * n)}],
            "alert_rule_test": [{"eval_time": f"{at}s", "alertname": "SparkVllmReconcileStale",
                                 "exp_alerts": [fired("SparkVllmReconcileStale", HEAD, at)]
                                 if fires else []}]})
    return {"rule_files": [rules_file], "evaluation_interval": f"{i}s", "tests": tests}


def _promtool_test(tmp_path: Path, rules_spec: MonitoringSpec,
                   tests_spec: MonitoringSpec) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yml").write_text(rules(rules_spec))
    # JSON is YAML: promtool reads it as its test file
    (tmp_path / "tests.yml").write_text(json.dumps(_rule_tests(tests_spec, "rules.yml")))
    return subprocess.run([_binary("promtool"), "test", "rules", "tests.yml"], cwd=tmp_path,
                          capture_output=True, text=True)


@pytest.mark.parametrize("over", [{}, OTHER])
def test_every_alert_fires_past_its_threshold_and_for_and_not_before(tmp_path, over):
    """`promtool test rules` with series made from the spec: every alert fires with its series'
    labels (`model` or `node`), its severity and its annotations (naming the model or node)
    once past its threshold for its `for`; at the threshold itself, or for less than `for`, it
    does not (a pending alert is not a firing one). Two sets of thresholds, one with durations
    of 0, so the rules follow the spec and not fixed numbers."""
    spec = _spec(**over)
    done = _promtool_test(tmp_path, spec, spec)
    assert done.returncode == 0, done.stdout + done.stderr
    cases = _rule_tests(spec, "rules.yml")["tests"]
    assert {t["alert_rule_test"][0]["alertname"] for t in cases} == set(ALERTS)
    for t in cases:
        for alert in t["alert_rule_test"][0]["exp_alerts"]:
            ann, name = alert["exp_annotations"], alert["exp_labels"]["alertname"] \
                if "alertname" in alert["exp_labels"] else t["alert_rule_test"][0]["alertname"]
            if "Reconcile" in name or "Drift" in name:  # the stack's, not a model's or node's
                assert "(stack t)" in ann["summary"], ann
                continue
            who = alert["exp_labels"].get("model") or alert["exp_labels"]["node"]
            assert who in ann["summary"] and who in ann["description"]
            if "model" in alert["exp_labels"] and name == "SparkVllmModelNotServing":
                assert alert["exp_labels"]["replica"] in ann["summary"]


def test_the_rule_tests_fail_rules_of_other_thresholds(tmp_path):
    """The previous test can fail: the cases of one spec against the rules of another
    (thresholds and durations differ) fail in promtool, alert by alert."""
    done = _promtool_test(tmp_path, _spec(**OTHER), _spec())
    assert done.returncode != 0
    for alert in ("SparkVllmModelNotServing", "SparkVllmKvCacheFull", "SparkVllmCrashLoop",
                  "SparkNodeMemoryLow"):
        assert f"alertname: {alert}" in done.stdout + done.stderr


# --- a real Prometheus, scraping fakes on loopback -------------------------------------------


class _Fake(http.server.BaseHTTPRequestHandler):
    """A fake gateway (`/metrics?model=<name>&replica=<node>` behind the key, a value per
    model, the replica it was asked for as a label) or, with `key` None, a fake node
    exporter."""

    key: str | None = KEY
    values: dict[str, float] = {}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.seen.append((self.path, self.headers.get("Authorization")))
        model = urllib.parse.parse_qs(url.query).get("model", [None])[0]
        replica = urllib.parse.parse_qs(url.query).get("replica", ["none"])[0]
        if self.key is None:
            body = "# TYPE node_memory_MemAvailable_bytes gauge\n" \
                   "node_memory_MemAvailable_bytes 123456789\n"
        elif self.headers.get("Authorization") != f"Bearer {self.key}":
            return self._send(401, "no key\n")
        elif url.path != "/metrics" or model not in self.values:
            return self._send(404, "no such model\n")
        else:
            body = "# TYPE spark_fake_value gauge\n" \
                   f'spark_fake_value{{served="{model}",asked="{replica}"}} ' \
                   f"{self.values[model]}\n"
        self._send(200, body)

    def _send(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> http.server.HTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def fakes() -> Iterator[tuple[type[_Fake], int, int]]:
    """(the gateway's handler class, the gateway's port, the node exporter's port)."""
    gw_handler = type("Gateway", (_Fake,), {"key": KEY, "seen": [],
                                            "values": {"tiny-moe": 11.0,
                                                       "org/tiny-embed": 22.0}})
    node_handler = type("Node", (_Fake,), {"key": None, "seen": []})
    gw, node = _serve(gw_handler), _serve(node_handler)
    yield gw_handler, gw.server_address[1], node.server_address[1]
    gw.shutdown()
    node.shutdown()


class Prometheus:
    """Debian's prometheus with command()'s flags, its mount paths pointed at `root` (conf/,
    secrets/) and its data in `data`."""

    def __init__(self, root: Path, data: Path) -> None:
        self.port = _free_port()
        argv = []
        for a in command("127.0.0.1", self.port, 1):
            flag, value = a.split("=", 1)
            value = str(data) if flag == "--storage.tsdb.path" else \
                value.replace(MONITORING_MOUNT, str(root))
            argv.append(f"{flag}={value}")
        self.log = root.parent / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([_binary("prometheus"), *argv], stdout=out,
                                         stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())["data"]

    def targets(self) -> dict[str, tuple[str, str]]:
        """`vllm/<model>@<replica>` or `node/<node>` -> (health, lastError)."""
        out = {}
        for t in self.get("/api/v1/targets?state=active")["activeTargets"]:
            labels = t["labels"]
            who = f"{labels['model']}@{labels['replica']}" if "model" in labels else \
                labels.get("node")
            out[f"{labels['job']}/{who}"] = (t["health"], t["lastError"])
        return out

    def wait_up(self, expected: set[str], timeout: float = 60) -> None:
        end, seen = time.monotonic() + timeout, {}
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                seen = self.targets()
                if set(seen) == expected and all(h == "up" for h, _ in seen.values()):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"targets not up: {seen}\n{self.log.read_text()[-3000:]}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.quote(expr)
        result: list[dict[str, Any]] = self.get(f"/api/v1/query?query={q}")["result"]
        return result

    def stop(self) -> str:
        return daemons.stop(self.proc, self.log)


def _scrape_spec(gw_port: int, node_port: int,
                 models: tuple[str | ModelTarget, ...] = ("tiny-moe", "org/tiny-embed")
                 ) -> MonitoringSpec:
    return _spec(gateway=f"http://127.0.0.1:{gw_port}", models=models,
                 nodes=(NodeTarget("spark-1", f"127.0.0.1:{node_port}"),),
                 scrape_interval_seconds=1)


REPLICATED = ("tiny-moe", ModelTarget("org/tiny-embed", ("spark-1", "spark-2")))


def test_a_real_prometheus_scrapes_each_replica_through_the_gateway_with_the_key(tmp_path,
                                                                                  fakes):
    """Debian's prometheus with the rendered files: one target per replica of every model at
    the gateway's address, each asking `/metrics?model=<its name>&replica=<node>` (the
    relabelled `__param_model` and `__param_replica`) with the key from the credentials file;
    each replica's own series arrives with its `model` and `replica` labels (issue 50: the two
    replicas of a service are two series, never one that jumps between processes); the node
    exporter's with `node`. The gate's payload passes against it. The key is nowhere in what
    Prometheus says."""
    gw, gw_port, node_port = fakes
    root = tmp_path / "monitoring"
    _write(root, render(_scrape_spec(gw_port, node_port, REPLICATED), root=str(root)))
    prom = Prometheus(root, tmp_path / "data")
    try:
        prom.wait_up({"vllm/tiny-moe@spark-1", "vllm/org/tiny-embed@spark-1",
                      "vllm/org/tiny-embed@spark-2", "node/spark-1"})
        end = time.monotonic() + 20
        while True:
            got = {(r["metric"]["model"], r["metric"]["replica"]):
                   (r["metric"]["served"], r["metric"]["asked"], r["value"][1])
                   for r in prom.query("spark_fake_value")}
            if len(got) == 3 or time.monotonic() > end:
                break
            time.sleep(0.5)
        assert got == {("tiny-moe", "spark-1"): ("tiny-moe", "spark-1", "11"),
                       ("org/tiny-embed", "spark-1"): ("org/tiny-embed", "spark-1", "22"),
                       ("org/tiny-embed", "spark-2"): ("org/tiny-embed", "spark-2", "22")}
        instances = {r["metric"]["instance"] for r in prom.query("up{job='vllm'}")}
        assert instances == {"tiny-moe@spark-1", "org/tiny-embed@spark-1",
                             "org/tiny-embed@spark-2"}
        (node,) = prom.query("node_memory_MemAvailable_bytes")
        assert node["metric"]["node"] == "spark-1" and node["metric"]["job"] == "node"
        # every scrape carried the key, and the model and replica as parameters, URL-encoded
        # (`/` is %2F: the gateway must decode it to find the model)
        asked = {path for path, auth in gw.seen if auth == f"Bearer {KEY}"}
        assert {"/metrics?model=tiny-moe&replica=spark-1",
                "/metrics?model=org%2Ftiny-embed&replica=spark-1",
                "/metrics?model=org%2Ftiny-embed&replica=spark-2"} <= asked
        assert all(auth == f"Bearer {KEY}" for _, auth in gw.seen)
        # the rules loaded; the gate passes against the real API
        spec = _scrape_spec(gw_port, node_port, REPLICATED)
        expected = json.dumps({"targets": monitoring.gate_targets(spec), "group": GROUP,
                               "rules": list(ALERTS)})
        gate = subprocess.run([sys.executable, "-c", monitoring._GATE_PY, prom.url, expected,
                               "30"], capture_output=True, text=True, timeout=60)
        assert gate.returncode == 0, gate.stderr
        assert json.loads(gate.stdout)["rules"] == list(ALERTS)
    finally:
        log = prom.stop()
    assert KEY not in log


def test_a_wrong_key_leaves_the_models_down_with_the_gateways_answer(tmp_path, fakes):
    """The same, with another key in the credentials file: the gateway answers 401, Prometheus
    reports the models' targets down saying so (what the gate prints), the node up."""
    _, gw_port, node_port = fakes
    root = tmp_path / "monitoring"
    _write(root, render(_scrape_spec(gw_port, node_port, ("tiny-moe",)), root=str(root)),
           key="sk-not-the-key")
    prom = Prometheus(root, tmp_path / "data")
    try:
        end, seen = time.monotonic() + 60, {}
        while time.monotonic() < end:
            assert prom.proc.poll() is None, prom.log.read_text()[-3000:]
            with contextlib.suppress(OSError):
                seen = prom.targets()
            if seen.get("vllm/tiny-moe@spark-1", ("",))[0] == "down" and \
                    seen.get("node/spark-1", ("",))[0] == "up":
                break
            time.sleep(0.5)
        assert seen["vllm/tiny-moe@spark-1"][0] == "down" and "401" in seen["vllm/tiny-moe@spark-1"][1], seen
    finally:
        prom.stop()


# --- the head's scripts, run with a stand-in docker (daemons.STAND_IN) -------------------------


class Head(daemons.Head):
    """names.monitoring_dir (and the stack's folder, the textfile folder) under `tmp`; the
    scripts run with the stand-in docker first on PATH."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp, NAMES, NAMES.monitoring_dir, MONITORING_MOUNT, "promtool",
                         _binary("promtool"), {"FAKE_ROOT": MONITORING_MOUNT},
                         more=[monitoring.TEXTFILE_ROOT])
        self.textfile_root = Path(self.places[monitoring.TEXTFILE_ROOT])

    def key(self, key: str = KEY) -> None:
        done = self.run(key_write(NAMES), stdin=key)
        assert done.returncode == 0, done.stderr


def test_config_write_checks_with_promtool_and_swaps_the_folder(tmp_path):
    """config_write, run: a good configuration becomes `conf` (a link to its `conf.<hash>`,
    root only) and the one before is removed; a configuration with a broken rule fails the
    script (promtool's message on stderr) and leaves `conf` as it was; so does a missing key
    file (the key's command must run first). Nothing runs a reload while no Prometheus runs."""
    head = Head(tmp_path)
    head.key()
    first, second = render(_spec()), render(_spec(models=("tiny-moe",)))
    done = head.run(config_write(NAMES, first, IMAGE, {"spark-vllm.managed": "true"}))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"monitoring config {config_hash(first)}\n"
    conf = head.d / "conf"
    assert os.readlink(conf) == f"conf.{config_hash(first)}"
    assert (conf / "prometheus.yml").read_text() == first["prometheus.yml"]
    assert oct(head.d.stat().st_mode & 0o777) == "0o700"
    assert oct((conf / "rules.yml").stat().st_mode & 0o777) == "0o600"
    assert "--label spark-vllm.role=prometheus-check" in head.docker_log.read_text()
    done = head.run(config_write(NAMES, second, IMAGE, {}))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in head.d.iterdir()) == \
        ["conf", f"conf.{config_hash(second)}", "secrets"]
    # a broken rule: promtool refuses it, `conf` stays
    bad = {**first, "rules.yml": first["rules.yml"].replace("> 0.9", "> > 0.9")}
    done = head.run(config_write(NAMES, bad, IMAGE, {}))
    assert done.returncode != 0 and "SparkVllmKvCacheFull" in done.stdout + done.stderr
    assert os.readlink(conf) == f"conf.{config_hash(second)}"
    assert "monitoring config" not in done.stdout
    # no key file: the check fails (the key's command runs before the configuration's)
    (head.d / "secrets" / "api-key").unlink()
    done = head.run(config_write(NAMES, first, IMAGE, {}))
    assert done.returncode != 0 and "api-key" in done.stdout + done.stderr
    assert os.readlink(conf) == f"conf.{config_hash(second)}"
    assert "prometheus reloaded" not in head.docker_log.read_text()
    # config_remove: the folders go, the key's folder stays while the key does
    head.key()
    assert head.run(config_remove(NAMES)).returncode == 0
    assert sorted(p.name for p in head.d.iterdir()) == ["secrets"]


def test_config_write_reloads_a_running_prometheus_which_takes_the_new_targets(tmp_path,
                                                                              fakes):
    """config_write against a running Prometheus (the stand-in names its pid): the script
    signals that process itself (SIGHUP; never `docker kill`, which the stand-in refuses) and
    Prometheus, still running, scrapes the new configuration's targets."""
    _, gw_port, node_port = fakes
    head = Head(tmp_path)
    # the files name the head's own folder here (Prometheus runs on this machine, no mount):
    # NAMES.monitoring_dir in the script, this test's folder once run
    head.env["FAKE_ROOT"] = str(head.d)
    head.key()

    def files(models: tuple[str, ...]) -> dict[str, str]:
        return render(_scrape_spec(gw_port, node_port, models), root=NAMES.monitoring_dir)

    done = head.run(config_write(NAMES, files(("tiny-moe",)), IMAGE, {}))
    assert done.returncode == 0, done.stderr
    prom = Prometheus(head.d, tmp_path / "data")
    try:
        prom.wait_up({"vllm/tiny-moe@spark-1", "node/spark-1"})
        done = head.run(config_write(NAMES, files(("tiny-moe", "org/tiny-embed")), IMAGE, {}),
                        FAKE_DOCKER_PID=str(prom.proc.pid))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == "prometheus reloaded"
        prom.wait_up({"vllm/tiny-moe@spark-1", "vllm/org/tiny-embed@spark-1", "node/spark-1"})
        assert prom.proc.poll() is None
    finally:
        log = prom.stop()
    assert log.count("Completed loading of configuration file") == 2  # the start, the reload
    assert " kill" not in head.docker_log.read_text()


def test_key_write_writes_the_key_root_only_then_reloads_once_prometheus_takes_sighup(tmp_path):
    """key_write, run with Prometheus running (a stand-in process that notes when SIGHUP
    arrives and whether the key file is there then), signalled by the script right after it
    starts: the key (stdin) lands in a 0600 file of a 0700 folder, its sha256 printed, and the
    signal comes only once the process has run RELOAD_MIN_AGE_SECONDS (Prometheus, a Go
    program, dies of a SIGHUP in its first milliseconds, before it asks for the signal) and
    after the file is in place."""
    head = Head(tmp_path)
    out, key = tmp_path / "hup", head.d / "secrets" / "api-key"
    child = subprocess.Popen([sys.executable, "-c", (
        "import os, signal, sys, time\n"
        "t0 = time.monotonic()\n"
        "def hup(*_):\n"
        f"    open({str(out)!r}, 'w').write('%f %s' % (time.monotonic() - t0, "
        f"os.path.exists({str(key)!r})))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGHUP, hup)\n"
        "time.sleep(60)\n")])
    try:
        done = head.run(key_write(NAMES), stdin=KEY, FAKE_DOCKER_PID=str(child.pid))
        assert done.returncode == 0, done.stderr
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
        child.wait()
    after, existed = out.read_text().split()
    # the child's clock starts after the interpreter's own start: a second of slack
    assert float(after) >= monitoring.RELOAD_MIN_AGE_SECONDS - 1 and existed == "True"
    assert key.read_text() == KEY and oct(key.stat().st_mode & 0o777) == "0o600"
    assert oct(key.parent.stat().st_mode & 0o777) == "0o700"
    assert done.stdout.splitlines() == [
        f"monitoring key {hashlib.sha256(KEY.encode()).hexdigest()}", "prometheus reloaded"]
    assert KEY not in key_write(NAMES) and KEY not in head.docker_log.read_text()


def test_the_data_folder_is_made_root_only_and_kept_or_removed_on_destroy(tmp_path):
    """data_write makes names.prometheus_data_dir and names.alertmanager_data_dir 0700, and the
    head exporter's textfile folder 0755 (the exporter runs as nobody); data_remove with keep
    leaves the data folders (and their data) and says so; without keep they go, with the
    stack's folder when that is empty; the textfile folder goes either way. A path outside the
    stack's folder is refused before any script is made."""
    head = Head(tmp_path)
    data = tmp_path / "node" / NAMES.prometheus_data_dir.lstrip("/")
    am = tmp_path / "node" / NAMES.alertmanager_data_dir.lstrip("/")
    text = head.textfile_root / "t"
    done = head.run(data_write(NAMES))
    assert done.returncode == 0 and oct(data.stat().st_mode & 0o777) == "0o700", done.stderr
    assert oct(am.stat().st_mode & 0o777) == "0o700"
    assert oct(text.stat().st_mode & 0o777) == oct(head.textfile_root.stat().st_mode & 0o777) \
        == "0o755"
    (data / "wal").mkdir()
    (data / "wal" / "00000000").write_text("samples")
    (am / "nflog").write_text("log")
    (text / "reconcile.prom").write_text("x 1\n")
    done = head.run(data_remove(NAMES, keep=True))
    assert done.returncode == 0 and (data / "wal" / "00000000").is_file()
    assert (am / "nflog").is_file() and not text.exists()
    assert done.stdout == (f"prometheus data kept (monitoring.keepDataOnDestroy): "
                           f"{NAMES.prometheus_data_dir}\n"
                           f"alertmanager data kept: {NAMES.alertmanager_data_dir}\n").replace(
                               NAMES.dir, str(head.stack_dir))
    done = head.run(data_remove(NAMES, keep=False))
    assert done.returncode == 0 and not data.exists() and not am.exists()
    assert not head.stack_dir.exists() and not head.textfile_root.exists()


# --- the scripts as text ------------------------------------------------------------------


def test_config_write_refuses_what_is_not_an_image_id_or_a_monitoring_file():
    files = render(_spec())
    for bad in ("", "sha256:x; reboot", "prom/prometheus:v2.42.0", IMAGE + "\n"):
        with pytest.raises(RemoteValueError):
            config_write(NAMES, files, bad, {})
    for extra in ({"../etc/passwd": "x"}, {"rules.yml": "x", "prometheus.yml": "x", "a.yml": ""}):
        with pytest.raises(ValueError):
            config_write(NAMES, {**files, **extra}, IMAGE, {})
    with pytest.raises(ValueError):
        config_write(NAMES, {"prometheus.yml": files["prometheus.yml"]}, IMAGE, {})
    script = config_write(NAMES, files, IMAGE, {})
    assert f"mv -T {NAMES.monitoring_dir}/conf.link {NAMES.monitoring_dir}/conf" in script
    assert "docker kill" not in script and 'kill -HUP "$pid"' in script


def test_commands_and_entrypoints():
    assert command("127.0.0.1", 9090, 15) == [
        f"--config.file={MONITORING_MOUNT}/conf/prometheus.yml",
        f"--storage.tsdb.path={PROMETHEUS_DATA}", "--storage.tsdb.retention.time=15d",
        "--web.listen-address=127.0.0.1:9090"]
    assert monitoring.entrypoint() == ["prometheus"]
    assert node_exporter_entrypoint() == ["node_exporter"]
    # the node's / and its /proc as the node's processes see them (a lab node's memory: its own)
    assert node_exporter_command("192.168.177.11", 9100) == [
        "--web.listen-address=192.168.177.11:9100", "--path.rootfs=/host",
        "--path.procfs=/host/proc"]
    # a textfile folder: the guard's (the count its kill hook writes) on a node, the stack's on
    # the head (the reconcile's results, a link to the guard's count: data_write)
    assert node_exporter_command("127.0.0.1", 9100,
                                 textfile="/var/lib/spark-vllm/guard/metrics")[-1] == (
        "--collector.textfile.directory=/host/var/lib/spark-vllm/guard/metrics")
    with pytest.raises(ValueError):
        command("127.0.0.1 --web.enable-lifecycle", 9090, 15)


@pytest.mark.parametrize("over", [
    {"stack": "a b"},
    {"gateway": "ftp://127.0.0.1:8080"},
    {"gateway": "http://127.0.0.1"},  # no port
    {"gateway": "http://127.0.0.1:8080/x"},
    {"gateway": "http://u:p@127.0.0.1:8080"},
    {"gateway": "http://127.0.0.1:99999"},
    {"models": ()},
    {"models": ("a", "a")},
    {"models": ("a b",)},
    {"nodes": (NodeTarget("Spark 1", "127.0.0.1:9100"),)},
    {"nodes": (NodeTarget("spark-1", "127.0.0.1"),)},
    {"nodes": (NodeTarget("spark-1", "127.0.0.1:1"), NodeTarget("spark-1", "127.0.0.2:1"))},
    {"scrape_interval_seconds": 0},
    {"crash_loop_window_seconds": 0},
    {"not_serving_seconds": -1},
    {"kv_cache_usage": 1.0},
])
def test_a_spec_that_cannot_be_rendered_is_refused(over):
    with pytest.raises(ValueError):
        _spec(**over)


def test_the_gate_marker_and_script():
    cid = "c" * 64
    assert gate_marker(cid, "prometheus reloaded\nmonitoring config 0123456789abcdef\n") == \
        f"{cid} 0123456789abcdef"
    with pytest.raises(ValueError, match="not a alertmanager config hash"):
        gate_marker(cid, "monitoring config 0123456789abcdef", "d" * 64, "ok")
    with pytest.raises(RemoteValueError):
        gate_marker("not-an-id;", "monitoring config 0123456789abcdef")
    spec = _spec()
    script = gate_script(NAMES, f"{cid} 0123456789abcdef", "http://127.0.0.1:9090", spec, 300)
    assert "docker start spark-vllm-t-prometheus" in script
    assert f"# monitoring: '{cid} 0123456789abcdef'" in script
    assert monitoring.gate_targets(spec) == [
        {"job": "vllm", "model": "tiny-moe", "replica": "spark-1"},
        {"job": "vllm", "model": "org/tiny-embed", "replica": "spark-1"},
        {"job": "node", "node": "spark-1"}, {"job": "node", "node": "spark-2"}]
    # Alertmanager too, when the stack has one: started with Prometheus, checked by the gate
    with_am = _spec(alertmanager="127.0.0.1:9093")
    script = gate_script(NAMES, f"{cid} 0123456789abcdef", "http://127.0.0.1:9090", with_am,
                         300)
    assert "docker start spark-vllm-t-alertmanager" in script
    assert '"alertmanager":"127.0.0.1:9093"' in script
    assert gate_marker(cid, "monitoring config 0123456789abcdef", "d" * 64,
                       "alertmanager config fedcba9876543210") == \
        f"{cid} 0123456789abcdef {'d' * 64} fedcba9876543210"


# --- the gate's payload against a fake Prometheus API ----------------------------------------


class _FakeApi(http.server.BaseHTTPRequestHandler):
    ready = True
    targets: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    # targets listed only for the first `stale_answers` answers (a reload not applied yet)
    stale: list[dict[str, Any]] = []
    stale_answers = 0
    answers = [0]
    alertmanagers: list[str] = []

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        if path == "/-/ready":
            return self._send(200 if self.ready else 503, "ready\n")
        data: dict[str, Any]
        if path == "/api/v1/targets":
            self.answers[0] += 1
            stale = self.stale if self.answers[0] <= self.stale_answers else []
            data = {"activeTargets": self.targets + stale, "droppedTargets": []}
        elif path == "/api/v1/rules":
            data = {"groups": self.groups}
        elif path == "/api/v1/alertmanagers":
            data = {"activeAlertmanagers": [{"url": u} for u in self.alertmanagers],
                    "droppedAlertmanagers": []}
        else:
            return self._send(404, "not found\n")
        self._send(200, json.dumps({"status": "success", "data": data}))

    def _send(self, code: int, body: str) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def _target(job: str, who: str, health: str = "up", error: str = "") -> dict[str, Any]:
    labels = {"job": job, "model": who, "replica": "spark-1"} if job == "vllm" else \
        {"job": job, "node": who}
    return {"labels": {**labels, "instance": "127.0.0.1:1"}, "health": health,
            "lastError": error}


ALL_RULES = [{"name": GROUP, "rules": [{"name": a, "type": "alerting"} for a in ALERTS]}]


def _gate(api: type[_FakeApi], timeout: int = 30,
          alertmanager: bool = False) -> subprocess.CompletedProcess[str]:
    server = _serve(api)
    try:
        spec = _spec(nodes=(NodeTarget("spark-1", "127.0.0.1:9100"),))
        want: dict[str, Any] = {"targets": monitoring.gate_targets(spec), "group": GROUP,
                                "rules": list(ALERTS)}
        if alertmanager:  # the fake answers Alertmanager's /-/ready too
            want["alertmanager"] = f"127.0.0.1:{server.server_address[1]}"
        expected = json.dumps(want)
        return subprocess.run([sys.executable, "-c", monitoring._GATE_PY,
                               f"http://127.0.0.1:{server.server_address[1]}", expected,
                               str(timeout)], capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()


def _api(**attrs: Any) -> type[_FakeApi]:
    targets = [_target("vllm", "tiny-moe"), _target("vllm", "org/tiny-embed"),
               _target("node", "spark-1"), _target("other", "spark-9")]
    return type("Api", (_FakeApi,), {"targets": targets, "groups": ALL_RULES, "answers": [0],
                                     **attrs})


def test_the_gate_passes_when_every_target_is_up_and_the_rules_are_loaded():
    done = _gate(_api())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "ready": True, "group": GROUP, "rules": list(ALERTS),
        "targets": ["node/spark-1", "vllm/org/tiny-embed@spark-1", "vllm/tiny-moe@spark-1"]}


def test_the_gate_waits_until_a_removed_target_is_gone():
    """A service removed: Prometheus applies the reload's target list seconds later (its
    discovery sends updates at most every 5 s). The gate waits for exactly the declared targets
    of its jobs (a job not the stack's is not its business); one that stays fails it."""
    stale = [_target("vllm", "old-embed", "down"), _target("node", "spark-9")]
    done = _gate(_api(stale=stale, stale_answers=3))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["targets"] == [
        "node/spark-1", "vllm/org/tiny-embed@spark-1", "vllm/tiny-moe@spark-1"]
    assert "monitoring gate: vllm/old-embed@spark-1 undeclared" in done.stderr
    done = _gate(_api(stale=stale, stale_answers=10 ** 6), timeout=3)
    assert done.returncode != 0 and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert "vllm/old-embed@spark-1 undeclared (still scraped" in last
    assert "node/spark-9 undeclared" in last and "tiny-moe" not in last


def test_the_gate_fails_naming_a_target_never_up_and_its_error():
    """A model's target down (the gateway's 401 as Prometheus reports it) and a node's missing:
    the gate prints their state while it waits and fails at its timeout naming both."""
    error = "server returned HTTP status 401 Unauthorized"
    targets = [_target("vllm", "tiny-moe"), _target("vllm", "org/tiny-embed", "down", error)]
    done = _gate(_api(targets=targets), timeout=3)
    assert done.returncode != 0 and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("targets not up after 3s: ")
    assert f"vllm/org/tiny-embed@spark-1 down ({error})" in last
    assert "node/spark-1 missing (not among Prometheus's active targets)" in last
    assert "vllm/tiny-moe@spark-1" not in last
    assert f"monitoring gate: vllm/org/tiny-embed@spark-1 down ({error})" in done.stderr
    assert "monitoring gate: vllm/tiny-moe@spark-1 up" in done.stderr


@pytest.mark.parametrize(("groups", "message"), [
    ([], "prometheus has no rule group spark-vllm (its groups: none)"),
    ([{"name": GROUP, "rules": [{"name": a} for a in ALERTS if a != "SparkNodeMemoryLow"]}],
     "prometheus's rule group spark-vllm lacks SparkNodeMemoryLow"),
])
def test_the_gate_fails_when_the_rules_are_not_loaded(groups, message):
    done = _gate(_api(groups=groups))
    assert done.returncode != 0 and message in done.stderr and done.stdout == ""


def test_the_gate_fails_when_prometheus_never_gets_ready():
    done = _gate(_api(ready=False), timeout=2)
    assert done.returncode != 0 and "not ready within 2s: HTTP 503" in done.stderr


def test_the_gate_waits_until_prometheus_sends_to_the_stacks_alertmanager():
    """With Alertmanager: the gate passes once Prometheus lists it among its active
    alertmanagers (/api/v1/alertmanagers), and fails at its timeout naming what it lists
    instead."""
    done = _gate(_api(), alertmanager=True, timeout=3)
    assert done.returncode != 0
    assert "prometheus does not send to alertmanager 127.0.0.1:" in done.stderr
    assert "(its alertmanagers: none)" in done.stderr

    class Listing(_FakeApi):
        def do_GET(self) -> None:  # its own address, known once it listens
            type(self).alertmanagers = [
                f"http://127.0.0.1:{self.server.server_address[1]}/api/v2/alerts"]
            super().do_GET()

    api = type("Api", (Listing,), dict(_api().__dict__))
    done = _gate(api, alertmanager=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["alertmanager"].startswith("127.0.0.1:")
