"""The planned firewall, as the rules that judge an exposure read it (issue 45).

A NodeFirewall (`spark-vllm:firewall:NodeFirewall`, components/firewall.py, one per node with
`firewall.enabled`) carries `node, host, managementInterface, table, unit, sshPort, public
[ports every address reaches], rules [{what, ports [[first, last]], sources [addresses]}]` (the
stack's ports on the node and who besides the node's loopback reaches them) and `dataPlane
{ports [first, last], sources}` (the kernel's ephemeral range, on every address).

`exposure(tables, node, port, allowed, what)` is what every rule asks of one port the stack
opens: is it filtered on that node, from at most `allowed` (None: loopback only)? It says why
not, or nothing. The rules call it for what they own: ray-not-exposed for Ray's ports,
mp-rendezvous-fabric-only for the master port, vllm-behind-gateway for every vLLM's, the
gateway's and the public ports, monitoring-not-exposed for Prometheus's and the exporters';
stack-ports-firewalled (rules/firewall.py) for the tables themselves. Unknown values (preview)
are not judged.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from pulumi_policy import PolicyResource

from contract import types
from contract.props import NodeFirewallProps

from ._common import Json, each, elements, get, is_unknown, num, props_of, text

FIREWALL: Final = types.NODE_FIREWALL

Span = tuple[int, int]


@dataclass(frozen=True)
class Table:
    """One node's planned table, as far as it is known."""

    node: str
    urn: str
    public: frozenset[int] | None  # None: unknown
    rules: tuple[tuple[str, tuple[Span, ...], frozenset[str]], ...] | None  # None: unknown

    def rule_for(self, port: int) -> tuple[str, frozenset[str]] | None:
        """(what, sources) of the rule that filters `port`; None: no rule names it."""
        for what, spans, sources in self.rules or ():
            if any(lo <= port <= hi for lo, hi in spans):
                return what, sources
        return None


def _spans(value: Json) -> tuple[Span, ...] | None:
    out = []
    for p in elements(value):
        lo, hi = num(get(p, 0)), num(get(p, 1))
        if lo is None or hi is None:
            return None
        out.append((int(lo), int(hi)))
    return tuple(out)


def tables(resources: Iterable[PolicyResource]) -> dict[str, Table | None]:
    """Every NodeFirewall by node name; None for one whose node is unknown."""
    out: dict[str, Table | None] = {}
    for r in resources:
        if r.resource_type != FIREWALL:
            continue
        props = props_of(r, NodeFirewallProps)
        node = text(props["node"])
        if node is None:
            continue
        public_raw = props["public"]
        public = None if is_unknown(public_raw) else frozenset(
            int(n) for n in (num(p) for p in elements(public_raw)) if n is not None)
        rules_raw = props["rules"]
        rules: list[tuple[str, tuple[Span, ...], frozenset[str]]] | None = []
        if is_unknown(rules_raw):
            rules = None
        else:
            for rule in each(rules_raw):
                spans = _spans(rule["ports"])
                sources = rule["sources"]
                if spans is None or is_unknown(sources) or is_unknown(rule):
                    rules = None
                    break
                assert rules is not None
                rules.append((text(rule["what"]) or "?", spans,
                              frozenset(s for s in (text(x) for x in elements(sources)) if s)))
        out[node] = Table(node, r.urn, public, None if rules is None else tuple(rules))
    return out


def any_firewall(resources: Iterable[PolicyResource]) -> bool:
    return any(r.resource_type == FIREWALL for r in resources)


def exposure(found: Mapping[str, Table | None], node: str, port: int,
             allowed: Collection[str] | None, what: str,
             fabric_is: str = "the stack's fabric addresses") -> str | None:
    """Why `what` (port `port` on `node`) is not kept to `allowed` (None: the node's loopback
    only) by the node's planned table; None when it is, or when that cannot be known."""
    table = found.get(node)
    if node not in found:
        return (f"{what} listens on port {port} of {node}, which has no firewall "
                "(NodeFirewall): every address reaches it")
    if table is None or table.rules is None:
        return None
    if table.public is not None and port in table.public:
        return (f"{what}: port {port} of {node} is a public port of its firewall, admitted "
                "from every address")
    rule = table.rule_for(port)
    if rule is None:
        return f"{what}: no rule of {node}'s firewall names port {port}: every address reaches it"
    name, sources = rule
    extra = sorted(sources - frozenset(allowed or ()))
    if extra:
        who = fabric_is if allowed else "its loopback only"
        return (f"{what}: {node}'s firewall rule {name} admits {', '.join(extra)} to port "
                f"{port}, beyond {who}")
    return None
