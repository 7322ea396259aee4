"""Which network transport NCCL chose on each node, read from NCCL_DEBUG=INFO log text.

After serving starts, vLLM's tensor-parallel all-reduces across Sparks should run over RoCE
(NCCL's `NET/IB` transport, or the same verbs through the HPC-X `IBext_vNN` plugin). When RoCE
is unusable NCCL silently falls back to TCP sockets (`NET/Socket`): nothing fails, it is just a
few times slower. `parse_transport` reads a vLLM/Ray log (any size, any noise) and reports, per
node, the transport, plugin, HCAs, socket interfaces, GPU Direct RDMA and channels it saw.

Formats matched, in NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027, i.e.
https://github.com/NVIDIA/nccl/blob/5067397c2676d5aed50042fc39e5c8ee96eb0027/<path>:
  src/debug.cc#L330-L354        prefix `host:pid:tid [dev] NCCL INFO <message>`
  src/transport/net_ib/init.cc#L494-L513
                                `NET/IB : Using [0]dev:port/RoCE ... [RO]; OOB if:addr<port>`
  src/transport/net_ib/common.h#L118-L119   link layers `IB` | `RoCE` | `UNSPECIFIED`
  src/transport/net_socket.cc#L73-L77       `NET/Socket : Using [0]if:addr<port> ...`
  src/init.cc#L486              `Using network <name>`
  src/init.cc#L1945             `... comm 0x.. rank R nranks N ... - Init COMPLETE`
  src/transport/net.cc#L324-L330 and #L377
                                `Channel CC/K : a[d] -> b[d] [send|receive] via NET/<name>/<dev>`
                                then `(proxy)`, `/GDRDMA`, `(PCI)`, `/Shared` when they apply
  src/graph/topo.cc#L1653       `NET/<name> : GPU Direct RDMA Enabled|Disabled for HCA n 'dev'`
Older releases: tag v2.27.3-1 src/graph/paths.cc#L443,#L453 (`GPU Direct RDMA Disabled for
GPU r / HCA ..`, a TRACE at the commit above); tag v2.8.3-1 src/transport/net.cc#L109
(`Channel CC : a[busid] -> ..`, no `/K`). The HPC-X plugin, at
https://github.com/Mellanox/nccl-rdma-sharp-plugins/blob/2f5ac02e164336044388b7f1f6242cc0db575fec/
<path>: src/ib_plugin.c#L2202-L2318 (net names `IBext_v6`..`IBext_v11`), src/p2p_plugin.c#L312,
#L322 (`GPU Direct RDMA (nvidia-peermem) enabled for HCA ..`), #L704 (`NET/IB : Using` again).

The node of a line is the `ip=` of Ray's `(Actor pid=N, ip=X)` prefix; lines without one come from
the driver's node (`default_node`). Ray folds lines that differ only in numbers into
`[repeated Nx across cluster]`, so other nodes' lines may be hidden: `repeated_lines` counts them
(set RAY_DEDUP_LOGS=0 to see every rank). Unknown, cut or malformed lines are skipped, never raised.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

Transport = Literal["IB", "Socket", "mixed", "unknown"]
Gdr = Literal["on", "off", "mixed", "unknown"]

MAX_CHARS = 4 * 1024 * 1024  # only the last 4 MiB of a log is read
MAX_LINE = 16 * 1024  # NCCL formats into 2-4 KiB buffers; longer lines are cut here

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_RAY_PREFIX = re.compile(
    r"\((?:(?:[^()]{0,80}?\s)?pid=\d+|raylet)(?:, ip=([0-9A-Za-z.:\-]{1,64}))?\)\s*"
)
_BAD_PREFIX = re.compile(r"\([^)]{0,120}(?:pid|ip)=")
_REPEATED = re.compile(r"\[repeated (\d+)x across cluster\]")
_HOST = re.compile(r"(?:^|\s)([\w.\-]{1,64}):\d+:\d+ \[\d+\] $")  # only tried after a space
_IB_USING = re.compile(r"NET/IB\s*:\s*Using")
_HCA = re.compile(  # [index]name:port, then :rail / ::plane / :rail:plane, then /link layer
    r"\s*\[(\d+)\]([\w.\-]+):(\d+)(?::\d*)?(?::\d+)?/(IB|RoCE|UNSPECIFIED)(?=[\s;\[]|$)"
)
_IB_TAIL = re.compile(r"\s*(\[RO\])?\s*(?:;\s*(?:OOB\s+([\w.\-]+:\S+<\d+>))?|$)")
_SOCK_USING = re.compile(r"NET/Socket\s*:\s*Using")
_SOCK_IF = re.compile(r"\s*\[(\d+)\]([^\s:\[\]<>]+):([^\s<>]+)<\d+>")
_USING_NET = re.compile(r"Using network ([\w.\-]+)\s*$")
_CHANNEL = re.compile(
    r"(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\]"
    r"(?: \[(send|receive)\])? via (\S+)"
)
_VIA_NET = re.compile(r"NET/([\w.\-]+)/\d+")
_GDR = re.compile(
    r"(?:NET/[\w.\-]+\s*:\s*)?GPU Direct RDMA(?: \([^)]*\))? (enabled|disabled)"
    r" for (?:GPU \S+ / )?HCA",
    re.IGNORECASE,
)
_INIT_RANK = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) nranks \d+\b")
_WORDS = ("NET/", "network", "RDMA", "rank", " via ")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hca(_Model):
    """One device of a `NET/IB : Using` line, e.g. rocep1s0f0 port 1 over RoCE."""

    index: int
    name: str
    port: int
    link_layer: str  # "RoCE" | "IB" | "UNSPECIFIED"


class SocketIf(_Model):
    """One interface of a `NET/Socket : Using` line."""

    index: int
    name: str
    address: str


class NodeTransport(_Model):
    node: str  # Ray's ip=, or the default node
    transport: Transport  # "mixed": this node's lines show both IB-like and Socket nets
    nets: list[str]  # net names used (channels, `Using network`), e.g. ["IBext_v11"]
    net_plugin: str | None  # the first used net that is not built in (IB, Socket)
    hcas: list[Hca]
    relaxed_ordering: bool | None
    oob: str | None  # `if:addr<port>` the IB transport uses for its handshake
    socket_ifs: list[SocketIf]
    gdr: Gdr
    channels: dict[str, int]  # distinct channel ids per transport, e.g. {"NET/IB": 4, "P2P": 2}
    ranks: list[int]
    hosts: list[str]  # NCCL's own hostnames in the `host:pid:tid` prefix

    def line(self) -> str:
        parts = [f"{self.node}: {self.transport}"]
        if self.net_plugin:
            parts.append(f"({self.net_plugin})")
        if self.transport in ("Socket", "mixed"):
            parts.append("TCP FALLBACK")
        if self.hcas:
            hcas = ",".join(f"{h.name}:{h.port}/{h.link_layer}" for h in self.hcas)
            parts.append(f"hcas={hcas}")
        if self.socket_ifs:
            parts.append("ifs=" + ",".join(f"{s.name}:{s.address}" for s in self.socket_ifs))
        parts.append(f"gdr={self.gdr}")
        if self.channels:
            parts.append("channels=" + ",".join(f"{k}:{v}" for k, v in self.channels.items()))
        if self.ranks:
            parts.append("ranks=" + ",".join(map(str, self.ranks)))
        return " ".join(parts)


class TransportReport(_Model):
    nodes: list[NodeTransport]
    lines_scanned: int
    truncated: bool  # the input was longer than MAX_CHARS; only its tail was read
    repeated_lines: int  # lines Ray folded into `[repeated Nx across cluster]`

    def node(self, name: str) -> NodeTransport | None:
        return next((n for n in self.nodes if n.node == name), None)

    def summary(self) -> str:
        if not self.nodes:
            return "nccl: no NCCL transport lines found (is NCCL_DEBUG=INFO set?)"
        lines = [n.line() for n in self.nodes]
        if self.repeated_lines:
            lines.append(f"(Ray folded {self.repeated_lines} lines; RAY_DEDUP_LOGS=0 shows all)")
        return "\n".join(lines)


def socket_fallback(report: TransportReport) -> list[str]:
    """The nodes whose NCCL traffic uses TCP sockets for some or all channels."""
    return [n.node for n in report.nodes if n.transport in ("Socket", "mixed")]


@dataclass
class _Acc:
    nets: dict[str, None] = field(default_factory=dict)  # ordered set
    init_nets: dict[str, None] = field(default_factory=dict)
    hcas: dict[tuple[str, int, str], int] = field(default_factory=dict)
    relaxed_ordering: bool | None = None
    oob: str | None = None
    socket_ifs: dict[tuple[str, str], int] = field(default_factory=dict)
    gdr_channels: Counter[bool] = field(default_factory=Counter)
    gdr_messages: Counter[bool] = field(default_factory=Counter)
    channels: dict[str, set[int]] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)
    hosts: dict[str, None] = field(default_factory=dict)


def _kind(net: str) -> Literal["IB", "Socket", "unknown"]:
    return "IB" if net.startswith("IB") else "Socket" if net == "Socket" else "unknown"


def _gdr(counts: Counter[bool]) -> Gdr:
    if counts[True] and counts[False]:
        return "mixed"
    return "on" if counts[True] else "off" if counts[False] else "unknown"


def _message(raw: str) -> tuple[str | None, str, str | None, int] | None:
    """(ray ip, NCCL message, NCCL hostname, Ray repeat count) of one line, None if malformed."""
    line = _CTRL.sub("", _ANSI.sub("", raw)).strip()
    ip: str | None = None
    for _ in range(4):  # vLLM may nest `(EngineCore pid=1) (RayWorkerWrapper pid=2, ip=..)`
        m = _RAY_PREFIX.match(line)
        if not m:
            break
        ip = m.group(1) or ip
        line = line[m.end() :]
    if _BAD_PREFIX.match(line):
        return None
    repeated = 0
    at = line.find(" [repeated ")  # str.find, not a regex search: no backtracking on long lines
    if at >= 0 and (m := _REPEATED.match(line, at + 1)):
        repeated, line = int(m.group(1)), line[:at]
    host = None
    at = line.find("NCCL INFO ")
    if at >= 0:
        h = _HOST.search(line[max(0, at - 200) : at])
        host = h.group(1) if h else None
        line = line[at + len("NCCL INFO ") :]
    return ip, line.strip(), host, repeated


def _read(acc: _Acc, msg: str, complete: bool) -> bool:
    """Add what one NCCL message says to acc; False when it is not a form read here."""
    if m := _CHANNEL.match(msg):
        channel, src, dst, direction, via = m.groups()
        net = _VIA_NET.match(via)
        if via.startswith("NET") and not net:
            return False  # cut before `/<dev>`: the name may be cut too
        key = f"NET/{net.group(1)}" if net else via.split("/")[0]
        if net:
            acc.nets[net.group(1)] = None
            acc.gdr_channels["/GDRDMA" in via] += 1
        acc.channels.setdefault(key, set()).add(int(channel))
        if direction:
            acc.ranks.add(int(src if direction == "send" else dst))
    elif ib := _IB_USING.match(msg):
        pos, found = ib.end(), []
        while h := _HCA.match(msg, pos):
            found.append(h)
            pos = h.end()
        tail = _IB_TAIL.match(msg, pos)
        if not (found and tail and (tail.group(1) or ";" in tail.group(0))):
            return False  # cut before its `[RO]` / `;` end: the HCA list may be incomplete
        for h in found:
            acc.hcas.setdefault((h.group(2), int(h.group(3)), h.group(4)), int(h.group(1)))
        acc.relaxed_ordering = bool(tail.group(1))
        acc.oob = tail.group(2) or acc.oob
        acc.init_nets["IB"] = None
    elif s := _SOCK_USING.match(msg):
        pos = s.end()
        while i := _SOCK_IF.match(msg, pos):
            acc.socket_ifs.setdefault((i.group(2), i.group(3)), int(i.group(1)))
            pos = i.end()
        if pos == s.end():
            return False
        acc.init_nets["Socket"] = None
    elif (u := _USING_NET.match(msg)) and complete:  # a cut name would look like another net
        acc.nets[u.group(1)] = None
    elif g := _GDR.match(msg):
        acc.gdr_messages[g.group(1).lower() == "enabled"] += 1
    elif r := _INIT_RANK.search(msg):
        acc.ranks.add(int(r.group(1)))
    else:
        return False
    return True


def _node(name: str, acc: _Acc) -> NodeTransport | None:
    used = acc.nets or acc.init_nets  # the init lines only say which nets came up
    kinds = {_kind(n) for n in used} - {"unknown"}
    if not (used or acc.hcas or acc.socket_ifs or acc.channels or acc.gdr_messages):
        return None
    transport: Transport = "mixed" if len(kinds) > 1 else kinds.pop() if kinds else "unknown"
    by_index = sorted(acc.hcas.items(), key=lambda kv: kv[1])
    return NodeTransport(
        node=name,
        transport=transport,
        nets=list(acc.nets),
        net_plugin=next((n for n in acc.nets if n not in ("IB", "Socket")), None),
        hcas=[Hca(index=i, name=k[0], port=k[1], link_layer=k[2]) for k, i in by_index],
        relaxed_ordering=acc.relaxed_ordering,
        oob=acc.oob,
        socket_ifs=[
            SocketIf(index=i, name=k[0], address=k[1])
            for k, i in sorted(acc.socket_ifs.items(), key=lambda kv: kv[1])
        ],
        gdr=_gdr(acc.gdr_channels) if acc.gdr_channels else _gdr(acc.gdr_messages),
        channels={k: len(v) for k, v in acc.channels.items()},
        ranks=sorted(acc.ranks),
        hosts=list(acc.hosts),
    )


def parse_transport(text: str, default_node: str) -> TransportReport:
    """Per-node NCCL transport from log text; lines without Ray's `ip=` belong to default_node."""
    truncated = len(text) > MAX_CHARS
    if truncated:
        text = text[-MAX_CHARS:]
        text = text[text.find("\n") + 1 :]  # the first line is probably cut
    ends_whole = text.endswith(("\n", "\r"))
    lines = text.replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    accs: dict[str, _Acc] = {}
    repeated = 0
    for number, raw in enumerate(lines):
        if not any(word in raw for word in _WORDS):
            continue  # cheap filter: every form read names one of these
        complete = len(raw) <= MAX_LINE and (ends_whole or number < len(lines) - 1)
        parsed = _message(raw[:MAX_LINE])
        if parsed is None:
            continue
        ip, msg, host, times = parsed
        acc = accs.setdefault(ip or default_node, _Acc())
        if _read(acc, msg, complete):
            repeated += times
            if host:
                acc.hosts[host] = None
    nodes = [n for name, acc in accs.items() if (n := _node(name, acc)) is not None]
    return TransportReport(
        nodes=nodes, lines_scanned=len(lines), truncated=truncated, repeated_lines=repeated
    )


@dataclass(frozen=True)
class Verdict:
    """What the stack makes of a report: a line per node for the stack output, and the
    problems (fail the `up`) and warnings (shown, the `up` goes on)."""

    lines: dict[str, str]
    problems: list[str]
    warnings: list[str]


def verdict(report: TransportReport, *, names: dict[str, str], rdma: bool, strict: bool,
            nccl_debug: str) -> Verdict:
    """Judge the transport: with `rdma` a Socket fallback is a problem when `strict` (outside
    dev), else a warning. `names` maps the addresses Ray prints (`ip=`) to node names."""
    lines = {names.get(n.node, n.node): n.line() for n in report.nodes}
    problems: list[str] = []
    warnings: list[str] = []
    if not report.nodes:
        hint = ("NCCL was not used or logged nothing" if nccl_debug in ("INFO", "TRACE")
                else f"nccl.debug is {nccl_debug}; INFO shows NCCL's choice")
        lines = {"all": f"unknown: no NCCL transport lines ({hint})"}
        if rdma and nccl_debug not in ("INFO", "TRACE"):
            warnings.append(f"the NCCL transport cannot be verified: {hint}")
        return Verdict(lines, problems, warnings)
    if rdma:
        for node in socket_fallback(report):
            msg = (f"{names.get(node, node)}: NCCL fell back to TCP sockets although nccl.rdma is "
                   f"true ({lines[names.get(node, node)]}); check the RoCE devices (ibdev2netdev), "
                   "NCCL_IB_HCA and that the image carries libibverbs")
            (problems if strict else warnings).append(msg)
    return Verdict(lines, problems, warnings)
