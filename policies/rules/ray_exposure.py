"""7. ray-not-exposed: Ray's GCS, client and dashboard ports stay off the management and public
networks.

Judged from the `ray start` flags (host networking makes `ports` moot): `--node-ip-address` must be
a fabric address, the head's dashboard off or on 127.0.0.1/fabric (Ray's default
`--dashboard-host` is 127.0.0.1, see https://docs.ray.io/en/latest/cluster/cli.html#ray-start),
published Ray ports only on loopback/fabric. A flag holding a shell variable (`$FABRIC_IP`) cannot
be judged and is skipped (policies/README.md "Ray exposure").
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    StackValidationArgs,
    StackValidationPolicy,
)

from ._common import (
    CONTAINER,
    DEFAULTS,
    NCCL_ENV,
    SPARK_NODE,
    ConfigSource,
    Json,
    Props,
    Report,
    conf,
    elements,
    get,
    num,
    stack_config,
    text,
)
from ._containers import command_tokens, flag_value, is_ray_container, provider_host
from ._schema import schema

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

RAY_PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port")


def parse_ip(value: str | None) -> IPAddress | None:
    if not value:
        return None
    try:
        return ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return None


def _fabric_subnets(args: ConfigSource) -> list[IPNetwork]:
    """Pack config `fabricSubnets`, else the stack config `nccl.fabricSubnets`."""
    subnets = conf(args, "fabricSubnets") or []
    if not subnets:
        nccl = stack_config("nccl")
        if isinstance(nccl, Mapping):
            subnets = nccl.get("fabricSubnets") or []
    out: list[IPNetwork] = []
    for s in subnets:
        try:
            out.append(ipaddress.ip_network(s, strict=False))
        except (TypeError, ValueError):
            continue
    return out


def _in_subnets(ip: IPAddress, subnets: Sequence[IPNetwork]) -> bool:
    return any(ip in n for n in subnets if n.version == ip.version)


def _listen_ok(ip: IPAddress, management: set[str], subnets: Sequence[IPNetwork],
               node_ip: IPAddress | None, fabric_ips: set[str] | None = None) -> bool:
    """A listen address that stays off the management and public networks."""
    if ip.is_loopback:
        return True
    if ip.is_unspecified or str(ip) in management:
        return False
    if fabric_ips and str(ip) in fabric_ips:
        return True
    if subnets:
        return _in_subnets(ip, subnets)
    return ip == node_ip and ip.is_private


@dataclass(frozen=True)
class _Container:
    """One Ray container and what its addresses are judged against."""

    name: str
    tokens: list[str]
    management: set[str]
    subnets: Sequence[IPNetwork]
    fabric_ips: set[str] | None
    node_ip_raw: str | None
    node_ip: IPAddress | None

    def listen_ok(self, ip: IPAddress) -> bool:
        return _listen_ok(ip, self.management, self.subnets, self.node_ip, self.fabric_ips)


def _node_ip_finding(c: _Container) -> str | None:
    """`--node-ip-address`: where Ray binds its GCS/object manager and what it advertises."""
    raw, ip = c.node_ip_raw, c.node_ip
    if raw is None:
        if not c.tokens:
            return None
        return (f"container {c.name}: `ray start` has no --node-ip-address; Ray then binds and "
                f"advertises the default-route (management) address")
    if ip is None:
        return None  # a shell variable cannot be judged here
    if ip.is_unspecified:
        return (f"container {c.name}: --node-ip-address {raw} binds Ray's GCS/object "
                f"manager on every interface; use the node's fabric address")
    if str(ip) in c.management:
        return (f"container {c.name}: --node-ip-address {raw} is the management "
                f"address; use the node's fabric address")
    if c.fabric_ips and str(ip) not in c.fabric_ips:
        return (f"container {c.name}: --node-ip-address {raw} is not a fabric address "
                f"of the stack ({', '.join(sorted(c.fabric_ips))})")
    if c.subnets and not _in_subnets(ip, c.subnets):
        return (f"container {c.name}: --node-ip-address {raw} is outside the fabric "
                f"subnets {', '.join(map(str, c.subnets))}")
    if not ip.is_private:
        return f"container {c.name}: --node-ip-address {raw} is a public address"
    return None


def _dashboard_finding(c: _Container) -> str | None:
    """The head's dashboard: off, or on loopback/fabric."""
    if "--head" not in c.tokens:
        return None
    include = (flag_value(c.tokens, "--include-dashboard") or "").lower()
    if include in ("false", "0", "no"):
        return None
    host_raw = flag_value(c.tokens, "--dashboard-host") or "127.0.0.1"  # Ray's default
    host = parse_ip("127.0.0.1" if host_raw == "localhost" else host_raw)
    if host is None or c.listen_ok(host):
        return None
    return (f"container {c.name}: the Ray dashboard listens on --dashboard-host "
            f"{host_raw}; disable it (--include-dashboard=false) or bind 127.0.0.1 "
            f"or the fabric address")


def _published_port_findings(c: _Container, props: Props, ray_ports: set[int]) -> list[str]:
    """Without host networking: Ray ports published only on loopback/fabric."""
    if text(get(props, "networkMode")) == "host":
        return []
    ports = set(ray_ports)
    for f in RAY_PORT_FLAGS:
        v = flag_value(c.tokens, f)
        if v and v.isdigit():
            ports.add(int(v))
    out: list[str] = []
    for p in elements(get(props, "ports")):
        internal = num(get(p, "internal"))
        if internal is None or int(internal) not in ports:
            continue
        ip_raw = text(get(p, "ip")) or "0.0.0.0"
        ip = parse_ip(ip_raw)
        if ip is not None and c.listen_ok(ip):
            continue
        external = num(get(p, "external"))
        out.append(f"container {c.name}: publishes Ray port {int(internal)} on {ip_raw}"
                   f"{':' + str(int(external)) if external else ''}")
    return out


def ray_exposure_findings(name: str, props: Props, management: set[str],
                          subnets: Sequence[IPNetwork], ray_ports: set[int],
                          fabric_ips: set[str] | None = None) -> list[str]:
    tokens = command_tokens(props)
    node_ip_raw = flag_value(tokens, "--node-ip-address")
    c = _Container(name, tokens, management, subnets, fabric_ips, node_ip_raw,
                   parse_ip(node_ip_raw))
    out = [msg for msg in (_node_ip_finding(c), _dashboard_finding(c)) if msg]
    return out + _published_port_findings(c, props, ray_ports)


def _management_hosts(resources: list[PolicyResource]) -> set[str]:
    """The SparkNode `host`s: the management addresses."""
    hosts = (text(get(r.props, "host")) for r in resources if r.resource_type == SPARK_NODE)
    return {h for h in hosts if h}


def _fabric_ips(resources: list[PolicyResource]) -> set[str]:
    """Every fabric interface address the NcclEnvironment reports."""
    ips: set[str] = set()
    for r in resources:
        if r.resource_type != NCCL_ENV:
            continue
        for node in elements(get(r.props, "nodes")):
            ips.update(_node_fabric_ips(node))
    return ips


def _node_fabric_ips(node: Json) -> list[str]:
    return [ip for ip in (text(get(f, "ip")) for f in elements(get(node, "fabric"))) if ip]


def validate_ray_not_exposed(args: StackValidationArgs, report: Report) -> None:
    management = _management_hosts(args.resources)
    fabric_ips = _fabric_ips(args.resources)
    subnets = _fabric_subnets(args)
    ray_ports = {int(p) for p in (conf(args, "rayPorts") or []) if num(p) is not None}
    for r in args.resources:
        if r.resource_type != CONTAINER or not is_ray_container(r.props):
            continue
        mgmt = set(management)
        ph = provider_host(r)
        if ph:
            mgmt.add(ph)
        for msg in ray_exposure_findings(r.name, r.props, mgmt, subnets, ray_ports, fabric_ips):
            report(msg, r.urn)


ray_not_exposed = StackValidationPolicy(
    name="ray-not-exposed",
    description="Ray's GCS, client and dashboard ports are not bound to management or public "
                "addresses: --node-ip-address is a fabric address, the dashboard is off or on "
                "127.0.0.1/fabric, no published Ray ports.",
    validate=validate_ray_not_exposed,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Start Ray with --node-ip-address=<fabric IP>, --include-dashboard=false (or "
                      "--dashboard-host=127.0.0.1), host networking and no `ports` for 6379/8265/"
                      "10001; reach the dashboard through an SSH tunnel.",
    config_schema=schema(
        fabricSubnets={"type": "array", "items": {"type": "string"}, "default": [],
                       "description": "CIDRs of the fabric; default: stack config "
                                      "nccl.fabricSubnets"},
        rayPorts={"type": "array", "items": {"type": "integer"}, "default": DEFAULTS["rayPorts"]},
    ),
)
