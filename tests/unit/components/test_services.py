"""`spark-vllm:services`: more models beside the main one, each its own supervised vLLM
container per node with a health gate on its task's endpoint (components/vllm_service.py)."""

from __future__ import annotations

import pulumi
import pytest

from config import ConfigError, validate_config
from hostscripts import vllm
from hostscripts.common import payload
from hostscripts.guard import PREFER
from hostscripts.paths import StackNames
from inspection.facts import ContainerFacts
from tests.conftest import config_raw, gb10_facts, reveal
from tests.unit.components.test_vllm_server import _changed, _registered
from tests.unit.conftest import settled

OOM = vllm.OomWatch(1000, 5)  # the dev stack file's guard: vllmScoreAdj, oomBackoffSeconds

EMBED = {"name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8100,
         "gpuMemoryUtilization": 0.05, "kvCacheMemoryBytes": 67108864, "enforceEager": True}
RERANK = {"name": "rerank", "repo": "Qwen/Qwen3-Reranker-0.6B", "task": "score", "port": 8101,
          "nodes": ["spark-2"], "gpuMemoryUtilization": 0.05}


def with_services(*services: dict, nodes: int = 2, **overrides) -> dict:
    return {**config_raw(nodes, **overrides), "services": list(services)}


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pulumi.runtime.test
def test_an_embedding_service_is_its_own_container_model_and_gate(build, mocks):
    h = build(raw=with_services(EMBED))

    def check(_):
        c = mocks.named("svc-embed-serve-spark-1").inputs
        assert c["name"] == "spark-vllm-dev-embed"  # named by stack and service
        argv = list(c["command"])
        assert argv[:3] == ["vllm", "serve", "spark-lab/tiny-embed"]
        assert _arg(argv, "--tensor-parallel-size") == "1"
        assert _arg(argv, "--distributed-executor-backend") == "uni"
        assert _arg(argv, "--runner") == "pooling" and "--convert" not in argv  # vLLM's auto
        assert _arg(argv, "--port") == "8100" and _arg(argv, "--served-model-name") == "embed"
        assert c["restart"] == "unless-stopped" and c["networkMode"] == "host"
        # its own IPC namespace and /dev/shm, never the host's nor the main model's (issue 46);
        # the dev stack runs Ray: its /dev/shm is as large as the Ray containers'
        assert c["ipcMode"] == "private" and c["shmSize"] == (8 << 10) + 1024
        # restarted when it stops serving: the liveness watchdog probes its own vLLM with an
        # embedding (the dev stack's health.liveness: 5 s apart, 10 s each, 3 in a row)
        ep = list(c["entrypoints"])
        assert ep[:3] == ["python3", "-c", payload("vllm_liveness.py")], ep[:2]
        assert ep[3:10] == [f"http://{_arg(argv, '--host')}:8100", "embed", "embed", "5",
                            "10", "3", "/run/spark-vllm/api-key"], ep[3:10]
        # the crash-loop settings (the dev stack file's): backoff 2 s up to 30 s, more than 2
        # restarts in 300 s
        assert ep[10:15] == ["/var/lib/spark-vllm-liveness/starts", "2", "30", "2", "300"], ep[10:15]
        assert ep[15:18] == ["/run/spark-vllm-guard/kills", PREFER, "5"], ep[15:18]
        assert ep[18:] == vllm.serve_entrypoint(guard=OOM)
        assert {"target": "/run/spark-vllm-guard", "type": "bind",
                "source": "/var/lib/spark-vllm/guard", "readOnly": True} in c["mounts"]
        labels = {x["label"]: x["value"] for x in c["labels"]}
        assert labels["spark-vllm.role"] == "vllm-service"
        assert labels["spark-vllm.service"] == "embed" and labels["spark-vllm.port"] == "8100"
        key = StackNames("dev").service_key_file("embed")
        assert key.startswith("/var/lib/spark-vllm/stacks/dev/")
        assert {"target": "/run/spark-vllm/api-key", "type": "bind", "source": key,
                "readOnly": True} in c["mounts"]
        # no Ray in a service, whatever the main model's executor
        assert not [e for e in c["envs"] if e.startswith(("RAY_AUTH", "RAY_ADDRESS",
                                                          "VLLM_RPC_BASE_PATH"))]
        gate = mocks.named("svc-embed-health-spark-1").inputs["create"]
        assert f" embed 128 < {key}" in gate  # task and the model's hidden size
        assert "docker exec -i spark-vllm-dev-embed python3" in gate
        # its own key file, written from stdin and removed with the service
        k = mocks.named("svc-embed-api-key-spark-1").inputs
        assert key in k["create"] and k["delete"].startswith(f"rm -f {key}; rmdir ")
        # its model only on its node: one fetch, no seeder
        names = {r.name for r in mocks.resources if r.name.startswith("svc-embed-model")}
        assert names == {"svc-embed-model", "svc-embed-model-fetch",
                         "svc-embed-model-verify-spark-1", "svc-embed-model-drop-cache-spark-1"}
        assert "spark-lab/tiny-embed" in mocks.named("svc-embed-model-fetch").inputs["create"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_without_liveness_the_vllm_containers_run_the_launcher_alone(build, mocks):
    """health.liveness.enabled false: the head's vLLM and the service's run the launcher as
    their main process (Docker's restart policy alone supervises them)."""
    raw = with_services(EMBED)
    raw["health"] = {**raw.get("health", {}), "liveness": {"enabled": False}}
    h = build(raw=raw)

    def check(_):
        for name in ("vllm-serve", "svc-embed-serve-spark-1"):
            c = mocks.named(name).inputs
            # vLLM still raises its oom_score_adj (the dev stack's guard); no watchdog, so no
            # guard folder to read
            assert list(c["entrypoints"]) == vllm.serve_entrypoint(guard=OOM), name
            assert not any(m["target"] == "/run/spark-vllm-guard" for m in c["mounts"]), name

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_service_on_a_worker_fetches_there_and_scores(build, mocks):
    h = build(raw=with_services(RERANK))

    def check(outputs):
        fetch = mocks.named("svc-rerank-model-fetch").inputs
        assert reveal(fetch["connection"])["host"] == "10.77.0.12"
        argv = list(mocks.named("svc-rerank-serve-spark-2").inputs["command"])
        assert _arg(argv, "--runner") == "pooling"
        # on a worker it listens on its fabric address, where the gateway on the head reaches it
        assert _arg(argv, "--host") == "192.168.177.12"
        ep = list(mocks.named("svc-rerank-serve-spark-2").inputs["entrypoints"])
        assert ep[3:6] == ["http://192.168.177.12:8101", "rerank", "score"], ep[3:6]
        gate = mocks.named("svc-rerank-health-spark-2").inputs["create"]
        assert " score 0 < " in gate and " http://192.168.177.12:8101 " in gate
        exported, backends = outputs
        assert "endpoints" not in exported["rerank"]  # clients use the gateway's endpoint
        assert exported["rerank"]["task"] == "score"
        assert backends["rerank"] == ["spark-2 http://192.168.177.12:8101"]
        assert backends["tiny-moe"] == ["spark-1 http://127.0.0.1:8000"]

    return settled(h, h.exports()["services"], h.exports()["backends"]).apply(check)


def test_adding_or_removing_a_service_changes_nothing_else(monkeypatch):
    """The change table: a service added creates only its own resources; the main model's keep
    their inputs (removing it is the same comparison read backwards)."""
    before = _registered(config_raw(2), monkeypatch)
    after = _registered(with_services(EMBED), monkeypatch)
    added = set(after) - set(before)
    assert added and all(n.startswith("svc-embed") for n in added), sorted(added)
    assert set(before) <= set(after)
    # the VllmServer component's props carry the service's share for the policy pack only; the
    # gateway's routing: its configuration (reloaded, not replaced), its gate and its props;
    # Prometheus's targets and Alertmanager's inhibition likewise (monitoring on: the dev
    # stack's); the service's port in the firewall of each node it runs on (its table updated
    # in place). Not their containers, images or keys
    assert _changed(before, {n: after[n] for n in before}) == {
        "vllm", "gateway", "gateway-config", "gateway-health", "monitoring",
        "monitoring-config", "monitoring-alertmanager-config", "monitoring-health",
        "firewall-spark-1", "firewall-spark-1-table"}


def test_a_service_flag_or_revision_change_touches_only_that_service(monkeypatch):
    one = _registered(with_services(EMBED, RERANK), monkeypatch)
    flag = _registered(with_services({**EMBED, "maxNumSeqs": 8}, RERANK), monkeypatch)
    assert _changed(one, flag) == {"svc-embed", "svc-embed-serve-spark-1"}
    moved = _registered(with_services({**EMBED, "revision": "other"}, RERANK), monkeypatch)
    changed = _changed(one, moved)
    assert changed and all(n.startswith("svc-embed") for n in changed), sorted(changed)


@pulumi.runtime.test
def test_a_service_container_stopped_behind_the_stack_reruns_only_its_gate(build, mocks):
    stopped = ContainerFacts(id="c1", name="spark-vllm-dev-embed", image="x", state="exited",
                             labels={"spark-vllm.managed": "true",
                                     "spark-vllm.stack": "spark-vllm/dev",
                                     "spark-vllm.service": "embed"})
    facts = {"spark-1": gb10_facts("spark-1", index=1, containers=[stopped]),
             "spark-2": gb10_facts("spark-2", index=2)}
    h = build(raw=with_services(EMBED), facts=facts)

    def check(_):
        gate = mocks.named("svc-embed-health-spark-1").inputs
        assert gate["triggers"][0].startswith("spark-vllm-dev-embed is exited @")
        assert mocks.named("vllm-health").inputs["triggers"] == ["none"]

    return settled(h).apply(check)


@pytest.mark.parametrize(("service", "message"), [
    ({**EMBED, "port": 8000}, "services[0].port: got 8000; expected a port other than "
                              "spark-vllm:vllm.port"),
    ({**EMBED, "port": 6379}, "spark-vllm:ray.port"),
    ({**EMBED, "port": 18472}, "seeders"),
    ({**EMBED, "nodes": ["spark-9"]}, "services[0].nodes: got ['spark-9']"),
    ({**EMBED, "nodes": []}, "services[0].nodes: got []"),
    ({**EMBED, "name": "Embed_1"}, "lowercase DNS label"),
    # the stack's own containers are spark-vllm-<stack>-<what>, a service's -<service>
    ({**EMBED, "name": "serve"}, "services[0].name: got 'serve'; expected a name other than "
                                 "the stack's own containers'"),
    ({**EMBED, "name": "ray-head"}, "services[0].name: got 'ray-head'"),
    ({**EMBED, "name": "ray-worker"}, "services[0].name: got 'ray-worker'"),
    ({**EMBED, "name": "model-seeder"}, "services[0].name: got 'model-seeder'"),
    ({**EMBED, "task": "classify"}, "services[0].task"),
    ({k: v for k, v in EMBED.items() if k != "gpuMemoryUtilization"},
     "services[0].gpuMemoryUtilization"),
])
def test_bad_services_are_refused_with_their_key_path(service, message):
    with pytest.raises(ConfigError) as err:
        validate_config(with_services(service))
    assert message in str(err.value)


def test_two_services_need_names_and_ports_of_their_own_per_node():
    with pytest.raises(ConfigError) as err:
        validate_config(with_services(EMBED, {**EMBED, "servedModelName": "e2"}))
    assert "services[1].name: got 'embed'; expected a unique service name" in str(err.value)
    assert "services[1].port: got 8100; expected a port other than services[0]'s on spark-1" \
        in str(err.value)
    # the same port on other nodes is fine
    cfg = validate_config(with_services(EMBED, {**EMBED, "name": "e2", "nodes": ["spark-2"]}))
    assert [cfg.service_nodes(s) for s in cfg.services] == [["spark-1"], ["spark-2"]]


def test_prod_wants_every_service_pinned_to_a_commit():
    raw = config_raw(2)
    raw["environment"] = "prod"
    raw["services"] = [EMBED]
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    assert "services[0].revision: got 'main'; expected a 40-hex commit in prod" in str(err.value)


def test_the_prod_examples_services_fit_beside_the_122b_model_by_the_kv_aware_estimate():
    """Pulumi.prod.yaml: the 122B model over both Sparks, an embedding model and a reranker on
    the head. Preflight's share sum and each service's estimate (weights + its KV cache) pass on
    a GB10's MemTotal; the services' Qwen3-0.6B configs are the model cards' (model_configs)."""
    import yaml

    from inspection import preflight
    from inspection.memory_fit import shape_from_config
    from tests.conftest import ROOT
    from tests.unit.components.test_vllm_server import qwen_raw
    from tests.unit.inspection.model_configs import QWEN3_06B_POOLING

    prod = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())["config"]
    services = [{**s, "revision": "0" * 40} for s in prod["spark-vllm:services"]]
    cfg = validate_config({**qwen_raw(), "services": services,
                           "preflight": prod["spark-vllm:preflight"]})
    assert [(s.name, s.task, cfg.service_nodes(s)) for s in cfg.services] == [
        ("embed", "embed", ["spark-1"]), ("rerank", "score", ["spark-1"])]
    shape = shape_from_config(QWEN3_06B_POOLING)
    models = {s.name: (1_200_000_000, shape) for s in cfg.services}
    head = gb10_facts("spark-1")
    assert preflight.check_shares(cfg, head, models) == []
    for svc in cfg.services:
        est = preflight.service_estimate(svc, 1_200_000_000, shape)
        assert est.kv_held_bytes == 2 * 1024**3  # kvCacheMemoryBytes, exactly
        assert (est.one_sequence_bytes or 0) < est.kv_held_bytes  # one 8192-token sequence fits
        # and with the policy pack's serviceOverheadBytes (2 GiB) inside the share
        assert (est.total_bytes or 0) + 2 * 1024**3 < svc.gpu_memory_utilization * \
            head.memory.total_bytes
    # shares of 0.15 each overflow the head: 0.70 + 0.15 + 0.15 of MemTotal leave no reserve
    wide = cfg.model_copy(update={"services": [s.model_copy(update={"gpu_memory_utilization": 0.15})
                                               for s in cfg.services]})
    assert [f.check for f in preflight.check_shares(wide, head, models)] == ["memory"]
