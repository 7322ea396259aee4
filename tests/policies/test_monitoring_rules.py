"""Rule 17 monitoring-not-exposed, on the Monitoring component (components/monitoring.py),
passing and failing, through `policy.validate(args, report)` and through pulumi_policy's own
servicer (the engine's wire form of unknowns)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_BOOLEAN_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_testkit import POLICIES_DIR, rargs, run

import rules
from rules import MONITORING, NODE_FABRIC, SPARK_NODE

HEAD_FABRIC = ["192.168.177.11", "192.168.178.11"]
WORKER_FABRIC = ["192.168.177.12", "192.168.178.12"]
PROMETHEUS_PIN = "prom/prometheus@sha256:" + "a" * 64
EXPORTER_PIN = "prom/node-exporter@sha256:" + "b" * 64
ALERTMANAGER_PIN = "prom/alertmanager@sha256:" + "c" * 64
PINNED = {"prometheus": PROMETHEUS_PIN, "nodeExporter": EXPORTER_PIN,
          "alertmanager": ALERTMANAGER_PIN}

PROMETHEUS_FIX = ("Prometheus has no authentication in this stack: set "
                  "spark-vllm:monitoring.listen: loopback (127.0.0.1; reach it with ssh -L) or "
                  "spark-vllm:monitoring.listen: fabric (the head's first fabric address)")
EXPORTER_FIX = ("a node exporter has no authentication: the stack places it on the head's "
                "loopback and on each other node's first fabric address (nodes[].fabric), never "
                "on the management network")
ALERTMANAGER_FIX = ("Alertmanager has no authentication in this stack (whoever reaches it can "
                    "silence every alert): the stack places it beside Prometheus "
                    "(spark-vllm:monitoring.listen: loopback or fabric) with its cluster off")


def exporter(node, host, listen):
    return {"node": node, "host": host, "listen": listen}


def monitoring(**over):
    """A Monitoring's props as components/monitoring.py's `_props` registers them for the
    two-node stack (spark-1 10.77.0.11 the head, spark-2 10.77.0.12) with the defaults:
    Prometheus on the head's loopback, the head's exporter on 127.0.0.1, the worker's on its
    first fabric address."""
    props = {
        "environment": "dev",
        "node": "spark-1",
        "host": "10.77.0.11",
        "listen": "127.0.0.1:9090",
        "authentication": False,
        "fabricAddresses": [*HEAD_FABRIC, *WORKER_FABRIC],
        "images": {"prometheus": "prom/prometheus:v3.5.0",
                   "nodeExporter": "prom/node-exporter:v1.9.1",
                   "alertmanager": "prom/alertmanager:v0.28.1"},
        "alertmanager": {"listen": "127.0.0.1:9093", "clusterListen": ""},
        "receivers": [],
        "exporters": [exporter("spark-1", "10.77.0.11", "127.0.0.1:9100"),
                      exporter("spark-2", "10.77.0.12", "192.168.177.12:9100")],
        "targets": {"models": ["qwen3.5-122b"], "replicas": {"qwen3.5-122b": ["spark-1"]},
                    "nodes": ["spark-1", "spark-2"]},
        "scrapeIntervalSeconds": 15,
        "retentionDays": 15,
        "keepDataOnDestroy": True,
    }
    props.update(over)
    return props


def with_exporter(i, **over):
    props = monitoring()
    props["exporters"][i].update(over)
    return props


def check(props, config=None):
    return run(rules.monitoring_not_exposed, rargs(MONITORING, props, "monitoring", config))


def prometheus_msg(listen, why, node="spark-1"):
    return f"node {node}: Prometheus listens on {listen}: {why}; {PROMETHEUS_FIX}"


def exporter_msg(node, listen, why):
    return f"node {node}: its node exporter listens on {listen}: {why}; {EXPORTER_FIX}"


EVERY = "is every address of the node, the management network's included"


def image_msg(env, what, key, ref):
    return (f"{env}: {what} image spark-vllm:monitoring.{key}.ref {ref!r} is not pinned by digest "
            "(<repo>@sha256:<64 hex>); pin it (`docker buildx imagetools inspect <ref>` shows "
            "the digest)")


# ------------------------------------------------------------------------------- passing
def test_passes_for_the_components_default_props():
    assert check(monitoring()) == []
    # monitoring.listen: fabric (the head's first fabric address), and its twin
    assert check(monitoring(listen="192.168.177.11:9090")) == []
    assert check(monitoring(listen="192.168.178.11:9090")) == []
    # every loopback spelling: 127.0.0.0/8, ::1, localhost
    for listen in ("127.0.0.2:9090", "[::1]:9090", "localhost:9090"):
        assert check(monitoring(listen=listen)) == [], listen
    # prod with every image pinned by digest
    assert check(monitoring(environment="prod", images=PINNED)) == []
    # Alertmanager on the fabric (with Prometheus), its cluster on loopback: fine too
    assert check(monitoring(alertmanager={"listen": "192.168.177.11:9093",
                                          "clusterListen": "127.0.0.1:9094"})) == []
    # a stack from before Alertmanager (no such props), in prod
    old = monitoring(environment="prod", images={"prometheus": PROMETHEUS_PIN,
                                                 "nodeExporter": EXPORTER_PIN})
    del old["alertmanager"]
    assert check(old) == []
    # a DNS management name: the loopback and fabric listeners are still fine
    assert check(monitoring(host="spark-1.lab.example")) == []


def test_passes_for_what_the_component_registers():
    """The real `Monitoring._props` (components/monitoring.py) for the two-node stack, with
    stand-ins for the nodes: loopback and fabric, dev and prod (pinned) pass."""
    from components.monitoring import Monitoring, MonitoringArgs
    from config.monitoring import MonitoringConfig

    def node(name, host, ips):
        return SimpleNamespace(name=name, node=SimpleNamespace(
            host=host, fabric=[SimpleNamespace(ip=ip) for ip in ips]))

    nodes = [node("spark-1", "10.77.0.11", HEAD_FABRIC),
             node("spark-2", "10.77.0.12", WORKER_FABRIC)]
    spec = SimpleNamespace(models=(SimpleNamespace(name="qwen3.5-122b", replicas=("spark-1",)),),
                           nodes=tuple(SimpleNamespace(node=n.name) for n in nodes))

    def props(listen, env, prometheus, node_exporter, alertmanager):
        cfg = MonitoringConfig.model_validate({
            "enabled": True, "listen": listen, "prometheus": {"ref": prometheus},
            "nodeExporter": {"ref": node_exporter}, "alertmanager": {"ref": alertmanager}})
        args = MonitoringArgs(monitoring=cfg, nodes=nodes, names=None, labels={},
                              environment=env, spec=spec, alerting=None, api_key=None)
        return Monitoring._props(args)

    default = props("loopback", "dev", "prom/prometheus:v3.5.0", "prom/node-exporter:v1.9.1",
                    "prom/alertmanager:v0.28.1")
    assert default == monitoring()  # the hand-built props above are the component's
    assert check(default) == []
    fabric = props("fabric", "prod", PROMETHEUS_PIN, EXPORTER_PIN, ALERTMANAGER_PIN)
    assert fabric["listen"] == "192.168.177.11:9090"
    assert fabric["alertmanager"] == {"listen": "192.168.177.11:9093", "clusterListen": ""}
    assert check(fabric) == []


def test_reviews_only_monitoring():
    bad = monitoring(listen="0.0.0.0:9090", environment="prod")
    for rtype in (SPARK_NODE, NODE_FABRIC, rules.GATEWAY, rules.CONTAINER):
        assert run(rules.monitoring_not_exposed, rargs(rtype, bad)) == [], rtype


# ----------------------------------------------------------------------- Prometheus's listen
@pytest.mark.parametrize(("listen", "why"), [
    ("0.0.0.0:9090", f"0.0.0.0 {EVERY}"),
    ("[::]:9090", f":: {EVERY}"),
    (":9090", "no address is every address of the node, the management network's included"),
])
def test_prometheus_on_every_address_fails(listen, why):
    assert check(monitoring(listen=listen)) == [prometheus_msg(listen, why)]


def test_prometheus_on_a_management_address_fails():
    assert check(monitoring(listen="10.77.0.11:9090")) == [prometheus_msg(
        "10.77.0.11:9090",
        "10.77.0.11 is the management address of node spark-1 (the network ssh arrives on)")]
    # another node's management address (its exporter's `host`) is named as that node's
    assert check(monitoring(listen="10.77.0.12:9090")) == [prometheus_msg(
        "10.77.0.12:9090",
        "10.77.0.12 is the management address of node spark-2 (the network ssh arrives on)")]
    # a DNS management name, as written
    msgs = check(monitoring(host="spark-1.lab.example", listen="spark-1.lab.example:9090"))
    assert msgs == [prometheus_msg(
        "spark-1.lab.example:9090", "spark-1.lab.example is the management address of node "
        "spark-1 (the network ssh arrives on)")]


def test_prometheus_on_a_management_address_that_is_also_declared_fabric_fails():
    """fabric-config refuses a management address in the fabric; this rule does not let it
    through either."""
    props = monitoring(listen="10.77.0.11:9090",
                       fabricAddresses=[*HEAD_FABRIC, *WORKER_FABRIC, "10.77.0.11"])
    assert len(check(props)) == 1


@pytest.mark.parametrize(("listen", "why"), [
    ("10.0.0.5:9090", "10.0.0.5 is neither loopback nor a fabric address of the stack"),
    # inside a fabric subnet but no node's address
    ("192.168.177.99:9090",
     "192.168.177.99 is neither loopback nor a fabric address of the stack"),
    ("[fd00::11]:9090", "fd00::11 is neither loopback nor a fabric address of the stack"),
    ("spark-1:9090", "spark-1 is not an IP address (a name is not resolved: it cannot be shown "
                     "to stay off the management network)"),
])
def test_prometheus_on_another_address_fails(listen, why):
    assert check(monitoring(listen=listen)) == [prometheus_msg(listen, why)]


@pytest.mark.parametrize("listen", [
    "127.0.0.1",            # no port
    "127.0.0.1:",           # empty port
    "127.0.0.1:0",          # port out of range
    "127.0.0.1:65536",
    "127.0.0.1:http",       # a service name
    "127.0.0.1:9090 ",      # whitespace
    " 127.0.0.1:9090",
    "::1:9090",             # IPv6 without brackets: ambiguous
    "[::1]9090",            # no colon after the bracket
    "[127.0.0.1]:9090",     # IPv4 in brackets
    "[::1:9090",            # unclosed bracket
    "127.0.0.1]:9090",
    "",
    None,
    9090,
    ["127.0.0.1:9090"],
    {"address": "127.0.0.1", "port": 9090},
])
def test_prometheus_with_a_malformed_listen_fails_closed(listen):
    shown = {list: "a list", dict: "an object"}.get(type(listen)) or repr(listen)
    assert check(monitoring(listen=listen)) == [
        f"node spark-1: Prometheus's listen {shown} is not an address:port (a.b.c.d:port, "
        "[v6]:port): it cannot be shown to stay off the management network; "
        f"{PROMETHEUS_FIX}"]
    # authentication does not make an unreadable value reviewable
    assert len(check(monitoring(listen=listen, authentication=True))) == 1


def test_authentication_lets_prometheus_listen_beyond_loopback_and_fabric():
    """`authentication` is reserved (no authentication today): a Prometheus that checks its
    clients may listen on the management network or every address."""
    for listen in ("10.77.0.11:9090", "0.0.0.0:9090", "[::]:9090", "10.0.0.5:9090"):
        assert check(monitoring(listen=listen, authentication=True)) == [], listen
        assert check(monitoring(listen=listen, authentication="true")) == [], listen
        # false, absent or not a boolean: no authentication
        for auth in (False, "false", None, "yes", 1):
            assert len(check(monitoring(listen=listen, authentication=auth))) == 1, (listen, auth)
    props = monitoring(listen="10.77.0.11:9090")
    del props["authentication"]
    assert len(check(props)) == 1
    # it is Prometheus's own: the exporters still may not listen on the management network
    props = with_exporter(1, listen="10.77.0.12:9100")
    props["authentication"] = True
    assert check(props) == [exporter_msg(
        "spark-2", "10.77.0.12:9100",
        "10.77.0.12 is the management address of node spark-2 (the network ssh arrives on)")]


# ------------------------------------------------------------------------------ exporters
def test_an_exporter_on_its_management_host_fails():
    assert check(with_exporter(1, listen="10.77.0.12:9100")) == [exporter_msg(
        "spark-2", "10.77.0.12:9100",
        "10.77.0.12 is the management address of node spark-2 (the network ssh arrives on)")]
    assert check(with_exporter(0, listen="10.77.0.11:9100")) == [exporter_msg(
        "spark-1", "10.77.0.11:9100",
        "10.77.0.11 is the management address of node spark-1 (the network ssh arrives on)")]


@pytest.mark.parametrize(("listen", "why"), [
    ("0.0.0.0:9100", f"0.0.0.0 {EVERY}"),
    ("[::]:9100", f":: {EVERY}"),
    (":9100", "no address is every address of the node, the management network's included"),
    ("10.0.0.5:9100", "10.0.0.5 is neither loopback nor a fabric address of the stack"),
])
def test_an_exporter_beyond_loopback_and_fabric_fails(listen, why):
    assert check(with_exporter(1, listen=listen)) == [exporter_msg("spark-2", listen, why)]


def test_an_exporter_on_loopback_or_any_fabric_address_passes():
    for listen in ("127.0.0.1:9100", "[::1]:9100", "192.168.178.12:9100"):
        assert check(with_exporter(1, listen=listen)) == [], listen
    # the exporters' hosts are no fabric address: the head's on its fabric address passes too
    assert check(with_exporter(0, listen="192.168.177.11:9100")) == []


@pytest.mark.parametrize("listen", ["192.168.177.12", "192.168.177.12:99999", "", None])
def test_an_exporter_with_a_malformed_listen_fails_closed(listen):
    assert check(with_exporter(1, listen=listen)) == [
        f"node spark-2: its node exporter's listen {listen!r} is not an address:port "
        "(a.b.c.d:port, [v6]:port): it cannot be shown to stay off the management network; "
        f"{EXPORTER_FIX}"]


# ---------------------------------------------------------------------------------- images
AM_UNPINNED = image_msg("prod", "Alertmanager's", "alertmanager", "prom/alertmanager:v0.28.1")


def test_prod_refuses_images_not_pinned_by_digest():
    assert check(monitoring(environment="prod")) == [
        image_msg("prod", "Prometheus's", "prometheus", "prom/prometheus:v3.5.0"),
        image_msg("prod", "the node exporters'", "nodeExporter", "prom/node-exporter:v1.9.1"),
        AM_UNPINNED]
    one = monitoring(environment="prod", images={**PINNED,
                                                 "nodeExporter": "prom/node-exporter:v1.9.1"})
    assert check(one) == [
        image_msg("prod", "the node exporters'", "nodeExporter", "prom/node-exporter:v1.9.1")]
    # a digest with a trailing newline, a bare image ID, none: not pinned
    for ref in (PROMETHEUS_PIN + "\n", "sha256:" + "a" * 64, None):
        props = monitoring(environment="prod", images={**PINNED, "prometheus": ref})
        assert check(props) == [image_msg("prod", "Prometheus's", "prometheus", ref)], ref
    props = monitoring(environment="prod", images={**PINNED, "alertmanager": None})
    assert check(props) == [image_msg("prod", "Alertmanager's", "alertmanager", None)]


def test_only_the_prod_environments_must_pin():
    assert check(monitoring(environment="dev")) == []
    assert check(monitoring(environment="staging")) == []
    assert len(check(monitoring(environment="staging"),
                     config={"prodEnvironments": ["staging", "prod"]})) == 3
    # no environment in the props: the pack config's
    props = monitoring()
    del props["environment"]
    assert check(props) == []
    assert len(check(props, config={"environment": "prod"})) == 3
    schema = rules.monitoring_not_exposed.config_schema
    assert schema is not None
    assert schema.properties["prodEnvironments"]["default"] == ["prod"]


# -------------------------------------------------------------------------------- unknowns
def test_everything_unknown_is_not_judged():
    props = {k: UNKNOWN_STRING_VALUE for k in monitoring()}
    assert check(props) == []
    props["environment"] = "prod"
    assert check(props) == []
    assert check(monitoring(environment="prod",
                            images=UNKNOWN_OBJECT_VALUE, listen=UNKNOWN_STRING_VALUE,
                            exporters=UNKNOWN_ARRAY_VALUE)) == []


def test_an_unknown_value_skips_only_its_check():
    bad_exporter = exporter_msg(
        "spark-2", "10.77.0.12:9100",
        "10.77.0.12 is the management address of node spark-2 (the network ssh arrives on)")
    # Prometheus's listen unknown: the exporters and images are still judged
    props = with_exporter(1, listen="10.77.0.12:9100")
    props.update(listen=UNKNOWN_STRING_VALUE, environment="prod")
    assert check(props) == [
        bad_exporter,
        image_msg("prod", "Prometheus's", "prometheus", "prom/prometheus:v3.5.0"),
        image_msg("prod", "the node exporters'", "nodeExporter", "prom/node-exporter:v1.9.1"),
        AM_UNPINNED]
    # the exporters unknown (the list, an entry, a listen): Prometheus still judged
    for exporters in (UNKNOWN_ARRAY_VALUE,
                      [UNKNOWN_OBJECT_VALUE, exporter("spark-2", "10.77.0.12", "0.0.0.0:9100")],
                      [exporter("spark-1", "10.77.0.11", UNKNOWN_STRING_VALUE),
                       exporter("spark-2", "10.77.0.12", "0.0.0.0:9100")]):
        msgs = check(monitoring(listen="0.0.0.0:9090", exporters=exporters))
        assert msgs[0] == prometheus_msg("0.0.0.0:9090", f"0.0.0.0 {EVERY}")
        assert len(msgs) == (1 if exporters is UNKNOWN_ARRAY_VALUE else 2)
    # authentication unknown: Prometheus's address is not judged, the exporters are
    props = with_exporter(1, listen="10.77.0.12:9100")
    props.update(listen="10.77.0.11:9090", authentication=UNKNOWN_BOOLEAN_VALUE)
    assert check(props) == [bad_exporter]
    # an unknown image: only the other one is judged
    props = monitoring(environment="prod", images={"prometheus": UNKNOWN_STRING_VALUE,
                                                   "nodeExporter": "prom/node-exporter:v1.9.1",
                                                   "alertmanager": ALERTMANAGER_PIN})
    assert check(props) == [
        image_msg("prod", "the node exporters'", "nodeExporter", "prom/node-exporter:v1.9.1")]
    # the environment unknown: no image check, the addresses still judged
    props = monitoring(environment=UNKNOWN_STRING_VALUE, listen="0.0.0.0:9090")
    assert check(props) == [prometheus_msg("0.0.0.0:9090", f"0.0.0.0 {EVERY}")]


def test_unknown_fabric_addresses_excuse_only_what_they_might_be():
    """With the fabric addresses (or one of them) unknown, another address may be one of them:
    not judged; every address and a management address are refused all the same."""
    for fabric in (UNKNOWN_ARRAY_VALUE, [*HEAD_FABRIC, UNKNOWN_STRING_VALUE]):
        assert check(monitoring(listen="10.0.0.5:9090", fabricAddresses=fabric)) == []
        props = with_exporter(1, listen="192.168.177.99:9100")
        props["fabricAddresses"] = fabric
        assert check(props) == []
        assert check(monitoring(listen="0.0.0.0:9090", fabricAddresses=fabric)) == [
            prometheus_msg("0.0.0.0:9090", f"0.0.0.0 {EVERY}")]
        assert len(check(monitoring(listen="10.77.0.11:9090", fabricAddresses=fabric))) == 1
        props = with_exporter(1, listen="10.77.0.12:9100")
        props["fabricAddresses"] = fabric
        assert len(check(props)) == 1
    # the management host unknown: that address is then judged as any other
    props = monitoring(host=UNKNOWN_STRING_VALUE, listen="10.77.0.11:9090")
    for e in props["exporters"]:
        e["host"] = UNKNOWN_STRING_VALUE
    assert check(props) == [prometheus_msg(
        "10.77.0.11:9090", "10.77.0.11 is neither loopback nor a fabric address of the stack")]


def test_every_finding_of_a_stack_at_once():
    props = monitoring(environment="prod", listen="10.77.0.11:9090")
    props["exporters"][0]["listen"] = "0.0.0.0:9100"
    props["exporters"][1]["listen"] = "192.168.177.12"
    props["alertmanager"] = {"listen": "10.77.0.11:9093", "clusterListen": "0.0.0.0:9094"}
    msgs = check(props)
    assert [m.split(":", 1)[0] for m in msgs] == [
        "node spark-1", "node spark-1", "node spark-2", "node spark-1", "node spark-1", "prod",
        "prod", "prod"]
    assert "Prometheus listens on 10.77.0.11:9090" in msgs[0]
    assert "its node exporter listens on 0.0.0.0:9100" in msgs[1]
    assert "its node exporter's listen '192.168.177.12' is not an address:port" in msgs[2]


def test_parse_listen():
    parse = rules.parse_listen
    assert parse("127.0.0.1:9090") == rules.monitoring.Listen("127.0.0.1", 9090)
    assert parse("[::1]:9090") == rules.monitoring.Listen("::1", 9090)
    assert parse(":9100") == rules.monitoring.Listen("", 9100)
    assert parse("spark-1:9090") == rules.monitoring.Listen("spark-1", 9090)
    assert parse("127.0.0.1:65535") is not None
    for bad in ("127.0.0.1", "127.0.0.1:0", "::1:9090", "[::1]", "[1.2.3.4]:1", "a b:1",
                "127.0.0.1:٩٠", None, 9090):
        assert parse(bad) is None, bad


# ------------------------------------------------------------------ level and pack config
def test_mandatory_and_not_turned_off_by_the_sample_configs():
    policy = rules.BY_NAME["monitoring-not-exposed"]
    assert policy.enforcement_level == EnforcementLevel.MANDATORY
    assert [p.name for p in rules.POLICIES][-5:-3] == ["fabric-addresses-unique",
                                                      "monitoring-not-exposed"]
    for name in ("config.dev.json", "config.prod.json"):
        cfg = json.loads((POLICIES_DIR / name).read_text())
        for key in ("monitoring-not-exposed", "all"):
            value = cfg.get(key)
            level = value.get("enforcementLevel") if isinstance(value, dict) else value
            assert level in (None, "mandatory"), (name, key, value)


# ------------------------------------------------------------------- through the servicer
def _analyze(props: dict, rtype: str = MONITORING):
    servicer = _PolicyAnalyzerServicer("spark-vllm", "0.1.0", list(rules.POLICIES),
                                       EnforcementLevel.MANDATORY)
    req = proto.AnalyzeRequest(type=rtype, urn=f"urn:pulumi:dev::p::{rtype}::monitoring",
                               name="monitoring",
                               properties=json_format.ParseDict(props, struct_pb2.Struct()))
    return list(servicer.Analyze(req, None).diagnostics)


def test_monitoring_rule_through_the_servicer():
    assert _analyze(monitoring()) == []
    diags = _analyze(monitoring(listen="0.0.0.0:9090", environment="prod",
                                exporters=[exporter("spark-1", "10.77.0.11", "127.0.0.1:9100"),
                                           exporter("spark-2", "10.77.0.12",
                                                    "10.77.0.12:9100")]))
    assert {d.policyName for d in diags} == {"monitoring-not-exposed"}
    assert {d.enforcementLevel for d in diags} == {proto.MANDATORY}
    assert len(diags) == 5  # Prometheus, an exporter, the three images
    # the servicer puts the policy's description first
    assert diags[0].message.endswith("\n" + prometheus_msg("0.0.0.0:9090", f"0.0.0.0 {EVERY}"))


def test_monitoring_rule_survives_unknowns_through_the_servicer():
    """The engine's sentinels, wholly or in part: no "can't run policy" advisory, no finding."""
    sentinel = {k: UNKNOWN_STRING_VALUE for k in monitoring()}
    partial = monitoring(
        listen=UNKNOWN_STRING_VALUE, authentication=UNKNOWN_BOOLEAN_VALUE,
        fabricAddresses=[UNKNOWN_STRING_VALUE, *HEAD_FABRIC],
        images={"prometheus": UNKNOWN_STRING_VALUE, "nodeExporter": UNKNOWN_STRING_VALUE,
                "alertmanager": UNKNOWN_STRING_VALUE},
        alertmanager={"listen": UNKNOWN_STRING_VALUE, "clusterListen": UNKNOWN_STRING_VALUE},
        exporters=[{"node": UNKNOWN_STRING_VALUE, "host": UNKNOWN_STRING_VALUE,
                    "listen": UNKNOWN_STRING_VALUE}, UNKNOWN_OBJECT_VALUE],
        scrapeIntervalSeconds=UNKNOWN_NUMBER_VALUE, environment="prod")
    for props in (sentinel, partial, monitoring(fabricAddresses=UNKNOWN_ARRAY_VALUE)):
        assert _analyze(props) == [], props


# ----------------------------------------------------------------------- Alertmanager (issue 50)
@pytest.mark.parametrize(("am", "what", "listen", "why"), [
    ({"listen": "0.0.0.0:9093", "clusterListen": ""}, "Alertmanager", "0.0.0.0:9093",
     f"0.0.0.0 {EVERY}"),
    ({"listen": "10.77.0.11:9093", "clusterListen": ""}, "Alertmanager", "10.77.0.11:9093",
     "10.77.0.11 is the management address of node spark-1 (the network ssh arrives on)"),
    # its default cluster listener: every address
    ({"listen": "127.0.0.1:9093", "clusterListen": "0.0.0.0:9094"}, "Alertmanager's cluster",
     "0.0.0.0:9094", f"0.0.0.0 {EVERY}"),
    ({"listen": "127.0.0.1:9093", "clusterListen": "10.0.0.5:9094"}, "Alertmanager's cluster",
     "10.0.0.5:9094", "10.0.0.5 is neither loopback nor a fabric address of the stack"),
])
def test_alertmanager_beyond_loopback_and_the_fabric_fails(am, what, listen, why):
    assert check(monitoring(alertmanager=am)) == [
        f"node spark-1: {what} listens on {listen}: {why}; {ALERTMANAGER_FIX}"]


def test_an_alertmanager_with_a_malformed_listen_fails_closed():
    assert check(monitoring(alertmanager={"listen": "127.0.0.1", "clusterListen": ""})) == [
        "node spark-1: Alertmanager listen '127.0.0.1' is not an address:port (a.b.c.d:port, "
        "[v6]:port): it cannot be shown to stay off the management network; "
        f"{ALERTMANAGER_FIX}"]
    # unknown: not judged
    assert check(monitoring(alertmanager=UNKNOWN_OBJECT_VALUE)) == []
