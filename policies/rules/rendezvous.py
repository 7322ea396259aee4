"""13. mp-rendezvous-fabric-only: vLLM's own multi-node executor meets its ranks on the fabric
only (issue 31).

With `vllm.executor: mp` on more than one node the ranks meet at the head's `--master-addr`
`--master-port`, where torch.distributed's TCPStore listens. vLLM 0.32 passes
`tcp://<addr>:<port>` to `init_process_group`, and the store's server binds the port on every
address (`::` or `0.0.0.0`: torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp), with no
authentication. `--master-addr` binds nothing, so the stack keeps the port on the fabric with
its firewall (issue 45: the head's NodeFirewall, rules/_firewall.py), the VllmServer naming
`masterAddr` and `masterPort`.

The rule: with executor mp on two or more nodes, `masterAddr` is a fabric address, the head
(the VllmServer's first node) has a NodeFirewall whatever the environment, and a rule of it
filters `masterPort` admitting the stack's fabric addresses only (the NcclEnvironment's, else
those inside the fabric subnets); and every container whose command carries `--master-addr`
names a fabric address. The fabric is the pack config's `fabricSubnets`, else the stack
config's `nccl.fabricSubnets` (as ray-not-exposed). Unknown values (preview) are skipped.
"""
from __future__ import annotations

from collections.abc import Mapping

from pulumi_policy import EnforcementLevel, StackValidationArgs, StackValidationPolicy

from contract.props import VllmServerProps

from ._common import (
    CONTAINER,
    VLLM_SERVER,
    Json,
    Props,
    Report,
    each,
    is_unknown,
    num,
    props_as,
    text,
)
from ._containers import command_tokens, flag_value
from ._firewall import Table, exposure, tables
from ._schema import FABRIC_SUBNETS_PROP, schema
from .ray_exposure import IPNetwork, _fabric_ips, _fabric_subnets, _in_subnets, parse_ip

_WHY = "torch's TCPStore binds 0.0.0.0 and ::, unauthenticated"


def _on_fabric(addr: str, subnets: list[IPNetwork]) -> bool:
    ip = parse_ip(addr)
    return ip is not None and not ip.is_loopback and not ip.is_unspecified \
        and _in_subnets(ip, subnets)


def server_findings(name: str, props: Json, fabric: list[IPNetwork],
                    found: Mapping[str, Table | None] | None = None,
                    fabric_ips: set[str] | None = None) -> list[str]:
    """The VllmServer's rendezvous: on a fabric address, and the head's firewall admitting the
    master port from the stack's fabric addresses only (`found`: the NodeFirewalls by node)."""
    p = props_as(props, VllmServerProps)
    if p["executor"] != "mp":
        return []
    nodes = p["nodes"]
    if is_unknown(nodes) or len(each(nodes)) < 2:
        return []
    out: list[str] = []
    port = p["masterPort"]
    addr = p["masterAddr"]
    if not is_unknown(addr) and fabric and not _on_fabric(text(addr) or "", fabric):
        out.append(f"{name}: masterAddr {text(addr)} is not a fabric address; the ranks must "
                   "meet on the fabric")
    head = text(each(nodes)[0]["name"])
    if is_unknown(port) or num(port) is None or head is None:
        return out
    allowed: set[str] | list[str] = fabric_ips or set()
    if not allowed and fabric:  # no NcclEnvironment: what the firewall admits must be inside
        allowed = [a for t in (found or {}).values() if t is not None
                   for _, _, sources in (t.rules or ()) for a in sources
                   if _on_fabric(a, fabric)]
    why = exposure(found or {}, head, int(num(port) or 0), frozenset(allowed),
                   f"{name}: vllm.executor mp's rendezvous ({_WHY})")
    if why:
        out.append(why)
    return out


def container_findings(name: str, props: Props, fabric: list[IPNetwork]) -> list[str]:
    """A container of an mp rank: `--master-addr` is a fabric address."""
    tokens = command_tokens(props)
    addr = flag_value(tokens, "--master-addr")
    if addr is None or not fabric or _on_fabric(addr, fabric) or addr.startswith("$"):
        return []
    return [f"container {name}: --master-addr {addr} is not a fabric address (the other ranks "
            "would reach the rendezvous over another network)"]


def validate_mp_rendezvous(args: StackValidationArgs, report: Report) -> None:
    fabric = _fabric_subnets(args)
    found = tables(args.resources)
    fabric_ips = _fabric_ips(args.resources)
    for r in args.resources:
        if r.resource_type == VLLM_SERVER:
            msgs = server_findings(r.name, r.props, fabric, found, fabric_ips)
        elif r.resource_type == CONTAINER:
            msgs = container_findings(r.name, r.props, fabric)
        else:
            continue
        for msg in msgs:
            report(msg, r.urn)


mp_rendezvous_fabric_only = StackValidationPolicy(
    name="mp-rendezvous-fabric-only",
    description="With vllm.executor mp on more than one node, the ranks meet on a fabric "
                "address and the head's firewall keeps the master port to the fabric: "
                "torch's TCPStore listens on every address without authentication.",
    validate=validate_mp_rendezvous,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Let the program set --master-addr (the head's fabric address) and keep "
                      "spark-vllm:firewall.enabled true; on the head, `nft list table inet "
                      "spark-vllm-<stack>` shows the rule vllm-rendezvous.",
    config_schema=schema(
        fabricSubnets=FABRIC_SUBNETS_PROP,
    ),
)
