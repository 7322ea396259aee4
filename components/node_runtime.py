"""NodeRuntime: what every GPU container of the stack on a node shares, Ray's and vLLM's.

Not a component: a description that RayCluster (the Ray containers) and VllmServer (the vLLM
containers) both build their containers from, so a Ray container and the vLLM container next
to it run the same image with the same runtime. Runtime settings: host network (Ray, NCCL and
vLLM bind the fabric address), every GPU, host IPC (and so the host's /dev/shm, NCCL's and
vLLM's shared memory between processes; Docker's shm_size does not apply to it, so none is
set), nofile raised, memlock unlimited with the RDMA device when RDMA is on, the HF cache
mounted with HF_HUB_OFFLINE=1 (the model is already on every node; a container must never
download it), restarted by Docker (`unless-stopped`), never privileged.

Compile and JIT caches (vLLM's torch.compile artifacts, torch inductor, Triton, FlashInfer, CUDA's
PTX cache) live in a folder per node and per stack (StackNames.compile_cache_dir), mounted into
the containers and kept on `destroy` like the model, so a replaced container (a new image, an env
change) does not compile again from nothing. They hold code the containers load, so no other
stack's containers see them (issue 31). The HF cache is mounted read-only: only the stack's model
commands write it. Everything a container mounts from the host is the stack's own
(hostscripts/paths.StackNames) but the HF cache, which stacks naming the same model.cacheDir
share (docs/design.md says why that is safe).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import rerun
from components.nccl import NcclEnvironment
from components.rerun import Again
from components.spark_node import Cluster, SparkNode
from hostscripts.paths import (
    COMPILE_CACHE_MOUNT,
    GUARD_DIR,
    GUARD_MOUNT,
    HF_MOUNT,
    RAY_SESSION_MOUNT,
    RAY_TOKEN_MOUNT,
    StackNames,
)
from hostscripts.ray import compile_cache_dir
from hostscripts.vllm import OomWatch

# the label that names the command which made the node's guard folder (components/guard.py):
# a folder made again (it was gone) replaces the containers whose mount held the old one
GUARD_LABEL = "spark-vllm.guard-records"

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


@dataclass(frozen=True)
class NodeRuntime:
    names: StackNames  # the stack's container names and host files
    nccl: NcclEnvironment
    cache_dir: str  # the nodes' HF cache (model.cacheDir)
    image_ids: Mapping[str, pulumi.Input[str]]
    nofile: int
    ray: bool  # Ray runs (vllm.executor ray): its token auth in the env, its token mounted
    # the nodes' guard (components/guard.py): vLLM's oom_score_adj and its watchdog's OOM
    # records (None: guard off), and per node the command that made the guard's folder, which
    # the API containers mount read-only
    oom: OomWatch | None = None
    guard_records: Mapping[str, remote.Command] = field(default_factory=dict)

    def guard_mounts(self, node: SparkNode) -> list[docker.ContainerMountArgs]:
        """The node's guard folder, read-only, for an API container's watchdog."""
        if node.name not in self.guard_records:
            return []
        return [docker.ContainerMountArgs(target=GUARD_MOUNT, type="bind", source=GUARD_DIR,
                                          read_only=True)]

    def guard_labels(self, node: SparkNode) -> list[docker.ContainerLabelArgs]:
        records = self.guard_records.get(node.name)
        return [] if records is None else [docker.ContainerLabelArgs(label=GUARD_LABEL,
                                                                     value=records.id)]

    def guard_after(self, node: SparkNode) -> list[pulumi.Resource]:
        records = self.guard_records.get(node.name)
        return [] if records is None else [records]

    def env(self, node: SparkNode) -> dict[str, str]:
        """The environment of the stack's containers on `node`: its NCCL/launcher values, the
        HF cache offline, the compile caches and, with Ray, Ray's token auth."""
        env = {**self.nccl.env[node.name], "HF_HOME": HF_MOUNT, "HF_HUB_OFFLINE": "1"}
        if self.ray:
            env.update({
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": RAY_TOKEN_MOUNT,
                # vLLM's processes on one node talk over ZeroMQ IPC sockets made in this folder:
                # Ray's session folder, which the vLLM container shares with the Ray head's
                "VLLM_RPC_BASE_PATH": RAY_SESSION_MOUNT,
            })
        return {**env, **COMPILE_CACHE_ENV}

    def runtime(self, node: SparkNode) -> ContainerRuntime:
        """The docker.Container arguments every GPU container of the stack on `node` shares."""
        extras = self.nccl.extras
        ulimits = [docker.ContainerUlimitArgs(name="nofile", soft=self.nofile, hard=self.nofile)]
        if extras.memlock_unlimited:
            ulimits.append(docker.ContainerUlimitArgs(name="memlock", soft=-1, hard=-1))
        return {
            "image": self.image_ids[node.name],
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
        """The HF cache (read-only: a serving container never writes it; the model commands
        do, in containers of their own), the stack's own compile caches and, with Ray, the Ray
        token (read-only)."""
        mounts = [
            docker.ContainerMountArgs(target=HF_MOUNT, type="bind", source=self.cache_dir,
                                      read_only=True),
            docker.ContainerMountArgs(
                target=COMPILE_CACHE_MOUNT, type="bind", source=self.names.compile_cache_dir
            ),
        ]
        if self.ray:
            mounts.insert(1, docker.ContainerMountArgs(
                target=RAY_TOKEN_MOUNT, type="bind", source=self.names.ray_token_file,
                read_only=True))
        return mounts


def compile_cache_dirs(
    name: str, parent: pulumi.Resource, cluster: Cluster, names: StackNames
) -> dict[str, remote.Command]:
    """The compile-cache folder on every node (a bind mount needs it to exist), kept on destroy
    like the model: a command per node, `<name>-compile-cache-<node>`. A folder recon found gone
    (the stack's folder wiped behind it, a reinstalled node) is made again: a fresh trigger on
    that node only (components/rerun.Again), else no diff. Without it the containers that mount
    it cannot be created (`bind source path does not exist`)."""
    again = {n.name: Again.when_wiped([rerun.fresh_trigger()]
                                      if n.facts.compile_cache_present is False else [])
             for n in cluster.nodes}
    return {
        n.name: n.command(
            f"{name}-compile-cache-{n.name}",
            parent,
            create=compile_cache_dir(names),
            retain_on_delete=True,
            triggers=again[n.name].triggers,
            ignore_changes=again[n.name].ignore_changes,
        )
        for n in cluster.nodes
    }
