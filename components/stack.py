"""build_stack: wire the components in dependency order; __main__ only calls this.

Order of things on the hosts (each arrow a dependency the engine enforces):
every node's firewall table (components/firewall.py) and the fabric pinged at the MTU between
every pair, the nodes' guard against memory exhaustion (components/guard.py; only the API vLLM
containers wait for its folder) -> stopped foreign containers, serving image on every node ->
the collective bandwidth gate (components/collective.py) -> model fetched on the
head -> fanned
out and verified on every node -> Ray head -> Ray workers -> `ray status` shows every GPU ->
the vLLM container on the head -> health gate -> the verified deployment recorded on every
node (or, when the gate failed, the last verified one put back and the up failed: issue 49) ->
NCCL's transport read from its log. With
vllm.executor mp there is no Ray: a vLLM container on every node follows the model. Each of
`spark-vllm:services` (components/vllm_service.py) follows the main model's cache: its own model,
container and gate on its nodes; nothing of the main model waits for a service. Last, the
gateway on the head (components/gateway.py): the stack's one endpoint, in front of the main
model and every service, after their gates; every vLLM listens only where it reaches them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from components import collective as collective_component
from components import gateway as gateway_component
from components import monitoring as monitoring_component
from components.collective import CollectiveGate, CollectiveGateArgs
from components.fabric import NodeFabric, NodeFabricArgs
from components.firewall import NodeFirewall, NodeFirewallArgs
from components.gateway import Gateway, GatewayArgs
from components.guard import NodeGuard, NodeGuardArgs
from components.model_cache import ModelCache, ModelCacheArgs
from components.monitoring import Monitoring, MonitoringArgs, alerting_spec, monitoring_spec
from components.nccl import NcclEnvironment, NcclEnvironmentArgs
from components.node_runtime import NodeRuntime, shm_bytes
from components.ray_cluster import RayCluster, RayClusterArgs
from components.spark_node import Cluster, SparkNode, SparkNodeArgs, write_known_hosts
from components.stack_secrets import StackSecrets, StackSecretsArgs
from components.vllm_image import VllmImage, VllmImageArgs, registry_host
from components.vllm_server import VllmServer, VllmServerArgs
from components.vllm_service import VllmService, VllmServiceArgs, restart_reasons
from config import Secrets, StackConfig
from config.listen import service_host, vllm_host
from config.ports import node_ports, public_ports
from contract import labels as lbl
from hostscripts.gateway import Route, Server
from hostscripts.paths import StackNames
from hostscripts.vllm import OomWatch
from inspection.facts import ContainerFacts, NodeFacts
from inspection.hub import ModelManifest
from inspection.preflight import Plan


def ownership_labels(project: str, stack: str) -> dict[str, str]:
    """Labels on everything the stack runs; recon treats anything without them as foreign."""
    return {lbl.MANAGED: "true", lbl.STACK: f"{project}/{stack}"}


def vllm_restart_reason(facts: Mapping[str, NodeFacts], stack_label: str) -> str | None:
    """Why the health gate must look at vLLM again although nothing in its configuration
    changed: the stack's vLLM container found not running (stopped behind the stack, or
    restarting), or one of its Ray containers (vLLM cannot serve without them; they come back
    by themselves, or with `up --refresh` when stopped by hand). None when all is well.
    """
    reasons = []
    for name, f in sorted(facts.items()):
        for c in f.docker.containers if f.docker else []:
            role = c.labels.get(lbl.ROLE)
            mine = c.labels.get(lbl.STACK) == stack_label
            if mine and role in lbl.SERVING_ROLES and c.state != "running":
                reasons.append(f"{name}: {c.name} is {c.state or 'not running'}")
    return "; ".join(reasons) or None


@dataclass
class StackHandles:
    cfg: StackConfig
    cluster: Cluster
    secrets: StackSecrets
    nccl: NcclEnvironment
    image: VllmImage
    model: ModelCache
    drafter: ModelCache | None  # model.drafter: the speculative drafter of another repo
    ray: RayCluster | None  # None with vllm.executor mp
    vllm: VllmServer
    services: dict[str, VllmService]
    gateway: Gateway
    monitoring: Monitoring | None  # monitoring.enabled
    gate: CollectiveGate
    firewalls: dict[str, NodeFirewall]  # per node (firewall.enabled)
    guards: dict[str, NodeGuard]  # guard.enabled: per node

    @property
    def nodes(self) -> dict[str, SparkNode]:
        return {n.name: n for n in self.cluster.nodes}

    def exports(self) -> dict[str, Any]:
        """What `pulumi stack output` shows (the names are part of the contract)."""
        return {
            # the gateway: the one endpoint for every model, behind the API key
            "endpoint": self.gateway.endpoint,
            "models": [r.name for r in self.gateway_routes],
            "vllmApiKey": self.secrets.api_key,  # secret: `--show-secrets` to read it
            "servedModelName": self.cfg.vllm.served_model_name,
            "modelCommit": self.model.commit,
            # model.drafter (another repo's speculative drafter): what promotion pins with the
            # model, and what `spark-vllm status` looks for on every node
            "drafter": None if self.drafter is None else {
                "repo": self.drafter.config.repo, "commit": self.drafter.commit,
                "verified": {n: c.stdout for n, c in self.drafter.verifies.items()}},
            "imageIds": self.image.image_ids,
            "imageProbe": self.image.probe_summary,  # per node: python, torch/CUDA, vllm, ray
            "fabricCheck": self.nccl.fabric_check,  # per node: each pair it pinged at the MTU
            # the collective bandwidth gate: verdict, threshold, bus bandwidth per size (GB/s)
            "collectiveGate": self.gate.summary,
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
            "ncclTransport": self.vllm.transport,  # per node, as NCCL's INFO lines show it
            # the last verified deployment of the main model (issue 49): image, commit, argv,
            # VLLM_* env, when, the gate's figures (hostscripts/payloads/deployment.py)
            "deployment": self.vllm.deployment.stdout.apply(summary),
            # spark-vllm:services, by name: what each serves (through the gateway) and its gates
            "services": {
                name: {
                    "task": s.args.service.task,
                    "repo": s.args.service.repo,  # with modelCommit: what promotion pins
                    "servedModelName": s.args.service.served_name,
                    "modelCommit": s.model.commit,
                    "health": {n: g.stdout for n, g in s.gates.items()},
                    "deployment": {n: d.stdout.apply(summary) for n, d in s.deployments.items()},
                }
                for name, s in self.services.items()
            },
            # where the gateway reaches each model's vLLM, per served name: on the nodes only
            # (loopback or fabric), for diagnosis; clients use `endpoint`
            "backends": {r.name: [f"{s.node} http://{s.address}:{s.port}" for s in r.servers]
                         for r in self.gateway_routes},
            "gateway": self.gateway.gate.stdout,  # its gate's findings
            # Prometheus on the head (monitoring.enabled): where the head reaches it, its gate
            # each node's firewall: the table its last load left (firewall.enabled)
            "firewall": {n: f.table.stdout for n, f in self.firewalls.items()},
            "monitoring": None if self.monitoring is None else {
                "url": self.monitoring.url, "alertmanager": self.monitoring.alertmanager_url,
                "health": self.monitoring.gate.stdout},
            # the nodes' guard (guard.enabled): what its commands applied, per node
            "guard": None if not self.guards else {
                name: {"killer": gd.args_killer, "applied": gd.killer.stdout,
                       "daemons": gd.daemons.stdout}
                for name, gd in self.guards.items()},
        }

    @property
    def gateway_routes(self) -> list[Route]:
        return list(self.gateway.routes)


def build_stack(
    cfg: StackConfig,
    facts: Mapping[str, NodeFacts],
    plan: Plan,
    secrets: Secrets,
    *,
    manifest: ModelManifest,
    service_manifests: Mapping[str, ModelManifest] | None = None,
    drafter_manifest: ModelManifest | None = None,
    key_path: str | None = None,
    project: str | None = None,
    stack: str | None = None,
) -> StackHandles:
    """Create every component, in the order of the module docstring.

    `facts` and `plan` come from recon and preflight; `manifest` is the model resolved at the
    hub before recon (its size fed preflight), `service_manifests` each service's, by name,
    `drafter_manifest` model.drafter's;
    `key_path` the SSH key file the docker provider's ssh transport uses (config.ssh_key_path).
    """
    project = project or pulumi.get_project()
    stack = stack or pulumi.get_stack()
    labels = ownership_labels(project, stack)
    names = StackNames(stack)  # every container name and host file of this stack
    missing = [n.name for n in cfg.nodes if n.name not in facts]
    if missing:
        raise ValueError(f"build_stack: recon returned no facts for {missing}")

    cluster = _nodes(cfg, facts, plan, secrets, labels, key_path, project, stack)
    made = StackSecrets("secrets", StackSecretsArgs(api_key=secrets.vllm_api_key))
    # the fabric the stack configures (fabric.manage), before anything checks or crosses it
    fabrics = [
        NodeFabric(f"fabric-{n.name}", NodeFabricArgs(
            node=n, fabric=cfg.fabric, subnets=cfg.nccl.fabric_subnets, stack=stack))
        for n in cluster.nodes
    ] if cfg.fabric.manage else []
    # the stack's nftables table on every node (firewall.enabled), before any of its containers
    firewalls = _firewalls(cfg, cluster, stack) if cfg.firewall.enabled else {}
    # the nodes' guard against memory exhaustion (guard.enabled): nothing waits for it but the
    # API vLLM containers, which mount its folder
    guards = {
        n.name: NodeGuard(f"guard-{n.name}", NodeGuardArgs(
            node=n, guard=cfg.guard, reserve_bytes=cfg.preflight.os_reserve_bytes, stack=stack))
        for n in cluster.nodes
    } if cfg.guard.enabled else {}
    nccl = NcclEnvironment("nccl", NcclEnvironmentArgs(
        nccl=cfg.nccl, cluster=cluster,
        configured=[c for f in fabrics for c in f.commands.values()],
        managed_mtu=cfg.fabric.mtu if cfg.fabric.manage else None))
    # the fabric proven (every pair at the MTU) before the image or the model cross it, and
    # every node's firewall loaded before any container of the stack starts
    fabric: list[pulumi.Resource] = [*nccl.fabric_checks.values(),
                                     *(f.table for f in firewalls.values())]
    image = VllmImage(
        "image",
        VllmImageArgs(
            image=cfg.image, cluster=cluster, names=names, labels=labels, rdma=cfg.nccl.rdma,
            load_format=cfg.vllm.load_format, environment=cfg.environment, after=fabric,
        ),
    )
    # the fabric proven at speed (issue 51): before the model crosses it and before Ray and vLLM
    gate = CollectiveGate("collective", CollectiveGateArgs(
        gate=cfg.fabric.collective, environment=cfg.environment, cluster=cluster, nccl=nccl,
        rdma=cfg.nccl.rdma, mtu=_fabric_mtu(cfg, facts), image_ids=image.image_ids,
        names=names, labels=labels, nofile=cfg.ray.nofile,
        nccl_builds=image.nccl.apply(lambda loaded: {
            n.name: {"vllm": (loaded.get(n.name) or {}).get("vllm"),
                     "host": [lib.model_dump(by_alias=True) for lib in n.facts.nccl_host or []]}
            for n in cluster.nodes}),
        after=[*fabric, image.check],
        configured=[c for f in fabrics for c in f.commands.values()],
        rerun=collective_component.rerun_reason(facts[cluster.head.name].collective_record_present,
                                                facts[cluster.head.name].collective_stopped)))
    model = ModelCache(
        "model",
        ModelCacheArgs(
            model=cfg.model,
            manifest=manifest,
            cluster=cluster,
            names=names,
            image_ids=image.image_ids,
            labels=labels,
            hf_token=secrets.hf_token,
            fabric_subnets=cfg.nccl.fabric_subnets,
            after=gate.done,
        ),
        opts=pulumi.ResourceOptions(depends_on=[image, *gate.done]),
    )
    drafter = _drafter(cfg, drafter_manifest, cluster, names, labels, image, model, secrets)
    fetched: list[pulumi.Resource] = [model, *([drafter] if drafter is not None else [])]
    stopped = [c for n in cluster.nodes for c in n.stopped]
    with_ray = cfg.vllm.executor == "ray"
    runtime = NodeRuntime(
        names=names, nccl=nccl, cache_dir=cfg.model.cache_dir, image_ids=image.image_ids,
        nofile=cfg.ray.nofile, ray=with_ray,
        shm_bytes=shm_bytes(cfg.ray.object_store_bytes if with_ray else None),
        vllm_port=cfg.firewall.block.vllm[0],
        firewall_probe=cfg.firewall.block.probe if firewalls else None,
        oom=OomWatch(cfg.guard.vllm_score_adj, cfg.guard.oom_backoff_seconds)
        if cfg.guard.enabled else None,
        guard_records={name: gd.records for name, gd in guards.items()})
    ray = RayCluster(
        "ray",
        RayClusterArgs(
            ray=cfg.ray,
            runtime=runtime,
            ready_timeout_seconds=min(cfg.health.timeout_seconds, 600),
            cluster=cluster,
            labels=labels,
            ray_token=made.ray_token,
            ports=cfg.firewall.block,
            after=[image, *fetched, *stopped],
        ),
    ) if with_ray else None
    vllm = VllmServer(
        "vllm",
        VllmServerArgs(
            vllm=cfg.vllm,
            health=cfg.health,
            environment=cfg.environment,
            model=cfg.model.repo,
            host=vllm_host(cfg),
            tensor_parallel_size=cfg.tensor_parallel_size,
            cluster_gpus=cfg.cluster_gpus,
            cluster=cluster,
            runtime=runtime,
            labels=labels,
            ray=ray,
            manifest=manifest,
            commit=model.commit,
            after=[] if with_ray else [image, *fetched, *stopped],
            checks_after=fetched if with_ray else [],
            # the drafter's weights load beside the model's on every rank: the memory fit
            # counts both
            model_bytes=model.model_bytes if drafter is None else pulumi.Output.all(
                model.model_bytes, drafter.model_bytes).apply(lambda b: int(b[0]) + int(b[1])),
            drafter=drafter,
            api_key=made.api_key,
            secrets=made,
            rdma=cfg.nccl.rdma,
            nccl_debug=cfg.nccl.debug,
            restart_reason=vllm_restart_reason(facts, labels[lbl.STACK]),
            image_ref=cfg.image.ref,
            service_shares={n.name: {s.name: s.gpu_memory_utilization
                                     for s in cfg.services_on(n.name)} for n in cfg.nodes},
            declared_env=sorted(k for k in cfg.nccl.extra_env if k.startswith("VLLM_")),
        ),
    )
    services = _services(cfg, facts, secrets, cluster, runtime, labels, made, fetched, vllm,
                         service_manifests or {})
    head = cluster.head
    routes = [Route(cfg.vllm.served_model_name, "generate", cfg.model.repo,
                    (Server(head.name, vllm_host(cfg), cfg.vllm.port),))]
    routes += [Route(s.served_name, s.task, s.repo,
                     tuple(Server(n, service_host(cfg, n), s.port) for n in cfg.service_nodes(s)))
               for s in cfg.services]
    gateway = Gateway(
        "gateway",
        GatewayArgs(
            gateway=cfg.gateway,
            head=head,
            names=names,
            labels=labels,
            environment=cfg.environment,
            routes=routes,
            api_key=made.api_key,
            key_file=vllm.api_key_file,
            tls_key=secrets.gateway_tls_key,
            gate_timeout_seconds=min(cfg.health.timeout_seconds, 600),
            # after every model's verified deployment (issue 49)
            after=[vllm.deployment, *(d for s in services.values()
                                      for d in s.deployments.values())],
            backends=[vllm.serve.id, vllm.health.id,
                      *(r.id for s in services.values()
                        for r in (*s.containers.values(), *s.gates.values()))],
            restart_reason=gateway_component.restart_reason(
                _containers(facts[head.name]), labels[lbl.STACK]),
        ),
    )
    monitoring = Monitoring(
        "monitoring",
        MonitoringArgs(
            monitoring=cfg.monitoring,
            nodes=cluster.nodes,
            names=names,
            labels=labels,
            environment=cfg.environment,
            spec=monitoring_spec(cfg, cluster.nodes, stack, routes),
            alerting=alerting_spec(cfg, stack, routes),
            api_key=made.api_key,
            guard=cfg.guard.enabled,
            alerting_secrets=secrets.alerting,
            gate_timeout_seconds=min(cfg.health.timeout_seconds, 600),
            after=[gateway.gate],
            firewall=[f.table for f in firewalls.values()],
            restart_reason="; ".join(filter(None, (gateway_component.restart_reason(
                _containers(facts[head.name]), labels[lbl.STACK], role=role)
                for role in (monitoring_component.ROLE,
                             monitoring_component.ALERTMANAGER_ROLE)))) or None,
            exporter_restart_reasons={n.name: gateway_component.restart_reason(
                _containers(facts[n.name]), labels[lbl.STACK],
                role=monitoring_component.EXPORTER_ROLE) for n in cluster.nodes},
        ),
    ) if cfg.monitoring.enabled else None
    return StackHandles(cfg, cluster, made, nccl, image, model, drafter, ray, vllm, services,
                        gateway, monitoring, gate, firewalls, guards)


def _fabric_mtu(cfg: StackConfig, facts: Mapping[str, NodeFacts]) -> int | None:
    """The fabric's MTU: the stack's when it configures the fabric, else the smallest recon saw
    on a declared interface (None: none seen)."""
    if cfg.fabric.manage:
        return cfg.fabric.mtu
    seen = [i.mtu for n in cfg.nodes for fi in n.fabric
            if n.name in facts and (i := facts[n.name].interface(fi.interface)) is not None]
    return min(seen) if seen else None


def _firewalls(cfg: StackConfig, cluster: Cluster, stack: str) -> dict[str, NodeFirewall]:
    """A NodeFirewall per node: the stack's ports there (config/firewall.node_ports) and who may
    reach them."""
    every = [f.ip for n in cfg.nodes for f in n.fabric]
    return {
        n.name: NodeFirewall(f"firewall-{n.name}", NodeFirewallArgs(
            node=n, stack=stack, environment=cfg.environment,
            rules=node_ports(cfg, n.name), public=public_ports(cfg, n.name),
            stack_addresses=every, head_addresses=[f.ip for f in cfg.head.fabric],
            probe=cfg.firewall.block.probe))
        for n in cluster.nodes
    }


def _drafter(cfg: StackConfig, manifest: ModelManifest | None, cluster: Cluster,
             names: StackNames, labels: Mapping[str, str], image: VllmImage, model: ModelCache,
             secrets: Secrets) -> ModelCache | None:
    """model.drafter (the speculative drafter of another repo) as the model is: fetched once at
    its commit on the head, fanned out over the fabric and verified on every node
    (components/model_cache.py, the same machinery), after the model's own copy (one seeder at a
    time on the head). None without a drafter."""
    drafter_cfg = cfg.drafter_model()
    if drafter_cfg is None:
        return None
    if manifest is None:
        raise ValueError("build_stack: model.drafter is set but no hub manifest was given")
    return ModelCache(
        "drafter",
        ModelCacheArgs(model=drafter_cfg, manifest=manifest, cluster=cluster, names=names,
                       image_ids=image.image_ids, labels=labels, hf_token=secrets.hf_token,
                       fabric_subnets=cfg.nccl.fabric_subnets),
        opts=pulumi.ResourceOptions(depends_on=[image, model]),
    )


def summary(stdout: str | None) -> Any:
    """A deployment step's stdout (the verified deployment's summary, one JSON line) as data;
    what is not JSON stays text."""
    lines = [ln for ln in (stdout or "").splitlines() if ln.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return lines[-1]


def _containers(f: NodeFacts) -> list[ContainerFacts]:
    return list(f.docker.containers) if f.docker else []


def _services(cfg: StackConfig, facts: Mapping[str, NodeFacts], secrets: Secrets,
              cluster: Cluster, runtime: NodeRuntime, labels: Mapping[str, str],
              made: StackSecrets, fetched: list[pulumi.Resource], vllm: VllmServer,
              manifests: Mapping[str, ModelManifest]) -> dict[str, VllmService]:
    """A VllmService per `services` entry. Each one's model follows the main model's (and its
    drafter's: `fetched`) and the previous service's (one seeder at a time on a node); nothing
    of the main model waits for a service."""
    missing = [s.name for s in cfg.services if s.name not in manifests]
    if missing:
        raise ValueError(f"build_stack: no hub manifest for the services {missing}")
    by_name = {n.name: n for n in cluster.nodes}
    containers = {name: f.docker.containers if f.docker else [] for name, f in facts.items()}
    out: dict[str, VllmService] = {}
    after: list[pulumi.Resource] = list(fetched)
    for svc in cfg.services:
        nodes = [by_name[n] for n in cfg.service_nodes(svc)]
        out[svc.name] = VllmService(
            f"svc-{svc.name}",
            VllmServiceArgs(
                service=svc,
                model=cfg.service_model(svc),
                manifest=manifests[svc.name],
                cluster=Cluster(head=nodes[0], workers=tuple(nodes[1:])),
                runtime=runtime,
                labels=labels,
                api_key=made.api_key,
                secrets=made,
                health=cfg.health,
                environment=cfg.environment,
                caches=vllm.caches,
                hosts={n.name: service_host(cfg, n.name) for n in nodes},
                hf_token=secrets.hf_token,
                fabric_subnets=cfg.nccl.fabric_subnets,
                after=list(after),
                restart_reasons=restart_reasons(
                    {n.name: containers.get(n.name, []) for n in nodes},
                    labels[lbl.STACK], svc.name),
                image_ref=cfg.image.ref,
            ),
        )
        after.append(out[svc.name].model)
    return out


def _nodes(
    cfg: StackConfig,
    facts: Mapping[str, NodeFacts],
    plan: Plan,
    secrets: Secrets,
    labels: Mapping[str, str],
    key_path: str | None,
    project: str,
    stack: str,
) -> Cluster:
    """A SparkNode per configured node (the first is the Ray head), with the known_hosts file
    the docker providers' ssh transport reads already written."""
    known_hosts = write_known_hosts(cfg, project, stack)
    registries = [registry_host(i.ref) for i in (cfg.image, cfg.gateway.image)
                  if i.plain_http_registry]
    nodes = [
        SparkNode(
            n.name,
            SparkNodeArgs(
                node=n,
                ssh=cfg.ssh,
                facts=facts[n.name],
                role="head" if i == 0 else "worker",
                private_key_path=key_path or cfg.ssh.private_key_path,
                known_hosts_path=str(known_hosts),
                ssh_private_key=secrets.ssh_private_key,
                stack_label=labels[lbl.STACK],
                stop_containers=plan.stop_containers.get(n.name, []),
                plain_http_registries=tuple(dict.fromkeys(registries)),
            ),
        )
        for i, n in enumerate(cfg.nodes)
    ]
    return Cluster(head=nodes[0], workers=tuple(nodes[1:]))
