"""NodeFirewall: the stack's nftables table on one node (issue 45).

The ports the stack opens on the node (config/firewall.node_ports: Ray's, pinned into the
stack's block; vLLM's API and its own; mp's rendezvous; the services'; the seeders'; Prometheus
and the node exporter) admit the node's loopback and their sources only (the stack's nodes'
fabric addresses, or the head's for a service and an exporter); the public ports (the gateway,
on the head) and the stack's sshd port are admitted from everywhere; new connections to the
kernel's ephemeral ports (every address: what binds port 0, gloo's sockets, vLLM's queues, the
torch store of Ray's V2 executor) admit the stack's nodes only. The
table, its file, its systemd unit (loaded before Docker at boot) and the vLLM launcher's probe:
hostscripts/firewall.py; why nftables and what it never touches: docs/design.md "The node's
firewall".

One command per node (`firewall-<node>-table`):
- a declared change (a service added, a port moved) updates it in place: the new table is
  checked by the node's nft, written and loaded in one transaction;
- drift behind the stack (the table removed or edited by hand, its file or unit gone or
  edited, the unit disabled; recon reads their digests and the last load's record) replaces
  it, delete before create, with the reasons in the preview's log; in step, its `triggers`
  keep the state's value (components/rerun.Again);
- `pulumi destroy` removes the table, the unit and the files.
Every container of the stack waits for every node's table (stack.py puts it before the image).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components import rerun
from components.fabric import management_interface
from components.rerun import Again
from components.spark_node import SparkNode
from config.firewall import DEFAULT_EPHEMERAL, PortRule
from contract import types
from contract.props import NodeFirewallProps
from hostscripts.firewall import (
    DataPlane,
    Rule,
    TableSpec,
    apply_script,
    remove_script,
    table_name,
    unit_name,
    unit_sha256,
)
from inspection.facts import NodeFacts

RESOURCE_TYPE = types.NODE_FIREWALL


@dataclass
class NodeFirewallArgs:
    node: SparkNode
    stack: str
    environment: str
    rules: Sequence[PortRule]  # config/firewall.node_ports
    public: Sequence[int]  # config/firewall.public_ports
    stack_addresses: Sequence[str]  # every fabric address of the stack's nodes
    head_addresses: Sequence[str]  # the head's fabric addresses
    probe: int  # the launcher's probe port (config/firewall.PortBlock.probe)


def table_spec(args: NodeFirewallArgs) -> TableSpec:
    """The node's table as the stack declares it."""
    node = args.node
    def ordered(addresses: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(addresses, key=ipaddress.IPv4Address))

    sources = {"loopback": (), "stack": ordered(args.stack_addresses),
               "head": ordered(args.head_addresses)}
    ephemeral = node.facts.ephemeral_ports or DEFAULT_EPHEMERAL
    return TableSpec(
        stack=args.stack,
        node=node.name,
        ssh_port=node.node.port,
        public=tuple(args.public),
        rules=tuple(Rule(r.what, r.ports, sources[r.sources]) for r in args.rules),
        data_plane=DataPlane(ports=ephemeral, sources=ordered(args.stack_addresses)),
        probe=args.probe,
    )


def drift(spec: TableSpec, facts: NodeFacts) -> list[str]:
    """Why the table must be loaded again (empty: as the stack last loaded it), as recon saw it.
    In step: the kernel's table, the file and the unit as the last load left them, the unit
    enabled. A declared change from there is an update. Not surveyed (nft missing, which
    preflight refuses): nothing to say."""
    fw = facts.firewall
    if fw is None:
        return []
    out = []
    names = spec.names
    loaded_file, loaded_table = fw.record if fw.record else (None, None)
    if fw.table is None:
        out.append(f"table inet {table_name(names)} is not loaded (deleted by hand, or the node "
                   "booted without its unit)")
    elif loaded_table is not None and fw.table != loaded_table:
        out.append(f"table inet {table_name(names)} was changed by hand (not what the last "
                   "load listed)")
    if fw.file is None:
        out.append("its ruleset file is gone")
    elif loaded_file is not None and fw.file != loaded_file:
        out.append("its ruleset file was changed")
    if fw.record is None:
        out.append("no record of its last load")
    if fw.unit is None:
        out.append(f"the unit {unit_name(names)} is gone")
    elif fw.unit != unit_sha256(names):
        out.append(f"the unit {unit_name(names)} was changed")
    elif not fw.enabled:
        out.append(f"the unit {unit_name(names)} is not enabled (the next boot would not load "
                   "the table before Docker)")
    return out


def _ports(ports: Sequence[int | tuple[int, int]]) -> list[list[int]]:
    return [[p[0], p[1]] if isinstance(p, tuple) else [p, p] for p in ports]


class NodeFirewall(pulumi.ComponentResource):
    """The stack's table on one node (see the module docstring)."""

    table: remote.Command

    def __init__(self, name: str, args: NodeFirewallArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        node = args.node
        self.args = args
        spec = table_spec(args)
        self.drift = drift(spec, node.facts)
        dp = spec.data_plane
        # what the policy pack judges (docs/contract.md "What policies see")
        props: NodeFirewallProps = {
            "environment": args.environment,
            "node": node.name,
            "host": node.node.host,
            "managementInterface": management_interface(node),
            "table": f"inet {table_name(spec.names)}",
            "unit": unit_name(spec.names),
            "sshPort": spec.ssh_port,
            "public": list(spec.public),
            "rules": [{"what": r.what, "ports": _ports(r.ports), "sources": list(r.sources)}
                      for r in spec.rules],
            "dataPlane": None if dp is None else {
                "ports": list(dp.ports), "sources": list(dp.sources)},
        }
        super().__init__(RESOURCE_TYPE, name, props, opts)
        if node.facts.ephemeral_ports is None:
            pulumi.log.warn(f"firewall {node.name}: its ephemeral port range could not be read; "
                            f"the data plane's rule names Linux's default {DEFAULT_EPHEMERAL}",
                            resource=self)
        if self.drift:  # say why the preview replaces it
            pulumi.log.info(f"firewall {node.name}: not as the stack loaded it: "
                            f"{'; '.join(self.drift)}; the up loads it again", resource=self)
        # a value never seen before when it drifted (the same drift twice must run twice)
        again = Again.when_wiped([rerun.fresh_trigger()] if self.drift else [])
        script = apply_script(spec)
        self.table = node.command(
            f"{name}-table",
            self,
            create=script,
            update=script,
            delete=remove_script(spec.names, node.name),
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            delete_before_replace=True,
        )
        # the props again: a stack policy reads a component's outputs (what it registered here),
        # not the inputs it was made with
        self.register_outputs({
            **props,
            "loaded": self.table.stdout,
            "drift": self.drift,
        })
