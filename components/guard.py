"""NodeGuard: one node that survives memory exhaustion (config/guard.py; what runs on the node:
hostscripts/guard.py; docs/design.md "A node that survives memory exhaustion").

On a DGX Spark the GPU's memory is the system's: a node pushed past it resets, or its sshd stops
answering while vLLM's restarts leak more. Per node, with `guard.enabled`:

* `guard-<node>-install` (`guard.install` only): the killer's Debian/Ubuntu package when the
  node lacks its program; never removed by the stack;
* `guard-<node>-records`: the node's guard folder (hostscripts/paths.GUARD_DIR): the record of
  every OOM kill, the kill hook that writes it, the count the node exporter reads. The API vLLM
  containers mount it read-only (their watchdog reads the kills), so this command's ID is in
  their labels: made again (recon found the folder gone), it replaces them, whose mount held the
  folder that went;
* `guard-<node>-daemons`: the stack's drop-ins that keep sshd and dockerd out of the OOM killer's
  way, applied to the running daemons too;
* `guard-<node>-<killer>` (`earlyoom` or `systemd-oomd`): the early OOM killer, configured by the
  stack's drop-in and (re)started with it. A killer changed in the config is a delete of one and
  a create of the other.

Drift: recon reads the stack's drop-ins (their sha256), whether the killer runs and whether the
folder is there (inspection/snippets/guard.sh). A drop-in changed or removed by hand, the killer
stopped, the folder gone: that command gets a value in `triggers` never seen before
(components/rerun.Again) and is replaced, delete before create, and nothing else is. In step, the
state's trigger is kept: no diff. A declared change (a new reserve) replaces the command likewise:
the files on the node are judged against the declaration. `destroy` removes the stack's
drop-ins and, with the last stack of the node, the folder, and puts the killer back as the node
ran it before.

vLLM's own part is in its containers (hostscripts/vllm.OomWatch): vLLM raises its oom_score_adj
to `guard.vllmScoreAdj` when it starts, and the watchdog records an OOM kill that ended it and
waits `guard.oomBackoffSeconds` before the next start.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components import rerun
from components.rerun import Again
from components.spark_node import SparkNode
from config.guard import GuardConfig
from contract import types
from contract.props import NodeGuardProps
from hostscripts import guard as g
from inspection.facts import NodeFacts


def spec_of(node: SparkNode, guard: GuardConfig, reserve_bytes: int, stack: str) -> g.GuardSpec:
    return g.GuardSpec(node=node.name, stack=stack, killer=guard.killer,
                       reserve_bytes=reserve_bytes, protect_score_adj=guard.protect_score_adj)


def _files_drift(want: dict[str, str], facts: NodeFacts) -> list[str]:
    """Why the stack's drop-ins on the node are not the declared ones (empty: they are)."""
    if facts.guard is None:  # not surveyed: preflight says so
        return []
    out = []
    for path, text in want.items():
        have = facts.guard.files.get(path)
        if have is None:
            out.append(f"{path} missing")
        elif have != g.sha256(text):
            out.append(f"{path} changed")
    return out


def daemons_drift(spec: g.GuardSpec, facts: NodeFacts) -> list[str]:
    return _files_drift(g.daemon_files(spec), facts)


def killer_drift(spec: g.GuardSpec, facts: NodeFacts) -> list[str]:
    out = _files_drift(g.killer_files(spec), facts)
    if facts.guard is not None:
        state = facts.guard.active.get(spec.killer_unit, "unknown")
        if state != "active":
            out.append(f"{spec.killer_unit} is {state}")
    return out


def records_gone(facts: NodeFacts) -> bool:
    return facts.guard is not None and not facts.guard.records_present


def install_wanted(guard: GuardConfig, facts: NodeFacts) -> bool:
    """Recon found the killer's program gone from a node where the stack installs it."""
    return facts.guard is not None and not facts.guard.has(guard.killer)


@dataclass
class NodeGuardArgs:
    node: SparkNode
    guard: GuardConfig
    reserve_bytes: int  # preflight.osReserveBytes: where the killer acts
    stack: str


class NodeGuard(pulumi.ComponentResource):
    """One node's guard (see the module docstring)."""

    install: remote.Command | None
    records: remote.Command
    daemons: remote.Command
    killer: remote.Command
    args_killer: str  # guard.killer
    drift: dict[str, list[str]]

    def __init__(self, name: str, args: NodeGuardArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        node, guard = args.node, args.guard
        spec = spec_of(node, guard, args.reserve_bytes, args.stack)
        props: NodeGuardProps = {
            "node": node.name,
            "host": node.node.host,
            "killer": guard.killer,
            "install": guard.install,
            "reserveBytes": args.reserve_bytes,
            # earlyoom's thresholds (systemd-oomd acts on memory pressure instead)
            "termBelowBytes": spec.term_kib * g.KiB if guard.killer == "earlyoom" else None,
            "killBelowBytes": spec.kill_kib * g.KiB if guard.killer == "earlyoom" else None,
            "protected": {u: guard.protect_score_adj for u in g.DAEMON_UNITS},
            "vllmScoreAdj": guard.vllm_score_adj,
            "prefer": g.PREFER if guard.killer == "earlyoom" else None,
            "avoid": g.AVOID if guard.killer == "earlyoom" else None,
            "files": sorted({**g.daemon_files(spec), **g.killer_files(spec)}),
        }
        super().__init__(types.NODE_GUARD, name, props, opts)
        self.args_killer = guard.killer
        facts = node.facts
        self.drift = {"daemons": daemons_drift(spec, facts),
                      guard.killer: killer_drift(spec, facts),
                      "records": ["the guard's folder is gone"] if records_gone(facts) else []}
        for what, why in self.drift.items():
            if why:  # say why the preview replaces it
                pulumi.log.info(f"guard {node.name} {what} is not as the stack declares it: "
                                f"{'; '.join(why)}; the up applies it", resource=self)

        def again(why: list[str]) -> Again:
            # a value never seen before when it drifted (the same drift twice must run twice)
            return Again.when_wiped([rerun.fresh_trigger()] if why else [])

        self.install = None
        if guard.install:
            a = again(["missing"] if install_wanted(guard, facts) else [])
            self.install = node.command(
                f"{name}-install", self,
                create=g.install_script(spec),
                triggers=a.triggers, ignore_changes=a.ignore_changes,
                delete_before_replace=True,
                timeout_seconds=600,
            )
        a = again(self.drift["records"])
        self.records = node.command(
            f"{name}-records", self,
            create=g.records_script(spec),
            update=g.records_script(spec),
            delete=g.records_remove(spec),
            triggers=a.triggers, ignore_changes=a.ignore_changes,
            delete_before_replace=True,
        )
        a = again(self.drift["daemons"])
        script = g.daemons_script(spec)
        self.daemons = node.command(
            f"{name}-daemons", self,
            create=script, update=script,
            delete=g.daemons_remove(spec),
            triggers=a.triggers, ignore_changes=a.ignore_changes,
            delete_before_replace=True,
        )
        a = again(self.drift[guard.killer])
        script = g.killer_script(spec)
        self.killer = node.command(
            f"{name}-{guard.killer}", self,
            create=script, update=script,
            delete=g.killer_remove(spec),
            triggers=a.triggers, ignore_changes=a.ignore_changes,
            delete_before_replace=True,
            depends_on=[self.records, *([self.install] if self.install else [])],
        )
        self.register_outputs({
            **props,
            "drift": self.drift,
            "daemonsApplied": self.daemons.stdout,
            "killerApplied": self.killer.stdout,
        })
