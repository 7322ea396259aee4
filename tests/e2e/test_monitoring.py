"""Metrics and alerts on the lab (issue 35): Prometheus the stack deploys, the real vLLM's
metrics through the gateway, the lab's node exporters, the stack's alert rules.

On the session's shared stack (tests/e2e/conftest.py), which the tests' deployments start with
monitoring off (lab/deployments.new_deployment: the change tables of the modules before this
one measure the stack's own changes); `make demo` runs Pulumi.dev.yaml as it is, monitoring on.
In order:

1. monitoring turned on: the preview creates only the monitoring component's resources; after
   the up, Prometheus (on the head's loopback, asked over ssh as an operator would) reports
   every target up: each served model through the gateway, each node's exporter, and the
   stack's rules loaded;
2. a completion through the gateway moves vLLM's request counter as Prometheus sees it;
3. the worker's vLLM stopped: the not-serving alert fires for the main model (the lab's
   threshold: 15 s); the worker started again and the stack converged, the model serves;
4. a new scrape interval: only the monitoring configuration (and its gate) change; Prometheus
   is reloaded with it, its container keeps its ID and start time;
5. the monitoring folders wiped on the head behind the stack: made again, Prometheus replaced;
   Prometheus stopped behind the stack: its gate starts it again;
6. a service added: its target is up when the up ends, and of monitoring only the configuration
   and its gate changed (Prometheus and the exporters keep running); the service removed again;
7. monitoring turned off: its containers go from every node, its data folder stays
   (monitoring.keepDataOnDestroy), then removed by the test.

Every `up` prints its wall time (`WALL ...`).
"""

from __future__ import annotations

import json
import time

import pytest

from lab.deployments import EMBED_REPO, complete, embed_service

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
PROMETHEUS = "spark-vllm-dev-prometheus"
EXPORTER = "spark-vllm-dev-node-exporter"
SERVE = "spark-vllm-dev-serve"
RAY_WORKER = "spark-vllm-dev-ray-worker"
DATA = "/var/lib/spark-vllm/stacks/dev/prometheus-data"
MONITORING_DIR = "/var/lib/spark-vllm/stacks/dev/monitoring"
MAIN = "tiny-moe"
URL = "http://127.0.0.1:9090"
# what the stack's resources may do when monitoring changes: its own, and the stack's outputs
OWN = ("monitoring",)


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


def targets(d) -> dict[tuple[str, str], str]:
    """(job, model or node) -> health of every active target."""
    out = {}
    for t in prom(d, "/api/v1/targets")["data"]["activeTargets"]:
        lab = t["labels"]
        out[(lab["job"], lab.get("model") or lab.get("node", "?"))] = t["health"]
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


def test_monitoring_on_adds_only_its_resources_and_every_target_is_up(stack):
    d = stack
    d.set("monitoring.enabled", True)
    d.run("preview")
    assert mine(d.ops(), firewall=True) == {}, d.ops()
    ops = d.timed_up("monitoring on")
    assert ops.get("monitoring-prometheus") == "create", ops
    assert mine(ops, firewall=True) == {}, ops
    assert ops.get(f"firewall-{WORKER}-table") == "update", ops  # the exporter's port
    served = list(d.stack.outputs()["models"].value)
    assert MAIN in served
    want = {("vllm", m) for m in served} | {("node", HEAD), ("node", WORKER)}
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


def test_the_not_serving_alert_fires_when_the_workers_vllm_stops(stack):
    d = stack
    # the worker's rank of the main model: its vLLM container with mp (where MODULE_ORDER runs
    # this module), its Ray worker with Ray (this module alone)
    rank = SERVE if container(d, WORKER, SERVE) else RAY_WORKER
    d.ssh(WORKER, f"docker stop -t 5 {rank}")
    try:
        def firing():
            alerts = prom(d, "/api/v1/alerts")["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "SparkVllmModelNotServing"
                    and a["labels"].get("model") == MAIN and a["state"] == "firing"]

        fired = wait(firing, 240, "SparkVllmModelNotServing firing for the main model", 5)
        assert fired[0]["annotations"]["summary"]
    finally:
        d.ssh(WORKER, f"docker start {rank}", check=False)
    d.timed_up("after the worker's vLLM stopped")
    assert wait(lambda: complete(d), 300, "the model serving again", 5)


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
                       "monitoring-health": "update"}, d.ops()
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


# What a service added or removed may change beside its own steps: the VllmServer component's
# props, the gateway's routing (tests/e2e/test_services.py) and, with monitoring, its target in
# Prometheus's configuration (a reload: the command and its gate). Never Prometheus's container,
# image, key or data folder, never an exporter.
ROUTING = {"vllm", "gateway", "gateway-config", "gateway-health",
           "monitoring", "monitoring-config", "monitoring-health",
           # the service's port in the firewall of its nodes (issue 45)
           *(f"firewall-{n}{t}" for n in ("spark-1", "spark-2") for t in ("", "-table"))}


def test_a_service_added_is_scraped_with_nothing_else_of_monitoring_touched(stack, lab_cfg):
    d = stack
    commits = lab_cfg.get("models", {}).get(EMBED_REPO, {}).get("commits")
    assert commits, f"the lab's stack.json lists no {EMBED_REPO} (a lab made before it: lab.py up)"
    prometheus = container(d, HEAD, PROMETHEUS)
    exporters = {n: container(d, n, EXPORTER) for n in (HEAD, WORKER)}
    d.set("services", [embed_service(commits["first"])])
    try:
        ops = d.timed_up("a service added, monitoring on")
        other = {k: v for k, v in ops.items()
                 if not k.startswith(("svc-embed", "spark-vllm-"))}
        assert set(other) <= ROUTING and other.get("monitoring-config") == "update", ops
        assert container(d, HEAD, PROMETHEUS) == prometheus  # reloaded, not restarted
        assert {n: container(d, n, EXPORTER) for n in (HEAD, WORKER)} == exporters
        # the gate waited for it: the service's target is up as soon as the up ends
        assert targets(d).get(("vllm", "tiny-embed")) == "up", targets(d)
    finally:
        d.set("services", [])
        d.timed_up("the service removed, monitoring on")
    assert ("vllm", "tiny-embed") not in targets(d)


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
        assert container(d, HEAD, PROMETHEUS) == ""
        assert d.ssh(HEAD, f"ls {DATA}").strip(), "monitoring.keepDataOnDestroy kept nothing"
    finally:
        d.ssh(HEAD, f"rm -rf {DATA}", check=False)
    assert complete(d)
