"""17. monitoring-not-exposed, on the Monitoring component: Prometheus, Alertmanager and the
node exporters, which have no authentication in this stack, never listen on the management
network.

A Monitoring (`spark-vllm:monitoring:Monitoring`, components/monitoring.py, one per stack with
`monitoring.enabled`) carries the `environment`, the head's `node` name and management `host`,
Prometheus's `listen` ("addr:port"), its `authentication` (false: there is none today),
`fabricAddresses` (every fabric address of every node), the `images` {prometheus,
nodeExporter, alertmanager} as configured, the `exporters` [{node, host, listen}], one per node,
and `alertmanager` {listen, clusterListen} (its API and UI, and its cluster's gossip listener,
"" when off).

* Prometheus's `listen` is loopback or a fabric address: never every address (0.0.0.0, ::, an
  empty address), a management address (the head's `host` or another node's) or any other,
  unless `authentication` is true (reserved for a Prometheus that checks its clients);
* every exporter's `listen` is loopback or a fabric address, never its node's management
  `host`, every address or any other (exporters have no authentication at all);
* Alertmanager's `listen` likewise (it has no authentication either: anyone who reaches it can
  silence every alert), and its `clusterListen` is off ("") or loopback or a fabric address
  (Alertmanager's default, 0.0.0.0:9094, is every address: its gossip takes silences and
  notifications from any peer);
* a `listen` that is not `addr:port` (`[v6]:port` for IPv6) is a finding: what cannot be read
  cannot be shown to stay off the management network;
* in the prod environments (pack config `prodEnvironments`), the images are pinned by digest
  (`<repo>@sha256:<64 hex>`, rule 10's DIGEST_REF_RE).

The program places them itself (loopback on the head, a node's first fabric address elsewhere;
config/monitoring.py, config/validate.py); the pack judges what really reaches the engine.
Unknown values (preview) are not judged: each check skips what it cannot know (an unknown
`fabricAddresses` leaves only the addresses it cannot excuse: every address, a management
one), and the others still run.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from contract import types
from contract.props import MonitoringProps

from ._common import (
    DEFAULTS,
    Json,
    Report,
    conf,
    each,
    elements,
    environment_of,
    flag,
    is_unknown,
    props_as,
    text,
)
from ._schema import ENV_PROP, env_list_prop, schema
from .pinning import DIGEST_REF_RE
from .ray_exposure import IPAddress, parse_ip

MONITORING: Final = types.MONITORING

_PROMETHEUS_FIX = ("Prometheus has no authentication in this stack: set "
                   "spark-vllm:monitoring.listen: loopback (127.0.0.1; reach it with ssh -L) or "
                   "spark-vllm:monitoring.listen: fabric (the head's first fabric address)")
_EXPORTER_FIX = ("a node exporter has no authentication: the stack places it on the head's "
                 "loopback and on each other node's first fabric address (nodes[].fabric), "
                 "never on the management network")
_ALERTMANAGER_FIX = ("Alertmanager has no authentication in this stack (whoever reaches it can "
                     "silence every alert): the stack places it beside Prometheus "
                     "(spark-vllm:monitoring.listen: loopback or fabric) with its cluster off")


@dataclass(frozen=True)
class Listen:
    """A known, well-formed `addr:port` (the address as written, brackets removed)."""

    address: str
    port: int


def parse_listen(value: Json) -> Listen | None:
    """`a.b.c.d:port`, `name:port`, `:port` (every address) or `[v6]:port`, with a port in
    1-65535; None for anything else (an unbracketed IPv6 address is ambiguous: refused)."""
    if not isinstance(value, str) or value != value.strip():
        return None
    if value.startswith("["):
        address, bracket, rest = value[1:].partition("]")
        ip = parse_ip(address) if "[" not in address else None
        if not bracket or not rest.startswith(":") or ip is None or ip.version != 6:
            return None
        port = rest[1:]
    else:
        address, colon, port = value.rpartition(":")
        if not colon or any(c in ":[]" or c.isspace() for c in address):
            return None
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) <= 65535:
        return None
    return Listen(address, int(port))


def _shown(value: Json) -> str:
    """A prop's value in a message: a scalar as Python writes it, a list or object by kind (the
    proxies the pack receives have no useful repr)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return repr(value)
    return "an object" if isinstance(value, Mapping) else "a list"


@dataclass(frozen=True)
class _Addresses:
    """What decides where a listener may be: management addresses by node, fabric addresses
    (`complete` false when some are unknown)."""

    management: dict[str, str]  # address as written -> node
    fabric: set[IPAddress]
    complete: bool


def _addresses(props: MonitoringProps) -> _Addresses:
    management: dict[str, str] = {}
    host = text(props["host"])
    if host:
        management[host] = text(props["node"]) or "?"
    for e in each(props["exporters"]):
        h = text(e["host"])
        if h:
            management.setdefault(h, text(e["node"]) or "?")
    raw = props["fabricAddresses"]
    complete = not is_unknown(raw)
    fabric: set[IPAddress] = set()
    for a in elements(raw):
        if is_unknown(a):
            complete = False
            continue
        ip = parse_ip(text(a))
        if ip is not None:
            fabric.add(ip)
    return _Addresses(management, fabric, complete)


def _management_node(address: str, ip: IPAddress | None, known: _Addresses) -> str | None:
    """The node whose management address `address` is (compared as IPs when both are)."""
    for host, node in known.management.items():
        if host == address or (ip is not None and parse_ip(host) == ip):
            return node
    return None


def _why_exposed(listen: Listen, known: _Addresses) -> str | None:
    """Why `listen` is reachable beyond loopback and the fabric; None when it is not, or when
    that depends on an unknown fabric address."""
    address = listen.address
    if address == "":
        return "no address is every address of the node, the management network's included"
    if address == "localhost":
        return None
    ip = parse_ip(address)
    if ip is not None and ip.is_loopback:
        return None
    if ip is not None and ip.is_unspecified:
        return f"{address} is every address of the node, the management network's included"
    node = _management_node(address, ip, known)
    if node is not None:
        return (f"{address} is the management address of node {node} (the network ssh "
                "arrives on)")
    if ip is None:
        return (f"{address} is not an IP address (a name is not resolved: it cannot be shown "
                "to stay off the management network)")
    if ip in known.fabric:
        return None
    if not known.complete:
        return None  # it may be one of the fabric addresses not known yet
    return f"{address} is neither loopback nor a fabric address of the stack"


def _listen_findings(node: str, raw: Json, known: _Addresses, whose: str, who: str,
                     fix: str) -> list[str]:
    """A listener's `listen` (known) is an address:port that stays on loopback or the fabric:
    `whose` names it in the first finding, `who` in the second."""
    listen = parse_listen(raw)
    if listen is None:
        return [f"node {node}: {whose} listen {_shown(raw)} is not an address:port "
                "(a.b.c.d:port, [v6]:port): it cannot be shown to stay off the management "
                f"network; {fix}"]
    why = _why_exposed(listen, known)
    return [] if why is None else [f"node {node}: {who} listens on {raw}: {why}; {fix}"]


def _prometheus_findings(props: MonitoringProps, known: _Addresses) -> list[str]:
    node = text(props["node"]) or "?"
    raw = props["listen"]
    if is_unknown(raw):
        return []
    authentication = props["authentication"]
    if parse_listen(raw) is not None \
            and (is_unknown(authentication) or flag(authentication) is True):
        return []  # with authentication, any address (an unparsable listen is still reported)
    return _listen_findings(node, raw, known, "Prometheus's", "Prometheus", _PROMETHEUS_FIX)


def _exporter_findings(props: MonitoringProps, known: _Addresses) -> list[str]:
    out: list[str] = []
    for e in each(props["exporters"]):
        if is_unknown(e):
            continue
        node = text(e["node"]) or "?"
        raw = e["listen"]
        if not is_unknown(raw):
            out += _listen_findings(node, raw, known, "its node exporter's", "its node exporter",
                                    _EXPORTER_FIX)
    return out


_AM_LISTENERS: Final[tuple[tuple[Literal["listen", "clusterListen"], str], ...]] = (
    ("listen", "Alertmanager"), ("clusterListen", "Alertmanager's cluster"))
_IMAGES: Final[tuple[tuple[Literal["prometheus", "nodeExporter", "alertmanager"], str], ...]] = (
    ("prometheus", "Prometheus's"), ("nodeExporter", "the node exporters'"),
    ("alertmanager", "Alertmanager's"))


def _alertmanager_findings(props: MonitoringProps, known: _Addresses) -> list[str]:
    """Alertmanager's API and its cluster listener (absent props: a stack without one)."""
    am = props["alertmanager"]
    if am is None or is_unknown(am):
        return []
    node = text(props["node"]) or "?"
    out: list[str] = []
    for key, what in _AM_LISTENERS:
        raw = am[key]
        if not is_unknown(raw) and not (key == "clusterListen" and raw == ""):
            out += _listen_findings(node, raw, known, what, what, _ALERTMANAGER_FIX)
    return out


def _image_findings(props: MonitoringProps, env: str) -> list[str]:
    out: list[str] = []
    images = props["images"]
    for key, what in _IMAGES:
        ref = None if images is None else images[key]
        if is_unknown(ref) or (isinstance(ref, str) and DIGEST_REF_RE.fullmatch(ref)):
            continue
        if key == "alertmanager" and ref is None and props["alertmanager"] is None:
            continue  # a stack from before Alertmanager
        out.append(f"{env}: {what} image spark-vllm:monitoring.{key}.ref {_shown(ref)} is not "
                   "pinned by digest (<repo>@sha256:<64 hex>); pin it (`docker buildx "
                   "imagetools inspect <ref>` shows the digest)")
    return out


def monitoring_findings(raw: Json, prod: str | None = None) -> list[str]:
    """Every finding of monitoring-not-exposed for one Monitoring's props; `prod`: the
    environment's name when it must pin its images."""
    props = props_as(raw, MonitoringProps)
    known = _addresses(props)
    out = _prometheus_findings(props, known)
    out += _exporter_findings(props, known)
    out += _alertmanager_findings(props, known)
    if prod:
        out += _image_findings(props, prod)
    return out


def validate_monitoring_not_exposed(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != MONITORING:
        return
    env = environment_of(args.props, args)
    prod = env if env in set(conf(args, "prodEnvironments") or []) else None
    for msg in monitoring_findings(args.props, prod):
        report(msg, None)


monitoring_not_exposed = ResourceValidationPolicy(
    name="monitoring-not-exposed",
    description="Prometheus, Alertmanager and the node exporters (no authentication in this "
                "stack) listen on loopback or a fabric address, never every address or the "
                "management network; Alertmanager's cluster is off; in prod their images are "
                "pinned by digest.",
    validate=validate_monitoring_not_exposed,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set spark-vllm:monitoring.listen to loopback (reach Prometheus with "
                      "`ssh -L 9090:127.0.0.1:9090 <head>`) or fabric; leave the exporters where "
                      "the stack puts them (the head's loopback, each other node's first fabric "
                      "address, nodes[].fabric); in prod set monitoring.prometheus.ref, "
                      "monitoring.nodeExporter.ref and monitoring.alertmanager.ref to "
                      "<repo>@sha256:<digest>.",
    config_schema=schema(
        environment=ENV_PROP,
        prodEnvironments=env_list_prop(DEFAULTS["prodEnvironments"],
                                       "environments whose monitoring images must be pinned"),
    ),
)
