"""`vllm.executor: mp`: vLLM's own multi-node executor, one vLLM container per node, no Ray."""

from __future__ import annotations

import hashlib

import pulumi
import pytest

from config import ConfigError, validate_config
from hostscripts import vllm
from hostscripts.common import payload
from tests.conftest import config_raw, reveal
from tests.unit.components.test_vllm_server import _changed, _registered
from tests.unit.conftest import settled, waits_for

OOM = vllm.OomWatch(1000, 5)  # the dev stack file's guard: vllmScoreAdj, oomBackoffSeconds

MP = {"executor": "mp"}


def _flags(argv: list[str], rank: int, nodes: int) -> None:
    """The node's place in argv: after the serve flags, before the listen address."""
    at = argv.index("--nnodes")
    want = ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", "192.168.177.11",
            "--master-port", "29501"] + (["--headless"] if rank else [])
    assert argv[at: at + len(want)] == want, argv
    assert argv[at + len(want)] == "--host"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "mp"


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_mp_runs_a_vllm_container_per_node_and_no_ray(build, mocks, dependencies, n):
    deps = dependencies
    h = build(n, vllm=MP)

    def check(_):
        names = {r.name for r in mocks.resources}
        assert h.ray is None
        assert not {x for x in names if x.startswith("ray-")}, sorted(names)
        # the stack's Ray token stays made (a switch back to Ray reuses it), on no node
        assert {x for x in names if "token" in x} == {"secrets-ray-token"}, sorted(names)
        head = mocks.named("vllm-serve").inputs
        _flags(list(head["command"]), 0, n)
        for rank in range(1, n):
            node = f"spark-{rank + 1}"
            worker = mocks.named(f"vllm-serve-{node}").inputs
            _flags(list(worker["command"]), rank, n)
            assert worker["name"] == "spark-vllm-dev-serve"
            assert f"VLLM_HOST_IP=192.168.177.{11 + rank}" in worker["envs"]
            # headless: no API, so no API key
            assert not any(m["target"] == "/run/spark-vllm/api-key" for m in worker["mounts"])
            assert reveal(mocks.named(f"vllm-compile-cache-{node}").inputs["connection"])[
                "host"] == f"10.77.0.{11 + rank}"
        for c in [head, *(mocks.named(f"vllm-serve-spark-{i}").inputs for i in range(2, n + 1))]:
            assert c["restart"] == "unless-stopped" and c["networkMode"] == "host"
            assert "pidMode" not in c and "volumes" not in c  # nothing of Ray's
            # every rank of a node in this one container: its own IPC namespace and /dev/shm
            # (8 GiB, no Ray object store), never the host's (issue 46)
            assert c["ipcMode"] == "private" and c["shmSize"] == 8 << 10
            assert not [e for e in c["envs"] if e.startswith(("RAY_AUTH", "RAY_ADDRESS",
                                                              "VLLM_RPC_BASE_PATH"))]
            assert not any(m["target"] == "/run/spark-vllm/ray-auth-token" for m in c["mounts"])
        assert any(m["target"] == "/run/spark-vllm/api-key" for m in head["mounts"])
        # a replaced headless vLLM replaces the head's: their IDs are one of its labels
        labels = {x["label"]: x["value"] for x in head["labels"]}
        label = labels["spark-vllm.headless-containers"]
        # and the head declares the ports it listens on, the master port too (preflight)
        assert labels["spark-vllm.port"] == "8000"
        assert labels["spark-vllm.master-port"] == "29501"  # vllm.masterPort's default
        assert not any(x["label"] == "spark-vllm.port" for x in worker["labels"])
        assert label.split() == [hashlib.sha256(f"vllm-serve-spark-{i}".encode()).hexdigest()
                                 for i in range(2, n + 1)]
        # the gate probes from the vLLM container itself (there is no Ray head container)
        gate = mocks.named("vllm-health").inputs["create"]
        assert "docker exec -i spark-vllm-dev-serve python3" in gate
        # the head's main process is the liveness watchdog, probing its own API at the head's
        # fabric address; every headless one runs under the rank watcher, which follows the
        # head's /health there
        ep = list(head["entrypoints"])
        assert ep[:3] == ["python3", "-c", payload("vllm_liveness.py")], ep[:2]
        assert ep[3] == "http://192.168.177.11:8000" and ep[18:] == vllm.serve_entrypoint(
            guard=OOM)
        for rank in range(1, n):
            ep = list(mocks.named(f"vllm-serve-spark-{rank + 1}").inputs["entrypoints"])
            assert ep[:3] == ["python3", "-c", payload("vllm_rank_watch.py")], ep[:2]
            assert ep[3:6] == ["http://192.168.177.11:8000/health", "5", "3"], ep[3:6]
            assert ep[6:] == vllm.serve_entrypoint(guard=OOM)  # vLLM raises its own score
        # nothing to restart on a healthy or new cluster: the restart's reason is ignored
        restart = mocks.named("vllm-ranks-restart").inputs
        assert restart["create"] == "true" and restart["stdin"] == "none"
        assert "docker restart -t 60 spark-vllm-dev-serve" in restart["update"]
        # the API listens on the head's fabric address (the ranks watch it there; the gateway
        # reaches it there), never the management network
        argv = list(head["command"])
        assert argv[argv.index("--host") + 1] == "192.168.177.11"
        # every rank's launcher checks its node's firewall first, which is loaded before any
        # vLLM container (test_mp_keeps_the_rendezvous_port_on_the_fabric)
        for c in [head, *(mocks.named(f"vllm-serve-spark-{i}").inputs for i in range(2, n + 1))]:
            assert "SPARK_VLLM_FIREWALL_PROBE=127.240.38.15:20008" in c["envs"]
            assert "VLLM_PORT=20020" in c["envs"]
        assert "firewall-spark-1-table" in waits_for(deps, "vllm-serve")
        vllm_props = next(r for r in mocks.resources if r.name == "vllm"
                          and r.typ == "spark-vllm:vllm_server:VllmServer").inputs
        assert vllm_props["host"] == "192.168.177.11"

    return settled(h).apply(check)


@pulumi.runtime.test
def test_no_rendezvous_rule_on_one_node(build, mocks):
    h = build(1, vllm={**MP, "tensorParallelSize": 1})

    def check(_):
        rules = {r["what"] for r in mocks.named("firewall-spark-1").inputs["rules"]}
        assert "vllm-rendezvous" not in rules and "ray" not in rules, rules
        argv = list(mocks.named("vllm-serve").inputs["command"])
        assert argv[argv.index("--host") + 1] == "127.0.0.1"  # nobody else watches it

    return settled(h).apply(check)


def test_switching_executor_moves_neither_image_nor_model(monkeypatch):
    """The change table's executor row: Ray's containers go, the vLLM container is replaced and
    others come; the image and the model stay as they are."""
    ray = _registered(config_raw(2), monkeypatch)
    mp = _registered(config_raw(2, vllm=MP), monkeypatch)
    gone, new = ray.keys() - mp.keys(), mp.keys() - ray.keys()
    assert gone == {"ray", "ray-head", "ray-worker-spark-2", "ray-ready", "ray-token-spark-1",
                    "ray-token-spark-2", "ray-compile-cache-spark-1",
                    "ray-compile-cache-spark-2"}, gone
    assert new == {"vllm-serve-spark-2", "vllm-compile-cache-spark-1",
                   "vllm-compile-cache-spark-2", "vllm-ranks-restart"}, new
    same = {k: ray[k] for k in ray.keys() & mp.keys()}
    changed = _changed(same, {k: mp[k] for k in same})
    assert not {r for r in changed if r.startswith(("image", "model", "nccl"))}, changed
    assert "vllm-serve" in changed
    # every node's table loses Ray's ports; the head's gains the rendezvous (an update)
    assert {"firewall-spark-1-table", "firewall-spark-2-table"} <= changed, changed


@pytest.mark.parametrize("vllm_over, key", [
    ({"executor": "mp", "masterPort": 8000}, "spark-vllm:vllm.masterPort"),
    ({"executor": "mpi"}, "spark-vllm:vllm.executor"),
    ({"extraArgs": ["--nnodes", "3"]}, "spark-vllm:vllm.extraArgs"),
    ({"extraArgs": ["--headless"]}, "spark-vllm:vllm.extraArgs"),
    ({"extraArgs": ["--distributed-executor-backend=mp"]}, "spark-vllm:vllm.extraArgs"),
])
def test_executor_settings_are_checked(vllm_over, key):
    with pytest.raises(ConfigError) as err:
        validate_config(config_raw(2, vllm=vllm_over))
    assert key in str(err.value), str(err.value)


def test_mp_on_more_nodes_needs_a_head_address_the_ranks_reach():
    with pytest.raises(ConfigError) as err:
        validate_config(config_raw(2, vllm={**MP, "host": "127.0.0.1"}))
    assert "vllm.host" in str(err.value) and "loopback" in str(err.value), str(err.value)
    validate_config(config_raw(1, vllm={**MP, "host": "127.0.0.1"}))  # one node: no one watches
    validate_config(config_raw(2, vllm={"host": "127.0.0.1"}))  # Ray: the workers do not watch


def test_every_node_but_the_head_is_headless():
    assert vllm.mp_node_flags(2, 1, "10.0.0.1", 1)[-1] == "--headless"
    assert "--headless" not in vllm.mp_node_flags(2, 0, "10.0.0.1", 1)


# Issue 31, item 5 and issue 45: vLLM 0.32's rendezvous (torch's TCPStore on the head's master
# port) listens on every address whatever --master-addr says, and has no authentication. The
# head's firewall (components/firewall.py; proven with the real nft in
# tests/unit/hostscripts/test_firewall.py) admits it from the stack's fabric addresses only,
# before any vLLM container, and shows it to the policy pack.
@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_mp_keeps_the_rendezvous_port_on_the_fabric(build, mocks, dependencies, n):
    h = build(n, vllm=MP)

    def check(_):
        fabric = [f"192.168.{net}.{10 + i}" for net in (177, 178) for i in range(1, n + 1)]
        table = mocks.named("firewall-spark-1-table").inputs
        assert reveal(table["connection"])["host"] == "10.77.0.11"  # the head
        rules = {r["what"]: r for r in mocks.named("firewall-spark-1").inputs["rules"]}
        assert rules["vllm-rendezvous"] == {"what": "vllm-rendezvous", "ports": [[29501, 29501]],
                                            "sources": fabric}
        # the head's API: the other ranks watch its /health on the fabric
        assert rules["vllm"]["sources"] == fabric
        assert "tcp dport { 29501 } ip saddr @stack4 accept" in table["create"]
        assert "tcp dport { 29501 } counter drop comment \"vllm-rendezvous\"" in table["create"]
        for i in range(2, n + 1):
            worker = {r["what"] for r in mocks.named(f"firewall-spark-{i}").inputs["rules"]}
            assert "vllm-rendezvous" not in worker and "vllm-internal" in worker
        for c in ["vllm-serve", *(f"vllm-serve-spark-{i}" for i in range(2, n + 1))]:
            assert {f"firewall-spark-{i}-table" for i in range(1, n + 1)} <= waits_for(
                dependencies, c), c
        props = {k: reveal(v) for k, v in mocks.named("vllm").inputs.items()}
        assert props["masterAddr"] == "192.168.177.11" and props["masterPort"] == 29501

    return settled(h).apply(check)
