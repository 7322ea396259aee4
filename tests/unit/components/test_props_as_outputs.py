"""Every component the policy pack judges registers its props as its outputs too.

A stack policy (CrossGuard's `validate_stack`) reads a component's outputs: what it passed to
`register_outputs`, not the props it was made with. NodeFirewall and CollectiveGate registered
only a few outputs, so on the lab the pack saw no firewall rule (every Ray and vLLM port judged
open) and no NCCL build, while every test under mocks, which reads the props, passed. This
records both for every component of a stack with every optional part on and compares them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pulumi
import pytest

from contract.props import PROPS
from tests.unit.conftest import settled

# the component types the pack's rules look at: those whose TypedDict of contract/props.py the
# rules read the props through (`props_of(r, VllmServerProps)`)
RULES = "".join(f.read_text() for f in
                (Path(__file__).resolve().parents[3] / "policies" / "rules").glob("*.py"))
JUDGED = {t for t, props in PROPS.items() if re.search(rf"\b{props.__name__}\b", RULES)}


@pytest.fixture
def recorded(monkeypatch):
    made: dict[str, tuple[str, dict[str, Any]]] = {}
    outputs: dict[str, dict[str, Any]] = {}
    init, register = pulumi.ComponentResource.__init__, pulumi.ComponentResource.register_outputs

    def _init(self, t, name, props=None, opts=None, remote=False):  # type: ignore[no-untyped-def]
        made[name] = (t, dict(props or {}))
        init(self, t, name, props, opts, remote)

    def _register(self, outs):  # type: ignore[no-untyped-def]
        outputs[self._name] = dict(outs or {})
        register(self, outs)

    monkeypatch.setattr(pulumi.ComponentResource, "__init__", _init)
    monkeypatch.setattr(pulumi.ComponentResource, "register_outputs", _register)
    return made, outputs


@pulumi.runtime.test
def test_every_judged_components_props_are_among_its_outputs(build, recorded):
    made, outputs = recorded
    h = build(2, monitoring={"enabled": True})

    def check(_):
        judged = {n: (t, p) for n, (t, p) in made.items() if t in JUDGED and p}
        assert {t for t, _ in judged.values()} >= {
            "spark-vllm:firewall:NodeFirewall", "spark-vllm:collective:CollectiveGate",
            "spark-vllm:vllm_server:VllmServer", "spark-vllm:gateway:Gateway"}, judged
        missing = {f"{t} {name}": sorted(set(props) - set(outputs.get(name, {})))
                   for name, (t, props) in judged.items()}
        assert not {k: v for k, v in missing.items() if v}, missing
        return judged

    return settled(h).apply(check)
