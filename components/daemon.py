"""A configured daemon on the head, as resources: what the gateway (components/gateway.py) and
monitoring's Prometheus and Alertmanager (components/monitoring.py) build alike. Their scripts
come from hostscripts/daemon.py.

* `remote_image`: the daemon's image, pulled by digest (a tag is resolved at the registry
  first: components/vllm_image.py `pull_ref`, the serving image's);
* `rerun_command`: a command of the daemon (its configuration, a secret file, a data folder, its
  gate) that runs again when `again` says so (components/rerun.py: a fresh trigger after recon
  found what it made gone, or recon's reason to start a container) and is replaced delete
  first (its name, its files);
* `config_command`: its configuration's command (hostscripts' config_write with the image's ID,
  config_remove), `secret_command`: a secret file's (the secret on stdin, its stdout only
  marking a change);
* `container`: the daemon's container: host network, restart `unless-stopped`, never
  privileged, replaced delete first (its name and its port on the node), root inside unless
  told (it reads the root-only files on every reload); none of the configuration is in its
  inputs, so a new configuration reloads it and never replaces it.

Recon's reason to start a stopped one: components/gateway.py restart_reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.rerun import Again
from components.spark_node import SparkNode
from components.vllm_image import pull_ref


def remote_image(name: str, parent: pulumi.Resource, ref: str,
                 node: SparkNode) -> docker.RemoteImage:
    """The image `ref` on `node`, pulled by digest (pull_ref) and kept there."""
    return docker.RemoteImage(
        name,
        name=pull_ref(parent, ref, node),
        keep_locally=True,
        opts=pulumi.ResourceOptions(parent=parent, provider=node.provider),
    )


def rerun_command(node: SparkNode, name: str, parent: pulumi.Resource, again: Again, /,
                  **more: Any) -> remote.Command:
    """A command on `node` that runs again as `again` says (its `triggers` and
    `ignore_changes`), replaced delete first; `more`: SparkNode.command's other arguments."""
    return node.command(name, parent, triggers=again.triggers,
                        ignore_changes=again.ignore_changes, delete_before_replace=True, **more)


def config_command(node: SparkNode, name: str, parent: pulumi.Resource, again: Again,
                   image: docker.RemoteImage, write: Callable[[str], str], remove: str, /,
                   **more: Any) -> remote.Command:
    """The daemon's configuration: `write(image ID)` (the image checks it), `remove` on delete;
    replaced delete first (a fresh trigger: its delete removes the folders)."""
    return rerun_command(node, name, parent, again, create=image.image_id.apply(write),
                         delete=remove, **more)


def secret_command(node: SparkNode, name: str, parent: pulumi.Resource, again: Again,
                   write: str, remove: str, stdin: pulumi.Input[str], /) -> remote.Command:
    """A secret file of the daemon: `stdin` (a secret) written by `write` (which prints the
    file's hash: only a change marker, so only stderr is logged), removed by `remove`."""
    return rerun_command(node, name, parent, again, create=write, delete=remove, stdin=stdin,
                         secret_outputs=["stdin", "stdout"], logging=remote.Logging.STDERR)


def bind_mounts(conf: tuple[str, str],
                data: tuple[str, str] | None = None) -> list[docker.ContainerMountArgs]:
    """The daemon's folders as its container sees them: (target, source) of its configuration
    folder (read-only), and of its data folder (written) when it has one."""
    out = [docker.ContainerMountArgs(target=conf[0], type="bind", source=conf[1],
                                     read_only=True)]
    if data is not None:
        out.append(docker.ContainerMountArgs(target=data[0], type="bind", source=data[1]))
    return out


def container(resource: str, parent: pulumi.Resource, node: SparkNode,
              image: docker.RemoteImage, name: str, entrypoints: Sequence[str],
              command: Sequence[str], /, *, labels: Sequence[docker.ContainerLabelArgs],
              depends_on: Sequence[pulumi.Resource] | None, destroy_grace_seconds: int,
              user: str | None = "0", **more: Any) -> docker.Container:
    """The daemon's container `name` on `node`, of `image` (see the module's docstring); `more`:
    its mounts, volumes, pid_mode..."""
    if user is not None:
        more["user"] = user
    return docker.Container(
        resource,
        name=name,
        image=image.image_id,
        entrypoints=list(entrypoints),
        command=list(command),
        network_mode="host",
        restart="unless-stopped",
        labels=list(labels),
        privileged=False,
        destroy_grace_seconds=destroy_grace_seconds,
        opts=pulumi.ResourceOptions(
            parent=parent,
            provider=node.provider,
            delete_before_replace=True,
            depends_on=list(depends_on) if depends_on is not None else None,
        ),
        **more,
    )
