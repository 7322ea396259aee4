"""Metrics and alerts on the lab (issues 35 and 50): Prometheus and Alertmanager the stack
deploys, the real vLLM's metrics through the gateway (each replica on its own), the lab's node
exporters, the stack's alert rules, a webhook receiver that hears of them, and `spark-vllm
reconcile` repairing drift with no human.

On the session's shared stack (tests/e2e/conftest.py), which the tests' deployments start with
monitoring off (lab/deployments.new_deployment: the change tables of the modules before this
one measure the stack's own changes); `make demo` runs Pulumi.dev.yaml as it is, monitoring on.
In order:

1. monitoring turned on, with a webhook receiver (a stand-in HTTP sink in this test, on the lab
   host's management address, which the head reaches; its URL a secret): the preview creates
   only the monitoring component's resources; after the up, Prometheus (on the head's
   loopback, asked over ssh as an operator would) reports every target up: each served model
   through the gateway, each node's exporter, and the stack's rules loaded; Alertmanager
   listens on the head's loopback;
2. a completion through the gateway moves vLLM's request counter as Prometheus sees it;
3. the worker's vLLM stopped: the not-serving alert fires for the main model (the lab's
   threshold: 15 s) and the webhook receives it (timed); the worker started again and the
   stack converged, the model serves and the webhook receives its resolution (timed);
   `spark-vllm status` shows what Alertmanager sent;
3b. `spark-vllm reconcile --every 15s` running (as its timer would): the worker's fabric twin
   loses its address and MTU behind the stack and the reconcile repairs it with no human
   (timed: drift made -> repaired), its result reaching Prometheus through the head
   exporter's textfile folder; an edited stack file is refused, nothing applied;
4. a new scrape interval: only the monitoring configuration (and its gate) change; Prometheus
   is reloaded with it, its container keeps its ID and start time;
5. the monitoring folders wiped on the head behind the stack: made again, Prometheus and
   Alertmanager replaced; Prometheus stopped behind the stack: its gate starts it again; the
   worker's node exporter stopped: the next `up` starts it again (its node's start command);
6. a service added on both nodes: each replica's target is up when the up ends (scraped on its
   own through the gateway), and of monitoring only the configurations and the gate changed
   (Prometheus, Alertmanager and the exporters keep running); the service removed again;
7. monitoring turned off: its containers go from every node, its data folder stays
   (monitoring.keepDataOnDestroy), then removed by the test.

Every `up` prints its wall time (`WALL ...`).
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pulumi.automation as auto
import pytest

from lab.deployments import EMBED_REPO, ROOT, complete, embed_service
from tests import reporting

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
PROMETHEUS = "spark-vllm-dev-prometheus"
EXPORTER = "spark-vllm-dev-node-exporter"
ALERTMANAGER = "spark-vllm-dev-alertmanager"
SERVE = "spark-vllm-dev-serve"
RAY_WORKER = "spark-vllm-dev-ray-worker"
DATA = "/var/lib/spark-vllm/stacks/dev/prometheus-data"
AM_DATA = "/var/lib/spark-vllm/stacks/dev/alertmanager-data"
TEXTFILE = "/var/lib/spark-vllm-textfile/dev/reconcile.prom"
MONITORING_DIR = "/var/lib/spark-vllm/stacks/dev/monitoring"
MAIN = "tiny-moe"
URL = "http://127.0.0.1:9090"
# what the stack's resources may do when monitoring changes: its own, and the stack's outputs
OWN = ("monitoring",)
SINK_HOST = "10.77.0.1"  # the lab host on the nodes' management network (the lab's registry's)
TWIN = "enP2p1s0f1np1"  # the worker's second fabric twin (tests/e2e/test_fabric.py says why)


class _Sink(http.server.BaseHTTPRequestHandler):
    """A STAND-IN webhook receiver: every notification Alertmanager posts, with its arrival."""

    got: list[tuple[float, dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.got.append((time.monotonic(), json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def sink():
    handler = type("Sink", (_Sink,), {"got": []})
    server = http.server.ThreadingHTTPServer((SINK_HOST, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://{SINK_HOST}:{server.server_address[1]}/hook/e2e-token"
    server.shutdown()
    server.server_close()


def _set_receivers(d, receivers: list[dict]) -> None:
    """monitoring.alerting.receivers written into the stack file (a list inside an object:
    `pulumi config set --path` would store its JSON as a string)."""
    import yaml

    path = Path(d.workdir) / "Pulumi.dev.yaml"
    doc = yaml.safe_load(path.read_text())
    monitoring = doc["config"]["spark-vllm:monitoring"]
    monitoring.setdefault("alerting", {})["receivers"] = receivers
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def notified(handler, status: str, alertname: str, since: float) -> list[dict]:
    """The alerts of `status` named `alertname` the sink received after `since`."""
    return [a for t, body in handler.got if t >= since for a in body["alerts"]
            if a["status"] == status and a["labels"]["alertname"] == alertname]


def prom(d, path: str) -> dict:
    """GET Prometheus's API on the head's loopback, from the head (ssh), as JSON."""
    code = ("import json,sys,urllib.request;"
            "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())")
    out = d.ssh(HEAD, f"python3 -c '{code}' '{URL}{path}'")
    return json.loads(out)


def query(d, expr: str) -> list[dict]:
    from urllib.parse import quote

    return prom(d, f"/api/v1/query?query={quote(expr, safe='')}")["data"]["result"]


def wait(pred, timeout: float, what: str, interval: float = 2.0):
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            last = pred()
            if last:
                return last
        except Exception as e:  # the last error is reported on timeout
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def targets(d) -> dict[tuple[str, ...], str]:
    """(job, model, replica) or (job, node) -> health of every active target."""
    out = {}
    for t in prom(d, "/api/v1/targets")["data"]["activeTargets"]:
        lab = t["labels"]
        key = ((lab["job"], lab["model"], lab.get("replica", "?")) if "model" in lab
               else (lab["job"], lab.get("node", "?")))
        out[key] = t["health"]
    return out


def container(d, node: str, name: str) -> str:
    return d.ssh(node, f"docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {name} "
                       "2>/dev/null || true").strip()


def mine(ops: dict[str, str], firewall: bool = False) -> dict[str, str]:
    """The ops that are not the monitoring component's own (the stack's outputs aside); with
    `firewall`, also not the nodes' firewall tables updated in place (monitoring turned on or
    off adds or removes Prometheus's and the exporters' ports there: issue 45)."""
    return {k: v for k, v in ops.items()
            if not k.startswith(OWN) and not k.startswith("spark-vllm-")
            and not (firewall and k.startswith("firewall-") and v == "update")}


def test_monitoring_on_adds_only_its_resources_and_every_target_is_up(stack, sink):
    d = stack
    _, url = sink
    # the receiver: a webhook whose URL is a secret (its value never in the stack file's text)
    _set_receivers(d, [{"name": "e2e-sink", "webhook": {"urlSecret": "sink"}}])
    d.stack.set_config("spark-vllm:alertingSecrets",
                       auto.ConfigValue(json.dumps({"sink": url}), secret=True))
    assert url not in (d.workdir / "Pulumi.dev.yaml").read_text()
    d.set("monitoring.enabled", True)
    d.run("preview")
    assert mine(d.ops(), firewall=True) == {}, d.ops()
    ops = d.timed_up("monitoring on")
    assert ops.get("monitoring-prometheus") == "create", ops
    assert mine(ops, firewall=True) == {}, ops
    assert ops.get(f"firewall-{WORKER}-table") == "update", ops  # the exporter's port
    served = list(d.stack.outputs()["models"].value)
    assert MAIN in served
    want = {("vllm", m, HEAD) for m in served} | {("node", HEAD), ("node", WORKER)}
    def all_up():
        t = targets(d)
        return t if set(t) == want and set(t.values()) == {"up"} else None

    health = wait(all_up, 120, "every target up")
    assert set(health) == want
    groups = prom(d, "/api/v1/rules")["data"]["groups"]
    names = {r["name"] for g in groups for r in g["rules"]}
    assert {"SparkVllmModelNotServing", "SparkVllmKvCacheFull", "SparkVllmRequestsWaiting",
            "SparkNodeMemoryLow", "SparkVllmCrashLoop"} <= names, names
    # the exporters listen where the issue wants them: the head's loopback, the worker's fabric
    assert "127.0.0.1:9100" in d.ssh(HEAD, "ss -ltnH 'sport = :9100'")
    fabric_ip = d.cfg["nodes"][1]["fabric"][0]["ip"]
    assert f"{fabric_ip}:9100" in d.ssh(WORKER, "ss -ltnH 'sport = :9100'")
    assert "127.0.0.1:9090" in d.ssh(HEAD, "ss -ltnH 'sport = :9090'")
    # Alertmanager beside it, on the loopback only, its cluster (gossip, 9094) off
    assert "127.0.0.1:9093" in d.ssh(HEAD, "ss -ltnH 'sport = :9093'")
    assert d.ssh(HEAD, "ss -ltnuH 'sport = :9094'").strip() == ""
    am = prom(d, "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
    assert [a["url"] for a in am] == ["http://127.0.0.1:9093/api/v2/alerts"]
    # its configuration (with the URL) root only on the head
    assert d.ssh(HEAD, "stat -c %a /var/lib/spark-vllm/stacks/dev/alertmanager/conf/"
                       "alertmanager.yml").strip() == "600"


def test_a_completion_moves_the_request_counter_prometheus_sees(stack):
    d = stack
    expr = f'sum(vllm:request_success_total{{job="vllm",model="{MAIN}"}})'

    def value() -> float:
        r = query(d, expr)
        return float(r[0]["value"][1]) if r else 0.0

    wait(lambda: query(d, expr), 60, "vLLM's request counter scraped")
    before = value()
    complete(d)
    complete(d)
    after = wait(lambda: (v := value()) >= before + 2 and v, 60, "the counter to move by 2")
    assert after >= before + 2
    # and a node exporter's memory series is there for the memory rule
    assert {r["metric"]["node"] for r in query(d, "node_memory_MemAvailable_bytes")} == {
        HEAD, WORKER}


def test_the_not_serving_alert_fires_when_the_workers_vllm_stops(stack, sink):
    """Prometheus fires it, Alertmanager tells the webhook within the rule's window, and its
    resolution once the model serves again; `spark-vllm status` shows what was sent."""
    d = stack
    handler, _ = sink
    # the worker's rank of the main model: its vLLM container with mp (where MODULE_ORDER runs
    # this module), its Ray worker with Ray (this module alone)
    rank = SERVE if container(d, WORKER, SERVE) else RAY_WORKER
    stopped = time.monotonic()
    d.ssh(WORKER, f"docker stop -t 5 {rank}")
    try:
        def firing():
            alerts = prom(d, "/api/v1/alerts")["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "SparkVllmModelNotServing"
                    and a["labels"].get("model") == MAIN and a["state"] == "firing"]

        fired = wait(firing, 240, "SparkVllmModelNotServing firing for the main model", 5)
        assert fired[0]["annotations"]["summary"]
        # the webhook hears of it: the rule's window (notServingSeconds 15 s, scraped and
        # evaluated every 5 s), Alertmanager's group wait (5 s), and the lab's slowness
        (sent,) = wait(lambda: notified(handler, "firing", "SparkVllmModelNotServing",
                                        stopped)[:1], 180, "the webhook's notification", 2)
        heard = next(t for t, body in handler.got if sent in body["alerts"]) - stopped
        reporting.record("alert: worker's vLLM stopped -> webhook notified", heard)
        assert sent["labels"]["model"] == MAIN and sent["labels"]["stack"] == "dev"
        assert heard < 120, heard
    finally:
        d.ssh(WORKER, f"docker start {rank}", check=False)
    started = time.monotonic()
    d.timed_up("after the worker's vLLM stopped")
    assert wait(lambda: complete(d), 300, "the model serving again", 5)
    (resolved,) = wait(lambda: notified(handler, "resolved", "SparkVllmModelNotServing",
                                        started)[:1], 180, "the webhook's resolution", 2)
    assert resolved["labels"]["model"] == MAIN
    reporting.record("alert: worker's vLLM back -> webhook told it is resolved",
                     next(t for t, body in handler.got if resolved in body["alerts"]) - started)
    # spark-vllm status: what Alertmanager sent (its webhook counter), read on the head
    code, data = d.status()
    assert code == 0, data  # every model serves again
    sent_total = (data["notifications"] or {}).get("sent", {}).get("webhook", {})
    assert sent_total.get("attempted", 0) >= 2 and sent_total.get("failed") == 0, data


def _reconcile_env(d) -> dict[str, str]:
    """This shell's environment with the stack's backend and passphrase (what an operator
    exports before running `spark-vllm`)."""
    return {**os.environ, **d.stack.workspace.env_vars}


def _port(d, node: str, iface: str = TWIN) -> tuple[str, str]:
    out = d.ssh(node, f"ip -o -4 addr show dev {iface} | awk '{{print $4}}' | tr '\\n' ' '; "
                      f"echo; cat /sys/class/net/{iface}/mtu").splitlines()
    return out[0].strip(), out[1].strip()


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_the_reconcile_repairs_fabric_drift_with_no_human(stack):
    """`spark-vllm reconcile -s dev --every 15s` runs as its timer would run it. The worker's
    second twin loses its address and its MTU behind the stack (as tests/e2e/test_fabric.py
    does by hand): the next run repairs it (a `fabric` class change) with no human; timed from
    the drift to the port back. Its result reaches Prometheus through the head exporter's
    textfile folder. No container of the stack is touched."""
    d = stack
    before = d.snapshot()
    assert _port(d, WORKER) == ("192.168.178.12/24", "9000")
    exe = ROOT / "venv" / "bin" / "spark-vllm"
    loop = subprocess.Popen([str(exe), "reconcile", "-s", "dev", "--every", "15s", "--json"],
                            cwd=d.workdir, env=_reconcile_env(d), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[dict] = []
    threading.Thread(target=lambda: [lines.append(json.loads(ln)) for ln in loop.stdout],
                     daemon=True).start()
    try:
        first = wait(lambda: lines[:1], 300, "the reconcile's first run", 2)
        assert first[0]["result"] == "clean", first
        made = time.monotonic()
        d.ssh(WORKER, f"ip addr flush dev {TWIN}; ip link set dev {TWIN} mtu 1500")
        wait(lambda: _port(d, WORKER) == ("192.168.178.12/24", "9000"), 300,
             "the reconcile to repair the twin", 2)
        repaired_in = time.monotonic() - made
        reporting.record("reconcile: fabric drift made -> repaired with no human",
                         repaired_in)
        run = wait(lambda: [r for r in lines if r["result"] == "repaired"], 60,
                   "the repairing run's record", 1)[0]
        assert set(run["saw"]) == {"fabric"}, run
        assert f"fabric-{WORKER}-{TWIN} replace" in run["saw"]["fabric"], run
        assert run["unrepaired"] == [] and run["did"], run
        assert not any(r["result"] in ("failed", "refused") for r in lines), lines
    finally:
        loop.send_signal(signal.SIGTERM)
        try:
            loop.wait(timeout=300)  # the run in progress ends first
        except subprocess.TimeoutExpired:
            loop.kill()
            loop.wait()
    assert loop.returncode == 0, loop.stderr.read() if loop.stderr else ""
    assert d.snapshot() == before  # no container restarted
    assert complete(d)
    # its result, on the head and in Prometheus (the head exporter's textfile collector)
    assert 'spark_vllm_reconcile_result{result="' in d.ssh(HEAD, f"cat {TEXTFILE}")
    got = wait(lambda: query(d, "spark_vllm_reconcile_last_run_timestamp_seconds"), 60,
               "Prometheus to scrape the reconcile's result", 2)
    assert got[0]["metric"]["node"] == HEAD
    d.run("preview")
    assert d.ops() == {}


def test_the_reconcile_refuses_an_edited_stack_file(stack):
    """A stack file edited and not `up`-ed: the run refuses (exit 3) naming the key, previews
    and applies nothing, and its result says so to Prometheus; the file put back, it is clean."""
    d = stack
    path = Path(d.workdir) / "Pulumi.dev.yaml"
    text = path.read_text()
    before = d.snapshot()
    d.set("vllm.maxNumSeqs", 3)
    try:
        exe = ROOT / "venv" / "bin" / "spark-vllm"
        done = subprocess.run([str(exe), "reconcile", "-s", "dev", "--once", "--json"],
                              cwd=d.workdir, env=_reconcile_env(d), capture_output=True,
                              text=True, timeout=600)
    finally:
        path.write_text(text)
    assert done.returncode == 3, done.stdout + done.stderr
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["result"] == "refused" and "spark-vllm:vllm" in run["why"], run
    assert "differs from the config of the last successful update" in run["why"]
    assert run["phases"] == {} and run["did"] == []
    assert d.snapshot() == before
    assert 'spark_vllm_reconcile_result{result="refused"} 1' in d.ssh(HEAD, f"cat {TEXTFILE}")
    d.run("preview")
    assert d.ops() == {}


def test_a_new_scrape_interval_reloads_prometheus_and_nothing_else(stack):
    d = stack
    before = container(d, HEAD, PROMETHEUS)
    assert before
    d.set("monitoring.scrapeIntervalSeconds", 10)
    d.run("preview")
    ops = d.ops()
    assert set(ops) - {"monitoring", *(k for k in ops if k.startswith("spark-vllm-"))} == {
        "monitoring-config", "monitoring-health"}, ops
    d.timed_up("scrape interval 5 s -> 10 s")
    assert container(d, HEAD, PROMETHEUS) == before  # reloaded, not restarted
    cfg = prom(d, "/api/v1/status/config")["data"]["yaml"]
    assert "scrape_interval: 10s" in cfg, cfg


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_a_monitoring_folder_wiped_behind_the_stack_is_made_again(stack):
    """The stack's monitoring and data folders removed on the head behind the stack (as a
    same-named stack's destroy from another backend does): recon sees them gone, the commands
    that made them run again and Prometheus's container, whose mounts held them, is replaced;
    nothing else of the stack changes."""
    d = stack
    before = container(d, HEAD, PROMETHEUS)
    d.ssh(HEAD, f"rm -rf {MONITORING_DIR} {DATA}")
    d.run("preview")
    planned = {k: v for k, v in d.ops().items() if k.startswith("monitoring-")}
    assert planned == {"monitoring-key": "replace", "monitoring-config": "replace",
                       "monitoring-data": "replace", "monitoring-prometheus": "replace",
                       "monitoring-alertmanager-config": "replace",
                       "monitoring-alertmanager": "replace", "monitoring-health": "update"}, \
        d.ops()
    ops = d.timed_up("the monitoring folders wiped behind the stack")
    assert mine(ops) == {}, ops
    assert container(d, HEAD, PROMETHEUS) not in ("", before)
    assert d.ssh(HEAD, f"ls {MONITORING_DIR}/conf/ {MONITORING_DIR}/secrets/").split() == [
        f"{MONITORING_DIR}/conf/:", "prometheus.yml", "rules.yml",
        f"{MONITORING_DIR}/secrets/:", "api-key"]
    # the gate saw every target up again; the configuration is the stack's (10 s, from above)
    assert set(targets(d).values()) == {"up"}, targets(d)
    assert "scrape_interval: 10s" in prom(d, "/api/v1/status/config")["data"]["yaml"]
    d.run("preview", expect_no_changes=True)


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_prometheus_stopped_behind_the_stack_is_started_by_the_up(stack):
    """`docker stop` is a manual stop: Docker's restart policy leaves it stopped. Recon sees it
    and the gate starts the same container again; nothing else runs."""
    d = stack
    cid = container(d, HEAD, PROMETHEUS).split()[0]
    d.ssh(HEAD, f"docker stop -t 5 {PROMETHEUS}")
    ops = d.timed_up("Prometheus stopped behind the stack")
    assert {k: v for k, v in ops.items() if not k.startswith("spark-vllm-")} == {
        "monitoring-health": "replace"}, ops
    running = d.ssh(HEAD, f"docker inspect -f '{{{{.Id}}}} {{{{.State.Running}}}}' {PROMETHEUS}")
    assert running.split() == [cid, "true"], running
    assert set(targets(d).values()) == {"up"}, targets(d)
    d.run("preview", expect_no_changes=True)


def test_a_node_exporter_stopped_behind_the_stack_is_started_by_the_up(stack):
    """Before issue 50 the next `up` left it stopped (a manual stop, which Docker's policy
    keeps): recon sees it, its node's start command runs again, nothing else does."""
    d = stack
    cid = container(d, WORKER, EXPORTER).split()[0]
    d.ssh(WORKER, f"docker stop -t 5 {EXPORTER}")
    ops = d.timed_up("the worker's node exporter stopped behind the stack")
    assert {k: v for k, v in ops.items() if not k.startswith("spark-vllm-")} == {
        f"monitoring-node-exporter-start-{WORKER}": "replace"}, ops
    running = d.ssh(WORKER, f"docker inspect -f '{{{{.Id}}}} {{{{.State.Running}}}}' {EXPORTER}")
    assert running.split() == [cid, "true"], running
    wait(lambda: targets(d).get(("node", WORKER)) == "up", 60, "the worker's exporter up", 2)
    d.run("preview", expect_no_changes=True)


# What a service added or removed may change beside its own steps: the VllmServer component's
# props, the gateway's routing (tests/e2e/test_services.py) and, with monitoring, its target in
# Prometheus's configuration (a reload: the command and its gate). Never Prometheus's container,
# image, key or data folder, never an exporter.
ROUTING = {"vllm", "gateway", "gateway-config", "gateway-health",
           "monitoring", "monitoring-config", "monitoring-alertmanager-config",
           "monitoring-health",
           # the service's port in the firewall of its nodes (issue 45)
           *(f"firewall-{n}{t}" for n in ("spark-1", "spark-2") for t in ("", "-table"))}


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_a_service_added_is_scraped_with_nothing_else_of_monitoring_touched(stack, lab_cfg):
    """On both nodes: each replica is a target of its own (the gateway's
    /metrics?model=&replica=), each replica's series carry its `replica` label."""
    d = stack
    commits = lab_cfg.get("models", {}).get(EMBED_REPO, {}).get("commits")
    assert commits, f"the lab's stack.json lists no {EMBED_REPO} (a lab made before it: lab.py up)"
    prometheus = container(d, HEAD, PROMETHEUS)
    alertmanager = container(d, HEAD, ALERTMANAGER)
    exporters = {n: container(d, n, EXPORTER) for n in (HEAD, WORKER)}
    d.set("services", [embed_service(commits["first"], nodes=[HEAD, WORKER])])
    try:
        ops = d.timed_up("a service added, monitoring on")
        other = {k: v for k, v in ops.items()
                 if not k.startswith(("svc-embed", "spark-vllm-"))}
        assert set(other) <= ROUTING and other.get("monitoring-config") == "update", ops
        assert container(d, HEAD, PROMETHEUS) == prometheus  # reloaded, not restarted
        assert container(d, HEAD, ALERTMANAGER) == alertmanager
        assert {n: container(d, n, EXPORTER) for n in (HEAD, WORKER)} == exporters
        # the gate waited for them: each replica's target is up as soon as the up ends
        t = targets(d)
        assert t.get(("vllm", "tiny-embed", HEAD)) == t.get(("vllm", "tiny-embed", WORKER)) \
            == "up", t
        series = wait(lambda: (r := query(d, 'vllm:num_requests_running{model="tiny-embed"}'))
                      and len(r) == 2 and r, 60, "both replicas' series", 2)
        assert {s["metric"]["replica"] for s in series} == {HEAD, WORKER}
    finally:
        d.set("services", [])
        d.timed_up("the service removed, monitoring on")
    assert not [k for k in targets(d) if k[:2] == ("vllm", "tiny-embed")]


def test_monitoring_off_removes_its_containers_and_keeps_its_data(stack):
    d = stack
    assert d.ssh(HEAD, f"ls {DATA}").strip()  # Prometheus wrote its TSDB
    d.set("monitoring.enabled", False)
    try:
        ops = d.timed_up("monitoring off")
        assert mine(ops, firewall=True) == {}, ops
        assert ops.get("monitoring-prometheus") == "delete", ops
        for node in (HEAD, WORKER):
            assert container(d, node, EXPORTER) == ""
        assert container(d, HEAD, PROMETHEUS) == container(d, HEAD, ALERTMANAGER) == ""
        assert ops.get("monitoring-alertmanager") == "delete", ops
        assert d.ssh(HEAD, f"ls {DATA}").strip(), "monitoring.keepDataOnDestroy kept nothing"
    finally:
        d.ssh(HEAD, f"rm -rf {DATA} {AM_DATA}", check=False)
    assert complete(d)
