"""A model's verified deployment on its nodes (issue 49; docs/design.md "An upgrade that
fails"): what the health gate and the `*-deployment-<node>` commands hand to
payloads/deployment.py, and the record's place.

Every value that reaches a script here is of its exact form: container names and file paths the
program chose, ids of 16 hex the program checked (`deployment_id`) after reading them back from
a node, the outcome words. The record itself (Docker's view of each container, the log tail)
stays on the node: it is read there by the payload, never put into a script's text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hostscripts.common import RemoteValueError, container_name, payload, q, stack_path_remove
from hostscripts.paths import StackNames

DEPLOYMENT_PY = payload("deployment.py")
RESTORED_LABEL = "spark-vllm.restored"  # on a container a restore recreated: the restore's id
AFTER_RESTORE_LABEL = "spark-vllm.after-restore"  # on one the stack made after that restore
_HEX16 = re.compile(r"[0-9a-f]{16}")
# What a node's step of a deployment says it did (its stdout's `result`)
NODE_RESULTS = ("recorded", "restored", "kept", "not-restored", "nothing")
OnFailure = Literal["restore", "keep"]


def deployment_id(value: object) -> str:
    """A deployment's or a restore's id (16 hex, made by the payload on a node), or
    RemoteValueError: it goes into the next scripts and a container label."""
    if not isinstance(value, str) or _HEX16.fullmatch(value) is None:
        raise RemoteValueError(f"not a deployment id (16 hex): {str(value)[:40]!r}")
    return value


@dataclass(frozen=True)
class Held:
    """One container of a model on one node, in start order, and the files the stack uploads
    into it (the record keeps them: Docker's inspect does not)."""

    name: str
    files: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"name": container_name(self.name), "files": list(self.files)}


@dataclass(frozen=True)
class NodeDeployment:
    """A model's part on one node: where its record is and which containers it holds."""

    dir: str  # StackNames.deployment_dir(...)
    containers: tuple[Held, ...]

    def args(self, **more: Any) -> dict[str, Any]:
        return {"dir": self.dir, "containers": [c.as_json() for c in self.containers], **more}


@dataclass(frozen=True)
class GateRestore:
    """What the health gate does on its node when vLLM fails it: with `on_failure` restore, this
    node's recorded containers put back, when the last verified deployment (its summary on this
    node) had this `shape`, the containers per node this up declares (another shape: a node
    added or gone, the executor switched; nothing of that shape was verified)."""

    node: NodeDeployment
    api: str  # the container whose vLLM the gate probes
    shape: Mapping[str, Sequence[str]]  # node -> the model's containers there, in start order
    on_failure: OnFailure

    def args(self) -> dict[str, Any]:
        restore = None if self.on_failure == "keep" else {"shape": shape_of(self.shape)}
        return self.node.args(restore=restore, api=container_name(self.api))


def shape_of(shape: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """A model's containers per node, as the record and the gate compare them."""
    return {node: [container_name(c) for c in names] for node, names in sorted(shape.items())}


# The shell function a script defines once (PAYLOAD_DEFINE) and calls as often as it needs:
# the payload's text is in the script (and in an error's echo of it) once.
PAYLOAD_FN = "spark_vllm_deployment"
PAYLOAD_DEFINE = f"{PAYLOAD_FN}() {{ python3 -c {q(DEPLOYMENT_PY)} \"$@\"; }}"


def run_payload(command: str, args: Mapping[str, Any], *extra: str) -> str:
    """A call of payloads/deployment.py `<command> '<args as JSON>' <extra...>` (quoted),
    through the function PAYLOAD_DEFINE defines: the script must hold that line first."""
    words = [q(json.dumps(dict(args), sort_keys=True, separators=(",", ":"))), *extra]
    return f"{PAYLOAD_FN} {command} " + " ".join(words)


@dataclass(frozen=True)
class GateVerdict:
    """The health gate's answer (its stdout's last line), checked: `ok` with the new
    deployment's id, or failed and, when it put the last verified deployment back on its node,
    that deployment's id and the restore's."""

    ok: bool
    deployment: str | None = None  # ok: the new one's id
    restored_from: str | None = None  # failed and put back: the last verified one's id
    restore: str | None = None  # and the restore's id (the label on what it recreated)


def parse_gate(stdout: str | None) -> GateVerdict:
    """The gate's stdout -> GateVerdict; what cannot be read is a failure with nothing put back
    (the head's deployment step then fails the `up` saying so)."""
    lines = [ln for ln in (stdout or "").splitlines() if ln.strip()]
    try:
        v = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return GateVerdict(ok=False)
    if not isinstance(v, dict):
        return GateVerdict(ok=False)
    try:
        if v.get("health") == "ok":
            return GateVerdict(ok=True, deployment=deployment_id(v.get("deployment")))
        r = v.get("restore")
        if v.get("health") == "failed" and isinstance(r, dict) and not v.get("notRestored") \
                and r.get("restored") is not None:
            return GateVerdict(ok=False, restored_from=deployment_id(r.get("deployment")),
                               restore=deployment_id(r.get("restore")))
    except RemoteValueError:
        pass
    return GateVerdict(ok=False)


def node_result(stdout: str | None) -> str:
    """What a node's deployment step did (NODE_RESULTS), or `unreadable`."""
    lines = [ln for ln in (stdout or "").splitlines() if ln.strip()]
    try:
        v = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return "unreadable"
    word = v.get("result") if isinstance(v, dict) else None
    return word if word in NODE_RESULTS else "unreadable"


def node_step(node: NodeDeployment, verdict: GateVerdict) -> str:
    """On a node of a model other than its API node, after the gate: the node's containers
    recorded under the new deployment's id (a pass), or the last verified ones put back (the
    gate put them back on its node: the same deployment, the same restore id), or nothing. Its
    text changes with every run of the gate (the ids), so it runs exactly then."""
    lines = ["set -eu", PAYLOAD_DEFINE]
    if verdict.ok:
        lines.append(run_payload("record", node.args(deployment=verdict.deployment)))
    elif verdict.restored_from is not None:
        lines.append(run_payload("restore", node.args(expect=verdict.restored_from,
                                                      restore=verdict.restore)))
    else:
        lines.append("echo '{\"result\": \"nothing\"}'")
        lines.append("echo 'the gate put nothing back: this node keeps what runs' >&2")
    return "\n".join(lines)


def after_restore(labels: Mapping[str, str]) -> str | None:
    """The restore a running container came from or follows (its RESTORED_LABEL, else its
    AFTER_RESTORE_LABEL), when that is a deployment id; None otherwise."""
    for key in (RESTORED_LABEL, AFTER_RESTORE_LABEL):
        value = labels.get(key)
        if value is not None:
            try:
                return deployment_id(value)
            except RemoteValueError:
                return None
    return None


def restored_remove(container: str, stack_label: str, restore: str) -> str:
    """On a node, before the stack makes `container` again after a restore (issue 49): the
    container restore `restore` put back under that name (the stack's, carrying its
    RESTORED_LABEL) stopped and removed, so the name is free; any other container of that name
    is left alone (the create then fails naming it). Its text names only the restore, so it
    runs once per restore."""
    c = q(container_name(container))
    label = "{{index .Config.Labels " + json.dumps(RESTORED_LABEL) + "}} " \
        "{{index .Config.Labels \"spark-vllm.stack\"}}"
    return "\n".join([
        "set -eu",
        f"# restore {deployment_id(restore)}",
        f"if [ \"$(docker inspect -f {q(label)} {c} 2>/dev/null || true)\" = "
        f"{q(f'{restore} {stack_label}')} ]; then",
        f"  docker stop -t 60 {c} >/dev/null || true",
        f"  docker rm -f {c} >/dev/null",
        f"  echo {q(f'removed {container}, put back by restore {restore}')}",
        "else",
        f"  echo {q(f'{container} is not the one restore {restore} put back: nothing removed')}",
        "fi",
    ])


def deployment_remove(names: StackNames, folder: str) -> str:
    """A node's record of a model (the step's delete: the model left the node, or destroy):
    its files, and its folders up to the stack's as far as they are empty."""
    return stack_path_remove(names, *(f"{folder}/{f}" for f in (
        "containers.json", "verified.json", "verdict.json", "containers.json.new",
        "verified.json.new", "verdict.json.new")))


def results_of(nodes: Mapping[str, str | None]) -> dict[str, str]:
    """Each other node's result word, from its step's stdout."""
    return {n: node_result(out) for n, out in sorted(nodes.items())}


def status_args(folder: str, container: str) -> str:
    """The `status` call of payloads/deployment.py for `spark-vllm status` (a script of its
    own)."""
    return "\n".join([PAYLOAD_DEFINE, run_payload(
        "status", {"dir": folder, "container": container_name(container)})])


def summary_facts(*, image: str, repo: str, commit: str, served_name: str,
                  shape: Mapping[str, Sequence[str]],
                  drafter: Mapping[str, str] | None) -> dict[str, Any]:
    """What the program adds to a verified deployment's summary (the rest is read on the
    node): the image as the stack names it, the model and its drafter, its nodes and the
    containers on each (the shape a later gate compares)."""
    return {"image": image, "model": {"repo": repo, "commit": commit},
            "drafter": dict(drafter) if drafter else None, "servedModelName": served_name,
            "nodes": sorted(shape), "shape": shape_of(shape)}
