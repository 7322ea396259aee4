"""A model's verified deployment in the graph (issue 49; docs/design.md "An upgrade that fails").

Not a component: what VllmServer, VllmService and RayCluster share about it.

* `restore_labels`: after a restore the state still holds the failed version's containers,
  which are gone. A container resource whose node runs a container of its name that a restore
  recreated (label `spark-vllm.restored`), or one made after such a restore
  (`spark-vllm.after-restore`), gets `spark-vllm.after-restore=<that restore's id>`: the next
  preview shows it replaced (only a new restore changes the value again).
* `restored_removal`: the container a restore put back holds the name of the container the
  stack makes again: it goes right before.
* `deployment_steps`: after the gate, `<prefix>-deployment-<node>` on every other node of the
  model (record, or put back) and last on the API node (record and summary, or fail the `up`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.spark_node import SparkNode
from contract import labels as lbl
from hostscripts.deployment import (
    AFTER_RESTORE_LABEL,
    NodeDeployment,
    after_restore,
    deployment_remove,
    node_step,
    parse_gate,
    restored_remove,
    results_of,
)
from hostscripts.paths import StackNames
from hostscripts.vllm import NO_DRAFTER_WEIGHTS


def _restore_of(node: SparkNode, container: str, stack_label: str) -> str | None:
    for c in node.facts.docker.containers if node.facts.docker else []:
        if c.name == container and c.labels.get(lbl.STACK) == stack_label:
            return after_restore(c.labels)
    return None


def restore_labels(node: SparkNode, container: str,
                   stack_label: str) -> list[docker.ContainerLabelArgs]:
    """[`spark-vllm.after-restore=<id>`] when recon found `container` of this stack on `node`
    carrying a restore's id (module docstring), else []."""
    rid = _restore_of(node, container, stack_label)
    return [] if rid is None else [docker.ContainerLabelArgs(label=AFTER_RESTORE_LABEL,
                                                             value=rid)]


def restored_removal(res_name: str, parent: pulumi.Resource, node: SparkNode, container: str,
                     stack_label: str, after: Sequence[pulumi.Resource]) -> list[remote.Command]:
    """[`<res_name>-restored`] with the restore labels' condition: the container a restore put
    back under `container`'s name is not the stack's (the state holds the one it replaced), so
    it is removed right before the stack makes its own (after `after`, what that container
    waits for: the deployment put back serves until then); the container resource depends on
    it. [] when no restore is known there."""
    rid = _restore_of(node, container, stack_label)
    if rid is None:
        return []
    return [node.command(f"{res_name}-restored", parent,
                         create=restored_remove(container, stack_label, rid),
                         depends_on=list(after))]


def deployment_steps(
    prefix: str,
    parent: pulumi.Resource,
    gate: remote.Command,
    api_node: SparkNode,
    parts: Mapping[str, tuple[SparkNode, NodeDeployment]],
    names: StackNames,
    final: Callable[..., str],
    *,
    timeout_seconds: int,
    extra: Sequence[pulumi.Input[Any]] = (),
) -> tuple[dict[str, remote.Command], remote.Command]:
    """The steps after `gate` (module docstring): (the other nodes' by name, the API node's).
    `parts`: per node of the model its record folder and containers; `final(verdict, others,
    *extra)` builds the API node's script from the gate's verdict, what each other node did and
    the values of `extra` (the model's commit, ...)."""
    others: dict[str, remote.Command] = {}
    for name, (node, part) in parts.items():
        if node is api_node:
            continue

        def step(out: str, part: NodeDeployment = part) -> str:
            return node_step(part, parse_gate(out))

        others[name] = node.command(
            f"{prefix}-deployment-{name}",
            parent,
            create=gate.stdout.apply(step),
            delete=deployment_remove(names, part.dir),
            depends_on=[gate],
            timeout_seconds=600,
        )
    order = sorted(others)

    def last(values: list[Any]) -> str:
        mine = values[1:1 + len(order)]
        return final(parse_gate(values[0]), results_of(dict(zip(order, mine, strict=True))),
                     *values[1 + len(order):])

    own = parts[api_node.name][1]
    done = api_node.command(
        f"{prefix}-deployment-{api_node.name}",
        parent,
        create=pulumi.Output.all(gate.stdout, *[others[n].stdout for n in order],
                                 *extra).apply(last),
        delete=deployment_remove(names, own.dir),
        depends_on=[gate, *others.values()],
        timeout_seconds=timeout_seconds,
    )
    return others, done


def shape(parts: Mapping[str, tuple[SparkNode, NodeDeployment]]) -> dict[str, list[str]]:
    """A model's containers per node, in start order (what its record's shape holds)."""
    return {n: [h.name for h in part.containers] for n, (_, part) in sorted(parts.items())}


def drafter(speculative: Mapping[str, Any] | None, repo: str,
            commit: str) -> dict[str, str] | None:
    """The drafter a speculative config loads from the served repo, pinned to the served commit
    (hostscripts/vllm.pinned_speculative_config), for the summary; None without one."""
    if not speculative:
        return None
    if speculative.get("method") in NO_DRAFTER_WEIGHTS and "model" not in speculative:
        return None
    return {"repo": str(speculative.get("model", repo)),
            "commit": str(speculative.get("revision", commit))}
