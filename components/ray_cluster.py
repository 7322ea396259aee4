"""RayCluster: one Ray head container and one Ray worker container per other node.

Each container is created through its own node's docker provider and runs the image ID that
VllmImage verified on that node, with the runtime every GPU container of the stack shares
(components/node_runtime.py); Ray's object store is capped (Ray's default takes ~30% of
memory, which on a Spark's unified memory is GPU memory) and the dashboard is off by default.
`ray start` and its flags: https://docs.ray.io/en/latest/ray-core/starting-ray.html

Ray runs with token authentication (https://docs.ray.io/en/latest/ray-security/token-auth.html):
Ray's servers listen on every interface whatever `--node-ip-address` advertises, so the cluster
token (StackSecrets) is written from stdin into a root-only file on every node, mounted
read-only into each Ray container, and named by RAY_AUTH_MODE=token + RAY_AUTH_TOKEN_PATH. The
token is never in an environment value, a command line, `docker inspect` or plain state; a
client without it (from the management network, say) is refused by the GCS.

Container names and host files are the stack's (hostscripts/paths.StackNames), but Ray's own
ports are not all `ray.port`: a second stack's Ray on the same node is refused by preflight.
`delete_before_replace=True`: host networking (ports, GPU) and container names mean the
replacement can only start once the old container is gone. Readiness: a command on the head polls
`ray status` until every node and every GPU has joined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import rerun
from components.deployment import restore_labels, restored_removal
from components.node_runtime import NodeRuntime, compile_cache_dirs
from components.rerun import Again
from components.spark_node import Cluster, SparkNode
from config import RayConfig
from config.firewall import DEFAULT_PORT_BASE, PortBlock
from contract import labels as lbl
from contract import types
from contract.props import RayClusterProps
from hostscripts.paths import RAY_SESSION_MOUNT, StackNames
from hostscripts.ray import ray_ready, ray_token_remove, ray_token_write


def ray_command(ray: RayConfig, node: SparkNode, head: SparkNode,
                ports: PortBlock | None = None) -> list[str]:
    """`ray start` for one node, in the foreground (`--block`) so the container lives with Ray.
    Every port Ray would pick at random is pinned into the stack's block (`ports`,
    config/firewall.PortBlock), so the node's firewall names exactly them."""
    ports = ports or PortBlock(DEFAULT_PORT_BASE)
    common = [
        "--node-ip-address",
        node.fabric_ip,
        "--num-gpus",
        str(ray.gpus_per_node),
        "--object-store-memory",
        str(ray.object_store_bytes),
        "--disable-usage-stats",
        *ports.ray_flags(head=node is head, dashboard=ray.dashboard),
    ]
    if node is head:
        cmd = ["ray", "start", "--head", "--block", "--port", str(ray.port), *common]
        cmd.append(f"--include-dashboard={'true' if ray.dashboard else 'false'}")
        if ray.dashboard:  # reachable on the fabric only, never on the management network
            cmd.append(f"--dashboard-host={head.fabric_ip}")
        return cmd
    return ["ray", "start", "--block", "--address", f"{head.fabric_ip}:{ray.port}", *common]


def session_volume(names: StackNames) -> docker.ContainerVolumeArgs:
    """The stack's Ray session folder on the head, in the Ray head container and the vLLM
    container. A `volumes` bind: Docker creates the host folder when it is missing (after a
    reboot)."""
    return docker.ContainerVolumeArgs(host_path=names.ray_session_dir,
                                      container_path=RAY_SESSION_MOUNT)


@dataclass
class RayClusterArgs:
    ray: RayConfig
    runtime: NodeRuntime  # what the containers share with the vLLM container (Ray on)
    ready_timeout_seconds: int  # how long `ray status` may take to show every node and GPU
    cluster: Cluster
    labels: Mapping[str, str]  # managed + stack; the role is added per container
    ray_token: pulumi.Output[str]  # secret (StackSecrets)
    ports: PortBlock = field(default_factory=lambda: PortBlock(DEFAULT_PORT_BASE))
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
        props: RayClusterProps = {
            "nodes": cluster.names,
            "port": ray.port,
            "dashboard": ray.dashboard,
            "objectStoreBytes": ray.object_store_bytes,
            "gpusPerNode": ray.gpus_per_node,
        }
        super().__init__(types.RAY_CLUSTER, name, props, opts)
        self._args = args
        names = args.runtime.names
        # A token file gone behind the stack (another stack's destroy on shared nodes, a node
        # reinstalled) is written again: recon saw it absent, so its command gets a fresh
        # trigger (components/rerun.Again: no diff while the file is there). Delete
        # before replace: the old command's delete removes the file the new one writes.
        again = {n.name: Again.when_wiped([rerun.fresh_trigger()]
                                          if n.facts.ray_token_present is False
                                          else []) for n in cluster.nodes}
        self.tokens = {
            n.name: n.command(
                f"{name}-token-{n.name}",
                self,
                create=ray_token_write(names),
                delete=ray_token_remove(names),
                stdin=args.ray_token,
                secret_outputs=["stdout"],
                logging=remote.Logging.STDERR,  # its stdout (the file's hash) is for a label only
                triggers=again[n.name].triggers,
                ignore_changes=again[n.name].ignore_changes,
                delete_before_replace=True,
            )
            for n in cluster.nodes
        }
        self.caches = compile_cache_dirs(name, self, cluster, names)
        self.head = self._container(f"{name}-head", names.ray_head, lbl.RAY_HEAD, cluster.head,
                                    list(args.after))
        self.workers = {
            n.name: self._container(f"{name}-worker-{n.name}", names.ray_worker, lbl.RAY_WORKER, n,
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
                    names.ray_head, len(cluster.nodes), gpus, args.ready_timeout_seconds, ids,
                    [n.fabric_ip for n in cluster.nodes],
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

    def token_label(self, node: SparkNode) -> docker.ContainerLabelArgs:
        """The token file's sha256: a new token replaces the container (Ray reads it once)."""
        return docker.ContainerLabelArgs(
            label="spark-vllm.ray-token",
            value=self.tokens[node.name].stdout.apply(lambda s: s.split()[-1]),
        )

    def _env(self, node: SparkNode) -> dict[str, str]:
        """The node's runtime env; on the head also the ports of the metrics servers Ray's
        head starts that no `ray start` flag pins (config/firewall.PortBlock.ray_head_env)."""
        env = self._args.runtime.env(node)
        if node is self._args.cluster.head:
            env.update(self._args.ports.ray_head_env())
        return env

    def _container(
        self,
        res_name: str,
        container_name: str,
        role: str,
        node: SparkNode,
        depends_on: list[pulumi.Resource],
    ) -> docker.Container:
        args, ray = self._args, self._args.ray
        labels = {**args.labels, lbl.ROLE: role, lbl.NODE: node.name}
        # On the head, Ray's session folder is shared with the vLLM container (the driver)
        volumes = (
            [session_volume(args.runtime.names)]
            if node is args.cluster.head
            else None
        )
        after = [*depends_on, self.tokens[node.name], self.caches[node.name]]
        # a container a restore put back under this name goes first (components/deployment.py)
        after += restored_removal(res_name, self, node, container_name,
                                  args.labels[lbl.STACK], after)
        return docker.Container(
            res_name,
            name=container_name,
            # Images such as vllm/vllm-openai set ENTRYPOINT ["vllm", "serve"]; env makes
            # `command` the whole command line whatever the image's entrypoint.
            entrypoints=["/usr/bin/env"],
            command=ray_command(ray, node, args.cluster.head, args.ports),
            envs=[f"{k}={v}" for k, v in sorted(self._env(node).items())],
            mounts=args.runtime.mounts(),
            volumes=volumes,
            labels=[
                *(docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())),
                self.token_label(node),
                # a restore's id when recon found it put back by one (components/deployment.py)
                *restore_labels(node, container_name, args.labels[lbl.STACK]),
            ],
            # the head's IPC namespace is the one the vLLM driver joins (its /dev/shm holds
            # Ray's object store, which the driver and the workers share)
            **args.runtime.runtime(
                node, ipc_mode="shareable" if node is args.cluster.head else "private"),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.provider,
                delete_before_replace=True,
                depends_on=after,
            ),
        )
