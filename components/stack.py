"""build_stack: wire the components in dependency order; __main__ only calls this.

Order of things on the hosts (each arrow a dependency the engine enforces):
stopped foreign containers, serving image on every node -> model fetched on the head -> fanned
out and verified on every node -> Ray head -> Ray workers -> `ray status` shows every GPU ->
`vllm serve` in the head container -> health gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from components.config import Secrets, StackConfig
from components.facts import ContainerFacts, NodeFacts
from components.model_cache import ModelCache, ModelCacheArgs, ModelManifest
from components.nccl import NcclEnvironment, NcclEnvironmentArgs
from components.ray_cluster import RayCluster, RayClusterArgs
from components.spark_node import SparkNode, SparkNodeArgs, write_known_hosts
from components.vllm_image import VllmImage, VllmImageArgs, registry_host
from components.vllm_server import VllmServer, VllmServerArgs


def ownership_labels(project: str, stack: str) -> dict[str, str]:
    """Labels on everything the stack runs; recon treats anything without them as foreign."""
    return {"spark-vllm.managed": "true", "spark-vllm.stack": f"{project}/{stack}"}


def vllm_restart_reason(facts: dict[str, NodeFacts], stack_label: str) -> str:
    """Why `vllm serve` must start again although nothing in its configuration changed.

    A stack Ray container that recon finds stopped (this up will start it again) or a dead
    `vllm serve` in the head container: vLLM does not survive losing a tensor-parallel worker,
    and starting the container again does not bring vLLM back. "none" when all is well.
    """
    reasons = []
    for name, f in sorted(facts.items()):
        for c in f.docker.containers if f.docker else []:
            role = c.labels.get("spark-vllm.role")
            mine = c.labels.get("spark-vllm.stack") == stack_label
            if mine and role in ("ray-head", "ray-worker") and c.state != "running":
                reasons.append(f"{name}: {c.name} is {c.state or 'not running'}")
        reasons += [
            f"{name}: vllm serve is not running in {c}"
            for c, alive in sorted(f.vllm_serve.items())
            if not alive
        ]
    return "; ".join(reasons) or "none"


@dataclass
class StackHandles:
    cfg: StackConfig
    nodes: dict[str, SparkNode]
    nccl: NcclEnvironment
    image: VllmImage
    model: ModelCache
    ray: RayCluster
    vllm: VllmServer

    def exports(self) -> dict[str, Any]:
        """What `pulumi stack output` shows (the names are part of the contract)."""
        return {
            "endpoint": self.vllm.endpoint,
            "servedModelName": self.cfg.vllm.served_model_name,
            "modelCommit": self.model.commit,
            "imageIds": self.image.image_ids,
            "nodes": {
                name: {
                    "role": n.role,
                    "host": n.node.host,
                    "fabricIp": n.fabric_ip,
                    "imageId": self.image.image_ids[name],
                    "stoppedContainers": n.stopped_names,
                }
                for name, n in self.nodes.items()
            },
            "recon": {name: n.summary for name, n in self.nodes.items()},
        }


def build_stack(
    cfg: StackConfig,
    facts: dict[str, NodeFacts],
    plan: Any,
    secrets: Secrets,
    project: str | None = None,
    stack: str | None = None,
    *,
    manifest: ModelManifest | None = None,
    key_path: str | None = None,
) -> StackHandles:
    """Create every component. `plan` is preflight's Plan (`stop_containers` per node).

    `manifest` is the model resolved on the hub before recon (its size feeds preflight);
    `key_path` the SSH key file the docker provider's ssh transport uses (config.ssh_key_path).
    """
    project = project or pulumi.get_project()
    stack = stack or pulumi.get_stack()
    labels = ownership_labels(project, stack)
    known_hosts = write_known_hosts(cfg, project, stack)
    stop: dict[str, list[ContainerFacts]] = dict(getattr(plan, "stop_containers", None) or {})

    missing = [n.name for n in cfg.nodes if n.name not in facts]
    if missing:
        raise ValueError(f"build_stack: recon returned no facts for {missing}")

    nodes: dict[str, SparkNode] = {}
    for i, n in enumerate(cfg.nodes):
        nodes[n.name] = SparkNode(
            n.name,
            SparkNodeArgs(
                node=n,
                facts=facts[n.name],
                role="head" if i == 0 else "worker",
                private_key_path=key_path or cfg.ssh.private_key_path,
                connect_timeout_seconds=cfg.ssh.connect_timeout_seconds,
                known_hosts_path=str(known_hosts),
                ssh_private_key=secrets.ssh_private_key,
                stack_label=labels["spark-vllm.stack"],
                stop_containers=stop.get(n.name, []),
                plain_http_registry=(
                    registry_host(cfg.image.ref) if cfg.image.plain_http_registry else None
                ),
            ),
        )
    ordered = [nodes[n.name] for n in cfg.nodes]

    nccl = NcclEnvironment("nccl", NcclEnvironmentArgs(cfg=cfg, facts=facts))
    image = VllmImage(
        "image", VllmImageArgs(ref=cfg.image.ref, source=cfg.image.source, nodes=ordered)
    )
    model = ModelCache(
        "model",
        ModelCacheArgs(
            repo=cfg.model.repo,
            revision=cfg.model.revision,
            cache_dir=cfg.model.cache_dir,
            endpoint=cfg.model.endpoint,
            nodes=ordered,
            image_ids=image.image_ids,
            labels=labels,
            hf_token=secrets.hf_token,
            manifest=manifest,
        ),
        opts=pulumi.ResourceOptions(depends_on=[image]),
    )
    stopped = [c for n in ordered for c in n.stopped]
    ray = RayCluster(
        "ray",
        RayClusterArgs(
            cfg=cfg,
            nodes=ordered,
            image_ids=image.image_ids,
            nccl=nccl,
            labels=labels,
            after=[image, model, *stopped],
        ),
    )
    vllm = VllmServer(
        "vllm",
        VllmServerArgs(
            cfg=cfg,
            head=ordered[0],
            nodes=ordered,
            ray=ray,
            commit=model.commit,
            model_bytes=model.model_bytes,
            api_key=secrets.vllm_api_key,
            restart_reason=vllm_restart_reason(facts, labels["spark-vllm.stack"]),
        ),
    )
    return StackHandles(cfg, nodes, nccl, image, model, ray, vllm)
