"""VllmService: one more model beside the main one (`spark-vllm:services`), e.g. an embedding
model or a reranker next to the 122B model, on the nodes the service names.

Per service:
* its model at one commit in those nodes' HF cache (a ModelCache of their own: the hub once, the
  other nodes over the fabric), after the main model's, so the seeders never meet;
* per node, a supervised vLLM container (`unless-stopped`) of the stack's image, tensor parallel
  1, on the host network at the service's port, listening only where the gateway reaches it
  (127.0.0.1 on the head, the node's fabric address elsewhere: config/listen.service_host),
  with the flags its task needs (hostscripts/vllm.TASK_FLAGS), named by stack and service
  (`spark-vllm-<stack>-<service>`);
  its API key (the stack's) in a root-only file of the service's own folder on that node, so
  adding or removing a service touches no file or container of the main model's;
* per node, a health gate on the endpoint the task uses: a completion (generate), an embedding
  of the model's hidden size (embed) or two scores (score), run in the service's container.

Nothing of the main model depends on a service: adding one creates only its resources (and
changes the gateway's routing), removing one deletes only them, a change of its flags or
revision replaces only its container (and moves only its files). Clients reach it through the
gateway (components/gateway.py), by its served name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.deployment import deployment_steps, restore_labels, restored_removal
from components.model_cache import ModelCache, ModelCacheArgs
from components.node_runtime import NodeRuntime
from components.rerun import Again
from components.spark_node import Cluster, SparkNode
from components.stack_secrets import StackSecrets
from components.vllm_server import model_file_problem
from config import HealthConfig, ModelConfig, ServiceConfig, chat_template_text
from contract import labels as lbl
from contract import types
from contract.props import VllmServiceProps
from hostscripts.deployment import GateRestore, GateVerdict, Held, NodeDeployment, summary_facts
from hostscripts.paths import VLLM_KEY
from hostscripts.vllm import (
    CHAT_TEMPLATE,
    TASK_FLAGS,
    api_key_write,
    service_key_remove,
    vllm_argv,
    vllm_deployment_final,
    vllm_health_gate,
    watched_entrypoint,
)
from inspection import memory_fit
from inspection.hub import ModelManifest


def service_argv(svc: ServiceConfig, commit: str, host: str) -> list[str]:
    """`vllm serve` for a service: its serve keys (config/serve.py, SERVICE), tensor parallel 1
    on its node in one process (`uni`), listening on `host` only (config/listen.service_host:
    loopback on the head, the node's fabric address elsewhere, where the gateway reaches it),
    its task's flags first among the extra args. The keys a service cannot set keep the main
    model's defaults (config refuses them in a service)."""
    settings = svc.model_copy(update={"tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                                      "host": host,
                                      "extra_args": [*TASK_FLAGS[svc.task], *svc.extra_args]})
    return vllm_argv(settings, model=svc.repo, commit=commit, backend="uni")


def expected_dimension(svc: ServiceConfig, manifest: ModelManifest) -> int:
    """The length an embedding must have: the model's hidden size, unless a sentence-transformers
    Dense module projects it (then any non-empty vector is accepted; 0)."""
    if svc.task != "embed" or any("Dense" in f.path for f in manifest.files):
        return 0
    return (manifest.shape.hidden_size if manifest.shape is not None else None) or 0


def restart_reasons(facts_containers: Mapping[str, Sequence[Any]], stack_label: str,
                    service: str) -> dict[str, str | None]:
    """Per node: why the service's gate must run again with unchanged flags (its container found
    not running), else None. `facts_containers`: recon's containers per node."""
    out: dict[str, str | None] = {}
    for node, containers in facts_containers.items():
        bad = [f"{c.name} is {c.state or 'not running'}" for c in containers
               if c.labels.get(lbl.STACK) == stack_label
               and c.labels.get(lbl.SERVICE) == service and c.state != "running"]
        out[node] = "; ".join(bad) or None
    return out


@dataclass
class VllmServiceArgs:
    service: ServiceConfig
    model: ModelConfig  # cfg.service_model(service): the service's repo in the main cache
    manifest: ModelManifest  # resolved at the hub before any resource
    cluster: Cluster  # the service's nodes (the first fetches from the hub)
    runtime: NodeRuntime  # with the stack's names (runtime.names)
    labels: Mapping[str, str]  # managed + stack
    api_key: pulumi.Output[str]
    secrets: StackSecrets  # its api_key_label (an HMAC under the stack's label key)
    health: HealthConfig
    environment: str
    caches: Mapping[str, pulumi.Resource]  # the compile-cache folder per node (a bind mount)
    hosts: Mapping[str, str]  # per node, where its vLLM listens (config/listen.service_host)
    hf_token: pulumi.Output[str] | None = None
    fabric_subnets: Sequence[str] = ()
    after: list[pulumi.Resource] = field(default_factory=list)  # the main model's cache, ...
    restart_reasons: Mapping[str, str | None] = field(default_factory=dict)
    image_ref: str = ""  # the image as the stack names it (the verified deployment's summary)


class VllmService(pulumi.ComponentResource):
    args: VllmServiceArgs
    model: ModelCache
    containers: dict[str, docker.Container]
    gates: dict[str, remote.Command]
    deployments: dict[str, remote.Command]  # per node: its summary, or the up's failure
    direct_urls: dict[str, str]  # per node, where the gateway reaches its vLLM

    def __init__(
        self, name: str, args: VllmServiceArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        problem = model_file_problem(args.service.reasoning_parser_plugin, args.manifest,
                                     f"services[{args.service.name}].reasoningParserPlugin")
        if problem is not None:
            raise ValueError(problem)
        props = self._props(args)
        super().__init__(types.VLLM_SERVICE, name, props, opts)
        svc = args.service
        self.args = args
        names = args.runtime.names
        self.container_name = names.service(svc.name)
        self.key_file = names.service_key_file(svc.name)
        self.model = ModelCache(
            f"{name}-model",
            ModelCacheArgs(model=args.model, manifest=args.manifest, cluster=args.cluster,
                           names=names,
                           image_ids=args.runtime.image_ids, labels=args.labels,
                           hf_token=args.hf_token, fabric_subnets=args.fabric_subnets),
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.after),
        )
        self.containers, self.gates, self.deployments, self.direct_urls = {}, {}, {}, {}
        for node in args.cluster.nodes:
            key = node.command(
                f"{name}-api-key-{node.name}",
                self,
                create=api_key_write(self.key_file),
                delete=service_key_remove(names, svc.name),
                stdin=args.api_key,
                secret_outputs=["stdin", "stdout"],
                logging=remote.Logging.STDERR,
                delete_before_replace=True,
            )
            self.direct_urls[node.name] = f"http://{args.hosts[node.name]}:{svc.port}"
            container = self._container(f"{name}-serve-{node.name}", args, node, key)
            self.containers[node.name] = container
            part = NodeDeployment(names.deployment_dir(svc.name), (
                Held(self.container_name, (CHAT_TEMPLATE,) if svc.chat_template else ()),))
            self.gates[node.name] = self._gate(f"{name}-health-{node.name}", args, node,
                                               container, part)
            self.deployments[node.name] = self._deployment(name, args, node,
                                                           part)
        self.register_outputs({
            **props,
            "directUrls": self.direct_urls,
            "containers": {n: c.name for n, c in self.containers.items()},
            "health": {n: g.stdout for n, g in self.gates.items()},
            "deployment": {n: d.stdout for n, d in self.deployments.items()},
        })

    def _container(self, res_name: str, args: VllmServiceArgs, node: SparkNode,
                   key: remote.Command) -> docker.Container:
        svc = args.service
        runtime = dataclasses.replace(args.runtime, ray=False)  # no Ray in a service
        labels = {**args.labels, lbl.ROLE: lbl.VLLM_SERVICE,
                  lbl.SERVICE: svc.name, lbl.NODE: node.name,
                  lbl.PORT: str(svc.port)}
        mounts = [*runtime.mounts(), docker.ContainerMountArgs(
            target=VLLM_KEY, type="bind", source=self.key_file, read_only=True)]
        watchdog = args.health.liveness.enabled  # it reads the node's guard folder
        if watchdog:
            mounts += runtime.guard_mounts(node)
        template = chat_template_text(svc.chat_template) if svc.chat_template else None
        after: list[pulumi.Resource] = [self.model, key, args.caches[node.name]]
        # a container a restore put back under this name goes first (components/deployment.py)
        after += restored_removal(res_name, self, node, self.container_name,
                                  args.labels[lbl.STACK], after)
        return docker.Container(
            res_name,
            name=self.container_name,
            # restarted when it stops serving (payloads/vllm_liveness.py)
            entrypoints=watched_entrypoint(self.direct_urls[node.name], svc.served_name,
                                           svc.task, args.health.liveness, runtime.oom),
            command=self.model.commit.apply(
                lambda c: service_argv(svc, c, args.hosts[node.name])),
            envs=[f"{k}={v}" for k, v in sorted(runtime.vllm_env(node).items())],
            mounts=mounts,
            uploads=[docker.ContainerUploadArgs(file=CHAT_TEMPLATE, content=template)]
            if template is not None else None,
            labels=[
                *(docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())),
                docker.ContainerLabelArgs(label="spark-vllm.api-key",
                                          value=args.secrets.api_key_label(key.stdout)),
                *(runtime.guard_labels(node) if watchdog else []),
                # a restore's id when recon found it put back by one (components/deployment.py)
                *restore_labels(node, self.container_name, args.labels[lbl.STACK]),
            ],
            destroy_grace_seconds=60,
            **runtime.runtime(node),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.provider,
                # its name, and its port and GPU on the host network: the old one goes first
                delete_before_replace=True,
                depends_on=[*after, *(runtime.guard_after(node) if watchdog else [])],
            ),
        )

    def _gate(self, res_name: str, args: VllmServiceArgs, node: SparkNode,
              container: docker.Container, part: NodeDeployment) -> remote.Command:
        """The task's endpoint answers (run in the service's own container: the gate fails as
        soon as vLLM exits). A container found stopped behind the stack gets a fresh marker."""
        svc, health = args.service, args.health
        reason = args.restart_reasons.get(node.name)
        restart = Again.because(reason)
        dim = expected_dimension(svc, args.manifest)
        return node.command(
            res_name,
            self,
            create=container.id.apply(lambda i: vllm_health_gate(
                self.container_name, self.container_name, i,
                f"http://{args.hosts[node.name]}:{svc.port}",
                svc.served_name, health.smoke_prompt, health.timeout_seconds,
                task=svc.task, dimension=dim, key_file=self.key_file,
                deployment=GateRestore(node=part, api=self.container_name,
                                       shape={node.name: [self.container_name]},
                                       on_failure=health.on_failure))),
            triggers=restart.triggers,
            ignore_changes=restart.ignore_changes,
            delete_before_replace=True,
            depends_on=[container],
            timeout_seconds=health.timeout_seconds + 300,
        )

    def _deployment(self, prefix: str, args: VllmServiceArgs, node: SparkNode,
                    part: NodeDeployment) -> remote.Command:
        """After the node's gate (issue 49): the service's summary on this node, or the `up`'s
        failure with its last verified container put back (components/deployment.py)."""
        svc, health = args.service, args.health
        dim = expected_dimension(svc, args.manifest)

        def final(verdict: GateVerdict, others: dict[str, str], commit: str) -> str:
            return vllm_deployment_final(
                part, verdict, others, api_container=self.container_name,
                probe_container=self.container_name, health_url=self.direct_urls[node.name],
                served_model_name=svc.served_name, smoke_prompt=health.smoke_prompt,
                timeout=health.timeout_seconds, task=svc.task, dimension=dim,
                key_file=self.key_file,
                facts=summary_facts(image=args.image_ref, repo=svc.repo, commit=commit,
                                    served_name=svc.served_name,
                                    shape={node.name: [self.container_name]}, drafter=None))

        _, done = deployment_steps(
            prefix, self, self.gates[node.name], node, {node.name: (node, part)},
            args.runtime.names, final, timeout_seconds=health.timeout_seconds + 300,
            extra=[self.model.commit])
        return done

    @staticmethod
    def _props(args: VllmServiceArgs) -> VllmServiceProps:
        """What the policy pack reviews: the memory fit of this service's share on each of its
        nodes (policies/rules/memory.py, the same shape as the VllmServer's props)."""
        svc, m = args.service, args.manifest
        fit = memory_fit.estimate(
            m.shape, model_bytes=m.total_bytes or None, tensor_parallel_size=1,
            max_model_len=svc.max_model_len, max_num_seqs=svc.max_num_seqs,
            kv_cache_dtype=svc.kv_cache_dtype, prefix_caching=svc.enable_prefix_caching,
        )
        props: VllmServiceProps = {
            "environment": args.environment,
            "service": svc.name,
            "task": svc.task,
            "repo": svc.repo,
            "revision": svc.revision,
            "commit": m.commit,
            "servedModelName": svc.served_name,
            "port": svc.port,
            "hosts": dict(args.hosts),
            "tensorParallelSize": 1,
            "pipelineParallelSize": 1,
            "gpuMemoryUtilization": svc.gpu_memory_utilization,
            "maxModelLen": svc.max_model_len,
            "maxNumSeqs": svc.max_num_seqs,
            "kvCacheDtype": svc.kv_cache_dtype,
            "modelBytes": m.total_bytes,
            "memoryFit": fit.props(),
            "nodes": [{"name": n.name, "memTotalBytes": n.facts.memory.total_bytes,
                       "unifiedMemory": n.facts.memory.unified} for n in args.cluster.nodes],
            "apiKey": pulumi.Output.secret(args.api_key),
        }
        if svc.kv_cache_memory_bytes is not None:
            props["kvCacheMemoryBytes"] = svc.kv_cache_memory_bytes
        if svc.trust_remote_code:  # the code it runs: policies/rules/remote_code.py
            props["trustRemoteCode"] = True
            props["remoteCode"] = [{"repo": svc.repo, "commit": m.commit}]
        return props
