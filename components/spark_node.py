"""SparkNode: how the stack reaches one Spark, and what recon found there.

Owns the per-node Docker provider (Docker over `ssh://`, the only way containers and images reach
the node) and the `remote.ConnectionArgs` every `remote.Command` on the node uses. Both pin the
host key from config: the SSH transport of the docker provider via a known_hosts file written from
the pinned keys with `StrictHostKeyChecking=yes`, pulumi-command via `host_key`. A node that
presents another key is refused before anything runs.

`SparkNode.command(...)` is how every component runs a script on a node: the connection, no
previous output in the environment (hostscripts/__init__.py says why) and the component as parent.

Foreign containers the preflight plan says to stop are stopped here, one `remote.Command` each,
whose delete starts them again, so `pulumi destroy` gives the machine back as it was found.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from config import NodeConfig, SshConfig, StackConfig
from config.paths import local_state_dir
from config.ssh import host_key_alias, known_hosts_line, ssh_options, write_private
from contract import types
from contract.props import SparkNodeProps
from hostscripts.foreign import start_foreign_container, stop_foreign_container
from inspection.facts import ContainerFacts, NodeFacts

Role = Literal["head", "worker"]


def write_known_hosts(cfg: StackConfig, project: str, stack: str) -> Path:
    """Write the stack's known_hosts file from the pinned keys; stable path, idempotent content.

    Written on every run (preview included): the docker provider dials the nodes at configure
    time, before any resource exists, so the file must be there already. One line per node,
    under the node's HostKeyAlias (config/ssh.py), through a temporary file of its own.

    A node taken out of the config keeps its alias line: the engine deletes that node's
    containers through the provider settings in the state, which name this file, so its key
    must still be here (it is the key that was pinned; a node of the same name back in the
    config gets its configured key again).
    """
    path = local_state_dir() / "known_hosts" / f"{project}.{stack}"
    current = {host_key_alias(n) for n in cfg.nodes}
    kept = ""
    if path.is_file() and not path.is_symlink():
        kept = "".join(line + "\n" for line in path.read_text().splitlines()
                       if line.split(" ", 1)[0].startswith("spark-vllm-")
                       and line.split(" ", 1)[0] not in current)
    text = "".join(known_hosts_line(n) for n in cfg.nodes) + kept
    if not path.is_file() or path.is_symlink() or path.read_text() != text:
        write_private(path, text)
    return path


def facts_summary(facts: NodeFacts) -> dict[str, Any]:
    """The recon facts worth exporting and reviewing, as plain JSON-able values.

    Only facts that stay put between runs: free memory and disk change every minute and would
    make every preview show a changed output; `make recon` shows them live.
    """
    gpu = facts.gpus[0] if facts.gpus else None
    return {
        "hostname": facts.hostname,
        "os": facts.os.pretty_name,
        "kernel": facts.os.kernel,
        "arch": facts.os.arch,
        "dgxSpark": facts.os.is_dgx_spark,
        "gpu": gpu.name if gpu else None,
        "computeCapability": gpu.compute_capability if gpu else None,
        "driver": gpu.driver_version if gpu else None,
        "cuda": gpu.cuda_version if gpu else None,
        "memTotalBytes": facts.memory.total_bytes,
        "unifiedMemory": facts.memory.unified,
        "docker": facts.docker.version if facts.docker else None,
        "foreignContainers": [c.name for c in facts.foreign_containers()],
        "interfaces": {
            i.name: {"ipv4": i.ipv4, "mtu": i.mtu, "carrier": i.carrier, "speedMbps": i.speed_mbps}
            for i in facts.interfaces
        },
        "roce": {r.device: r.state for r in facts.roce},
    }


@dataclass
class SparkNodeArgs:
    node: NodeConfig  # its host key pinned (config.pin_host_keys)
    ssh: SshConfig
    facts: NodeFacts
    role: Role
    private_key_path: str  # the file ssh uses (config.ssh_key_path)
    known_hosts_path: str
    ssh_private_key: pulumi.Input[str]  # secret
    stack_label: str  # <project>/<stack>, recorded with containers the stack stops
    stop_containers: list[ContainerFacts] = field(default_factory=list)
    # Registries that speak plain HTTP (image.plainHttpRegistry, gateway.image's): the
    # provider's registry client must use http:// for them when resolving a tag (it has no
    # credentials to send).
    plain_http_registries: tuple[str, ...] = ()


class SparkNode(pulumi.ComponentResource):
    """One Spark: docker provider, SSH connection, role, facts, stopped foreign containers."""

    provider: docker.Provider
    connection: remote.ConnectionArgs
    stopped: list[remote.Command]

    def __init__(
        self, name: str, args: SparkNodeArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        node = args.node
        props: SparkNodeProps = {"name": node.name, "host": node.host,
                                 "hostKey": node.pinned_host_key, "role": args.role}
        super().__init__(types.SPARK_NODE, name, props, opts)
        self.name = node.name
        self.role: Role = args.role
        self.node = node
        self.facts = args.facts
        self.fabric_ip = node.primary.ip

        self.ssh_opts = ssh_options(
            node,
            key_path=os.path.expanduser(args.private_key_path),
            known_hosts=args.known_hosts_path,
            connect_timeout=args.ssh.connect_timeout_seconds,
        )
        registry_auth = [
            docker.ProviderRegistryAuthArgs(address=f"http://{r}", auth_disabled=True)
            for r in args.plain_http_registries
        ] or None
        self.provider = docker.Provider(
            f"{name}-docker",
            host=f"ssh://{node.user}@{node.host}:{node.port}",
            ssh_opts=self.ssh_opts,
            registry_auth=registry_auth,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.connection = remote.ConnectionArgs(
            host=node.host,
            port=node.port,
            user=node.user,
            host_key=node.pinned_host_key,
            private_key=pulumi.Output.secret(args.ssh_private_key),
            per_dial_timeout=args.ssh.connect_timeout_seconds,
            dial_error_limit=3,
        )

        self.stopped_names = [c.name for c in args.stop_containers]
        self.stopped = [
            self.command(
                f"{name}-stop-{c.name}",
                self,
                create=stop_foreign_container(c.name, args.stack_label),
                delete=start_foreign_container(c.name),
            )
            for c in args.stop_containers
        ]

        self.summary = facts_summary(args.facts)
        self.register_outputs(
            {
                "name": node.name,
                "role": args.role,
                "host": node.host,
                "hostKey": node.pinned_host_key,  # stack-level policies (prod-pinned) read outputs
                "fabricIp": self.fabric_ip,
                "facts": self.summary,
                "stoppedContainers": self.stopped_names,
            }
        )

    def command(
        self,
        name: str,
        parent: pulumi.Resource,
        *,
        create: pulumi.Input[str],
        update: pulumi.Input[str] | None = None,
        delete: pulumi.Input[str] | None = None,
        stdin: pulumi.Input[str] | None = None,
        triggers: Sequence[Any] | None = None,
        logging: remote.Logging | None = None,
        depends_on: Sequence[pulumi.Resource] = (),
        ignore_changes: list[str] | None = None,
        retain_on_delete: bool | None = None,
        secret_outputs: list[str] | None = None,
        delete_before_replace: bool | None = None,
        timeout_seconds: int | None = None,
    ) -> remote.Command:
        """A `remote.Command` that runs on this node, as a child of `parent`."""
        timeouts = None
        if timeout_seconds is not None:
            timeouts = pulumi.CustomTimeouts(
                create=f"{timeout_seconds}s", update=f"{timeout_seconds}s"
            )
        return remote.Command(
            name,
            connection=self.connection,
            add_previous_output_in_env=False,
            create=create,
            update=update,
            delete=delete,
            stdin=stdin,
            triggers=list(triggers) if triggers is not None else None,
            logging=logging,
            opts=pulumi.ResourceOptions(
                parent=parent,
                depends_on=list(depends_on) or None,
                ignore_changes=ignore_changes,
                retain_on_delete=retain_on_delete,
                additional_secret_outputs=secret_outputs,
                delete_before_replace=delete_before_replace,
                custom_timeouts=timeouts,
            ),
        )


@dataclass(frozen=True)
class Cluster:
    """The nodes of a stack: the Ray head (the first node of the config) and the workers."""

    head: SparkNode
    workers: tuple[SparkNode, ...]

    @property
    def nodes(self) -> tuple[SparkNode, ...]:
        return (self.head, *self.workers)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]
