"""RayCluster: one Ray head container and one Ray worker container per other node.

Each container is created through its own node's docker provider and runs the image ID that
VllmImage verified on that node. Runtime settings: host network (Ray and NCCL bind the fabric
address), every GPU, host IPC (and so the host's /dev/shm), nofile raised, memlock unlimited
with the RDMA device when RDMA is on, the HF cache mounted with HF_HUB_OFFLINE=1 (the model is
already on every node; a container must never download it), object store capped (Ray's default
takes ~30% of memory, which on a Spark's unified memory is GPU memory) and the dashboard off by
default.
`ray start` and its flags: https://docs.ray.io/en/latest/ray-core/starting-ray.html

Ray runs with token authentication (https://docs.ray.io/en/latest/ray-security/token-auth.html):
Ray's servers listen on every interface whatever `--node-ip-address` advertises, so the cluster
token (StackSecrets) is written from stdin into a root-only file on every node, mounted
read-only into each Ray container, and named by RAY_AUTH_MODE=token + RAY_AUTH_TOKEN_PATH. The
token is never in an environment value, a command line, `docker inspect` or plain state; a
client without it (from the management network, say) is refused by the GCS.

Compile and JIT caches (vLLM's torch.compile artifacts, torch inductor, Triton, FlashInfer, CUDA's
PTX cache) live in a stack-owned folder per node, mounted into the containers and kept on
`destroy` like the model, so a replaced container (a new image, an env change) does not compile
again from nothing.

`delete_before_replace=True`: host networking and fixed container names mean the replacement
can only start once the old container is gone. Readiness: a command on the head polls
`ray status` until every node and every GPU has joined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import model_cache
from components.model_cache import Again
from components.nccl import NcclEnvironment
from components.spark_node import Cluster, SparkNode
from config import RayConfig
from hostscripts.paths import (
    COMPILE_CACHE_DIR,
    COMPILE_CACHE_MOUNT,
    HF_MOUNT,
    RAY_SESSION_DIR,
    RAY_SESSION_MOUNT,
    RAY_TOKEN_FILE,
    RAY_TOKEN_MOUNT,
)
from hostscripts.ray import compile_cache_dir, ray_ready, ray_token_remove, ray_token_write

# Where each compiler keeps its cache, inside COMPILE_CACHE_MOUNT. vLLM: VLLM_CACHE_ROOT holds
# torch_compile_cache/ (and points inductor there while compiling); TORCHINDUCTOR_CACHE_DIR is
# inductor's own (used with VLLM_USE_AOT_COMPILE=0); TRITON_CACHE_DIR; FlashInfer appends
# .cache/flashinfer to FLASHINFER_WORKSPACE_BASE (python/flashinfer/jit/env.py in
# https://github.com/flashinfer-ai/flashinfer); CUDA_CACHE_PATH is the driver's PTX JIT cache.
COMPILE_CACHE_ENV = {
    "VLLM_CACHE_ROOT": f"{COMPILE_CACHE_MOUNT}/vllm",
    "TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE_MOUNT}/torchinductor",
    "TRITON_CACHE_DIR": f"{COMPILE_CACHE_MOUNT}/triton",
    "FLASHINFER_WORKSPACE_BASE": f"{COMPILE_CACHE_MOUNT}/flashinfer",
    "CUDA_CACHE_PATH": f"{COMPILE_CACHE_MOUNT}/cuda",
}

HEAD_CONTAINER = "spark-vllm-ray-head"
WORKER_CONTAINER = "spark-vllm-ray-worker"


def ray_command(ray: RayConfig, node: SparkNode, head: SparkNode) -> list[str]:
    """`ray start` for one node, in the foreground (`--block`) so the container lives with Ray."""
    common = [
        "--node-ip-address",
        node.fabric_ip,
        "--num-gpus",
        str(ray.gpus_per_node),
        "--object-store-memory",
        str(ray.object_store_bytes),
        "--disable-usage-stats",
    ]
    if node is head:
        cmd = ["ray", "start", "--head", "--block", "--port", str(ray.port), *common]
        cmd.append(f"--include-dashboard={'true' if ray.dashboard else 'false'}")
        if ray.dashboard:  # reachable on the fabric only, never on the management network
            cmd.append(f"--dashboard-host={head.fabric_ip}")
        return cmd
    return ["ray", "start", "--block", "--address", f"{head.fabric_ip}:{ray.port}", *common]


def session_volume() -> docker.ContainerVolumeArgs:
    """Ray's session folder on the head, in the Ray head container and the vLLM container. A
    `volumes` bind: Docker creates the host folder when it is missing (after a reboot)."""
    return docker.ContainerVolumeArgs(host_path=RAY_SESSION_DIR, container_path=RAY_SESSION_MOUNT)


class ContainerRuntime(TypedDict):
    image: pulumi.Input[str]
    network_mode: str
    gpus: str
    ipc_mode: str
    ulimits: list[docker.ContainerUlimitArgs]
    devices: list[docker.ContainerDeviceArgs] | None
    capabilities: docker.ContainerCapabilitiesArgs | None
    restart: str
    privileged: bool


@dataclass
class RayClusterArgs:
    ray: RayConfig
    cache_dir: str  # the nodes' HF cache (model.cacheDir), mounted into every container
    ready_timeout_seconds: int  # how long `ray status` may take to show every node and GPU
    cluster: Cluster
    image_ids: Mapping[str, pulumi.Input[str]]
    nccl: NcclEnvironment
    labels: Mapping[str, str]  # managed + stack; the role is added per container
    ray_token: pulumi.Output[str]  # secret (StackSecrets)
    after: list[pulumi.Resource] = field(default_factory=list)  # model, image, stopped containers


class RayCluster(pulumi.ComponentResource):
    head: docker.Container
    workers: dict[str, docker.Container]
    ready: remote.Command
    container_ids: pulumi.Output[str]

    def __init__(
        self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        ray, cluster = args.ray, args.cluster
        super().__init__(
            "spark-vllm:ray_cluster:RayCluster",
            name,
            {
                "nodes": cluster.names,
                "port": ray.port,
                "dashboard": ray.dashboard,
                "objectStoreBytes": ray.object_store_bytes,
                "gpusPerNode": ray.gpus_per_node,
            },
            opts,
        )
        self._args = args
        # A token file gone behind the stack (another stack's destroy on shared nodes, a node
        # reinstalled) is written again: recon saw it absent, so its command gets a fresh
        # trigger (components/model_cache.Again: no diff while the file is there). Delete
        # before replace: the old command's delete removes the file the new one writes.
        again = {n.name: Again.when_wiped([model_cache.repair_token()]
                                          if n.facts.ray_token_present is False
                                          else []) for n in cluster.nodes}
        self.tokens = {
            n.name: n.command(
                f"{name}-token-{n.name}",
                self,
                create=ray_token_write(),
                delete=ray_token_remove(),
                stdin=args.ray_token,
                secret_outputs=["stdout"],
                triggers=again[n.name].triggers,
                ignore_changes=again[n.name].ignore_changes,
                delete_before_replace=True,
            )
            for n in cluster.nodes
        }
        self.caches = {
            n.name: n.command(
                f"{name}-compile-cache-{n.name}",
                self,
                create=compile_cache_dir(),
                retain_on_delete=True,  # kept on destroy, like the model
            )
            for n in cluster.nodes
        }
        self.head = self._container(f"{name}-head", HEAD_CONTAINER, "ray-head", cluster.head,
                                    list(args.after))
        self.workers = {
            n.name: self._container(f"{name}-worker-{n.name}", WORKER_CONTAINER, "ray-worker", n,
                                    [*args.after, self.head])
            for n in cluster.workers
        }
        all_containers = [self.head, *self.workers.values()]
        self.container_ids = pulumi.Output.all(*[c.id for c in all_containers]).apply(
            lambda ids: " ".join(ids)
        )
        gpus = len(cluster.nodes) * ray.gpus_per_node
        self.ready = cluster.head.command(
            f"{name}-ready",
            self,
            create=self.container_ids.apply(
                lambda ids: ray_ready(
                    HEAD_CONTAINER, len(cluster.nodes), gpus, args.ready_timeout_seconds, ids
                )
            ),
            depends_on=all_containers,
        )
        self.register_outputs(
            {
                "head": self.head.name,
                "workers": {n: c.name for n, c in self.workers.items()},
                "ready": self.ready.stdout,
            }
        )

    @property
    def args(self) -> RayClusterArgs:
        return self._args

    def env(self, node: SparkNode) -> dict[str, str]:
        """The environment of the stack's containers on `node`: its NCCL/launcher values, the
        HF cache offline, Ray's token auth, the compile caches."""
        return {
            **self._args.nccl.env[node.name],
            "HF_HOME": HF_MOUNT,
            "HF_HUB_OFFLINE": "1",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": RAY_TOKEN_MOUNT,
            # vLLM's processes on one node talk over ZeroMQ IPC sockets made in this folder:
            # Ray's session folder, which the vLLM container shares with the Ray head's
            "VLLM_RPC_BASE_PATH": RAY_SESSION_MOUNT,
            **COMPILE_CACHE_ENV,
        }

    def runtime(self, node: SparkNode) -> ContainerRuntime:
        """The docker.Container arguments every GPU container of the stack on `node` shares
        (the Ray containers and the vLLM container): host network, every GPU, host IPC (and so
        the host's /dev/shm, NCCL's and vLLM's shared memory between processes; Docker's
        shm_size does not apply to it, so none is set), nofile raised, memlock and the RDMA
        devices when RDMA is on, restarted by Docker, never privileged."""
        args, ray = self._args, self._args.ray
        extras = args.nccl.extras
        ulimits = [docker.ContainerUlimitArgs(name="nofile", soft=ray.nofile, hard=ray.nofile)]
        if extras.memlock_unlimited:
            ulimits.append(docker.ContainerUlimitArgs(name="memlock", soft=-1, hard=-1))
        return {
            "image": args.image_ids[node.name],
            "network_mode": "host",
            "gpus": "all",
            "ipc_mode": "host",
            "ulimits": ulimits,
            "devices": [
                docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions="rwm")
                for d in extras.devices
            ]
            or None,
            "capabilities": (
                docker.ContainerCapabilitiesArgs(adds=extras.cap_add) if extras.cap_add else None
            ),
            "restart": "unless-stopped",
            "privileged": False,
        }

    def mounts(self) -> list[docker.ContainerMountArgs]:
        """The HF cache, the Ray token (read-only) and the compile caches."""
        return [
            docker.ContainerMountArgs(target=HF_MOUNT, type="bind", source=self._args.cache_dir),
            docker.ContainerMountArgs(
                target=RAY_TOKEN_MOUNT, type="bind", source=RAY_TOKEN_FILE, read_only=True
            ),
            docker.ContainerMountArgs(
                target=COMPILE_CACHE_MOUNT, type="bind", source=COMPILE_CACHE_DIR
            ),
        ]

    def token_label(self, node: SparkNode) -> docker.ContainerLabelArgs:
        """The token file's sha256: a new token replaces the container (Ray reads it once)."""
        return docker.ContainerLabelArgs(
            label="spark-vllm.ray-token",
            value=self.tokens[node.name].stdout.apply(lambda s: s.split()[-1]),
        )

    def _container(
        self,
        res_name: str,
        container_name: str,
        role: str,
        node: SparkNode,
        depends_on: list[pulumi.Resource],
    ) -> docker.Container:
        args, ray = self._args, self._args.ray
        labels = {**args.labels, "spark-vllm.role": role, "spark-vllm.node": node.name}
        # On the head, Ray's session folder is shared with the vLLM container (the driver)
        volumes = (
            [session_volume()]
            if node is args.cluster.head
            else None
        )
        return docker.Container(
            res_name,
            name=container_name,
            # Images such as vllm/vllm-openai set ENTRYPOINT ["vllm", "serve"]; env makes
            # `command` the whole command line whatever the image's entrypoint.
            entrypoints=["/usr/bin/env"],
            command=ray_command(ray, node, args.cluster.head),
            envs=[f"{k}={v}" for k, v in sorted(self.env(node).items())],
            mounts=self.mounts(),
            volumes=volumes,
            labels=[
                *(docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())),
                self.token_label(node),
            ],
            **self.runtime(node),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.provider,
                delete_before_replace=True,
                depends_on=[*depends_on, self.tokens[node.name], self.caches[node.name]],
            ),
        )
