"""What the stack opens on each node, and who may reach it (config/firewall.py says why the
stack filters its own ports; components/firewall.py loads the rules made from this table).

`node_ports(cfg, node)` is the one table of the stack's ports on a node: the source of the
firewall's rules, of the policy pack's props (NodeFirewall) and of the docs' table of ports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from config.firewall import PortRule
from config.forms import IMAGE_SEED_PORT, MODEL_SEED_PORT

if TYPE_CHECKING:
    from config.models import StackConfig


def node_ports(cfg: StackConfig, node: str) -> list[PortRule]:
    """What the stack opens on `node`, rule by rule (see the module docstring). Not here: sshd
    (always admitted) and the gateway (public, on the head): `public_ports`."""
    block = cfg.firewall.block
    head = node == cfg.head.name
    rules: list[PortRule] = []
    if cfg.vllm.executor == "ray":
        ray: list[int | tuple[int, int]] = []
        if head:
            ray += [cfg.ray.port, block.client_server, block.autoscaler_metrics,
                    block.dashboard_metrics]
            if cfg.ray.dashboard:
                ray.append(block.dashboard)
        ray += [block.node_manager, block.object_manager, block.runtime_env_agent,
                block.dashboard_agent_grpc, block.dashboard_agent_http, block.metrics_export,
                block.workers]
        rules.append(PortRule("ray", tuple(ray), "stack"))
    multi_mp = cfg.vllm.executor == "mp" and len(cfg.nodes) > 1
    if head:
        # the API: on loopback (the gateway's backend), with mp on more than one node on the
        # head's fabric address, where the other ranks watch its /health
        rules.append(PortRule("vllm", (cfg.vllm.port,), "stack" if multi_mp else "loopback"))
        if multi_mp:
            rules.append(PortRule("vllm-rendezvous", (cfg.vllm.master_port,), "stack"))
    gate = cfg.fabric.collective
    if head and gate.enabled and len(cfg.nodes) > 1:
        # the collective gate's rendezvous (torchrun's store on the head's fabric address),
        # while its ranks run (components/collective.py)
        rules.append(PortRule("collective", (gate.port,), "stack"))
    # VLLM_PORT on every node: the Ray executor's driver (the head) and its workers' processes
    # (every Ray node), every mp rank
    rules.append(PortRule("vllm-internal", (block.vllm,), "stack"))
    for svc in cfg.services:
        if node in cfg.service_nodes(svc):
            rules.append(PortRule(f"service-{svc.name}", (svc.port,), "head"))
    # the model seeder on the first node of each model (the head's, a service's first node),
    # the image seeder on the head: only while a copy runs, but always named
    rules.append(PortRule("seeders", (IMAGE_SEED_PORT, MODEL_SEED_PORT), "stack"))
    m = cfg.monitoring
    if m.enabled:
        if head:
            rules.append(PortRule("prometheus", (m.port,),
                                  "stack" if m.listen == "fabric" else "loopback"))
        rules.append(PortRule("node-exporter", (m.node_exporter_port,), "head"))
    return rules


def public_ports(cfg: StackConfig, node: str) -> list[int]:
    """The stack's ports every address may reach on `node`: the gateway's, on the head."""
    return [cfg.gateway.port] if node == cfg.head.name else []


def declared_ports(cfg: StackConfig) -> dict[int, str]:
    """Every port the stack config names (outside the pinned block), with its key: none of them
    may fall inside the block."""
    out: dict[int, str] = {}
    for i, n in enumerate(cfg.nodes):
        out.setdefault(n.port, f"spark-vllm:nodes[{i}].port (sshd on {n.name})")
    out.setdefault(cfg.ray.port, "spark-vllm:ray.port")
    out.setdefault(cfg.vllm.port, "spark-vllm:vllm.port")
    if cfg.vllm.executor == "mp":
        out.setdefault(cfg.vllm.master_port, "spark-vllm:vllm.masterPort")
    out.setdefault(cfg.gateway.port, "spark-vllm:gateway.port")
    if cfg.fabric.collective.enabled:
        out.setdefault(cfg.fabric.collective.port, "spark-vllm:fabric.collective.port")
    for i, svc in enumerate(cfg.services):
        out.setdefault(svc.port, f"spark-vllm:services[{i}].port")
    if cfg.monitoring.enabled:
        out.setdefault(cfg.monitoring.port, "spark-vllm:monitoring.port")
        out.setdefault(cfg.monitoring.node_exporter_port, "spark-vllm:monitoring.nodeExporterPort")
    out.setdefault(IMAGE_SEED_PORT, "the image seeder's")
    out.setdefault(MODEL_SEED_PORT, "the model seeder's")
    return out
