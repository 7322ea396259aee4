"""18. stack-ports-firewalled: the nodes' firewalls themselves (issue 45).

Ray's servers, torch's store and vLLM's own sockets listen on every address of a node whatever
they are told, so the stack keeps its ports to its loopback and fabric with an nftables table
of its own on every node (components/firewall.py: NodeFirewall, its props in rules/_firewall.py).
This rule judges the tables as planned; which port must be in them, with which sources, is
judged by the rule of the exposure (ray-not-exposed, mp-rendezvous-fabric-only,
vllm-behind-gateway, monitoring-not-exposed):

* outside dev (pack config `nonDevEnvironments`), every node (SparkNode) has a NodeFirewall;
* a table admits the stack's sshd port (`sshPort`, a port: an operator never loses ssh);
* its public ports, which every address reaches, are the gateway's on the gateway's node and
  nothing else;
* every rule admits fabric addresses of the stack only (the NcclEnvironment's interfaces, else
  the pack's or the stack's `fabricSubnets`): never a management address or any other; its
  data plane (the kernel's ephemeral ports on the node's fabric addresses) likewise;
* the monitoring's ports (a stack policy sees every resource; monitoring-not-exposed judges the
  Monitoring alone): Prometheus's on the head admits its loopback only (the stack's fabric
  addresses with `monitoring.listen: fabric`), each node exporter's the head's fabric
  addresses only: neither has authentication.

Unknown values (preview) are not judged.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    StackValidationArgs,
    StackValidationPolicy,
)

from contract.props import GatewayProps, MonitoringProps, NodeFirewallProps, SparkNodeProps

from ._common import (
    DEFAULTS,
    SPARK_NODE,
    Finding,
    Report,
    conf,
    each,
    elements,
    is_unknown,
    num,
    props_of,
    stack_environment,
    text,
)
from ._firewall import FIREWALL, Table, exposure, tables
from ._schema import FABRIC_SUBNETS_PROP, env_list_prop, schema
from .gateway import GATEWAY, head_fabric_ips
from .monitoring import MONITORING, parse_listen
from .ray_exposure import (
    IPNetwork,
    _fabric_ips,
    _fabric_subnets,
    _in_subnets,
    _management_hosts,
    parse_ip,
)


def _fabric(address: str, fabric_ips: set[str], subnets: Sequence[IPNetwork]) -> bool:
    if fabric_ips:
        return address in fabric_ips
    ip = parse_ip(address)
    return ip is not None and _in_subnets(ip, subnets)


def firewall_findings(resources: Sequence[PolicyResource], environment: str | None,
                      non_dev: Sequence[str], fabric_ips: set[str],
                      subnets: Sequence[IPNetwork]) -> list[Finding]:
    out: list[Finding] = []
    found = tables(resources)
    if environment in non_dev:
        for r in resources:
            if r.resource_type != SPARK_NODE:
                continue
            name = text(props_of(r, SparkNodeProps)["name"])
            if name and name not in found:
                out.append((f"node {name} has no firewall (NodeFirewall) in {environment}: Ray's "
                            "servers, torch's store and vLLM's own sockets answer on every "
                            "address of it; keep spark-vllm:firewall.enabled true", r.urn))
    management = _management_hosts(list(resources))
    gateways = {text(p["node"]): num(p["port"]) for p in (
        props_of(g, GatewayProps) for g in resources if g.resource_type == GATEWAY)}
    for r in resources:
        if r.resource_type != FIREWALL:
            continue
        props = props_of(r, NodeFirewallProps)
        node = text(props["node"]) or r.name
        ssh = props["sshPort"]
        if not is_unknown(ssh) and num(ssh) is None:
            out.append((f"{node}'s firewall names no sshd port it always admits (sshPort): "
                        "the operator's ssh must never depend on the stack's rules", r.urn))
        public = props["public"]
        if not is_unknown(public):
            allowed = {gateways.get(node)} - {None}
            extra = sorted(int(n) for n in (num(p) for p in elements(public))
                           if n is not None and n not in allowed)
            if extra:
                out.append((f"{node}'s firewall admits every address to port(s) "
                            f"{', '.join(map(str, extra))}: only the gateway's port is public",
                            r.urn))
        rules = props["rules"]
        checks = [] if is_unknown(rules) else [
            (text(rule["what"]) or "?", rule["sources"]) for rule in each(rules)]
        dp = props["dataPlane"]
        if dp and not is_unknown(dp):
            checks.append(("data-plane", dp["sources"]))
        for what, sources in checks:
            if is_unknown(sources):
                continue
            for s in (text(x) for x in elements(sources)):
                if s is None:
                    continue
                if s in management:
                    why = "a management address"
                elif _fabric(s, fabric_ips, subnets):
                    continue
                else:
                    why = "not a fabric address of the stack"
                out.append((f"{node}'s firewall rule {what} admits {s} ({why}); the stack's "
                            "ports admit its loopback and fabric only", r.urn))
    if found:
        out += _monitoring(resources, found, fabric_ips)
    return out


def _monitoring(resources: Sequence[PolicyResource], found: Mapping[str, Table | None],
                fabric_ips: set[str]) -> list[Finding]:
    """Prometheus's port on the head admits its loopback only (the stack's fabric addresses
    with `listen: fabric`), each node exporter's port the head's fabric addresses only (where
    Prometheus scrapes it from): neither has authentication here."""
    out: list[Finding] = []
    for r in resources:
        if r.resource_type != MONITORING:
            continue
        props = props_of(r, MonitoringProps)
        head = text(props["node"])
        listen = parse_listen(props["listen"])
        if head is None:
            continue
        if listen is not None:
            ip = parse_ip(listen.address)
            allowed = None if ip is not None and ip.is_loopback else fabric_ips
            why = exposure(found, head, listen.port, allowed, "Prometheus")
            if why:
                out.append((why, r.urn))
        head_ips = head_fabric_ips(resources, head)
        for e in each(props["exporters"]):
            node, listen = text(e["node"]), parse_listen(e["listen"])
            if node is None or listen is None:
                continue
            why = exposure(found, node, listen.port, head_ips, f"the node exporter of {node}",
                           fabric_is="the head's fabric addresses")
            if why:
                out.append((why, r.urn))
    return out


def validate_stack_ports_firewalled(args: StackValidationArgs, report: Report) -> None:
    non_dev = [str(e) for e in (conf(args, "nonDevEnvironments") or [])]
    for msg, urn in firewall_findings(args.resources, stack_environment(args), non_dev,
                                      _fabric_ips(args.resources), _fabric_subnets(args)):
        report(msg, urn)


stack_ports_firewalled = StackValidationPolicy(
    name="stack-ports-firewalled",
    description="Every node has the stack's firewall outside dev; it always admits sshd, makes "
                "only the gateway's port public and admits the stack's fabric addresses only "
                "to the stack's ports.",
    validate=validate_stack_ports_firewalled,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Keep spark-vllm:firewall.enabled true (the program makes a NodeFirewall "
                      "per node from config/ports.py); reach the models through the gateway; "
                      "on a node, `nft list table inet spark-vllm-<stack>` shows what it loaded.",
    config_schema=schema(
        nonDevEnvironments=env_list_prop(DEFAULTS["nonDevEnvironments"],
                                         "environments where every node needs its firewall"),
        fabricSubnets=FABRIC_SUBNETS_PROP,
    ),
)
