"""`spark-vllm logs` (tools/logs.py), the pure part: which containers a stack's logs come from,
and the node script's frames (hostscripts/logs.py says what each is) read back into entries,
merged in time order.

Every container's lines come in Docker's order; the lines of all containers are merged by
Docker's timestamp (RFC3339Nano, the node's clock: the nodes' clocks are not corrected here, so
lines of two nodes closer in time than the clocks' offset may print in the wrong order; NTP
keeps that to milliseconds).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

from config import StackConfig
from hostscripts.logs import CONTAINER_NAME
from hostscripts.paths import StackNames

# --- what to read ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One container to read on one node."""

    node: str
    container: str


class SelectionError(ValueError):
    """MODEL or --node names nothing of the stack (the message lists what it knows)."""


def select_targets(cfg: StackConfig, names: StackNames, model: str | None = None,
                   node: str | None = None) -> list[Target]:
    """The containers to read, node by node in the config's order: the main model (`serve`,
    and Ray's containers with executor ray), a service (its containers on its nodes), or with
    `model` None all of them and the gateway. `node` keeps one node's only."""
    node_names = [n.name for n in cfg.nodes]
    if node is not None and node not in node_names:
        raise SelectionError(f"no node {node!r} in the stack; its nodes: {', '.join(node_names)}")
    models = [cfg.vllm.served_model_name, *(s.served_name for s in cfg.services)]
    if model is not None and model not in models:
        raise SelectionError(f"no model {model!r} in the stack; its models: {', '.join(models)}")

    wanted: list[Target] = []
    if model is None or model == cfg.vllm.served_model_name:
        if cfg.vllm.executor == "mp":
            wanted += [Target(n, names.serve) for n in node_names]
        else:
            wanted.append(Target(cfg.head.name, names.serve))
            wanted.append(Target(cfg.head.name, names.ray_head))
            wanted += [Target(n.name, names.ray_worker) for n in cfg.workers]
    for svc in cfg.services:
        if model is None or model == svc.served_name:
            wanted += [Target(n, names.service(svc.name)) for n in cfg.service_nodes(svc)]
    if model is None:
        wanted.append(Target(cfg.head.name, names.gateway))

    order = {n: i for i, n in enumerate(node_names)}
    chosen = sorted((t for t in wanted if node is None or t.node == node),
                    key=lambda t: order[t.node])  # stable: a node's containers keep their order
    if not chosen:
        raise SelectionError(f"nothing of {model or 'the stack'} runs on {node}")
    return chosen


def by_node(targets: Iterable[Target]) -> dict[str, list[str]]:
    """node -> its containers, in the targets' order."""
    out: dict[str, list[str]] = {}
    for t in targets:
        out.setdefault(t.node, []).append(t.container)
    return out


# --- reading the node's output --------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    kind: Literal["L", "P", "M", "S", "?"]  # "?": not a frame (printed as a note)
    container: str
    payload: bytes


_KINDS: dict[bytes, Literal["L", "P", "M", "S"]] = {
    b"L ": "L", b"P ": "P", b"M ": "M", b"S ": "S"}


def parse_frame(raw: bytes) -> Frame:
    """One line of a node's output (without its newline) as a frame."""
    kind = _KINDS.get(raw[:2])
    name, _, payload = raw[2:].partition(b" ")
    container = name.decode("ascii", "replace")
    if kind is None or not CONTAINER_NAME.fullmatch(container):
        return Frame("?", "", raw)
    return Frame(kind, container, payload)


_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"
                    r"(Z|[+-]\d\d:\d\d)")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_stamp(stamp: str) -> int | None:
    """An RFC 3339 timestamp as nanoseconds since the epoch, or None."""
    m = _STAMP.fullmatch(stamp)
    if not m:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7) or "", m.group(8)
    tz = UTC if zone == "Z" else timezone(
        (-1 if zone[0] == "-" else 1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        at = datetime(y, mo, d, h, mi, s, tzinfo=tz)
    except ValueError:
        return None
    seconds = (at - _EPOCH) // timedelta(seconds=1)
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0"))


@dataclass(frozen=True)
class Entry:
    """A log line (kind "log") or a note of the node's script (kind "note"), at `ts`
    (nanoseconds since the epoch, the node's clock)."""

    ts: int
    node: str
    container: str
    text: str  # as received (sanitize before printing)
    kind: Literal["log", "note"] = "log"


@dataclass(frozen=True)
class Synced:
    """The history of one container of a node has been read (frame S)."""

    node: str
    container: str


@dataclass
class Assembler:
    """Turns one node's frames into entries: joins the pieces of long lines and gives a line
    without a timestamp the one of the line before it in the same container."""

    node: str
    _pieces: dict[str, list[bytes]] = field(default_factory=dict)
    _last: dict[str, int] = field(default_factory=dict)

    def feed(self, frame: Frame) -> Entry | Synced | None:
        c = frame.container
        if frame.kind == "P":
            self._pieces.setdefault(c, []).append(frame.payload)
            return None
        if frame.kind == "S":
            return Synced(self.node, c)
        if frame.kind == "?":
            text = "unexpected output: " + frame.payload.decode("utf-8", "replace")
            return Entry(self._last.get(c, 0), self.node, c, text, "note")
        line = b"".join([*self._pieces.pop(c, []), frame.payload]).decode("utf-8", "replace")
        stamp, _, text = line.partition(" ")
        ts = parse_stamp(stamp)
        if ts is None:
            ts, text = self._last.get(c, 0), line
        self._last[c] = ts
        return Entry(ts, self.node, c, text, "log" if frame.kind == "L" else "note")


def parse_output(node: str, data: bytes) -> list[Entry | Synced]:
    """A node's whole output (the non-follow case), in its order."""
    asm = Assembler(node)
    out = [asm.feed(parse_frame(raw)) for raw in data.split(b"\n") if raw]
    return [e for e in out if e is not None]


def merge(entries: Iterable[Entry | Synced]) -> list[Entry]:
    """Every entry in time order, split by (node, container) and merged (heapq.merge, stable
    for equal times). A container's lines come in Docker's order, which is time order but for
    a stdout and a stderr line stamped close together (copied apart): each stream is sorted
    first (stable, and linear on such nearly sorted input), like -f's reorder window does."""
    streams: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        if isinstance(e, Entry):
            streams.setdefault((e.node, e.container), []).append(e)
    return list(heapq.merge(*(sorted(s, key=lambda e: e.ts) for s in streams.values()),
                            key=lambda e: e.ts))


# --- the forms a line prints with -----------------------------------------------------------------


def short_name(stack: str, container: str) -> str:
    """The container's name without the stack's `spark-vllm-<stack>-` prefix."""
    prefix = f"spark-vllm-{stack}-"
    return container[len(prefix):] if container.startswith(prefix) else container


def clock(ts: int) -> str:
    """UTC, to the millisecond (Docker's timestamps are UTC)."""
    at = _EPOCH + timedelta(microseconds=ts // 1000)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


