"""14. vllm-behind-gateway: no vLLM port of the stack is reachable but through the gateway.

vLLM's `--api-key` guards only some of its paths (issue 30: `/invocations`, `/tokenize`,
`/metrics`, ... answer without it), so the gateway (`spark-vllm:gateway:Gateway`, HAProxy on
the head, which checks the key on every path) must be the stack's only listener beyond a node.
Every vLLM listens on loopback or a fabric address, where the gateway reaches it:

* the VllmServer's `host` (the main model's API) and each VllmService's `hosts` (per node) are
  loopback or a fabric address: never every address (0.0.0.0, ::), a management address (a
  SparkNode `host` or a docker provider's ssh host) or any other;
* every vLLM container with an API (role `vllm-serve` without `--headless`, `vllm-service`)
  has `--host` on its command line, loopback or fabric (without it vLLM listens on every
  address), and publishes no port;
* the stack has a Gateway and it routes every model the stack serves, to servers at loopback or
  fabric addresses.

* with the stack's firewall (issue 45, rules/_firewall.py), each of those ports is filtered on
  its node: the main vLLM's on the head admitting its loopback only (the stack's fabric
  addresses with mp on more than one node: the other ranks watch its /health), a service's on
  each of its nodes the head's fabric addresses only (the gateway reaches it from there).

mp's rendezvous port (torch.distributed's store on `masterPort`, every address whatever vLLM is
told) is no API port and the gateway does not front it: rule 13, mp-rendezvous-fabric-only
(rules/rendezvous.py), judges the head's firewall rule that keeps it on the fabric.

Fabric addresses: the NcclEnvironment's interfaces, else pack config `fabricSubnets`, else the
stack config `nccl.fabricSubnets`. Unknown values (preview) are not judged.
"""
from __future__ import annotations

from collections.abc import Sequence

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    StackValidationArgs,
    StackValidationPolicy,
)

from contract import labels, types
from contract.props import GatewayProps, NcclEnvironmentProps, VllmServerProps, VllmServiceProps

from ._common import (
    CONTAINER,
    NCCL_ENV,
    VLLM_SERVER,
    VLLM_SERVICE,
    Report,
    each,
    elements,
    get,
    is_unknown,
    mapping_items,
    model_props,
    num,
    props_of,
    text,
)
from ._containers import command_tokens, flag_value, has_flag, labels_of, provider_host
from ._firewall import any_firewall, exposure, tables
from ._schema import FABRIC_SUBNETS_PROP, schema
from .ray_exposure import (
    IPNetwork,
    _fabric_ips,
    _fabric_subnets,
    _in_subnets,
    _management_hosts,
    _node_fabric_ips,
    parse_ip,
)

GATEWAY = types.GATEWAY
API_ROLES = labels.API_ROLES
_FIX = ("bind it to 127.0.0.1 or the node's fabric address (spark-vllm:vllm.host unset: the "
        "stack's choice); clients use the gateway's endpoint")


def _where(host: object, management: set[str], fabric_ips: set[str],
           subnets: Sequence[IPNetwork]) -> str | None:
    """Why `host` is not a place only the gateway reaches, or None when it is one."""
    if not isinstance(host, str):
        return "no address: vLLM then listens on every address"
    if host == "localhost":
        return None
    ip = parse_ip(host)
    if ip is None:
        return f"{host} is not an address"
    if ip.is_loopback:
        return None
    if ip.is_unspecified:
        return f"{host} is every address of the node, the management network's included"
    if host in management:
        return f"{host} is a management address"
    if host in fabric_ips or (not fabric_ips and _in_subnets(ip, subnets)):
        return None
    return f"{host} is neither loopback nor a fabric address"


def behind_gateway_findings(resources: Sequence[PolicyResource], management: set[str],
                            fabric_ips: set[str], subnets: Sequence[IPNetwork]
                            ) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []

    def judge(what: str, host: object, urn: str) -> None:
        if is_unknown(host):
            return
        why = _where(host, management, fabric_ips, subnets)
        if why:
            out.append((f"{what} listens where the gateway does not guard it: {why}; {_FIX}",
                        urn))

    served: list[tuple[str, str]] = []  # (served name, urn)
    gateways = [r for r in resources if r.resource_type == GATEWAY]
    for r in resources:
        if r.resource_type == VLLM_SERVER:
            server = props_of(r, VllmServerProps)
            judge(f"vLLM ({text(server['servedModelName']) or r.name})", server["host"], r.urn)
            name = server["servedModelName"]
            if isinstance(name, str):
                served.append((name, r.urn))
        elif r.resource_type == VLLM_SERVICE:
            service = props_of(r, VllmServiceProps)
            hosts = service["hosts"]
            what = f"service {text(service['service']) or r.name}"
            if is_unknown(hosts):
                pass
            elif not mapping_items(hosts):
                out.append((f"{what} does not say where its vLLM listens (no `hosts`): it "
                            "cannot be shown to stay behind the gateway", r.urn))
            for node, host in mapping_items(hosts):
                judge(f"{what} on {node}", host, r.urn)
            name = service["servedModelName"]
            if isinstance(name, str):
                served.append((name, r.urn))
        elif r.resource_type == CONTAINER:
            out += _container_findings(r, management, fabric_ips, subnets)
    if served and not gateways:
        out.append(("the stack serves vLLM without a gateway (spark-vllm:gateway:Gateway): "
                    "nothing checks the API key on every path", None))
    for g in gateways:
        out += _gateway_findings(g, served, management, fabric_ips, subnets)
    return out


def _container_findings(r: PolicyResource, management: set[str], fabric_ips: set[str],
                        subnets: Sequence[IPNetwork]) -> list[tuple[str, str | None]]:
    role = text(labels_of(r.props).get(labels.ROLE))
    if role not in API_ROLES:
        return []
    raw = get(r.props, "command")
    if is_unknown(raw):
        return []
    tokens = command_tokens(r.props)
    if role == labels.VLLM_SERVE and "--headless" in tokens:
        return []  # no API server
    mgmt = set(management)
    ph = provider_host(r)
    if ph:
        mgmt.add(ph)
    out: list[tuple[str, str | None]] = []
    host = flag_value(tokens, "--host") if has_flag(tokens, "--host") else None
    why = _where(host, mgmt, fabric_ips, subnets)
    if why:
        out.append((f"container {r.name}: vLLM listens where the gateway does not guard it: "
                    f"{why}; {_FIX}", r.urn))
    for p in elements(get(r.props, "ports")):
        internal = num(get(p, "internal"))
        if internal is not None:
            out.append((f"container {r.name}: publishes port {int(internal)} of vLLM beyond "
                        "the node; only the gateway may listen there", r.urn))
    return out


def _gateway_findings(g: PolicyResource, served: list[tuple[str, str]], management: set[str],
                      fabric_ips: set[str], subnets: Sequence[IPNetwork]
                      ) -> list[tuple[str, str | None]]:
    routes = props_of(g, GatewayProps)["routes"]
    if is_unknown(routes):
        return []
    out: list[tuple[str, str | None]] = []
    routed: set[str] = set()
    for route in each(routes):
        name = text(route["name"])
        if name:
            routed.add(name)
        for s in each(route["servers"]):
            address = s["address"]
            if is_unknown(address):
                continue
            why = _where(address, management, fabric_ips, subnets)
            if why:
                out.append((f"the gateway reaches {name} at {address}: {why}; a vLLM there "
                            "listens beyond the gateway", g.urn))
    for name, urn in served:
        if name not in routed:
            out.append((f"the gateway does not route {name}: its clients would have to reach "
                        "vLLM directly", urn))
    return out


def head_fabric_ips(resources: Sequence[PolicyResource], head: str) -> set[str]:
    """The fabric addresses the NcclEnvironment reports for the node `head`."""
    return {ip for r in resources if r.resource_type == NCCL_ENV
            for n in each(props_of(r, NcclEnvironmentProps)["nodes"]) if text(n["name"]) == head
            for ip in _node_fabric_ips(n)}


def firewall_findings(resources: Sequence[PolicyResource],
                      fabric_ips: set[str]) -> list[tuple[str, str | None]]:
    """With the stack's firewall (issue 45): the main vLLM's port on the head admits its
    loopback only (the stack's fabric addresses with mp on more than one node, whose ranks watch
    its /health), each service's port on each of its nodes the head's fabric addresses only."""
    if not any_firewall(resources):
        return []
    found = tables(resources)
    out: list[tuple[str, str | None]] = []
    head = next((text(nodes[0]["name"]) for r in resources if r.resource_type == VLLM_SERVER
                 and (nodes := each(props_of(r, VllmServerProps)["nodes"]))), None)
    if head is None:
        return out
    head_ips = head_fabric_ips(resources, head)
    for r in resources:
        if r.resource_type not in (VLLM_SERVER, VLLM_SERVICE):
            continue
        port = num(model_props(r.props)["port"])
        if port is None:
            continue
        if r.resource_type == VLLM_SERVER:
            server = props_of(r, VllmServerProps)
            host = text(server["host"])
            ip = parse_ip(host)
            allowed = None if host == "localhost" or (ip is not None and ip.is_loopback) \
                else fabric_ips
            why = exposure(found, head, int(port), allowed,
                           f"vLLM ({text(server['servedModelName']) or r.name})")
            if why:
                out.append((why, r.urn))
        elif r.resource_type == VLLM_SERVICE:
            service = props_of(r, VllmServiceProps)
            for node, _host in mapping_items(service["hosts"]):
                why = exposure(found, node, int(port), head_ips,
                               f"service {text(service['service']) or r.name}",
                               fabric_is="the head's fabric addresses")
                if why:
                    out.append((why, r.urn))
    return out


def validate_vllm_behind_gateway(args: StackValidationArgs, report: Report) -> None:
    management = _management_hosts(args.resources)
    fabric_ips = _fabric_ips(args.resources)
    for msg, urn in behind_gateway_findings(args.resources, management, fabric_ips,
                                            _fabric_subnets(args)):
        report(msg, urn)
    for msg, urn in firewall_findings(args.resources, fabric_ips):
        report(msg, urn)


vllm_behind_gateway = StackValidationPolicy(
    name="vllm-behind-gateway",
    description="No vLLM port of the stack is reachable but through the gateway: every vLLM API "
                "listens on loopback or a fabric address (never 0.0.0.0 or a management "
                "address), vLLM containers publish no port, and the gateway routes every served "
                "model.",
    validate=validate_vllm_behind_gateway,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Leave spark-vllm:vllm.host unset (or 127.0.0.1 / the head's fabric "
                      "address); keep the gateway section (spark-vllm:gateway) and reach every "
                      "model through its endpoint; never --host in extraArgs, never `ports` on a "
                      "vLLM container.",
    config_schema=schema(
        fabricSubnets=FABRIC_SUBNETS_PROP,
    ),
)
