"""Issue 45: the policy pack judges the planned firewall (NodeFirewall, components/firewall.py),
an exposure per rule: Ray's ports (7, ray-not-exposed), the rendezvous (13, in
test_policy_rules.py), every vLLM's and the public ports (14, vllm-behind-gateway), the
monitoring's and the tables themselves (18, stack-ports-firewalled). Each passing on what the
program makes (the props as the testkit writes them after components/firewall.py) and failing
on a port left out, widened to a management or outside address, or made public; unknowns are
not judged."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_testkit import (
    FIREWALL,
    HEAD_FABRIC,
    STACK_FABRIC,
    fabric,
    fw_rule,
    nccl_env,
    node_firewall,
    ray_head,
    ray_worker,
    res,
    run,
    sargs,
    spark_node,
    vllm_server,
)

import rules
from rules import CONTAINER, MONITORING, NCCL_ENV, SPARK_NODE, VLLM_SERVER, VLLM_SERVICE

BLOCK = ["--node-manager-port", "20000", "--object-manager-port", "20001",
         "--runtime-env-agent-port", "20002", "--dashboard-agent-grpc-port", "20003",
         "--dashboard-agent-listen-port", "20004", "--metrics-export-port", "20005",
         "--min-worker-port", "20100", "--max-worker-port", "20199"]
RAY_HEAD = fw_rule("ray", 6379, 20006, 20009, 20010, *range(20000, 20006), (20100, 20199))
RAY_WORKER = fw_rule("ray", *range(20000, 20006), (20100, 20199))


def _labels(role, node):
    return [{"label": "spark-vllm.managed", "value": "true"},
            {"label": "spark-vllm.role", "value": role},
            {"label": "spark-vllm.node", "value": node}]


def _ray(pinned=True):
    head_cmd = ["ray", "start", "--head", "--block", "--port", "6379",
                "--node-ip-address", "192.168.177.11", *(BLOCK if pinned else []),
                "--ray-client-server-port", "20006", "--include-dashboard=false"]
    worker_cmd = ["ray", "start", "--block", "--address", "192.168.177.11:6379",
                  "--node-ip-address", "192.168.177.12", *(BLOCK if pinned else [])]
    head_env = [*ray_head()["envs"], "AUTOSCALER_METRIC_PORT=20009",
                "DASHBOARD_METRIC_PORT=20010"]
    return [res(CONTAINER, ray_head(command=head_cmd, labels=_labels("ray-head", "spark-1"),
                                    envs=head_env if pinned else ray_head()["envs"]),
                "ray-head", provider_host="ssh://root@10.77.0.11"),
            res(CONTAINER, ray_worker(command=worker_cmd,
                                      labels=_labels("ray-worker", "spark-2")),
                "ray-worker-spark-2", provider_host="ssh://root@10.77.0.12")]


def _nccl():
    return res(NCCL_ENV, nccl_env(nodes=[
        {"name": n, "env": {}, "fabric": [{**fabric("enp1s0f1np1", "rocep1s0f1"),
                                           "ip": f"192.168.177.{ip}"},
                                          {**fabric("enP2p1s0f1np1", "roceP2p1s0f1"),
                                           "ip": f"192.168.178.{ip}"}]}
        for n, ip in (("spark-1", 11), ("spark-2", 12))]), "nccl")


def _gateway():
    routes = [{"name": "m", "task": "generate",
               "servers": [{"node": "spark-1", "address": "127.0.0.1", "port": 8000}]},
              {"name": "embed", "task": "embed",
               "servers": [{"node": "spark-2", "address": "192.168.177.12", "port": 8001}]}]
    return res(rules.GATEWAY, {"environment": "prod", "node": "spark-1", "host": "10.77.0.11",
                               "port": 8080, "listen": "0.0.0.0:8080", "routes": routes},
               "gateway")


def _monitoring(**over):
    props = {"environment": "prod", "node": "spark-1", "host": "10.77.0.11",
             "listen": "127.0.0.1:9090", "authentication": False,
             "fabricAddresses": STACK_FABRIC,
             "images": {"prometheus": "p@sha256:" + "a" * 64,
                        "nodeExporter": "n@sha256:" + "b" * 64},
             "exporters": [{"node": "spark-1", "host": "10.77.0.11", "listen": "127.0.0.1:9100"},
                           {"node": "spark-2", "host": "10.77.0.12",
                            "listen": "192.168.177.12:9100"}]}
    props.update(over)
    return res(MONITORING, props, "monitoring")


def _tables(head_rules=None, worker_rules=None, head=None, worker=None):
    head_rules = head_rules if head_rules is not None else [
        RAY_HEAD, fw_rule("vllm", 8000, sources=()),
        fw_rule("prometheus", 9090, sources=()), fw_rule("node-exporter", 9100,
                                                         sources=HEAD_FABRIC)]
    worker_rules = worker_rules if worker_rules is not None else [
        RAY_WORKER, fw_rule("service-embed", 8001, sources=HEAD_FABRIC),
        fw_rule("node-exporter", 9100, sources=HEAD_FABRIC)]
    head_props = {**node_firewall("spark-1", head_rules, public=(8080,)), **(head or {})}
    worker_props = {**node_firewall("spark-2", worker_rules), **(worker or {})}
    return [res(FIREWALL, head_props, "firewall-spark-1"),
            res(FIREWALL, worker_props, "firewall-spark-2")]


def stack(tables=None, ray=None, monitoring=None, server=None, svc=None, environment="prod"):
    return [
        res(SPARK_NODE, spark_node("spark-1", "10.77.0.11"), "spark-1"),
        res(SPARK_NODE, spark_node("spark-2", "10.77.0.12"), "spark-2"),
        _nccl(), _gateway(),
        res(VLLM_SERVER, vllm_server(environment=environment, servedModelName="m", port=8000,
                                     **(server or {})), "vllm"),
        res(VLLM_SERVICE, {"environment": environment, "service": "embed",
                           "servedModelName": "embed", "port": 8001,
                           "hosts": {"spark-2": "192.168.177.12"}, **(svc or {})}, "svc-embed"),
        *(ray if ray is not None else _ray()),
        monitoring if monitoring is not None else _monitoring(),
        *(tables if tables is not None else _tables()),
    ]


ALL = (rules.ray_not_exposed, rules.vllm_behind_gateway, rules.mp_rendezvous_fabric_only,
       rules.stack_ports_firewalled)


def findings(resources) -> list[str]:
    return [m for rule in ALL for m in run(rule, sargs(resources))]


def test_what_the_program_makes_passes_every_rule():
    assert findings(stack()) == []


def test_outside_dev_every_node_needs_its_table():
    msgs = run(rules.stack_ports_firewalled, sargs(stack(tables=_tables()[:1])))
    assert msgs == ["node spark-2 has no firewall (NodeFirewall) in prod: Ray's servers, "
                    "torch's store and vLLM's own sockets answer on every address of it; keep "
                    "spark-vllm:firewall.enabled true",
                    "the node exporter of spark-2 listens on port 9100 of spark-2, which has "
                    "no firewall (NodeFirewall): every address reaches it"], msgs
    # dev may go without (firewall.enabled false): nothing then to judge of the tables
    dev = stack(tables=[], environment="dev")
    assert run(rules.stack_ports_firewalled, sargs(dev)) == []
    assert run(rules.ray_not_exposed, sargs(dev)) == []


def test_rays_ports_must_be_pinned_and_kept_to_the_fabric():
    msgs = run(rules.ray_not_exposed, sargs(stack(ray=_ray(pinned=False))))
    assert any("Ray picks its node-manager port at random (no --node-manager-port): the "
               "firewall of spark-2 cannot name it" in m for m in msgs), msgs
    assert any("Ray's workers bind ports of Ray's default range" in m for m in msgs), msgs
    assert any("Ray's autoscaler-metric: no rule of spark-1's firewall names port 44217" in m
               for m in msgs), msgs
    no_gcs = _tables(head_rules=[fw_rule("ray", 20006, 20009, 20010, *range(20000, 20006),
                                         (20100, 20199))])
    (msg,) = run(rules.ray_not_exposed, sargs(stack(tables=no_gcs)))
    assert msg == ("container ray-head: Ray's GCS: no rule of spark-1's firewall names port "
                   "6379: every address reaches it"), msg
    short = _tables(worker_rules=[fw_rule("ray", *range(20000, 20006), (20100, 20150))])
    (msg,) = run(rules.ray_not_exposed, sargs(stack(tables=short)))
    assert msg.startswith("container ray-worker-spark-2: Ray's worker: no rule of spark-2's "
                          "firewall names port 20151"), msg
    wide = _tables(worker_rules=[fw_rule("ray", *range(20000, 20006), (20100, 20199),
                                         sources=[*STACK_FABRIC, "10.77.0.11"])])
    msgs = run(rules.ray_not_exposed, sargs(stack(tables=wide)))
    assert msgs and all("admits 10.77.0.11" in m for m in msgs), msgs
    assert any("spark-2's firewall rule ray admits 10.77.0.11 to port 20000, beyond the "
               "stack's fabric addresses" in m for m in msgs), msgs


def test_each_vllm_keeps_to_its_sources():
    # the main vLLM on loopback: nobody else; a service: the head's fabric addresses only
    opened = _tables(head_rules=[RAY_HEAD, fw_rule("vllm", 8000)])  # the stack's fabric
    (msg,) = run(rules.vllm_behind_gateway, sargs(stack(tables=opened)))
    assert msg.startswith("vLLM (m): spark-1's firewall rule vllm admits 192.168.177.11, "
                          "192.168.177.12, 192.168.178.11, 192.168.178.12 to port 8000, beyond "
                          "its loopback only"), msg
    svc = _tables(worker_rules=[RAY_WORKER, fw_rule("service-embed", 8001)])
    (msg,) = run(rules.vllm_behind_gateway, sargs(stack(tables=svc)))
    assert msg == ("service embed: spark-2's firewall rule service-embed admits "
                   "192.168.177.12, 192.168.178.12 to port 8001, beyond the head's fabric "
                   "addresses"), msg
    missing = _tables(worker_rules=[RAY_WORKER])
    (msg,) = run(rules.vllm_behind_gateway, sargs(stack(tables=missing)))
    assert msg == ("service embed: no rule of spark-2's firewall names port 8001: every "
                   "address reaches it"), msg
    # with mp on two nodes the main vLLM listens on the head's fabric address, where the other
    # ranks watch it: the stack's fabric addresses then
    mp = {"host": "192.168.177.11", "executor": "mp", "masterAddr": "192.168.177.11",
          "masterPort": 29501}
    mp_tables = _tables(head_rules=[fw_rule("vllm", 8000), fw_rule("vllm-rendezvous", 29501),
                                    fw_rule("prometheus", 9090, sources=())],
                        worker_rules=[fw_rule("service-embed", 8001, sources=HEAD_FABRIC)])
    assert findings(stack(tables=mp_tables, server=mp, ray=[],
                          monitoring=_monitoring(exporters=[]))) == []


def test_public_ports_are_the_gateways_and_sources_the_stacks_fabric():
    extra = _tables(head={"public": [8080, 6379]})
    msgs = run(rules.stack_ports_firewalled, sargs(stack(tables=extra)))
    assert msgs == ["spark-1's firewall admits every address to port(s) 6379: only the "
                    "gateway's port is public"], msgs
    assert any("Ray's GCS: port 6379 of spark-1 is a public port of its firewall" in m
               for m in run(rules.ray_not_exposed, sargs(stack(tables=extra)))), extra
    mgmt = _tables(worker_rules=[RAY_WORKER, fw_rule("service-embed", 8001, sources=HEAD_FABRIC),
                                 fw_rule("node-exporter", 9100, sources=HEAD_FABRIC),
                                 fw_rule("seeders", 18471, sources=["10.77.0.11"])])
    (msg,) = run(rules.stack_ports_firewalled, sargs(stack(tables=mgmt)))
    assert msg == ("spark-2's firewall rule seeders admits 10.77.0.11 (a management address); "
                   "the stack's ports admit its loopback and fabric only"), msg
    outside = _tables(worker={"dataPlane": {"ports": [32768, 60999],
                                            "sources": ["192.168.177.99"]}})
    (msg,) = run(rules.stack_ports_firewalled, sargs(stack(tables=outside)))
    assert "rule data-plane admits 192.168.177.99 (not a fabric address of the stack)" in msg
    no_ssh = _tables(head={"sshPort": None})
    (msg,) = run(rules.stack_ports_firewalled, sargs(stack(tables=no_ssh)))
    assert "names no sshd port it always admits (sshPort)" in msg


def test_the_monitoring_ports_keep_to_theirs():
    wide = _tables(head_rules=[RAY_HEAD, fw_rule("vllm", 8000, sources=()),
                               fw_rule("prometheus", 9090),
                               fw_rule("node-exporter", 9100, sources=HEAD_FABRIC)])
    (msg,) = run(rules.stack_ports_firewalled, sargs(stack(tables=wide)))
    assert msg.startswith("Prometheus: spark-1's firewall rule prometheus admits "), msg
    # with `listen: fabric` the stack's fabric addresses are its own
    fabric_listen = _monitoring(listen="192.168.177.11:9090")
    assert run(rules.stack_ports_firewalled,
               sargs(stack(tables=wide, monitoring=fabric_listen))) == []
    exporter = _tables(worker_rules=[RAY_WORKER, fw_rule("service-embed", 8001,
                                                         sources=HEAD_FABRIC),
                                     fw_rule("node-exporter", 9100)])
    (msg,) = run(rules.stack_ports_firewalled, sargs(stack(tables=exporter)))
    assert msg.startswith("the node exporter of spark-2: spark-2's firewall rule node-exporter "
                          "admits 192.168.177.12, 192.168.178.12 to port 9100, beyond the "
                          "head's fabric addresses"), msg


@pytest.mark.parametrize("prop", ["rules", "public"])
def test_unknowns_are_not_judged(prop):
    from pulumi_policy.proxy import UNKNOWN_ARRAY_VALUE

    unknown = _tables(head={prop: UNKNOWN_ARRAY_VALUE}, worker={prop: UNKNOWN_ARRAY_VALUE})
    assert findings(stack(tables=unknown)) == []
