"""7. ray-not-exposed: what really protects Ray: token authentication, and a dashboard that
stays off the management and public networks.

`--node-ip-address` only sets the address Ray advertises: Ray's servers (GCS, raylet, object
manager, client server) listen on every interface whatever it says, so it is not judged. What
keeps strangers out is Ray's token authentication: every Ray container (`is_ray_container`) must
carry `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN_PATH=<file>` with that file mounted into the
container (a `mounts` entry, or a `volumes` entry, with that target), read-only, and must not
carry the token itself (`RAY_AUTH_TOKEN=<literal>`) in its env: envs are readable in
`docker inspect` and the state. Unknown envs or mounts (preview) are not judged.

With the stack's firewall (issue 45, rules/_firewall.py), every port a Ray container listens on
is pinned by its `ray start` flag (the node manager, object manager, runtime-env agent,
dashboard agent and metrics export ports and the workers' range: Ray picks them at random
otherwise) and filtered on its node (label `spark-vllm.node`) from the stack's fabric addresses
only: the GCS (`--port`), the client server, the dashboard and the autoscaler's and dashboard's
metrics servers (AUTOSCALER_METRIC_PORT, DASHBOARD_METRIC_PORT in its env) on the head, the
dashboard agent's HTTP port, each worker port.

The head's dashboard is off or bound to 127.0.0.1/a fabric address (Ray's default
`--dashboard-host` is 127.0.0.1, https://docs.ray.io/en/latest/cluster/cli.html#ray-start);
without host networking, published Ray ports only on loopback/fabric. A flag holding a shell
variable (`$FABRIC_IP`) cannot be judged and is skipped (policies/README.md "Ray exposure").
"""
from __future__ import annotations

import ipaddress
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    StackValidationArgs,
    StackValidationPolicy,
)

from contract import labels
from contract.props import NcclEnvironmentProps, NcclNodeProps, SparkNodeProps

from ._common import (
    CONTAINER,
    DEFAULTS,
    NCCL_ENV,
    SPARK_NODE,
    UNKNOWN,
    ConfigSource,
    Json,
    Props,
    Report,
    conf,
    each,
    elements,
    flag,
    get,
    num,
    props_of,
    stack_config,
    text,
)
from ._containers import (
    command_tokens,
    env_pairs,
    flag_value,
    is_literal,
    is_ray_container,
    labels_of,
    provider_host,
)
from ._firewall import Table, any_firewall, exposure, tables
from ._schema import FABRIC_SUBNETS_PROP, schema
from ._secrets import mask

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

RAY_PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port")

# Ray's listening ports by `ray start` flag (Ray 2.60): the ones Ray picks at random unless
# the flag pins them, and those with a fixed default (head only: the GCS, the client server)
RANDOM_PORT_FLAGS = ("--node-manager-port", "--object-manager-port", "--runtime-env-agent-port",
                     "--dashboard-agent-grpc-port", "--metrics-export-port")
DEFAULT_PORTS = {"--dashboard-agent-listen-port": 52365}
HEAD_DEFAULT_PORTS = {"--port": 6379, "--ray-client-server-port": 10001}
# and by environment variable (ray/autoscaler/_private/constants.py, ray/dashboard/consts.py)
HEAD_METRIC_PORTS = {"AUTOSCALER_METRIC_PORT": 44217, "DASHBOARD_METRIC_PORT": 44227}


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
    if fabric_ips:  # the stack's fabric addresses are known: nothing else is one
        return False
    # nothing known about the fabric: the address Ray advertises, if private, is the best guess
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


_OPEN = ("Ray's servers listen on every interface, so whoever reaches the node can join or drive "
         "the cluster")


def _mount_of(props: Props, target: str) -> Json:
    """The `mounts` (or `volumes`) entry whose target is `target`; UNKNOWN when that cannot be
    told (unknown list or entry), None when there is none."""
    want = posixpath.normpath(target)
    unknown = False
    for key, field in (("mounts", "target"), ("volumes", "containerPath")):
        raw = get(props, key)
        if raw is UNKNOWN:
            unknown = True
            continue
        for m in elements(raw):
            path = text(get(m, field))
            if m is UNKNOWN or get(m, field) is UNKNOWN:
                unknown = True
            elif path and posixpath.normpath(path) == want:
                return m
    return UNKNOWN if unknown else None


def auth_findings(name: str, props: Props) -> list[str]:
    """Ray token authentication of one Ray container (see the module docstring)."""
    pairs = env_pairs(props)
    if pairs is None:
        return []  # unknown during preview: nothing can be concluded from what is missing
    env = dict(pairs)
    out: list[str] = []
    mode = env.get("RAY_AUTH_MODE")
    if mode is None:
        out.append(f"container {name}: Ray runs without token authentication: RAY_AUTH_MODE is "
                   f"not set; {_OPEN}; set RAY_AUTH_MODE=token")
    elif mode.strip().lower() != "token":
        out.append(f"container {name}: Ray runs without token authentication: "
                   f"RAY_AUTH_MODE={mode}, not token; {_OPEN}")
    path = env.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if not path:
        out.append(f"container {name}: RAY_AUTH_TOKEN_PATH is not set: Ray's token must come "
                   f"from a file mounted read-only into the container")
    else:
        mount = _mount_of(props, path)
        if mount is None:
            out.append(f"container {name}: RAY_AUTH_TOKEN_PATH {path} is not mounted into the "
                       f"container (no mount with target {path}): Ray cannot read its token")
        elif mount is not UNKNOWN and flag(get(mount, "readOnly")) is not True \
                and get(mount, "readOnly") is not UNKNOWN:
            out.append(f"container {name}: the Ray auth token file {path} is mounted writable; "
                       f"mount it read-only")
    token = env.get("RAY_AUTH_TOKEN")
    if token is not None and is_literal(token):
        out.append(f"container {name}: carries the Ray auth token itself in env RAY_AUTH_TOKEN "
                   f"({mask(token)}); envs are readable in `docker inspect` and the state: mount "
                   f"it as a file and point RAY_AUTH_TOKEN_PATH at it")
    return out


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
    why = ("every interface" if host.is_unspecified else "a management address"
           if str(host) in c.management else "not a fabric address")
    return (f"container {c.name}: the Ray dashboard listens on --dashboard-host "
            f"{host_raw} ({why}); disable it (--include-dashboard=false) or bind 127.0.0.1 "
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
    out = auth_findings(name, props)
    dashboard = _dashboard_finding(c)
    if dashboard:
        out.append(dashboard)
    return out + _published_port_findings(c, props, ray_ports)


def _management_hosts(resources: list[PolicyResource]) -> set[str]:
    """The SparkNode `host`s: the management addresses."""
    hosts = (text(props_of(r, SparkNodeProps)["host"]) for r in resources
             if r.resource_type == SPARK_NODE)
    return {h for h in hosts if h}


def _fabric_ips(resources: list[PolicyResource]) -> set[str]:
    """Every fabric interface address the NcclEnvironment reports."""
    ips: set[str] = set()
    for r in resources:
        if r.resource_type != NCCL_ENV:
            continue
        for node in each(props_of(r, NcclEnvironmentProps)["nodes"]):
            ips.update(_node_fabric_ips(node))
    return ips


def _node_fabric_ips(node: NcclNodeProps) -> list[str]:
    return [ip for ip in (text(f["ip"]) for f in each(node["fabric"])) if ip]


def _port(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def firewall_findings(name: str, props: Props, found: Mapping[str, Table | None],
                      fabric_ips: set[str]) -> list[str]:
    """With the stack's firewall (issue 45): every port this Ray container listens on is pinned
    (a port Ray picks at random cannot be named by a rule) and filtered on its node, from the
    stack's fabric addresses only."""
    tokens = command_tokens(props)
    node = text(labels_of(props).get(labels.NODE))
    if not tokens or node is None:
        return []
    head = "--head" in tokens
    out: list[str] = []
    ports: list[tuple[str, int]] = []
    for f in RANDOM_PORT_FLAGS:
        port = _port(flag_value(tokens, f))
        if port is None:
            out.append(f"container {name}: Ray picks its {f[2:-5]} port at random (no {f}): "
                       f"the firewall of {node} cannot name it")
        else:
            ports.append((f[2:-5], port))
    defaults = {**DEFAULT_PORTS, **(HEAD_DEFAULT_PORTS if head else {})}
    for f, default in defaults.items():
        ports.append(({"--port": "GCS"}.get(f, f[2:-5]), _port(flag_value(tokens, f)) or default))
    include = (flag_value(tokens, "--include-dashboard") or "").lower()
    if head and include not in ("false", "0", "no"):
        ports.append(("dashboard", _port(flag_value(tokens, "--dashboard-port")) or 8265))
    if head:  # the head's metrics servers, whatever --include-dashboard says (env, not flags)
        env = dict(env_pairs(props) or [])
        for var, default in HEAD_METRIC_PORTS.items():
            ports.append((var.lower().replace("_", "-").removesuffix("-port"),
                          _port(env.get(var)) or default))
    lo, hi = (_port(flag_value(tokens, f)) for f in ("--min-worker-port", "--max-worker-port"))
    if lo is None or hi is None or lo == 0:
        out.append(f"container {name}: Ray's workers bind ports of Ray's default range "
                   "(no --min-worker-port/--max-worker-port): pin them, so that "
                   f"{node}'s firewall names them")
    else:
        ports += [("worker", p) for p in range(lo, hi + 1)]
    judged: set[str] = set()
    for what, port in ports:
        if what in judged:  # one finding per kind (a worker range: its first port)
            continue
        why = exposure(found, node, port, fabric_ips, f"container {name}: Ray's {what}")
        if why:
            judged.add(what)
            out.append(why)
    return out


def validate_ray_not_exposed(args: StackValidationArgs, report: Report) -> None:
    management = _management_hosts(args.resources)
    fabric_ips = _fabric_ips(args.resources)
    subnets = _fabric_subnets(args)
    ray_ports = {int(p) for p in (conf(args, "rayPorts") or []) if num(p) is not None}
    found = tables(args.resources) if any_firewall(args.resources) else None
    for r in args.resources:
        if r.resource_type != CONTAINER or not is_ray_container(r.props):
            continue
        mgmt = set(management)
        ph = provider_host(r)
        if ph:
            mgmt.add(ph)
        for msg in ray_exposure_findings(r.name, r.props, mgmt, subnets, ray_ports, fabric_ips):
            report(msg, r.urn)
        if found is not None:
            for msg in firewall_findings(r.name, r.props, found, fabric_ips):
                report(msg, r.urn)


ray_not_exposed = StackValidationPolicy(
    name="ray-not-exposed",
    description="Every Ray container uses token authentication (RAY_AUTH_MODE=token, "
                "RAY_AUTH_TOKEN_PATH mounted read-only, no RAY_AUTH_TOKEN literal in its env): "
                "Ray listens on every interface; the dashboard is off or on 127.0.0.1/fabric, "
                "no published Ray ports.",
    validate=validate_ray_not_exposed,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Give every Ray container RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH=<file> "
                      "with that file bind-mounted read-only (never the token in an env value); "
                      "start the head with --include-dashboard=false (or --dashboard-host="
                      "127.0.0.1 / its fabric IP), host networking and no `ports` for 6379/8265/"
                      "10001; reach the dashboard through an SSH tunnel.",
    config_schema=schema(
        fabricSubnets=FABRIC_SUBNETS_PROP,
        rayPorts={"type": "array", "items": {"type": "integer"}, "default": DEFAULTS["rayPorts"]},
    ),
)
