"""CollectiveGate: the fabric proven at speed, after the fabric check and before vLLM.

The fabric check (components/nccl.py) proves that every pair carries the MTU; it says nothing of
speed, and a link that passes it can carry ~3 GB/s of collective bandwidth instead of ~22 GB/s
(NVIDIA/dgx-spark-playbooks issue 102: a wrong NCCL_IB_HCA; issue 25: the MTU), with vLLM then
serving at a fraction of its speed and no error. So, with `fabric.collective.enabled` and more
than one node, the serving image's own torch.distributed runs one rank per node
(`<name>-rank-<node>`, hostscripts/collective.py: the node's NCCL environment, NCCL on the GPU or
Gloo where there is none, the same code) and times all_gather and all_reduce over a sweep of
sizes up to `maxBytes`, each bounded by the memory recon found free (inspection/collective.sweep).
`<name>-check` on the head judges the figures (inspection/collective.judge: all_gather's bus
bandwidth as nccl-tests defines it against `minBusGBps`, NVIDIA's 21.875 GB/s for two nodes and
10 for a ring by default), leaves the record `spark-vllm status` shows
(StackNames.collective_record) and, where the gate is enforced (staging and prod by default),
fails below the threshold or without a figure, naming both and the likely causes: the model, Ray
and vLLM wait for it, so the serving vLLM is not replaced.

When it runs again: the ranks' scripts hold the image ID, each node's NCCL environment, the ranks,
the head's fabric address and the sizes, and every rank carries the digest of all of them in its
`triggers`, so all ranks run again together (a rank alone would wait for peers that never come)
when the image, the NCCL environment or the nodes change, or when a fabric interface the stack
configures ran (components/fabric.py: a declared change or a repaired drift). A no-op up runs
nothing. One more case, through components/rerun (a fresh trigger): recon found the last record
saying the gate stopped an up (the fabric may be fixed now: measure again rather than judge the
old figures), or found the record gone.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_command import remote

from components import rerun
from components.nccl import NcclEnvironment, twins_up
from components.spark_node import Cluster
from config import CollectiveConfig
from contract import labels as lbl
from contract import types
from contract.props import CollectiveGateProps
from hostscripts.collective import (
    collective_check,
    collective_rank,
    collective_record_remove,
    rank_request,
)
from hostscripts.paths import StackNames
from inspection.collective import (
    CollectiveError,
    NodeFabric,
    RankReport,
    Verdict,
    judge,
    parse_rank,
    sweep,
)


def rerun_reason(record_present: bool | None, stopped: bool | None) -> str | None:
    """Why the ranks must measure again although nothing they run changed: the last verdict
    stopped an up, or its record is gone (None: neither, or not surveyed)."""
    if record_present is False:
        return ("the head holds no record of the gate (a first run, or the stack's folder was "
                "wiped)")
    if stopped:
        return "the gate stopped the last up"
    return None


@dataclass
class CollectiveGateArgs:
    gate: CollectiveConfig
    environment: str
    cluster: Cluster
    nccl: NcclEnvironment  # each node's environment and the container extras RDMA needs
    rdma: bool
    mtu: int | None  # the fabric's MTU (fabric.mtu when the stack configures it)
    image_ids: Mapping[str, pulumi.Input[str]]
    names: StackNames
    labels: Mapping[str, str]
    nofile: int  # ray.nofile: the stack's GPU containers' open-file limit
    # the NCCL every node's serving vLLM loads (VllmImage.nccl) and each host's (recon): props
    # for the policy pack's nccl-build-advisory
    nccl_builds: pulumi.Input[Mapping[str, Any]] = field(default_factory=dict)
    # what must be done before a rank starts (the fabric checks, the image check)
    after: list[pulumi.Resource] = field(default_factory=list)
    # the fabric interfaces the stack configures: one that ran makes every rank run again
    configured: list[remote.Command] = field(default_factory=list)
    rerun: str | None = None  # rerun_reason(...) from recon


class CollectiveGate(pulumi.ComponentResource):
    """`ranks[node]`, `check` (None without a gate: disabled, or one node) and `summary` (the
    verdict's figures, the stack output `collectiveGate`)."""

    ranks: dict[str, remote.Command]
    check: remote.Command | None
    summary: pulumi.Output[dict[str, Any]]

    def __init__(self, name: str, args: CollectiveGateArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        cluster = args.cluster
        nodes = list(cluster.nodes)
        gate = args.gate
        # (not the props' names: a component's props become Output attributes of the same name)
        self.active = gate.enabled and len(nodes) > 1
        self.threshold_gbps = gate.threshold(len(nodes))
        self.enforced = gate.enforced(args.environment)
        self.sweep_sizes = sweep(gate.min_bytes, gate.max_bytes,
                                 [n.facts.memory.available_bytes for n in nodes])
        # what the policy pack judges; registered again as the outputs (a stack policy reads a
        # component's outputs, not the inputs it was made with)
        props: CollectiveGateProps = {
            "enabled": self.active,
            "environment": args.environment,
            "nodes": [n.name for n in nodes],
            "thresholdGBps": self.threshold_gbps,
            "enforce": self.enforced,
            "sizes": self.sweep_sizes if self.active else [],
            "rdma": args.rdma,
            "ncclBuilds": args.nccl_builds,
        }
        super().__init__(types.COLLECTIVE_GATE, name, props, opts)
        self.ranks = {}
        self.check = None
        if not self.active:
            why = "disabled (fabric.collective.enabled)" if not gate.enabled else "one node"
            self.summary = pulumi.Output.from_input({"verdict": f"not run: {why}"})
            self.register_outputs({**props, "summary": self.summary})
            return
        if args.rerun:
            pulumi.log.info(f"collective gate: {args.rerun}; the ranks measure again",
                            resource=self)
        labels = {**args.labels, lbl.ROLE: lbl.COLLECTIVE_GATE}
        extras = args.nccl.extras
        head = cluster.head

        def script(image: str | None, node: str, rank: int) -> str:
            return collective_rank(
                args.names, image or "", args.nccl.env[node],
                rank_request(rank=rank, world=len(nodes), master=head.fabric_ip,
                             port=gate.port, sizes=self.sweep_sizes,
                             deadline=gate.timeout_seconds),
                labels, devices=extras.devices, cap_add=extras.cap_add,
                memlock_unlimited=extras.memlock_unlimited, nofile=args.nofile)

        texts: dict[str, pulumi.Output[str]] = {}
        for i, n in enumerate(nodes):
            texts[n.name] = pulumi.Output.from_input(args.image_ids[n.name]).apply(
                functools.partial(script, node=n.name, rank=i))
        # every rank carries the digest of every rank's script: they run again together
        together = pulumi.Output.all(**texts).apply(
            lambda t: hashlib.sha256("\0".join(t[k] for k in sorted(t)).encode()).hexdigest())
        triggers: list[Any] = [together]
        triggers += [v for c in args.configured for v in (c.id, c.stdout)]
        # the last trigger: a fresh value when recon asks for a new measurement, else whatever
        # the state holds (ignored by its path), so the up after one that measured again sees
        # no diff (a list that grew or shrank by it would replace every rank once more)
        triggers.append(rerun.fresh_trigger() if args.rerun else "intact")
        ignore = None if args.rerun else [f"triggers[{len(triggers) - 1}]"]
        for n in nodes:
            self.ranks[n.name] = n.command(
                f"{name}-rank-{n.name}",
                self,
                create=texts[n.name],
                # its answer is one long JSON line for the check, which prints the verdict;
                # only a docker or torch complaint (stderr) shows in the `up`
                logging=remote.Logging.STDERR,
                triggers=triggers,
                ignore_changes=ignore,
                depends_on=args.after,
                # the deadline is the payload's own; this only bounds a wedged docker
                timeout_seconds=gate.timeout_seconds + 300,
            )
        facts = {n.name: NodeFabric(env=args.nccl.env[n.name], twins=len(n.node.fabric),
                                    twins_up=len(twins_up(n.node, n.facts))) for n in nodes}

        def verdict(stdouts: dict[str, str]) -> Verdict:
            reports: dict[str, RankReport | str] = {}
            for node, text in sorted(stdouts.items()):
                try:
                    reports[node] = parse_rank(node, text or "")
                except CollectiveError as exc:
                    reports[node] = str(exc)
            return judge(reports, threshold=self.threshold_gbps, enforce=self.enforced,
                         rdma=args.rdma, mtu=args.mtu, nodes=facts)

        judged = pulumi.Output.all(**{k: c.stdout for k, c in self.ranks.items()}).apply(verdict)
        self.summary = judged.apply(lambda v: v.summary)
        self.check = head.command(
            f"{name}-check",
            self,
            create=judged.apply(lambda v: collective_check(args.names, v.lines, v.problems,
                                                           v.warnings, v.summary)),
            delete=collective_record_remove(args.names),
            delete_before_replace=True,  # the new record is written after the old one goes
            depends_on=list(self.ranks.values()),
        )
        self.register_outputs({**props, "summary": self.summary})

    @property
    def done(self) -> Sequence[pulumi.Resource]:
        """What the model, Ray and vLLM wait for: the verdict (nothing without a gate)."""
        return [self.check] if self.check is not None else []
