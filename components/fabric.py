"""NodeFabric: one node's ConnectX-7 interfaces, configured as the stack declares them.

With `fabric.manage` (the default) every fabric interface in nodes[].fabric[] is the stack's:
its address (nodes[].fabric[].ip with the prefix of its nccl.fabricSubnets entry), its MTU
(`fabric.mtu`) and link state, and a netplan file of the stack's own so the node boots into the
same state (hostscripts/fabric_config.py: validated by the node's netplan, applied with `ip` on
that interface only, never `netplan apply`; why: docs/design.md "The fabric as code").

One command per interface (`fabric-<node>-<interface>`), so a preview names exactly the
interface that changes:
- a declared change (address, MTU) updates it in place: the apply validates, converges the
  interface, and restores the previous file and running state when a step fails;
- drift behind the stack (the interface not as the stack's own file for it says: an address
  removed, the MTU changed, the netplan file gone or edited; recon reads them before the run)
  replaces it, delete before create, and nothing else of the node; in step, its `triggers`
  keep the state's value (components/rerun.Again). A first apply is a create either way;
- `pulumi destroy` removes the stack's file and address (another stack's file declaring the
  same address keeps it) and leaves the rest of the node as it found it.
The fabric check (components/nccl.py) runs after every interface is applied, and again only
when one of them ran.

With `fabric.manage: false` there is no NodeFabric: preflight wants the fabric configured (the
check-only behaviour of 0.18).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

import pulumi
from pulumi_command import remote

from components import rerun
from components.rerun import Again
from components.spark_node import SparkNode
from config import FabricConfig
from contract import types
from contract.props import NodeFabricProps
from hostscripts.fabric_config import (
    InterfaceSpec,
    apply_script,
    netplan_sha256,
    remove_script,
)
from inspection.facts import NodeFacts


def interface_specs(node: SparkNode, fabric: FabricConfig, subnets: list[str],
                    stack: str) -> list[InterfaceSpec]:
    """The declared state of each of the node's fabric interfaces."""
    nets = [ipaddress.IPv4Network(s) for s in subnets]
    out = []
    for f in node.node.fabric:
        net = next(n for n in nets if ipaddress.IPv4Address(f.ip) in n)  # config checked it
        out.append(InterfaceSpec(node=node.name, stack=stack, interface=f.interface,
                                 address=f"{f.ip}/{net.prefixlen}", mtu=fabric.mtu))
    return out


def drift(spec: InterfaceSpec, facts: NodeFacts) -> list[str]:
    """Why the interface must be put back (empty: nothing behind the stack's back), as recon saw
    it. A node whose interface is as the stack's own netplan file for it says (one address, that
    MTU, the file as the stack writes it) is in step with what the stack last applied: a
    declared change from there is an update, which validates first and keeps the working state
    when it fails. Anything else (an address removed or added, the MTU changed, the file gone
    or edited) is drift. A node's interface recon could not list is preflight's finding."""
    iface = facts.interface(spec.interface)
    if iface is None:
        return []
    own = [a for a in iface.ipv4 if not a.startswith("169.254.")]
    if facts.fabric_files is not None and len(own) == 1:  # None: not surveyed
        try:
            running = replace(spec, address=own[0], mtu=iface.mtu)
            if facts.fabric_files.get(spec.path) == netplan_sha256(running):
                return []
        except ValueError:  # an address the stack would never write (a /31, ...)
            pass
    out = []
    if spec.address not in iface.ipv4:
        out.append(f"address {spec.address} missing")
    out += [f"address {a} not the stack's" for a in own if a != spec.address]
    if iface.mtu != spec.mtu:
        out.append(f"MTU {iface.mtu}, not {spec.mtu}")
    if facts.fabric_files is not None:
        digest = facts.fabric_files.get(spec.path)
        if digest != netplan_sha256(spec):
            out.append("netplan file " + ("missing" if digest is None else "changed"))
    return out


def management_interface(node: SparkNode) -> str | None:
    """The interface that carries the node's management address (the one ssh uses)."""
    host = node.node.host
    return next((i.name for i in node.facts.interfaces
                 if host in (a.split("/")[0] for a in i.ipv4)), None)


@dataclass
class NodeFabricArgs:
    node: SparkNode
    fabric: FabricConfig
    subnets: list[str]  # nccl.fabricSubnets
    stack: str


class NodeFabric(pulumi.ComponentResource):
    """One node's fabric interfaces in their declared state (see the module docstring)."""

    commands: dict[str, remote.Command]  # per interface (not `interfaces`: a prop of that name)

    def __init__(self, name: str, args: NodeFabricArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        node = args.node
        specs = interface_specs(node, args.fabric, args.subnets, args.stack)
        self.drift = {s.interface: drift(s, node.facts) for s in specs}
        props: NodeFabricProps = {
            "node": node.name,
            "host": node.node.host,
            "managementInterface": management_interface(node),
            "mtu": args.fabric.mtu,
            "interfaces": [{"interface": s.interface, "address": s.address, "file": s.path}
                           for s in specs],
        }
        super().__init__(types.NODE_FABRIC, name, props, opts)
        self.commands = {}
        for s in specs:
            if self.drift[s.interface]:  # say why the preview replaces it
                pulumi.log.info(f"fabric {node.name} {s.interface} is not as the stack applied "
                                f"it: {'; '.join(self.drift[s.interface])}; the up applies it",
                                resource=self)
            # a value never seen before when it drifted (the same drift twice must run twice)
            again = Again.when_wiped([rerun.fresh_trigger()] if self.drift[s.interface] else [])
            script = apply_script(s)
            self.commands[s.interface] = node.command(
                f"{name}-{s.interface}",
                self,
                create=script,
                update=script,
                delete=remove_script(s),
                triggers=again.triggers,
                ignore_changes=again.ignore_changes,
                delete_before_replace=True,
            )
        # the props again: a stack policy reads a component's outputs (rules 15 and 16)
        self.register_outputs({
            **props,
            "node": node.name,
            "applied": {i: c.stdout for i, c in self.commands.items()},
            "drift": self.drift,
        })
