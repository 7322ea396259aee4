"""The rules read each component's props through its TypedDict in contract/props.py (issue 47):
mypy checks the keys statically; here every rule runs over the props of the goldens' resources,
where a read of a key the contract does not declare raises `UndeclaredProp` and fails the test."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_testkit import rargs, res, run, sargs, secret
from pulumi_policy import ResourceValidationPolicy, StackValidationPolicy
from pulumi_policy.proxy import UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE

import rules
from contract.props import PROPS, GatewayProps, NodeFirewallProps, VllmServerProps
from rules import VLLM_SERVER, VLLM_SERVICE
from rules._common import UNKNOWN, UndeclaredProp, each, model_props, props_as, props_of

GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "components" / "golden"
GOLDENS = sorted(GOLDEN.glob("*.json"))


def _wire(value):
    """A golden's value in the form the engine sends it: `{"<secret>": v}` becomes a secret."""
    if isinstance(value, dict):
        if list(value) == ["<secret>"]:
            return secret(_wire(value["<secret>"]))
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


def _resources(path: Path) -> list[tuple[str, str, dict]]:
    return [(r["type"], r["name"], _wire(r.get("inputs") or {}))
            for r in json.loads(path.read_text())["resources"]]


def test_the_goldens_carry_every_contract_type():
    """The run below reaches every TypedDict: each type of PROPS is in some golden."""
    seen = {t for path in GOLDENS for t, _, _ in _resources(path)}
    assert set(PROPS) <= seen


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: p.stem)
def test_every_rule_reads_only_declared_props(path):
    resources = _resources(path)
    for policy in rules.POLICIES:
        if isinstance(policy, ResourceValidationPolicy):
            for rtype, name, props in resources:
                run(policy, rargs(rtype, props, name))  # UndeclaredProp fails the test
        else:
            assert isinstance(policy, StackValidationPolicy)
            run(policy, sargs([res(rtype, props, name) for rtype, name, props in resources]))


def test_an_undeclared_key_raises():
    props = props_as({"host": "0.0.0.0", "other": 1}, VllmServerProps)
    assert props["host"] == "0.0.0.0"
    with pytest.raises(UndeclaredProp, match="VllmServerProps declares no prop 'other'"):
        props["other"]  # type: ignore[typeddict-item]
    with pytest.raises(UndeclaredProp):
        props.get("other")
    # nested objects are read through their own TypedDict
    fw = props_as({"dataPlane": {"ports": [1, 2], "extra": 1}}, NodeFirewallProps)
    assert fw["dataPlane"] is not None and fw["dataPlane"]["ports"] == [1, 2]
    with pytest.raises(UndeclaredProp, match="DataPlaneProps"):
        fw["dataPlane"]["extra"]  # type: ignore[typeddict-item]
    gw = props_as({"routes": [{"name": "m", "servers": [{"node": "a", "port": 1}]}]}, GatewayProps)
    assert gw["routes"][0]["servers"][0]["node"] == "a"
    with pytest.raises(UndeclaredProp, match="GatewayServerProps"):
        gw["routes"][0]["servers"][0]["host"]  # type: ignore[typeddict-item]


def test_reads_are_as_tolerant_as_get():
    """Absent or None -> the default, a secret unwrapped, an unknown -> UNKNOWN."""
    p = props_as(rargs(VLLM_SERVER, {"host": None, "apiKey": secret("k"),
                                     "servedModelName": UNKNOWN_STRING_VALUE}).props,
                 VllmServerProps)
    assert p["host"] is None and p.get("pipelineParallelSize", 1) == 1
    assert p["apiKey"] == "k"
    assert p["servedModelName"] is UNKNOWN
    assert "host" in p and "port" not in p
    # an unknown item of a list reads as unknown all the way down
    nodes = each(props_as(rargs(VLLM_SERVER, {"nodes": [UNKNOWN_OBJECT_VALUE]}).props,
                          VllmServerProps)["nodes"])
    assert nodes == [UNKNOWN] and nodes[0]["name"] is UNKNOWN
    # an item or object that is not one reads None for every key, as get(value, key) does
    odd = props_as({"nodes": [None, "x"]}, VllmServerProps)
    assert [n["name"] for n in each(odd["nodes"])] == [None, None]
    dp = props_as({"dataPlane": "x"}, NodeFirewallProps)["dataPlane"]
    assert dp is not None and dp["sources"] is None


def test_props_of_names_the_type_of_the_resource():
    args = rargs(VLLM_SERVICE, {"hosts": {"a": "10.0.0.1"}})
    with pytest.raises(TypeError, match="does not carry VllmServerProps"):
        props_of(args, VllmServerProps)
    # a vLLM's props, main or service, read through the keys both declare
    assert model_props(args.props)["nodes"] is None
    with pytest.raises(UndeclaredProp):
        model_props(args.props)["hosts"]  # type: ignore[typeddict-item]
