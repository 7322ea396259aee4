"""VllmServer: `vllm serve` inside the head Ray container, gated on health.

vLLM with the Ray executor must run inside the head Ray container (field notes 2.7: a separate
container joining via `ray://` does not work for TP). So this is a `remote.Command` on the head,
not a container: its create script stops a previous `vllm serve` in the head container, starts
the new one detached with its output in a log file, and waits for `/health`, `/v1/models`
listing the served name, and one smoke completion; on failure it prints the log tail.

Consequences that are the point of the design:
* A vLLM flag change updates only this command (the Ray containers do not see vLLM flags).
* The script text carries the Ray container IDs, so a replaced Ray container (image or NCCL
  change) re-runs it.
* The API key travels on stdin into a root-only file in the container and reaches vLLM as
  VLLM_API_KEY: it is in no command line, no log and no plaintext state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pulumi
from pulumi_command import remote

from components import nccl, scripts
from components.config import StackConfig
from components.ray_cluster import HEAD_CONTAINER, RayCluster
from components.spark_node import SparkNode



def serve_argv(cfg: StackConfig, commit: str) -> list[str]:
    v = cfg.vllm
    return scripts.vllm_argv(
        model=cfg.model.repo,
        served_model_name=v.served_model_name,
        revision=commit,
        tensor_parallel_size=cfg.tensor_parallel_size,
        pipeline_parallel_size=v.pipeline_parallel_size,
        gpu_memory_utilization=v.gpu_memory_utilization,
        max_model_len=v.max_model_len,
        max_num_seqs=v.max_num_seqs,
        kv_cache_dtype=v.kv_cache_dtype,
        enable_prefix_caching=v.enable_prefix_caching,
        load_format=v.load_format,
        speculative_config=v.speculative_config,
        enforce_eager=v.enforce_eager,
        host=v.host,
        port=v.port,
        extra_args=v.extra_args,
    )


def local_url(cfg: StackConfig) -> str:
    host = "127.0.0.1" if cfg.vllm.host == "0.0.0.0" else cfg.vllm.host
    return f"http://{host}:{cfg.vllm.port}"


@dataclass
class VllmServerArgs:
    cfg: StackConfig
    head: SparkNode
    nodes: list[SparkNode]
    ray: RayCluster
    commit: pulumi.Input[str]
    model_bytes: pulumi.Input[int]
    api_key: pulumi.Output[str] | None = None
    after: list[pulumi.Resource] = field(default_factory=list)
    # recon's reason to start vLLM again with unchanged flags (stack.vllm_restart_reason)
    restart_reason: str = "none"


class VllmServer(pulumi.ComponentResource):
    serve: remote.Command
    endpoint: pulumi.Output[str]
    argv: pulumi.Output[list[str]]
    depends_on: dict[str, list[pulumi.Resource]]

    def __init__(self, name: str, args: VllmServerArgs, opts: pulumi.ResourceOptions | None = None):
        cfg = args.cfg
        props = {
            "environment": cfg.environment,
            "tensorParallelSize": cfg.tensor_parallel_size,
            "pipelineParallelSize": cfg.vllm.pipeline_parallel_size,
            "clusterGpus": cfg.cluster_gpus,
            "gpuMemoryUtilization": cfg.vllm.gpu_memory_utilization,
            "maxModelLen": cfg.vllm.max_model_len,
            "kvCacheDtype": cfg.vllm.kv_cache_dtype,
            "enforceEager": cfg.vllm.enforce_eager,
            "modelBytes": args.model_bytes,
            "servedModelName": cfg.vllm.served_model_name,
            "host": cfg.vllm.host,
            "port": cfg.vllm.port,
            "nodes": [
                {
                    "name": n.name,
                    "memTotalBytes": n.facts.memory.total_bytes,
                    "unifiedMemory": n.facts.memory.unified,
                }
                for n in args.nodes
            ],
        }
        if args.api_key is not None:
            props["apiKey"] = pulumi.Output.secret(args.api_key)
        super().__init__("spark-vllm:vllm_server:VllmServer", name, props, opts)

        self.argv = pulumi.Output.from_input(args.commit).apply(lambda c: serve_argv(cfg, c))
        create = pulumi.Output.all(self.argv, args.ray.container_ids).apply(
            lambda a: scripts.vllm_start(
                HEAD_CONTAINER,
                a[0],
                local_url(cfg),
                cfg.vllm.served_model_name,
                cfg.health.smoke_prompt,
                cfg.health.timeout_seconds,
                a[1],
                nccl.PER_NODE_KEYS,
            )
        )
        # Recon's reason to start vLLM again with unchanged flags travels in `triggers`, not in
        # the script: the script would change back once vLLM runs again and cost one more
        # (idempotent) run. When there is no reason, ignore_changes keeps whatever marker the
        # state holds, so nothing diffs. (Not `environment`: pulumi-command fails a command
        # whose variables the node's sshd does not AcceptEnv.) A new marker replaces the
        # command: its delete stops vLLM, then its create starts it (delete_before_replace, so
        # the old command's delete cannot stop the new vLLM).
        if args.restart_reason == "none":
            marker, ignore = "none", ["triggers"]
        else:
            marker, ignore = f"{args.restart_reason} @{time.time_ns()}", None
        deps = [args.ray.ready, *args.ray.workers.values(), args.ray.head, *args.after]
        self.depends_on = {f"{name}-serve": deps}
        api_key = args.api_key if args.api_key is not None else pulumi.Output.secret("")
        self.serve = remote.Command(
            f"{name}-serve",
            connection=args.head.connection,
            add_previous_output_in_env=False,  # see scripts.py
            create=create,
            delete=scripts.vllm_stop(HEAD_CONTAINER),
            stdin=api_key,
            triggers=[marker],
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=deps,
                ignore_changes=ignore,
                delete_before_replace=True,
                additional_secret_outputs=["stdin"],
                custom_timeouts=pulumi.CustomTimeouts(
                    create=f"{cfg.health.timeout_seconds + 300}s",
                    update=f"{cfg.health.timeout_seconds + 300}s",
                ),
            ),
        )
        public = args.head.node.host if cfg.vllm.host == "0.0.0.0" else cfg.vllm.host
        self.endpoint = pulumi.Output.from_input(f"http://{public}:{cfg.vllm.port}/v1")
        # The reviewable props are outputs too: stack-level policies (vllm-api-key) see a
        # component's registered outputs, not the inputs that resource-level policies see.
        self.register_outputs(
            {
                **props,
                "endpoint": self.endpoint,
                "servedModelName": cfg.vllm.served_model_name,
                "health": self.serve.stdout,
            }
        )
