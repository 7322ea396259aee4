"""VllmServer: `vllm serve` inside the head Ray container, gated on health.

vLLM with the Ray executor runs as a Ray driver on the head, inside the head Ray container. So
this is a `remote.Command` on the head, not a container: its create script stops a previous
`vllm serve` in the head container, starts the new one detached with its output in a log file,
and waits for `/health`, `/v1/models` listing the served name, and one smoke completion; on
failure it prints the log tail (hostscripts/vllm.py).

Consequences that are the point of the design:
* A vLLM flag change updates only this command (the Ray containers do not see vLLM flags),
  and so does a recipe's serve setting or chat template: the template's text travels in this
  command's script into the head container (hostscripts/vllm.py). A recipe's env is the Ray
  containers' (components/nccl.node_env).
* The script text carries the Ray container IDs, so a replaced Ray container (image or NCCL
  change) re-runs it.
* The API key travels on stdin into a root-only file in the container and reaches vLLM as
  VLLM_API_KEY: it is in no command line, no log and no plaintext state.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_command import remote

from components.nccl import PER_NODE_KEYS
from components.ray_cluster import HEAD_CONTAINER, RayCluster
from components.spark_node import Cluster
from config import HealthConfig, VllmConfig, chat_template_text
from hostscripts.common import verdict_script
from hostscripts.vllm import vllm_argv, vllm_nccl_lines, vllm_start, vllm_stop
from inspection import hub, memory_fit
from inspection.nccl_transport import parse_transport, verdict

# Env keys vLLM's Ray executor must not copy from the driver to the workers: the per-node NCCL
# values, and the API key (only the API server needs it).
NON_CARRY_OVER = (*PER_NODE_KEYS, "VLLM_API_KEY")


def serve_argv(vllm: VllmConfig, model: str, commit: str, tensor_parallel_size: int) -> list[str]:
    return vllm_argv(
        model=model,
        served_model_name=vllm.served_model_name,
        revision=commit,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=vllm.pipeline_parallel_size,
        gpu_memory_utilization=vllm.gpu_memory_utilization,
        kv_cache_memory_bytes=vllm.kv_cache_memory_bytes,
        max_model_len=vllm.max_model_len,
        max_num_seqs=vllm.max_num_seqs,
        kv_cache_dtype=vllm.kv_cache_dtype,
        enable_prefix_caching=vllm.enable_prefix_caching,
        load_format=vllm.load_format,
        speculative_config=vllm.speculative_config,
        enforce_eager=vllm.enforce_eager,
        host=vllm.host,
        port=vllm.port,
        extra_args=vllm.extra_args,
        max_num_batched_tokens=vllm.max_num_batched_tokens,
        language_model_only=vllm.language_model_only,
        enable_expert_parallel=vllm.enable_expert_parallel,
        reasoning_parser=vllm.reasoning_parser,
        tool_call_parser=vllm.tool_call_parser,
        enable_auto_tool_choice=vllm.enable_auto_tool_choice,
        chat_template=vllm.chat_template is not None,
    )


def serve_chat_template(vllm: VllmConfig) -> str | None:
    """The text of the chat template vLLM is given (shipped in config/recipes_data/), or None
    for the model's own."""
    return chat_template_text(vllm.chat_template) if vllm.chat_template is not None else None


def local_url(vllm: VllmConfig) -> str:
    host = "127.0.0.1" if vllm.host == "0.0.0.0" else vllm.host
    return f"http://{host}:{vllm.port}"


@dataclass
class VllmServerArgs:
    vllm: VllmConfig
    health: HealthConfig
    environment: str
    model: str  # the HF repo id vLLM serves
    tensor_parallel_size: int
    cluster_gpus: int
    cluster: Cluster
    ray: RayCluster
    commit: pulumi.Input[str]
    model_bytes: pulumi.Input[int]
    api_key: pulumi.Output[str]  # configured or generated (StackSecrets): vLLM never serves open
    rdma: bool = False  # nccl.rdma: a TCP fallback of NCCL is then a finding
    nccl_debug: str = "WARN"
    after: list[pulumi.Resource] = field(default_factory=list)
    # recon's reason to start vLLM again with unchanged flags (stack.vllm_restart_reason)
    restart_reason: str | None = None


class VllmServer(pulumi.ComponentResource):
    serve: remote.Command
    nccl_log: remote.Command
    transport_check: remote.Command
    transport: pulumi.Output[dict[str, str]]
    endpoint: pulumi.Output[str]
    argv: pulumi.Output[list[str]]

    def __init__(
        self, name: str, args: VllmServerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        props = self._props(args)
        super().__init__("spark-vllm:vllm_server:VllmServer", name, props, opts)
        v = args.vllm
        self.argv = pulumi.Output.from_input(args.commit).apply(
            lambda c: serve_argv(v, args.model, c, args.tensor_parallel_size)
        )
        create = pulumi.Output.all(self.argv, args.ray.container_ids).apply(
            lambda a: vllm_start(
                HEAD_CONTAINER,
                a[0],
                local_url(v),
                v.served_model_name,
                args.health.smoke_prompt,
                args.health.timeout_seconds,
                a[1],
                NON_CARRY_OVER,
                chat_template=serve_chat_template(v),
            )
        )
        # Recon's reason to start vLLM again with unchanged flags travels in `triggers`, not in
        # the script: the script would change back once vLLM runs again and cost one more
        # (idempotent) run. When there is no reason, ignore_changes keeps whatever marker the
        # state holds, so nothing diffs. (Not `environment`: pulumi-command fails a command
        # whose variables the node's sshd does not AcceptEnv.) A new marker replaces the
        # command: its delete stops vLLM, then its create starts it (delete_before_replace, so
        # the old command's delete cannot stop the new vLLM).
        if args.restart_reason is None:
            marker, ignore = "none", ["triggers"]
        else:
            marker, ignore = f"{args.restart_reason} @{time.time_ns()}", None
        api_key = args.api_key
        self.serve = args.cluster.head.command(
            f"{name}-serve",
            self,
            create=create,
            delete=vllm_stop(HEAD_CONTAINER),
            stdin=api_key,
            triggers=[marker],
            depends_on=[args.ray.ready, *args.ray.workers.values(), args.ray.head, *args.after],
            ignore_changes=ignore,
            delete_before_replace=True,
            secret_outputs=["stdin"],
            timeout_seconds=args.health.timeout_seconds + 300,
        )
        self._transport(name, args, create)
        public = args.cluster.head.node.host if v.host == "0.0.0.0" else v.host
        self.endpoint = pulumi.Output.from_input(f"http://{public}:{v.port}/v1")
        # The reviewable props are outputs too: stack-level policies (vllm-api-key) see a
        # component's registered outputs, not the inputs that resource-level policies see.
        self.register_outputs(
            {
                **props,
                "endpoint": self.endpoint,
                "servedModelName": v.served_model_name,
                "health": self.serve.stdout,
                "ncclTransport": self.transport,
            }
        )

    def _transport(self, name: str, args: VllmServerArgs, serve_text: pulumi.Output[str]) -> None:
        """After the health gate: which transport NCCL chose on every node, read from the
        running vLLM's log (inspection/nccl_transport.py). With nccl.rdma a TCP fallback fails
        the `up` outside dev and warns in dev. Runs again whenever vLLM was started again (its
        script's hash is in the text)."""
        head = args.cluster.head
        names = {f.ip: n.name for n in args.cluster.nodes for f in n.node.fabric}
        self.nccl_log = head.command(
            f"{name}-nccl-log",
            self,
            create=pulumi.Output.all(serve_text, self.serve.id).apply(
                lambda a: vllm_nccl_lines(
                    HEAD_CONTAINER, hashlib.sha256(f"{a[0]}\n{a[1]}".encode()).hexdigest()[:16]
                )
            ),
            logging=remote.Logging.STDERR,  # the lines are kept in its stdout, not logged
            depends_on=[self.serve],
        )
        judged = self.nccl_log.stdout.apply(
            lambda text: verdict(
                parse_transport(text or "", head.fabric_ip),
                names=names,
                rdma=args.rdma,
                strict=args.environment != "dev",
                nccl_debug=args.nccl_debug,
            )
        )
        self.transport = judged.apply(lambda v: v.lines)
        self.transport_check = head.command(
            f"{name}-transport",
            self,
            create=judged.apply(
                lambda v: verdict_script(
                    "nccl transport",
                    [f"{n}: {line}" for n, line in sorted(v.lines.items())],
                    v.problems,
                    v.warnings,
                )
            ),
        )

    @staticmethod
    def _props(args: VllmServerArgs) -> dict[str, Any]:
        """What the policy pack reviews (memory fit, parallelism, API key, ...)."""
        v = args.vllm
        props: dict[str, Any] = {
            "environment": args.environment,
            "tensorParallelSize": args.tensor_parallel_size,
            "pipelineParallelSize": v.pipeline_parallel_size,
            "clusterGpus": args.cluster_gpus,
            "gpuMemoryUtilization": v.gpu_memory_utilization,
            "maxModelLen": v.max_model_len,
            "kvCacheDtype": v.kv_cache_dtype,
            "enforceEager": v.enforce_eager,
            "modelBytes": args.model_bytes,
            "servedModelName": v.served_model_name,
            "host": v.host,
            "port": v.port,
            "nodes": [
                {
                    "name": n.name,
                    "memTotalBytes": n.facts.memory.total_bytes,
                    "unifiedMemory": n.facts.memory.unified,
                }
                for n in args.cluster.nodes
            ],
        }
        if v.kv_cache_memory_bytes is not None:  # the KV cache size the policy's memory fit uses
            props["kvCacheMemoryBytes"] = v.kv_cache_memory_bytes
        props["maxNumSeqs"] = v.max_num_seqs
        # memory-fit's numbers per rank: inspection/memory_fit.estimate (what preflight uses too)
        # on the shape the hub read from this commit's config.json. The pack runs in its own
        # virtualenv and cannot import the program, so the numbers travel as props.
        tp = args.tensor_parallel_size

        def fit(values: list[Any]) -> dict[str, Any]:
            commit, model_bytes = values
            manifest = hub.known_manifest(args.model, commit)
            return memory_fit.estimate(
                manifest.shape if manifest is not None else None,
                model_bytes=int(model_bytes) if model_bytes else None,
                tensor_parallel_size=tp, pipeline_parallel_size=v.pipeline_parallel_size,
                max_model_len=v.max_model_len, max_num_seqs=v.max_num_seqs,
                kv_cache_dtype=v.kv_cache_dtype, speculative_config=v.speculative_config,
                prefix_caching=v.enable_prefix_caching,
            ).props()

        props["memoryFit"] = pulumi.Output.all(args.commit, args.model_bytes).apply(fit)
        props["apiKey"] = pulumi.Output.secret(args.api_key)
        return props
