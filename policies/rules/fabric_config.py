"""15. fabric-config and 16. fabric-addresses-unique, on the NodeFabric components: the fabric the
stack configures itself (`fabric.manage`, components/fabric.py) is one the nodes can run.

A NodeFabric (`spark-vllm:fabric:NodeFabric`, one per node) carries the node's name, its
management `host` (an IPv4 address or a DNS name), the `managementInterface` recon saw carrying
that address (null when none), the `mtu` the stack sets and its `interfaces`: each with its
`interface` name, its `address` in CIDR notation and its netplan `file`.

* fabric-config (per node): the MTU is at least the pack config's `minMtu`; the node's
  interfaces (the ConnectX-7 twins) sit in IPv4 networks of their own; none of them is the
  management interface, and the management address is in none of their networks (configuring the
  fabric would take the management route); every address is IPv4 CIDR.
* fabric-addresses-unique (the stack): no IPv4 address (whatever its prefix) is on two
  interfaces, of two nodes or of one.

The program's own validation (config/validate.py) and preflight refuse most of these before any
resource exists; the pack judges what really reaches the engine (a hand-made stack, an older
program, a recon that changed its mind). Unknown values (preview) are not judged: each check
skips what it cannot know, and the others still run.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from contract import types
from contract.props import FabricInterfaceProps, NodeFabricProps

from ._common import (
    Finding,
    Json,
    Report,
    conf,
    each,
    is_unknown,
    num,
    props_as,
    props_of,
    text,
)
from ._schema import schema

NODE_FABRIC: Final = types.NODE_FABRIC


@dataclass(frozen=True)
class FabricAddress:
    """One fabric interface of a node with its known, valid address."""

    name: str  # "?" when unknown
    address: str  # as the props give it
    iface: ipaddress.IPv4Interface


def parse_cidr(value: str) -> ipaddress.IPv4Interface | None:
    """`a.b.c.d/prefix` (a prefix length, not a netmask), else None."""
    address, slash, prefix = value.strip().partition("/")
    if not slash or not (prefix.isascii() and prefix.isdigit()):
        return None
    try:
        return ipaddress.IPv4Interface(f"{address}/{int(prefix)}")
    except ValueError:
        return None


def _iface_name(entry: FabricInterfaceProps) -> str:
    return text(entry["interface"]) or "?"


def _addresses(props: NodeFabricProps) -> tuple[list[FabricAddress], list[str]]:
    """The interfaces with a known valid address; (e) the messages of those not IPv4 CIDR."""
    node = text(props["node"]) or "?"
    valid: list[FabricAddress] = []
    invalid: list[str] = []
    for entry in each(props["interfaces"]):
        if is_unknown(entry):
            continue
        raw = entry["address"]
        if is_unknown(raw):
            continue
        name = _iface_name(entry)
        value = text(raw)
        iface = parse_cidr(value) if value else None
        if iface is None:
            shown = "no address" if raw is None or value == "" else f"address {raw!r}"
            invalid.append(f"node {node}: fabric interface {name} has {shown}, not an IPv4 "
                           "address in CIDR notation (a.b.c.d/prefix)")
        else:
            valid.append(FabricAddress(name, value or "", iface))
    return valid, invalid


def _mtu_findings(props: NodeFabricProps, min_mtu: float) -> list[str]:
    """(a) the MTU the stack sets on the node's fabric interfaces, at least `min_mtu`."""
    node = text(props["node"]) or "?"
    mtu = num(props["mtu"])
    if mtu is None or mtu >= min_mtu:
        return []
    names = [_iface_name(e) for e in each(props["interfaces"])]
    if not names:
        return [f"node {node}: the stack sets MTU {mtu:g} on its fabric interfaces, below the "
                f"required {min_mtu:g} (minMtu)"]
    return [f"node {node}: fabric interface {name} is set to MTU {mtu:g}, below the required "
            f"{min_mtu:g} (minMtu)" for name in names]


def _twin_findings(node: str, valid: Sequence[FabricAddress]) -> list[str]:
    """(b) each interface of a node in an IPv4 network of its own."""
    out: list[str] = []
    for i, a in enumerate(valid):
        for b in valid[i + 1:]:
            na, nb = a.iface.network, b.iface.network
            if not na.overlaps(nb):
                continue
            where = (f"the same IPv4 network {na}" if na == nb
                     else f"overlapping IPv4 networks {na} and {nb}")
            out.append(f"node {node}: fabric interfaces {a.name} ({a.address}) and {b.name} "
                       f"({b.address}) are in {where}; each twin needs a subnet of its own (two "
                       "interfaces in one subnet make the kernel's route between them a guess)")
    return out


def _management_findings(props: NodeFabricProps, node: str,
                         valid: Sequence[FabricAddress]) -> list[str]:
    """(c) the management interface is no fabric interface; (d) the management address is in
    no fabric interface's network."""
    out: list[str] = []
    host = text(props["host"])
    mgmt = text(props["managementInterface"])
    if mgmt:
        for entry in each(props["interfaces"]):
            name = text(entry["interface"])
            if name == mgmt:
                carries = f" {host}" if host else ""
                out.append(f"node {node}: fabric interface {name} is the management interface "
                           f"(it carries the management address{carries}, the one ssh uses); "
                           "configuring it as fabric would cut the connection the stack "
                           "arrives on")
    try:
        address = ipaddress.IPv4Address(host) if host else None
    except ValueError:  # a DNS name (or IPv6): nothing to compare
        address = None
    if address is not None:
        for f in valid:
            if address in f.iface.network:
                out.append(f"node {node}: the management address {host} is inside "
                           f"{f.iface.network}, the network of fabric interface {f.name} "
                           f"({f.address}); the fabric's configuration would take the "
                           "management route")
    return out


def fabric_config_findings(raw: Json, min_mtu: float) -> list[str]:
    """Every finding of fabric-config for one NodeFabric's props."""
    props = props_as(raw, NodeFabricProps)
    node = text(props["node"]) or "?"
    valid, invalid = _addresses(props)
    out = _mtu_findings(props, min_mtu)
    out += _twin_findings(node, valid)
    out += _management_findings(props, node, valid)
    out += invalid
    return out


def validate_fabric_config(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != NODE_FABRIC:
        return
    min_mtu = num(conf(args, "minMtu")) or 9000
    for msg in fabric_config_findings(args.props, min_mtu):
        report(msg, None)


@dataclass(frozen=True)
class _Seen:
    node: str
    interface: str
    urn: str


def fabric_address_findings(resources: Sequence[PolicyResource]) -> list[Finding]:
    """(16) an IPv4 address (prefix ignored) on two fabric interfaces, of two nodes or of one;
    unknown and invalid addresses are skipped (fabric-config reports the invalid ones)."""
    seen: dict[ipaddress.IPv4Address, _Seen] = {}
    out: list[Finding] = []
    for r in resources:
        if r.resource_type != NODE_FABRIC:
            continue
        props = props_of(r, NodeFabricProps)
        node = text(props["node"]) or r.name
        for entry in each(props["interfaces"]):
            value = text(entry["address"])
            if not value:
                continue
            try:
                address = ipaddress.IPv4Address(value.split("/", 1)[0].strip())
            except ValueError:
                continue
            name = _iface_name(entry)
            first = seen.get(address)
            if first is None:
                seen[address] = _Seen(node, name, r.urn)
            elif first.urn == r.urn:
                out.append((f"node {node}: fabric address {address} is on two of its "
                            f"interfaces, {first.interface} and {name}; each fabric interface "
                            "needs an address of its own", r.urn))
            else:
                out.append((f"fabric address {address} is on two nodes: node {first.node} "
                            f"interface {first.interface} and node {node} interface {name}; each "
                            "fabric interface needs an address of its own", r.urn))
    return out


def validate_fabric_addresses_unique(args: StackValidationArgs, report: Report) -> None:
    for msg, urn in fabric_address_findings(args.resources):
        report(msg, urn)


fabric_config = ResourceValidationPolicy(
    name="fabric-config",
    description="The fabric the stack configures on a node (NodeFabric) is sound: MTU at least "
                "the configured minimum (9000), the ConnectX-7 twins in IPv4 subnets of their "
                "own, the management interface and address outside the fabric, every address "
                "IPv4 CIDR.",
    validate=validate_fabric_config,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set spark-vllm:fabric.mtu to 9000 (or lower the pack's minMtu for a lab "
                      "link); give each fabric interface of a node an address in its own "
                      "spark-vllm:nccl.fabricSubnets entry (nodes[].fabric[].ip); name only the "
                      "ConnectX-7 interfaces in nodes[].fabric[] (ibdev2netdev lists them), never "
                      "the one carrying nodes[].host, and keep the management network outside "
                      "the fabric subnets.",
    config_schema=schema(
        minMtu={"type": "integer", "minimum": 576, "default": 9000,
                "description": "the lowest MTU the stack may set on the fabric (fabric.mtu)"},
    ),
)

fabric_addresses_unique = StackValidationPolicy(
    name="fabric-addresses-unique",
    description="No fabric IPv4 address the stack configures (NodeFabric) is on two interfaces, "
                "of two nodes or of one.",
    validate=validate_fabric_addresses_unique,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Give every entry of spark-vllm:nodes[].fabric[].ip an address of its own "
                      "across all nodes (e.g. 192.168.177.11 / 192.168.178.11 on spark-1, "
                      "192.168.177.12 / 192.168.178.12 on spark-2).",
)
