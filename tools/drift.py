"""What `spark-vllm reconcile` repairs by itself, and what it only reports (issue 50).

A preview (with a refresh first) of a stack whose stack file is the config of its last
successful update lists the steps that would bring the hosts back to that config. Each step is
a Change: the resource's type and name (the last part of its URN), the engine's operation and
the properties whose difference caused it. A Change is in a repair class when its resource,
operation and changed properties match one row of CLASSES; the run applies the `up` only when
every Change is in one, and reports the others by name otherwise.

Why these classes and no others: each repairs what the stack itself wrote on a node and what
only the stack uses, without moving the model, pulling an image or changing what vLLM runs with:
the fabric's interfaces (and the MTU checks and the collective gate that run again after them),
the host firewall's and the guards' rules, monitoring's and the gateway's configuration files
(each written, checked and reloaded in place), and a container of the stack that is stopped or
gone (the docker provider's refresh drops a stopped one, `must_run`, so both come back as a
create), with what must run again because of it: a container whose only changed input is a label
naming the ID of one made again, and the gates that start a stopped container and prove it
serves. Everything else is reported, never applied: a deletion (the declared stack has less than
the hosts), an image (a tag that moved: a new image replaces vLLM), a changed command,
environment or mount of a container (the program or its config changed), the model's cache (its
repair moves bytes), the Ray token and API key files, a component's props. So are a policy
violation and a node the preview could not reach (the preview fails first).

The firewall and guard classes match by name prefix (`firewall-`, `guard-`): the components
that make them (a NodeFirewall, a NodeGuard) name every resource so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

COMMAND = "command:remote:Command"
CONTAINER = "docker:index/container:Container"
STACK = "pulumi:pulumi:Stack"  # the stack itself: its outputs, never a change on a host

# the engine's operations, as one word each (a delete-before-replace is two steps: one replace)
REPLACE_OPS = ("replace", "create-replacement", "delete-replaced", "discard-replaced")
IGNORED_OPS = ("same", "read", "refresh", "read-replacement", "import")
MAKE = frozenset({"create", "update", "replace"})  # never a delete


@dataclass(frozen=True)
class Change:
    """One step a preview plans: `kind` the resource's type token, `name` its name (the URN's
    last part), `op` create | update | replace | delete, `diffs` the properties that differ."""

    kind: str
    name: str
    op: str
    diffs: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.name} {self.op}"


@dataclass(frozen=True)
class RepairClass:
    """A class of changes the reconcile applies by itself: resources of `kinds` (None: any
    type) whose name matches `names`, operations in `ops`, and, when `diffs` is given, only
    those properties changed (an empty difference too: a create after a refresh has none)."""

    name: str
    kinds: tuple[str, ...] | None
    names: re.Pattern[str]
    ops: frozenset[str]
    diffs: frozenset[str] | None
    why: str

    def matches(self, c: Change) -> bool:
        if self.kinds is not None and c.kind not in self.kinds:
            return False
        if not self.names.fullmatch(c.name) or c.op not in self.ops:
            return False
        return self.diffs is None or set(c.diffs) <= self.diffs


def _names(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# The one table: what is repaired without a human. The order only decides which class a Change
# is counted in when two would take it (none does today).
CLASSES: tuple[RepairClass, ...] = (
    RepairClass(
        "fabric", None, _names(r"fabric-[A-Za-z0-9_.:-]+|nccl-fabric-[a-z0-9-]+"), MAKE, None,
        "a fabric interface's address, MTU, link or netplan file changed behind the stack "
        "(components/fabric.py), and the MTU checks between the nodes that run again after it"),
    RepairClass(
        "fabric", (COMMAND,), _names(r"collective-rank-[a-z0-9-]+|collective-check"), MAKE, None,
        "the collective bandwidth gate (components/collective.py), which measures the fabric "
        "again after it changed (and, outside dev, stops the repair below its threshold)"),
    RepairClass(
        "firewall", None, _names(r"firewall-[A-Za-z0-9-]+|vllm-master-guard"), MAKE, None,
        "a host firewall rule of the stack gone (a reboot forgets them): the NodeFirewall's "
        "(`firewall-*`) and mp's rendezvous guard"),
    RepairClass(
        "guard", None, _names(r"guard-[A-Za-z0-9-]+"), MAKE, None,
        "a NodeGuard's check or rule (`guard-*`) gone or changed behind the stack"),
    RepairClass(
        "monitoring files", (COMMAND,),
        _names(r"monitoring-(key|config|data|alertmanager-config)"), MAKE, None,
        "Prometheus's or Alertmanager's configuration, key file or data folders wiped behind "
        "the stack: written again, checked, reloaded"),
    RepairClass(
        "gateway configuration", (COMMAND,), _names(r"gateway-(config|key|tls)"), MAKE, None,
        "the gateway's configuration or its key or TLS files wiped behind the stack: written "
        "again, checked with haproxy -c, reloaded (no connection dropped)"),
    RepairClass(
        "stopped or missing container", (CONTAINER,), _names(r"[a-z0-9-]+"),
        frozenset({"create", "replace"}), frozenset({"labels"}),
        "a container of the stack stopped or removed by hand (made again with the same image "
        "and command), or one whose only change is a label naming the ID of one made again"),
    RepairClass(
        "stopped or missing container", (COMMAND,),
        _names(r"vllm-health|vllm-nccl-log|vllm-transport|vllm-ranks-restart|ray-ready|"
               r"gateway-health|monitoring-health|monitoring-node-exporter-start-[a-z0-9-]+|"
               r"svc-[a-z0-9-]+-health-[a-z0-9-]+"),
        MAKE, frozenset({"triggers", "create", "stdin"}),
        "the gates that start a stopped container of the stack and prove it again (their "
        "marker or the container IDs in their text changed, nothing else)"),
)


def classify(change: Change) -> RepairClass | None:
    """The repair class of a change, or None: reported, not applied."""
    return next((c for c in CLASSES if c.matches(change)), None)


@dataclass
class Verdict:
    """The changes of a preview, by repair class, and those in none."""

    safe: dict[str, list[Change]]
    unsafe: list[Change]

    @property
    def changes(self) -> int:
        return sum(len(v) for v in self.safe.values()) + len(self.unsafe)

    @property
    def repairable(self) -> bool:
        return not self.unsafe


def verdict(changes: Iterable[Change]) -> Verdict:
    safe: dict[str, list[Change]] = {}
    unsafe: list[Change] = []
    for c in changes:
        if c.kind == STACK:
            continue
        cls = classify(c)
        if cls is None:
            unsafe.append(c)
        else:
            safe.setdefault(cls.name, []).append(c)
    return Verdict(safe, unsafe)


def _op(metadata: Any) -> str:
    op = str(getattr(metadata.op, "value", metadata.op))
    return "replace" if op in REPLACE_OPS else op


def changes_of(events: Sequence[Any]) -> list[Change]:
    """The Changes an engine run's events plan (or made): one per resource, from its
    resource_pre_event (a replace's several steps are one `replace`)."""
    out: dict[str, Change] = {}
    for e in events:
        pre = getattr(e, "resource_pre_event", None)
        if pre is None or pre.metadata is None:
            continue
        m = pre.metadata
        op = _op(m)
        if op in IGNORED_OPS:
            continue
        urn = str(m.urn)
        kind = str(getattr(m, "type", "") or urn.split("::")[-2].split("$")[-1])
        name = urn.split("::")[-1]
        diffs = tuple(sorted({str(d) for d in (getattr(m, "diffs", None) or [])}))
        before = out.get(urn)
        if before is not None:
            diffs = tuple(sorted(set(diffs) | set(before.diffs)))
            op = "replace" if "replace" in (op, before.op) else op
        out[urn] = Change(kind, name, op, diffs)
    return list(out.values())


def policy_findings(events: Sequence[Any]) -> list[str]:
    """`<policy>: <message>` of every policy event (advisory or mandatory) of a run."""
    found = []
    for e in events:
        ev = getattr(e, "policy_event", None)
        if ev is None:
            continue
        name = getattr(ev, "policy_name", "") or "policy"
        level = getattr(ev, "enforcement_level", "")
        text = str(getattr(ev, "message", "") or "").strip()
        line = f"{name} ({level}): {text.splitlines()[-1] if text else ''}".strip()
        if line not in found:
            found.append(line)
    return found
