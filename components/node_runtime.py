"""NodeRuntime: what every GPU container of the stack on a node shares, Ray's and vLLM's.

Not a component: a description that RayCluster (the Ray containers) and VllmServer (the vLLM
containers) both build their containers from, so a Ray container and the vLLM container next
to it run the same image with the same runtime. Runtime settings: host network (Ray, NCCL and
vLLM bind the fabric address), every GPU, an IPC namespace of the stack's own with a /dev/shm of
`shm_bytes` (below), nofile raised, memlock unlimited with the RDMA device when RDMA is on, the
HF cache's hub/ mounted with HF_HUB_OFFLINE=1 (the model is already on every node; a container
must never download it), restarted by Docker (`unless-stopped`), never privileged.

Compile and JIT caches (vLLM's torch.compile artifacts, torch inductor, Triton, FlashInfer, CUDA's
PTX cache) live in a folder per node and per stack (StackNames.compile_cache_dir), mounted into
the containers and kept on `destroy` like the model, so a replaced container (a new image, an env
change) does not compile again from nothing. They hold code the containers load, so no other
stack's containers see them (issue 31). The HF cache is mounted read-only: only the stack's model
commands write it. Everything a container mounts from the host is the stack's own
(hostscripts/paths.StackNames) but the HF cache, which stacks naming the same model.cacheDir
share (docs/design.md says why that is safe).

IPC (issue 46): the containers ran with `ipc_mode: host`, so every stack's containers on a node
(and any other container with host IPC) shared the node's /dev/shm, where vLLM's shared-memory
broadcast (`psm_*` segments, which its readers unpickle), NCCL's and Ray's object store live.
Now each container has its own IPC namespace and /dev/shm (`private`), but for those that must
share it: on a Ray node the vLLM driver joins the Ray head's (`shareable` there, `container:<id>`
in vLLM's, as its PID namespace already does): Ray's object store and compiled graphs, which the
driver and its workers share, live in that /dev/shm. With mp every rank of a node is in one
container. No recipe needs the host's IPC: nothing of the stack shares memory with a process
outside its containers.
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
from hostscripts.firewall import PROBE_ENV, probe_target
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


# /dev/shm of each container (tmpfs: a cap, taken as used): what vLLM's broadcast queues, NCCL's
# shared-memory transport and PyTorch's workers use, and with Ray its object store on top
# (ray.objectStoreBytes; Ray puts it in /dev/shm when it fits). The host's /dev/shm, which the
# containers shared before, is half the node's memory by default; 8 GiB holds vLLM's queues many
# times over.
SHM_BYTES = 8 << 30


def shm_bytes(object_store_bytes: int | None) -> int:
    """The /dev/shm of the stack's containers: SHM_BYTES, and Ray's object store with Ray."""
    return SHM_BYTES + (object_store_bytes or 0)


class ContainerRuntime(TypedDict):
    image: pulumi.Input[str]
    network_mode: str
    gpus: str
    ipc_mode: pulumi.Input[str]
    shm_size: int
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
    shm_bytes: int = SHM_BYTES  # each container's /dev/shm (shm_bytes(ray.objectStoreBytes))
    # the first of vLLM's own ports (VLLM_PORT: config/firewall.PortBlock.vllm), so the
    # firewall's rules name them
    vllm_port: int | None = None
    # the firewall's probe port (config/firewall.PortBlock.probe): the vLLM launcher starts
    # vLLM only when the stack's table answers it; None: no firewall (dev may go without)
    firewall_probe: int | None = None
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
        if self.vllm_port is not None:
            # vLLM counts up from it for its own ports (the Ray driver's torch store, ...), on
            # every node where its code runs
            env["VLLM_PORT"] = str(self.vllm_port)
        return {**env, **COMPILE_CACHE_ENV}

    def vllm_env(self, node: SparkNode) -> dict[str, str]:
        """`env` and, with the firewall, the probe port its launcher checks the table with
        (hostscripts/firewall.probe_launcher)."""
        env = self.env(node)
        if self.firewall_probe is not None:
            env[PROBE_ENV] = probe_target(self.names, self.firewall_probe)
        return env

    def runtime(self, node: SparkNode,
                ipc_mode: pulumi.Input[str] = "private") -> ContainerRuntime:
        """The docker.Container arguments every GPU container of the stack on `node` shares.
        `ipc_mode`: `private` (its own IPC namespace and /dev/shm), `shareable` for the one a
        container of the stack joins on that node (`container:<its id>`), never `host`."""
        if ipc_mode == "host":
            raise ValueError("a container of the stack never shares the host's IPC namespace")
        extras = self.nccl.extras
        ulimits = [docker.ContainerUlimitArgs(name="nofile", soft=self.nofile, hard=self.nofile)]
        if extras.memlock_unlimited:
            ulimits.append(docker.ContainerUlimitArgs(name="memlock", soft=-1, hard=-1))
        return {
            "image": self.image_ids[node.name],
            "network_mode": "host",
            "gpus": "all",
            # its own IPC namespace and /dev/shm, never the host's (issue 46); RayCluster makes
            # the head's shareable, and the vLLM driver joins it (VllmServer)
            "ipc_mode": ipc_mode,
            "shm_size": self.shm_bytes >> 20,  # MB, as Docker's API counts it
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
        """The HF cache's hub/ (read-only: a serving container never writes it; the model
        commands do, in containers of their own), the stack's own compile caches and, with Ray,
        the Ray token (read-only). Only hub/, what vLLM reads offline: the cache folder is
        HF_HOME, where `hf auth login` on a node leaves its `token` (issue 46)."""
        mounts = [
            docker.ContainerMountArgs(target=f"{HF_MOUNT}/hub", type="bind",
                                      source=f"{self.cache_dir}/hub", read_only=True),
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
