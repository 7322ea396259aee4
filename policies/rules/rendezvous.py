"""13. mp-rendezvous-fabric-only: vLLM's own multi-node executor meets its ranks on the fabric
only (issue 31).

With `vllm.executor: mp` on more than one node the ranks meet at the head's `--master-addr`
`--master-port`, where torch.distributed's TCPStore listens. vLLM 0.32 passes
`tcp://<addr>:<port>` to `init_process_group`, and the store's server binds the port on every
address (`::` or `0.0.0.0`: torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp), with no
authentication. `--master-addr` binds nothing, so the stack keeps the port on the fabric with a
firewall rule on the head (hostscripts/firewall.py), which the VllmServer component reports as
its `masterGuard` prop ({port, sources[{interface, subnet}]}) beside `masterAddr` and
`masterPort`.

The rule: with executor mp on two or more nodes, `masterAddr` is a fabric address, a
`masterGuard` exists for `masterPort` and lets in only fabric subnets; and every container
whose command carries `--master-addr` names a fabric address. The fabric is the pack config's
`fabricSubnets`, else the stack config's `nccl.fabricSubnets` (as ray-not-exposed). Unknown
values (preview) are skipped.
"""
from __future__ import annotations

import ipaddress

from pulumi_policy import EnforcementLevel, StackValidationArgs, StackValidationPolicy

from ._common import CONTAINER, UNKNOWN, VLLM_SERVER, Props, Report, elements, get, num, text
from ._containers import command_tokens, flag_value
from ._schema import schema
from .ray_exposure import IPNetwork, _fabric_subnets, _in_subnets, parse_ip

_WHY = "torch's TCPStore binds 0.0.0.0 and ::, unauthenticated"


def _show(value: object) -> str:
    n = num(value)
    return str(int(n)) if n is not None else str(text(value))


def _on_fabric(addr: str, subnets: list[IPNetwork]) -> bool:
    ip = parse_ip(addr)
    return ip is not None and not ip.is_loopback and not ip.is_unspecified \
        and _in_subnets(ip, subnets)


def _subnet_inside(subnet: str, fabric: list[IPNetwork]) -> bool:
    try:
        net = ipaddress.ip_network(subnet, strict=False)
    except (TypeError, ValueError):
        return False
    return any(net.version == f.version and net.subnet_of(f) for f in fabric)  # type: ignore[arg-type]


def server_findings(name: str, props: Props, fabric: list[IPNetwork]) -> list[str]:
    """The VllmServer's rendezvous: on a fabric address, guarded to the fabric."""
    if get(props, "executor") != "mp":
        return []
    nodes = get(props, "nodes")
    if nodes is UNKNOWN or len(elements(nodes)) < 2:
        return []
    out: list[str] = []
    port = get(props, "masterPort")
    addr = get(props, "masterAddr")
    if addr is not UNKNOWN and fabric and not _on_fabric(text(addr) or "", fabric):
        out.append(f"{name}: masterAddr {text(addr)} is not a fabric address; the ranks must "
                   "meet on the fabric")
    guard = get(props, "masterGuard")
    if guard is UNKNOWN or port is UNKNOWN:
        return out
    if guard is None:
        out.append(f"{name}: vllm.executor mp listens for its ranks on port {_show(port)} of every "
                   f"address ({_WHY}) with no firewall rule keeping it on the fabric "
                   "(masterGuard)")
        return out
    guarded = get(guard, "port")
    if guarded is not UNKNOWN and num(guarded) != num(port):
        out.append(f"{name}: the firewall rule (masterGuard) guards port {_show(guarded)}, not the "
                   f"master port {_show(port)}; the rendezvous answers on every address ({_WHY})")
    sources = get(guard, "sources")
    if sources is UNKNOWN:
        return out
    if not elements(sources):
        out.append(f"{name}: the firewall rule (masterGuard) lets no fabric interface in; the "
                   "other ranks cannot reach the rendezvous")
    for s in elements(sources):
        subnet, iface = get(s, "subnet"), get(s, "interface")
        if subnet is UNKNOWN or not fabric:
            continue
        if not _subnet_inside(text(subnet) or "", fabric):
            out.append(f"{name}: the firewall rule (masterGuard) lets {text(subnet)} "
                       f"({text(iface)}) in, outside the fabric subnets")
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
    for r in args.resources:
        if r.resource_type == VLLM_SERVER:
            msgs = server_findings(r.name, r.props, fabric)
        elif r.resource_type == CONTAINER:
            msgs = container_findings(r.name, r.props, fabric)
        else:
            continue
        for msg in msgs:
            report(msg, r.urn)


mp_rendezvous_fabric_only = StackValidationPolicy(
    name="mp-rendezvous-fabric-only",
    description="With vllm.executor mp on more than one node, the ranks meet on a fabric "
                "address and a firewall rule on the head keeps the master port to the fabric: "
                "torch's TCPStore listens on every address without authentication.",
    validate=validate_mp_rendezvous,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Let the program set --master-addr (the head's fabric address) and its "
                      "master-port guard (hostscripts/firewall.py); on the head, "
                      "`iptables -S INPUT` shows the jump for the master port, or run `up` "
                      "again after a reboot.",
    config_schema=schema(
        fabricSubnets={"type": "array", "items": {"type": "string"}, "default": [],
                       "description": "CIDRs of the fabric; default: stack config "
                                      "nccl.fabricSubnets"},
    ),
)
