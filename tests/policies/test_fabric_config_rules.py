"""Rules 15 fabric-config and 16 fabric-addresses-unique, on the NodeFabric components
(components/fabric.py), passing and failing, through `policy.validate(args, report)` and through
pulumi_policy's own servicer (the engine's wire form of unknowns)."""
from __future__ import annotations

import json
import sys
from asyncio import run as run_async
from inspect import isawaitable
from pathlib import Path

import pytest
from google.protobuf import json_format, struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel
from pulumi_policy.policy import _PolicyAnalyzerServicer
from pulumi_policy.proxy import (
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_testkit import POLICIES_DIR, rargs, res, run, sargs, urn

import rules
from rules import NODE_FABRIC, SPARK_NODE


def node_fabric(node="spark-2", host="10.77.0.12", mgmt="enP7s7", mtu=9000, octet=12, **over):
    """A NodeFabric's props as components/fabric.py registers them."""
    props = {
        "node": node,
        "host": host,
        "managementInterface": mgmt,
        "mtu": mtu,
        "interfaces": [
            {"interface": "enp1s0f1np1", "address": f"192.168.177.{octet}/24",
             "file": "/etc/netplan/40-spark-vllm-dev-enp1s0f1np1.yaml"},
            {"interface": "enP2p1s0f1np1", "address": f"192.168.178.{octet}/24",
             "file": "/etc/netplan/40-spark-vllm-dev-enP2p1s0f1np1.yaml"},
        ],
    }
    props.update(over)
    return props


def check(props, config=None):
    return run(rules.fabric_config, rargs(NODE_FABRIC, props, "fabric-spark-2", config))


def two_nodes(first=None, second=None):
    return [res(NODE_FABRIC, first or node_fabric("spark-1", "10.77.0.11", octet=11),
                "fabric-spark-1"),
            res(NODE_FABRIC, second or node_fabric(), "fabric-spark-2")]


def check_stack(resources):
    """fabric-addresses-unique: (message, urn) pairs."""
    seen: list[tuple[str, object]] = []
    result = rules.fabric_addresses_unique.validate(sargs(resources),
                                                    lambda m, u=None: seen.append((m, u)))
    if isawaitable(result):
        run_async(result)
    return seen


# -------------------------------------------------------------------------- 15. fabric-config
def test_fabric_config_passes_for_the_components_props():
    assert check(node_fabric()) == []
    # recon did not see the management address on any interface; a DNS management name
    assert check(node_fabric(mgmt=None)) == []
    assert check(node_fabric(host="spark-2.lab.example")) == []
    # a single fabric interface, and none (a node without fabric)
    one = node_fabric()
    one["interfaces"] = one["interfaces"][:1]
    assert check(one) == []
    assert check(node_fabric(interfaces=[])) == []


def test_fabric_config_reviews_only_node_fabric():
    bad = node_fabric(mtu=1500, mgmt="enp1s0f1np1")
    assert run(rules.fabric_config, rargs(SPARK_NODE, bad)) == []
    assert run(rules.fabric_config, rargs(rules.NCCL_ENV, bad)) == []


def test_fabric_config_fails_an_mtu_below_the_floor():
    assert check(node_fabric(mtu=1500)) == [
        "node spark-2: fabric interface enp1s0f1np1 is set to MTU 1500, below the required 9000 "
        "(minMtu)",
        "node spark-2: fabric interface enP2p1s0f1np1 is set to MTU 1500, below the required "
        "9000 (minMtu)"]
    assert check(node_fabric(mtu=8999)) != []
    assert check(node_fabric(mtu=9000)) == []
    assert check(node_fabric(mtu=9216)) == []
    # the interfaces unknown during preview: the MTU still fails, for the node
    assert check(node_fabric(mtu=1500, interfaces=UNKNOWN_ARRAY_VALUE)) == [
        "node spark-2: the stack sets MTU 1500 on its fabric interfaces, below the required 9000 "
        "(minMtu)"]


def test_fabric_config_mtu_floor_comes_from_its_pack_config():
    assert check(node_fabric(mtu=1500), config={"minMtu": 1500}) == []
    msgs = check(node_fabric(mtu=1500), config={"minMtu": 4000})
    assert len(msgs) == 2 and "below the required 4000 (minMtu)" in msgs[0]
    # the sample configs: the lab accepts 1500, prod wants 9000
    dev = json.loads((POLICIES_DIR / "config.dev.json").read_text())["fabric-config"]
    prod = json.loads((POLICIES_DIR / "config.prod.json").read_text())["fabric-config"]
    assert check(node_fabric(mtu=1500), config=dev) == []
    assert len(check(node_fabric(mtu=1500), config=prod)) == 2
    schema = rules.fabric_config.config_schema
    assert schema is not None and schema.properties["minMtu"]["default"] == 9000


def test_fabric_config_fails_twins_in_one_subnet():
    props = node_fabric()
    props["interfaces"][1]["address"] = "192.168.177.13/24"
    assert check(props) == [
        "node spark-2: fabric interfaces enp1s0f1np1 (192.168.177.12/24) and enP2p1s0f1np1 "
        "(192.168.177.13/24) are in the same IPv4 network 192.168.177.0/24; each twin needs a "
        "subnet of its own (two interfaces in one subnet make the kernel's route between them a "
        "guess)"]
    # different prefixes that overlap are just as ambiguous
    props["interfaces"][1]["address"] = "192.168.177.200/25"
    msgs = check(props)
    assert len(msgs) == 1
    assert ("fabric interfaces enp1s0f1np1 (192.168.177.12/24) and enP2p1s0f1np1 "
            "(192.168.177.200/25) are in overlapping IPv4 networks 192.168.177.0/24 and "
            "192.168.177.128/25") in msgs[0]
    # adjacent but disjoint networks are fine
    props["interfaces"][0]["address"] = "192.168.177.12/25"
    assert check(props) == []


def test_fabric_config_fails_the_management_interface_as_a_fabric_interface():
    assert check(node_fabric(mgmt="enp1s0f1np1")) == [
        "node spark-2: fabric interface enp1s0f1np1 is the management interface (it carries the "
        "management address 10.77.0.12, the one ssh uses); configuring it as fabric would cut "
        "the connection the stack arrives on"]
    msgs = check(node_fabric(mgmt="enP2p1s0f1np1", host="spark-2.lab.example"))
    assert msgs == [
        "node spark-2: fabric interface enP2p1s0f1np1 is the management interface (it carries the "
        "management address spark-2.lab.example, the one ssh uses); configuring it as fabric "
        "would cut the connection the stack arrives on"]
    # names are case-sensitive (enp1s0f1np1 vs enP2p1s0f1np1 are different interfaces)
    assert check(node_fabric(mgmt="ENP1S0F1NP1")) == []


def test_fabric_config_fails_the_management_address_inside_a_fabric_network():
    assert check(node_fabric(host="192.168.178.5")) == [
        "node spark-2: the management address 192.168.178.5 is inside 192.168.178.0/24, the "
        "network of fabric interface enP2p1s0f1np1 (192.168.178.12/24); the fabric's "
        "configuration would take the management route"]
    # the management address on the fabric interface itself: both (c) and (d)
    msgs = check(node_fabric(host="192.168.177.12", mgmt="enp1s0f1np1"))
    assert len(msgs) == 2
    assert msgs[0].startswith("node spark-2: fabric interface enp1s0f1np1 is the management "
                              "interface (it carries the management address 192.168.177.12")
    assert msgs[1].startswith("node spark-2: the management address 192.168.177.12 is inside "
                              "192.168.177.0/24, the network of fabric interface enp1s0f1np1")
    # a DNS name is not resolved, an IPv6 management address is not compared
    assert check(node_fabric(host="spark-2")) == []
    assert check(node_fabric(host="fd00::12")) == []


@pytest.mark.parametrize(("address", "shown"), [
    ("192.168.177.12", "address '192.168.177.12'"),            # no prefix
    ("192.168.177.312/24", "address '192.168.177.312/24'"),    # not an IPv4 address
    ("192.168.177.12/33", "address '192.168.177.12/33'"),      # prefix out of range
    ("192.168.177.12/255.255.255.0", "address '192.168.177.12/255.255.255.0'"),  # a netmask
    ("192.168.177.12/", "address '192.168.177.12/'"),
    ("fd00:177::12/64", "address 'fd00:177::12/64'"),          # IPv6
    ("", "no address"),
    (None, "no address"),
    (24, "address 24"),
])
def test_fabric_config_fails_an_address_that_is_not_ipv4_cidr(address, shown):
    props = node_fabric()
    props["interfaces"][1]["address"] = address
    assert check(props) == [
        f"node spark-2: fabric interface enP2p1s0f1np1 has {shown}, not an IPv4 address in CIDR "
        "notation (a.b.c.d/prefix)"]


def test_fabric_config_reports_every_finding_of_a_node():
    props = node_fabric(mtu=1280, host="192.168.177.7", mgmt="enP2p1s0f1np1")
    props["interfaces"][1]["address"] = "192.168.177.13/24"
    props["interfaces"].append({"interface": "enp1s0f0np0", "address": "192.168.179.12",
                                "file": "/etc/netplan/40-spark-vllm-dev-enp1s0f0np0.yaml"})
    msgs = check(props)
    assert [m.split(":", 1)[0] for m in msgs] == ["node spark-2"] * len(msgs)
    kinds = [("MTU 1280" in m, "same IPv4 network" in m, "is the management interface" in m,
              "the management address 192.168.177.7 is inside" in m, "not an IPv4 address" in m)
             for m in msgs]
    assert [k.index(True) for k in kinds] == [0, 0, 0, 1, 2, 3, 3, 4]


def test_fabric_config_skips_only_what_is_unknown_in_a_preview():
    """During a preview any value may be unknown: the check that needs it is skipped, the
    others still run, and nothing raises."""
    everything = {"node": UNKNOWN_STRING_VALUE, "host": UNKNOWN_STRING_VALUE,
                  "managementInterface": UNKNOWN_STRING_VALUE, "mtu": UNKNOWN_NUMBER_VALUE,
                  "interfaces": UNKNOWN_ARRAY_VALUE}
    assert check(everything) == []
    assert check(node_fabric(mtu=UNKNOWN_NUMBER_VALUE)) == []
    assert check(node_fabric(host=UNKNOWN_STRING_VALUE, mgmt=UNKNOWN_STRING_VALUE)) == []
    # an unknown address: no twin, management or CIDR check on it; the MTU still fails
    props = node_fabric(mtu=1500, host="192.168.178.5")
    props["interfaces"][1]["address"] = UNKNOWN_STRING_VALUE
    assert check(props) == [
        "node spark-2: fabric interface enp1s0f1np1 is set to MTU 1500, below the required 9000 "
        "(minMtu)",
        "node spark-2: fabric interface enP2p1s0f1np1 is set to MTU 1500, below the required "
        "9000 (minMtu)"]
    # an unknown interface entry or name is never the management interface, and a known one is
    props = node_fabric(mgmt="enp1s0f1np1")
    props["interfaces"][1] = UNKNOWN_OBJECT_VALUE
    assert len(check(props)) == 1
    props = node_fabric(mgmt="enp1s0f1np1", node=UNKNOWN_STRING_VALUE)
    props["interfaces"][0]["interface"] = UNKNOWN_STRING_VALUE
    props["interfaces"][1]["address"] = "192.168.177.13/24"
    assert check(props) == [
        "node ?: fabric interfaces ? (192.168.177.12/24) and enP2p1s0f1np1 (192.168.177.13/24) "
        "are in the same IPv4 network 192.168.177.0/24; each twin needs a subnet of its own (two "
        "interfaces in one subnet make the kernel's route between them a guess)"]
    # the management interface unknown: the management address check still runs
    msgs = check(node_fabric(mgmt=UNKNOWN_STRING_VALUE, host="192.168.177.1"))
    assert len(msgs) == 1 and "the management address 192.168.177.1 is inside" in msgs[0]


# ------------------------------------------------------------------ 16. fabric-addresses-unique
def test_fabric_addresses_unique_passes_for_distinct_addresses():
    assert check_stack(two_nodes()) == []
    assert check_stack([]) == []
    assert check_stack(two_nodes()[:1]) == []


def test_fabric_addresses_unique_fails_an_address_on_two_nodes():
    second = node_fabric()
    second["interfaces"][1]["address"] = "192.168.178.11/24"  # spark-1's
    assert check_stack(two_nodes(second=second)) == [
        ("fabric address 192.168.178.11 is on two nodes: node spark-1 interface enP2p1s0f1np1 and "
         "node spark-2 interface enP2p1s0f1np1; each fabric interface needs an address of its "
         "own", urn(NODE_FABRIC, "fabric-spark-2"))]
    # the prefix is ignored
    second["interfaces"][1]["address"] = "192.168.178.11/16"
    assert len(check_stack(two_nodes(second=second))) == 1
    # both of a node's twins taken: one finding each
    assert len(check_stack(two_nodes(second=node_fabric(octet=11)))) == 2


def test_fabric_addresses_unique_fails_an_address_twice_on_one_node():
    props = node_fabric()
    props["interfaces"][1]["address"] = "192.168.177.12/25"
    assert check_stack(two_nodes(second=props)) == [
        ("node spark-2: fabric address 192.168.177.12 is on two of its interfaces, enp1s0f1np1 "
         "and enP2p1s0f1np1; each fabric interface needs an address of its own",
         urn(NODE_FABRIC, "fabric-spark-2"))]


def test_fabric_addresses_unique_skips_unknown_and_invalid_addresses():
    first = node_fabric("spark-1", "10.77.0.11", octet=11)
    first["interfaces"][0]["address"] = UNKNOWN_STRING_VALUE
    second = node_fabric(interfaces=UNKNOWN_ARRAY_VALUE)
    assert check_stack(two_nodes(first, second)) == []
    third = node_fabric(octet=11)
    third["interfaces"][1] = UNKNOWN_OBJECT_VALUE  # 192.168.177.11 is unknown on spark-1
    assert check_stack(two_nodes(first, third)) == []
    bad = node_fabric(octet=11)
    for entry in bad["interfaces"]:
        entry["address"] = "not-an-address"
    assert check_stack([*two_nodes(second=bad), res(NODE_FABRIC, bad, "fabric-spark-3")]) == []
    # other resource types carrying `interfaces` are not NodeFabrics
    other = res(SPARK_NODE, node_fabric(octet=11), "spark-1")
    assert check_stack([*two_nodes(), other]) == []


# ------------------------------------------------------------------- through the servicer
def _servicer():
    return _PolicyAnalyzerServicer("spark-vllm", "0.1.0", list(rules.POLICIES),
                                   EnforcementLevel.MANDATORY)


def _struct(props: dict) -> struct_pb2.Struct:
    return json_format.ParseDict(props, struct_pb2.Struct())


def _analyze(props: dict):
    req = proto.AnalyzeRequest(type=NODE_FABRIC, urn=f"urn:pulumi:dev::p::{NODE_FABRIC}::f",
                               name="f", properties=_struct(props))
    return list(_servicer().Analyze(req, None).diagnostics)


def _analyze_stack(resources: list[tuple[str, dict]]):
    req = proto.AnalyzeStackRequest(resources=[
        proto.AnalyzerResource(type=NODE_FABRIC, urn=f"urn:pulumi:dev::p::{NODE_FABRIC}::{n}",
                               name=n, properties=_struct(p)) for n, p in resources])
    return list(_servicer().AnalyzeStack(req, None).diagnostics)


def test_fabric_rules_through_the_servicer():
    assert _analyze(node_fabric()) == []
    assert _analyze_stack([("fabric-spark-1", node_fabric("spark-1", "10.77.0.11", octet=11)),
                           ("fabric-spark-2", node_fabric())]) == []
    diags = _analyze(node_fabric(mtu=1500, mgmt="enp1s0f1np1"))
    assert {d.policyName for d in diags} == {"fabric-config"}
    assert {d.enforcementLevel for d in diags} == {proto.MANDATORY}
    assert len(diags) == 3
    dup = _analyze_stack([("fabric-spark-1", node_fabric("spark-1", "10.77.0.11", octet=11)),
                          ("fabric-spark-2", node_fabric(octet=11))])
    assert {d.policyName for d in dup} == {"fabric-addresses-unique"}
    assert {d.enforcementLevel for d in dup} == {proto.MANDATORY}
    assert len(dup) == 2 and "fabric address 192.168.177.11 is on two nodes" in dup[0].message


def test_fabric_rules_survive_unknowns_through_the_servicer():
    """The engine's sentinels, wholly or in part: no "can't run policy" advisory, no finding."""
    sentinel = {k: UNKNOWN_STRING_VALUE
                for k in ("node", "host", "managementInterface", "mtu", "interfaces")}

    def partial(octet):
        props = node_fabric(mtu=UNKNOWN_NUMBER_VALUE, host=UNKNOWN_STRING_VALUE, octet=octet)
        props["interfaces"][0] = {"interface": UNKNOWN_STRING_VALUE,
                                  "address": UNKNOWN_STRING_VALUE, "file": UNKNOWN_STRING_VALUE}
        return props

    for a, b in ((sentinel, sentinel), (partial(11), partial(12)),
                 (node_fabric(interfaces=UNKNOWN_ARRAY_VALUE), node_fabric(octet=11))):
        diags = _analyze(a) + _analyze(b) + _analyze_stack([("a", a), ("b", b)])
        assert diags == [], diags
