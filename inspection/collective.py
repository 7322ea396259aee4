"""The collective bandwidth gate's figures and verdict: what the ranks measured, as nccl-tests
defines its bandwidths, against the stack's threshold. Pure: no resources, no hosts.

The ranks (hostscripts/payloads/collective_bench.py, one per node, in the serving image) time
all_gather and all_reduce at a sweep of sizes; each prints one JSON line. The figures are
recomputed here from what they measured (bytes, seconds, ranks), with nccl-tests' formula
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md; src/all_gather.cu and
src/all_reduce.cu `...GetBw`): algbw = bytes / seconds / 1e9, and the bus bandwidth
busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, where `bytes` is the whole
collective's size (all_gather: the send count x the ranks) and the time one iteration's,
averaged over the ranks (nccl-tests' `-a 1`).

The verdict judges all_gather's best bus bandwidth of the sweep, the figure NVIDIA's multi-Spark
setup judges (config.models NVIDIA_TWO_NODES_GBPS, NVIDIA_RING_GBPS); all_reduce's is reported.
Below the threshold, or with no figure at all (a rank that failed, printed nothing readable, or
measured nothing), the gate fails closed where it is enforced (staging and prod unless
fabric.collective.enforce says otherwise) and warns elsewhere, naming the figure, the threshold
and the likely causes it can see: RDMA off, an HCA list that leaves a twin unused, a twin
without carrier, an MTU below 9000, and what the ranks' own NCCL log says of the transport
(inspection/nccl_transport.py: TCP sockets, one HCA of two, GPU Direct RDMA off).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hostscripts.collective import FAILED as RANK_FAILED
from inspection.nccl_transport import NodeTransport, parse_transport

GB = 1e9  # nccl-tests' GB/s are 1e9 bytes per second
OPS = ("all_gather", "all_reduce")
JUDGED = "all_gather"  # the collective whose bus bandwidth is held to the threshold
STEP = 4  # the sweep's factor between sizes
# A size's buffers (at most twice its bytes on a rank) within an eighth of the smallest
# MemAvailable the nodes report: NVIDIA's playbook's 16 GB test froze a Spark (unified memory;
# NVIDIA/dgx-spark-playbooks issue 102). The rank applies the same bound to what it sees itself.
MEMORY_DIVISOR = 8
FULL_MTU = 9000

CHECKLIST = ("otherwise check: the HCA list (NCCL_IB_HCA names the RoCE device of each cabled "
             "twin), the MTU (9000 on both ends and the switch), that both twins carry traffic "
             "(a single QSFP cable is two x4 PCIe endpoints of ~100 Gb/s each), GPU Direct RDMA "
             "(nvidia-peermem or DMA-BUF), and `spark-vllm fabric test -s <stack>` after each "
             "change")


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' correction of the algorithm bandwidth (PERFORMANCE.md, "Summary")."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op == "all_gather":
        return (ranks - 1) / ranks
    raise ValueError(f"unknown collective {op!r}")


def bandwidths(op: str, nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of `op` moving `nbytes` (the whole collective) in `seconds`."""
    if seconds <= 0:
        raise ValueError(f"a collective takes some time, got {seconds} s")
    algbw = nbytes / GB / seconds
    return algbw, algbw * bus_factor(op, ranks)


def sweep(min_bytes: int, max_bytes: int, available: Iterable[int | None] = ()) -> list[int]:
    """The sizes a gate measures: `min_bytes`, x4, ... up to `max_bytes`, none whose buffers
    (twice its bytes) exceed 1/MEMORY_DIVISOR of the smallest known MemAvailable. At least the
    smallest size, which the ranks skip by themselves if it does not fit either."""
    known = [a for a in available if a is not None]
    limit = min([max_bytes, *(a // (2 * MEMORY_DIVISOR) for a in known)])
    sizes = [min_bytes]
    while sizes[-1] * STEP <= limit:
        sizes.append(sizes[-1] * STEP)
    return sizes


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class Measurement(_Model):
    op: str
    bytes: int = Field(ge=1)
    iters: int = Field(ge=1)
    seconds: float = Field(gt=0)


class RankReport(_Model):
    """One rank's JSON line (payloads/collective_bench.py)."""

    rank: int = Field(ge=0)
    world: int = Field(ge=1)
    backend: str
    device: str = ""
    host: str = ""
    torch: str | None = None
    nccl_version: str | None = Field(default=None, alias="ncclVersion")
    results: list[Measurement] = Field(default_factory=list)
    skipped: list[dict[str, Any]] = Field(default_factory=list)
    stopped: str | None = None
    memory_available: int | None = Field(default=None, alias="memoryAvailable")
    nccl_log: list[str] = Field(default_factory=list, alias="ncclLog")
    seconds: float = 0.0


class CollectiveError(ValueError):
    """A rank printed no readable answer: the gate has no figure from it."""


def parse_rank(node: str, text: str) -> RankReport:
    """A rank command's stdout: its last JSON object line; what came before (a failed run's exit
    code and stderr tail, hostscripts/collective.py) is the error's text otherwise."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    failed = next((i for i, ln in enumerate(lines) if ln.startswith(RANK_FAILED)), None)
    if failed is not None:  # the rank's process exited non-zero: no figure of it is trusted
        tail = " | ".join(lines[failed:failed + 9])[-800:]
        raise CollectiveError(f"{node}: {tail}")
    for line in reversed(lines):
        if line.lstrip().startswith("{"):
            try:
                return RankReport.model_validate(json.loads(line))
            except (ValueError, ValidationError) as exc:
                raise CollectiveError(f"{node}: the rank's answer is not readable "
                                      f"({type(exc).__name__})") from None
    tail = " | ".join(lines[-6:])[-600:] or "no output"
    raise CollectiveError(f"{node}: the rank printed no answer: {tail}")


@dataclass(frozen=True)
class Figure:
    op: str
    bytes: int
    algbw: float
    busbw: float


def figures(report: RankReport) -> list[Figure]:
    """The report's measurements as nccl-tests' bandwidths, recomputed here."""
    out = []
    for m in report.results:
        algbw, busbw = bandwidths(m.op, m.bytes, m.seconds, report.world)
        out.append(Figure(m.op, m.bytes, algbw, busbw))
    return out


def best(figs: Sequence[Figure], op: str) -> Figure | None:
    """The size at which `op` reached its best bus bandwidth."""
    return max((f for f in figs if f.op == op), key=lambda f: f.busbw, default=None)


@dataclass(frozen=True)
class NodeFabric:
    """What the causes need to know of one node: its NCCL environment and its twins."""

    env: Mapping[str, str] = field(default_factory=dict)
    twins: int = 0  # declared fabric interfaces
    twins_up: int = 0  # with carrier (recon)


def likely_causes(*, rdma: bool, mtu: int | None, nodes: Mapping[str, NodeFabric],
                  transports: Mapping[str, NodeTransport]) -> list[str]:
    """The causes the stack can see of a collective bandwidth below the threshold, most specific
    first, then the checklist of the rest."""
    out = []
    if not rdma:
        out.append("nccl.rdma is false: NCCL runs over TCP sockets (NCCL_IB_DISABLE=1)")
    for name, n in sorted(nodes.items()):
        if n.twins and n.twins_up < n.twins:
            out.append(f"{name}: {n.twins - n.twins_up} of its {n.twins} fabric twins without "
                       "carrier (one twin unused)")
        hcas = [h for h in n.env.get("NCCL_IB_HCA", "").split(",") if h]
        if rdma and n.twins_up > 1 and len(hcas) < n.twins_up:
            out.append(f"{name}: NCCL_IB_HCA names {','.join(hcas) or 'no device'}: "
                       f"{n.twins_up - len(hcas)} of its {n.twins_up} cabled twins unused")
    if mtu is not None and mtu < FULL_MTU:
        out.append(f"the fabric MTU is {mtu}, not {FULL_MTU} (NVIDIA/dgx-spark-playbooks issue "
                   "25 measured the difference)")
    for name, t in sorted(transports.items()):
        if t.transport in ("Socket", "mixed"):
            out.append(f"{name}: NCCL fell back to TCP sockets ({t.line()})")
        hcas = [h for h in nodes.get(name, NodeFabric()).env.get("NCCL_IB_HCA", "").split(",")
                if h]
        used = t.devices or [h.name for h in t.hcas]
        if t.transport == "IB" and len(hcas) > 1 and 0 < len(used) < len(hcas):
            out.append(f"{name}: NCCL used {','.join(used)} only of NCCL_IB_HCA "
                       f"{','.join(hcas)} (one twin unused)")
        if t.gdr == "off":
            out.append(f"{name}: GPU Direct RDMA off (NCCL says so for its HCAs)")
    return [*out, CHECKLIST]


@dataclass(frozen=True)
class Verdict:
    """A line per figure (the check's stdout), what stops the up, what is only said, and the
    figures as data (the stack output `collectiveGate`, the record `spark-vllm status` reads)."""

    lines: list[str]
    problems: list[str]
    warnings: list[str]
    summary: dict[str, Any]


STOPS = "; the up stops before vLLM changes"


def judge(reports: Mapping[str, RankReport | str], *, threshold: float, enforce: bool,
          rdma: bool, mtu: int | None = None,
          nodes: Mapping[str, NodeFabric] | None = None, stops: str = STOPS) -> Verdict:
    """The gate's verdict on every rank's report (a str: why a node has none). Fails closed:
    without every rank's report, or without an all_gather figure, there is no verdict but
    "not measured", which stops where the gate is enforced (`stops`: what the problem adds)."""
    nodes = nodes or {}
    failed = {n: r for n, r in reports.items() if isinstance(r, str)}
    good = {n: r for n, r in reports.items() if isinstance(r, RankReport)}
    head = min(good.items(), key=lambda kv: kv[1].rank, default=(None, None))[1]
    figs = figures(head) if head is not None else []
    judged = best(figs, JUDGED)
    other = best(figs, "all_reduce")
    lines = []
    if head is not None:
        lines.append(f"{head.world} ranks over {head.backend} ({head.device or '?'}), torch "
                     f"{head.torch or '?'}" + (f", NCCL {head.nccl_version}"
                                               if head.nccl_version else ""))
        for op in OPS:
            row = [f for f in figs if f.op == op]
            if row:
                lines.append(f"{op} busbw: " + ", ".join(
                    f"{size_text(f.bytes)} {f.busbw:.3f}" for f in row) + " GB/s")
    transports: dict[str, NodeTransport] = {}
    for name, r in sorted(good.items()):
        if r.nccl_log:
            seen = parse_transport("\n".join(r.nccl_log) + "\n", default_node=name).nodes
            if seen:
                transports[name] = seen[0]
                lines.append(f"{name}: NCCL {seen[0].line()}")
        if r.stopped:
            lines.append(f"{name}: the sweep ended early: {r.stopped}")
        for s in r.skipped[:4]:
            lines.append(f"{name}: skipped {s.get('op')} at {s.get('bytes')} bytes: "
                         f"{s.get('why')}")
    problems: list[str] = []
    warnings: list[str] = []
    sink = problems if enforce else warnings
    why = None
    if failed or judged is None:
        reasons = [str(v) for v in failed.values()]
        if not failed and head is not None:
            reasons.append("no all_gather figure" + (f" ({head.stopped})" if head.stopped else ""))
        why = "not measured"
        sink.append("the collective bandwidth could not be measured, so the fabric's speed is "
                    f"not proven: {'; '.join(reasons) or 'no rank answered'}"
                    + (stops if enforce else ""))
    elif judged.busbw < threshold:
        why = "below threshold"
        causes = likely_causes(rdma=rdma, mtu=mtu, nodes=nodes, transports=transports)
        sink.append(f"all_gather bus bandwidth {judged.busbw:.3f} GB/s (the best of the sweep, "
                    f"at {size_text(judged.bytes)}) is below the threshold {threshold:g} GB/s"
                    f" (spark-vllm:fabric.collective.minBusGBps)"
                    + (stops if enforce else "")
                    + ". Likely causes: " + "; ".join(causes))
    verdict = "passed" if why is None else why
    lines.insert(0, f"collective gate {verdict}: all_gather "
                 + (f"{judged.busbw:.3f} GB/s" if judged else "unmeasured")
                 + f" against {threshold:g} GB/s"
                 + (f"; all_reduce {other.busbw:.3f} GB/s" if other else "")
                 + ("" if enforce else " (not enforced here)"))
    summary = {
        "verdict": verdict,
        "enforced": enforce,
        "stopped": bool(problems),
        "thresholdGBps": threshold,
        "allGatherBusGBps": round(judged.busbw, 6) if judged else None,
        "allReduceBusGBps": round(other.busbw, 6) if other else None,
        "backend": head.backend if head else None,
        "ranks": head.world if head else len(reports),
        "busbw": {op: {str(f.bytes): round(f.busbw, 6) for f in figs if f.op == op}
                  for op in OPS},
        "transport": {n: t.line() for n, t in transports.items()},
        "why": next(iter(problems or warnings), None),
    }
    return Verdict(lines, problems, warnings, summary)


class GateRecord(_Model):
    """The record the gate's check leaves on the head (StackNames.collective_record): its
    summary; `spark-vllm status` shows it, recon reads whether it stopped an up."""

    verdict: str
    enforced: bool = False
    stopped: bool = False
    threshold_gbps: float | None = Field(default=None, alias="thresholdGBps")
    all_gather_bus_gbps: float | None = Field(default=None, alias="allGatherBusGBps")
    all_reduce_bus_gbps: float | None = Field(default=None, alias="allReduceBusGBps")
    backend: str | None = None
    ranks: int = 0
    why: str | None = None

    def line(self) -> str:
        figure = ("unmeasured" if self.all_gather_bus_gbps is None
                  else f"all_gather {self.all_gather_bus_gbps:.3f} GB/s")
        text = f"{self.verdict}: {figure}"
        if self.threshold_gbps is not None:
            text += f" against {self.threshold_gbps:g} GB/s"
        if self.all_reduce_bus_gbps is not None:
            text += f", all_reduce {self.all_reduce_bus_gbps:.3f} GB/s"
        if self.backend:
            text += f" ({self.ranks} ranks, {self.backend})"
        return text


def parse_record(text: str) -> GateRecord:
    """The record's JSON (raises ValueError when it is not one)."""
    try:
        return GateRecord.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"not a collective gate record ({type(exc).__name__})") from None
