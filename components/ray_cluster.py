"""RayCluster: one Ray head container and one Ray worker container per other node.

Each container is created through its own node's docker provider and runs the image ID that
VllmImage verified on that node. Runtime settings follow field notes 2.5/2.7: host network (Ray
and NCCL bind the fabric address), every GPU, host IPC plus a large shm, nofile raised, memlock
unlimited with the RDMA device when RDMA is on, the HF cache mounted with HF_HUB_OFFLINE=1 (the
model is already on every node; a container must never download it), object store capped and
the dashboard off by default (unified memory is GPU memory).

`delete_before_replace=True`: host networking and fixed container names mean the replacement
can only start once the old container is gone. Readiness: a command on the head polls
`ray status` until every node and every GPU has joined.

Ordering is explicit and inspectable: `self.depends_on[<child name>]` lists what each child
waits for (unit tests assert on it, since Pulumi mocks do not record dependencies).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import scripts
from components.config import StackConfig
from components.nccl import NcclEnvironment
from components.spark_node import SparkNode

HEAD_CONTAINER = "spark-vllm-ray-head"
WORKER_CONTAINER = "spark-vllm-ray-worker"
MIB = 1024 * 1024


def ray_command(cfg: StackConfig, node: SparkNode, head: SparkNode) -> list[str]:
    """`ray start` for one node, in the foreground (`--block`) so the container lives with Ray."""
    common = [
        "--node-ip-address",
        node.fabric_ip,
        "--num-gpus",
        str(cfg.ray.gpus_per_node),
        "--object-store-memory",
        str(cfg.ray.object_store_bytes),
        "--disable-usage-stats",
    ]
    if node is head:
        cmd = ["ray", "start", "--head", "--block", "--port", str(cfg.ray.port), *common]
        cmd.append(f"--include-dashboard={'true' if cfg.ray.dashboard else 'false'}")
        if cfg.ray.dashboard:  # reachable on the fabric only, never on the management network
            cmd.append(f"--dashboard-host={head.fabric_ip}")
        return cmd
    return ["ray", "start", "--block", "--address", f"{head.fabric_ip}:{cfg.ray.port}", *common]


@dataclass
class RayClusterArgs:
    cfg: StackConfig
    nodes: list[SparkNode]  # the head first
    image_ids: dict[str, pulumi.Input[str]]
    nccl: NcclEnvironment
    labels: dict[str, str]  # managed + stack; the role is added per container
    after: list[pulumi.Resource] = field(default_factory=list)  # model, image, stopped containers


class RayCluster(pulumi.ComponentResource):
    head: docker.Container
    workers: dict[str, docker.Container]
    ready: remote.Command
    depends_on: dict[str, list[pulumi.Resource]]
    container_ids: pulumi.Output[str]

    def __init__(self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        cfg = args.cfg
        super().__init__(
            "spark-vllm:ray_cluster:RayCluster",
            name,
            {
                "nodes": [n.name for n in args.nodes],
                "port": cfg.ray.port,
                "dashboard": cfg.ray.dashboard,
                "objectStoreBytes": cfg.ray.object_store_bytes,
                "gpusPerNode": cfg.ray.gpus_per_node,
            },
            opts,
        )
        head_node, others = args.nodes[0], args.nodes[1:]
        self.depends_on = {}
        self.commands: dict[str, list[str]] = {}

        self.head = self._container(
            f"{name}-head", HEAD_CONTAINER, "ray-head", head_node, head_node, args, list(args.after)
        )
        self.workers = {
            n.name: self._container(
                f"{name}-worker-{n.name}",
                WORKER_CONTAINER,
                "ray-worker",
                n,
                head_node,
                args,
                [*args.after, self.head],
            )
            for n in others
        }
        all_containers = [self.head, *self.workers.values()]
        self.container_ids = pulumi.Output.all(*[c.id for c in all_containers]).apply(
            lambda ids: " ".join(ids)
        )
        self.depends_on[f"{name}-ready"] = list(all_containers)
        self.ready = remote.Command(
            f"{name}-ready",
            connection=head_node.connection,
            add_previous_output_in_env=False,  # see scripts.py
            create=self.container_ids.apply(
                lambda ids: scripts.ray_ready(
                    HEAD_CONTAINER,
                    len(args.nodes),
                    cfg.cluster_gpus,
                    min(cfg.health.timeout_seconds, 600),
                    ids,
                )
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=all_containers),
        )
        self.register_outputs(
            {
                "head": self.head.name,
                "workers": {n: c.name for n, c in self.workers.items()},
                "ready": self.ready.stdout,
            }
        )

    def _container(
        self,
        res_name: str,
        container_name: str,
        role: str,
        node: SparkNode,
        head: SparkNode,
        args: RayClusterArgs,
        depends_on: list[pulumi.Resource],
    ) -> docker.Container:
        cfg = args.cfg
        extras = args.nccl.extras
        env = {
            **args.nccl.env[node.name],
            "HF_HOME": scripts.HF_MOUNT,
            "HF_HUB_OFFLINE": "1",
        }
        nofile = cfg.ray.nofile
        ulimits = [docker.ContainerUlimitArgs(name="nofile", soft=nofile, hard=nofile)]
        if extras.memlock_unlimited:
            ulimits.append(docker.ContainerUlimitArgs(name="memlock", soft=-1, hard=-1))
        labels = {**args.labels, "spark-vllm.role": role, "spark-vllm.node": node.name}
        command = ray_command(cfg, node, head)
        self.commands[res_name] = command
        self.depends_on[res_name] = depends_on
        return docker.Container(
            res_name,
            name=container_name,
            image=args.image_ids[node.name],
            # Images such as vllm/vllm-openai set ENTRYPOINT ["vllm", "serve"]; env makes
            # `command` the whole command line whatever the image's entrypoint.
            entrypoints=["/usr/bin/env"],
            command=command,
            envs=[f"{k}={v}" for k, v in sorted(env.items())],
            network_mode="host",
            gpus="all",
            ipc_mode="host",
            shm_size=cfg.ray.shm_bytes // MIB,
            ulimits=ulimits,
            devices=[
                docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions="rwm")
                for d in extras.devices
            ]
            or None,
            capabilities=(
                docker.ContainerCapabilitiesArgs(adds=extras.cap_add) if extras.cap_add else None
            ),
            mounts=[
                docker.ContainerMountArgs(
                    target=scripts.HF_MOUNT, type="bind", source=cfg.model.cache_dir
                )
            ],
            labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())],
            restart="unless-stopped",
            privileged=False,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.provider,
                delete_before_replace=True,
                depends_on=depends_on,
            ),
        )
