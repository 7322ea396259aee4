"""4. nccl-rdma-interfaces and 5. fabric-mtu, both on the NcclEnvironment component: with RDMA on,
NCCL's HCA and socket interface lists name the carrier-up fabric; fabric interfaces run jumbo MTU.

NCCL's list syntax (`=` exact names, `^` exclusion, `name:port`) is NCCL's own, see
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html (NCCL_SOCKET_IFNAME,
NCCL_IB_HCA).
"""
from __future__ import annotations

from typing import Literal

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from contract.props import NcclEnvironmentProps, NcclFabricProps, NcclNodeProps

from ._common import (
    NCCL_ENV,
    Json,
    Report,
    conf,
    each,
    flag,
    get,
    is_unknown,
    num,
    props_as,
    props_of,
    text,
)
from ._schema import schema

SOCKET_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _name_list(value: str) -> tuple[list[str], bool, bool]:
    """NCCL interface/HCA list syntax: `=` exact, `^` exclude, `name:port`."""
    exact = value.startswith("=")
    value = value.lstrip("=")
    exclude = value.startswith("^")
    value = value.lstrip("^")
    names = [n.strip().split(":")[0] for n in value.split(",") if n.strip()]
    return names, exact, exclude


def _covers(names: list[str], exact: bool, target: str) -> bool:
    return any(target == n if exact else target.startswith(n) for n in names)


def _hca_active(state: str) -> bool:
    """ibdev2netdev says Up/Down; sysfs says '4: ACTIVE' / 'PORT_ACTIVE' / DOWN."""
    state = state.strip().upper()
    return state == "UP" or ("ACTIVE" in state and "INACTIVE" not in state)


def _known_texts(interfaces: list[NcclFabricProps], key: Literal["interface", "hca"]) -> list[str]:
    """The non-empty `key` (interface, hca) of each fabric interface, in order."""
    return [v for v in (text(f[key]) for f in interfaces) if v]


def _hca_findings(name: str, env: Json, up_hcas: list[str]) -> list[str]:
    """NCCL_IB_HCA must list every carrier-up HCA (unknown: skipped)."""
    raw = get(env, "NCCL_IB_HCA")
    if is_unknown(raw):
        return []
    hca_value = text(raw)
    if not hca_value:
        return [f"node {name}: NCCL_IB_HCA is not set; it must list the carrier-up HCAs "
                f"{', '.join(up_hcas)}"]
    names, exact, exclude = _name_list(hca_value)
    if exclude:
        return [f"node {name}: NCCL_IB_HCA={hca_value} is an exclusion list; list the "
                f"carrier-up HCAs {', '.join(up_hcas)} explicitly"]
    missing = [h for h in up_hcas if not _covers(names, exact, h)]
    if missing:
        return [f"node {name}: NCCL_IB_HCA={hca_value} does not cover carrier-up "
                f"HCA(s) {', '.join(missing)}"]
    return []


def _hca_state_findings(name: str, up: list[NcclFabricProps]) -> list[str]:
    """The HCA behind each carrier-up interface must be ACTIVE."""
    out: list[str] = []
    for f in up:
        state = text(f["hcaState"])
        if state and not _hca_active(state):
            out.append(f"node {name}: HCA {text(f['hca'])} of carrier-up interface "
                       f"{text(f['interface'])} is {state}, not ACTIVE")
    return out


def _socket_finding(name: str, var: str, raw: Json, up_ifaces: list[str]) -> str | None:
    """`var` (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) must name carrier-up fabric interfaces."""
    if is_unknown(raw):
        return None
    value = text(raw)
    if not value:
        return (f"node {name}: {var} is not set; it must name a fabric interface "
                f"({', '.join(up_ifaces)}), or the bootstrap picks the management network")
    names, exact, exclude = _name_list(value)
    if exclude:
        return (f"node {name}: {var}={value} is an exclusion list; name the fabric "
                f"interface ({', '.join(up_ifaces)})")
    bad = [n for n in names if not any(i == n or (not exact and i.startswith(n))
                                       for i in up_ifaces)]
    if bad:
        return (f"node {name}: {var}={value} names {', '.join(bad)}, not a carrier-up "
                f"fabric interface ({', '.join(up_ifaces)})")
    return None


def _node_nccl_findings(node: NcclNodeProps) -> list[str]:
    name = text(node["name"]) or "?"
    env = node.get("env", {})
    fabric = each(node["fabric"])
    if is_unknown(env) or any(is_unknown(f) for f in fabric):
        return []
    up = [f for f in fabric if flag(f["carrier"]) is True]
    if not fabric:
        return []
    if not up:
        return [f"node {name}: RDMA is on but no fabric interface has carrier"]
    up_ifaces = _known_texts(up, "interface")
    out = _hca_findings(name, env, _known_texts(up, "hca"))
    out += _hca_state_findings(name, up)
    for var in SOCKET_VARS:
        msg = _socket_finding(name, var, get(env, var), up_ifaces)
        if msg:
            out.append(msg)
    return out


def nccl_findings(props: Json) -> list[str]:
    p = props_as(props, NcclEnvironmentProps)
    if flag(p["rdma"]) is not True:
        return []  # RDMA off (the lab) or unknown
    out: list[str] = []
    for node in each(p["nodes"]):
        out.extend(_node_nccl_findings(node))
    return out


def validate_nccl(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type == NCCL_ENV:
        for msg in nccl_findings(args.props):
            report(msg, None)


def _mtu_findings(node: NcclNodeProps, min_mtu: float, include_down: bool) -> list[str]:
    name = text(node["name"]) or "?"
    out: list[str] = []
    for f in each(node["fabric"]):
        carrier = flag(f["carrier"])
        if carrier is not True and not (include_down and carrier is False):
            continue
        mtu = num(f["mtu"])
        if mtu is not None and mtu < min_mtu:
            out.append(f"node {name}: fabric interface {text(f['interface']) or '?'} has MTU "
                       f"{mtu:g}, below the required {min_mtu:g}")
    return out


def validate_mtu(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != NCCL_ENV:
        return
    min_mtu = num(conf(args, "minMtu")) or 9000
    include_down = bool(conf(args, "includeCarrierDown"))
    for node in each(props_of(args, NcclEnvironmentProps)["nodes"]):
        for msg in _mtu_findings(node, min_mtu, include_down):
            report(msg, None)


nccl_rdma_interfaces = ResourceValidationPolicy(
    name="nccl-rdma-interfaces",
    description="With RDMA on, NCCL_IB_HCA covers the carrier-up ConnectX-7 twins (HCAs ACTIVE) "
                "and NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name fabric interfaces.",
    validate=validate_nccl,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="List every carrier-up fabric HCA in NCCL_IB_HCA (e.g. "
                      "=rocep1s0f1,roceP2p1s0f1), set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to "
                      "the fabric interface, cable the port or fix the RoCE link state.",
)

fabric_mtu = ResourceValidationPolicy(
    name="fabric-mtu",
    description="Fabric interfaces (carrier up) run at least the configured MTU (9000).",
    validate=validate_mtu,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set MTU 9000 on the fabric interfaces (netplan/nmcli, persistently) on "
                      "every node and on the switch if there is one.",
    config_schema=schema(
        minMtu={"type": "integer", "minimum": 576, "default": 9000},
        includeCarrierDown={"type": "boolean", "default": False,
                            "description": "also check fabric interfaces without carrier"},
    ),
)
