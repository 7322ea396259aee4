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
#L322 (`GPU Direct RDMA (nvidia-peermem) enabled for HCA ..`), #L704 (`NET/IB : Using` again),
where an HPC-X build with SHARP marks a device `[0]mlx5_9:1/IB/SHARP`. Also read: the plugin
announcements `P2P plugin [v10 ]IBext_v10`, `NET/Plugin: Loaded net plugin <name>`, NCCL
2.28's `Initialized NET plugin <name>` / `Assigned NET plugin <name> to comm`, the virtual
devices `NET/IB : Made virtual device [0] name=rocep1s0f1 speed=200000 ndevs=1` (the IB
transport's devices when the external plugin runs them) and `NET/IB : No device found`.
Recorded real logs: tests/fixtures/nccl/ (INDEX.md there: sources).

The node of a line is the `ip=` of Ray's `(Actor pid=N, ip=X)` prefix. A line without one is
attributed by NCCL's own `host:pid:tid` prefix: to the Ray address that host's other lines
carry, else to the address of its own OOB/socket interface, else (one such host only) to the
driver's node (`default_node`); lines without either come from the driver's node. Two hosts are
never merged into one node. Ray folds lines that differ only in numbers into
`[repeated Nx across cluster]`, so other nodes' lines may be hidden: `repeated_lines` counts them
(set RAY_DEDUP_LOGS=0 to see every rank). Unknown, cut or malformed lines are skipped, never raised.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
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
    r"\s*\[(\d+)\]([\w.\-]+):(\d+)(?::\d*)?(?::\d+)?/(IB|RoCE|UNSPECIFIED)(?:/SHARP)?"
    r"(?=[\s;\[]|$)"
)
_IB_TAIL = re.compile(r"\s*(\[RO\])?\s*(?:;\s*(?:OOB\s+([\w.\-]+:\S+<\d+>))?|$)")
_VDEV = re.compile(r"NET/IB\s*:\s*Made virtual device \[(\d+)\] name=([\w.\-+]+) ")
_NO_DEVICE = re.compile(r"NET/IB\s*:\s*No device found\.?\s*$")
_SOCK_USING = re.compile(r"NET/Socket\s*:\s*Using")
_SOCK_IF = re.compile(r"\s*\[(\d+)\]([^\s:\[\]<>]+):([^\s<>]+)<\d+>")
_USING_NET = re.compile(r"(?:Using network|Assigned NET plugin) ([\w.\-]+)(?: to comm)?\s*$")
_PLUGIN = re.compile(
    r"(?:P2P plugin (?:v\d+ )?|Initialized NET plugin |NET/Plugin\s*:\s*Loaded net plugin )"
    r"([\w.\-]+(?: [\w.\-]+)*?)(?: \(v\d+\))?\s*$"
)
_CHANNEL = re.compile(
    r"(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\]"
    r"(?: \[(send|receive)\])? via (\S+)"
)
_VIA_NET = re.compile(r"NET/([\w.\-]+)/\d+")
_GDR = re.compile(
    r"(?:NET/([\w.\-]+)\s*:\s*)?GPU Direct RDMA(?: \([^)]*\))? (enabled|disabled)"
    r" for (?:GPU \S+ / )?HCA (\d+)(?: '([\w.\-]+))?",
    re.IGNORECASE,
)
_INIT_RANK = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) nranks \d+\b")
_WORDS = ("NET/", "network", "RDMA", "rank", " via ", "plugin")
_BUILTIN = ("IB", "Socket")


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
    node: str  # Ray's ip=, the OOB address of an NCCL host, or the default node
    transport: Transport  # "mixed": this node's lines show both IB-like and Socket nets
    nets: list[str]  # net names used (channels, `Using network`), e.g. ["IBext_v11"]
    net_plugin: str | None  # the first used (else announced) net that is not built in
    hcas: list[Hca]
    relaxed_ordering: bool | None
    oob: str | None  # `if:addr<port>` the IB transport uses for its handshake (the first seen)
    socket_ifs: list[SocketIf]
    gdr: Gdr  # NCCL's own `GPU Direct RDMA enabled|disabled for HCA` statements, per HCA
    channels: dict[str, int]  # distinct channel ids per transport, e.g. {"NET/IB": 4, "P2P": 2}
    ranks: list[int]
    hosts: list[str]  # NCCL's own hostnames in the `host:pid:tid` prefix
    devices: list[str] = []  # IB devices NCCL announced (`Using [0]..`, `Made virtual device`)
    ib_no_device: bool = False  # `NET/IB : No device found`
    plugins: list[str] = []  # net plugins announced (`P2P plugin ..`, `Loaded net plugin ..`)
    gdr_channels: Gdr = "unknown"  # detail: whether the NET channel lines carry `/GDRDMA`

    def line(self) -> str:
        parts = [f"{self.node}: {self.transport}"]
        if self.net_plugin:
            parts.append(f"({self.net_plugin})")
        if self.transport in ("Socket", "mixed"):
            parts.append("TCP FALLBACK")
        if self.ib_no_device:
            parts.append("(NET/IB: no device found)")
        if self.hcas:
            hcas = ",".join(f"{h.name}:{h.port}/{h.link_layer}" for h in self.hcas)
            parts.append(f"hcas={hcas}")
        elif self.devices:
            parts.append("devices=" + ",".join(self.devices))
        if self.socket_ifs:
            parts.append("ifs=" + ",".join(f"{s.name}:{s.address}" for s in self.socket_ifs))
        parts.append(f"gdr={self.gdr}")
        if self.channels:
            parts.append("channels=" + ",".join(f"{k}:{v}" for k, v in self.channels.items()))
            if self.gdr_channels != "unknown":
                parts.append(f"channel-gdrdma={self.gdr_channels}")
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
    devices: dict[str, None] = field(default_factory=dict)
    ib_no_device: bool = False
    plugins: dict[str, None] = field(default_factory=dict)
    relaxed_ordering: bool | None = None
    oob: str | None = None
    socket_ifs: dict[tuple[str, str], int] = field(default_factory=dict)
    gdr_channels: Counter[bool] = field(default_factory=Counter)
    gdr_hcas: dict[str, bool] = field(default_factory=dict)  # NCCL's statement, per net:HCA
    channels: dict[str, set[int]] = field(default_factory=dict)
    ranks: set[int] = field(default_factory=set)
    hosts: dict[str, None] = field(default_factory=dict)

    def merge(self, other: _Acc) -> None:
        """Add what `other` saw (another source of the same node's lines)."""
        for mine, theirs in ((self.nets, other.nets), (self.init_nets, other.init_nets),
                             (self.devices, other.devices), (self.plugins, other.plugins),
                             (self.hosts, other.hosts)):
            mine.update(theirs)
        for k, v in other.hcas.items():
            self.hcas.setdefault(k, v)
        for sk, sv in other.socket_ifs.items():
            self.socket_ifs.setdefault(sk, sv)
        for gk, gv in other.gdr_hcas.items():
            self.gdr_hcas.setdefault(gk, gv)
        self.ib_no_device = self.ib_no_device or other.ib_no_device
        if self.relaxed_ordering is None:
            self.relaxed_ordering = other.relaxed_ordering
        self.oob = self.oob or other.oob
        self.gdr_channels.update(other.gdr_channels)
        for ck, cv in other.channels.items():
            self.channels.setdefault(ck, set()).update(cv)
        self.ranks |= other.ranks

    def address(self) -> str | None:
        """The node's own address as NCCL printed it: its OOB interface, else its first socket
        interface (`if:addr<port>` -> addr)."""
        if self.oob:
            return self.oob.split(":", 1)[1].rsplit("<", 1)[0]
        first = min(self.socket_ifs.items(), key=lambda kv: kv[1], default=None)
        return first[0][1] if first else None


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
            acc.devices[h.group(2)] = None
        acc.relaxed_ordering = bool(tail.group(1))
        acc.oob = acc.oob or tail.group(2)
        acc.init_nets["IB"] = None
    elif v := _VDEV.match(msg):
        for name in v.group(2).split("+"):
            if name:
                acc.devices[name] = None
        acc.init_nets["IB"] = None
    elif _NO_DEVICE.match(msg):
        acc.ib_no_device = True
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
    elif (p := _PLUGIN.match(msg)) and complete:
        acc.plugins[p.group(1)] = None
    elif g := _GDR.match(msg):
        net_name, state, index, hca = g.groups()
        acc.gdr_hcas[f"{net_name or '?'}:{hca or 'HCA ' + index}"] = state.lower() == "enabled"
    elif r := _INIT_RANK.search(msg):
        acc.ranks.add(int(r.group(1)))
    else:
        return False
    return True


def _node(name: str, acc: _Acc) -> NodeTransport | None:
    used = acc.nets or acc.init_nets  # the init lines only say which nets came up
    kinds = {_kind(n) for n in used} - {"unknown"}
    if not (used or acc.hcas or acc.socket_ifs or acc.channels or acc.gdr_hcas or acc.devices
            or acc.ib_no_device):
        return None
    transport: Transport = "mixed" if len(kinds) > 1 else kinds.pop() if kinds else "unknown"
    by_index = sorted(acc.hcas.items(), key=lambda kv: kv[1])
    announced = [p for p in acc.plugins if _kind(p) == "IB" and p not in _BUILTIN]
    return NodeTransport(
        node=name,
        transport=transport,
        nets=list(acc.nets),
        net_plugin=next((n for n in acc.nets if n not in _BUILTIN), None)
        or (announced[0] if transport in ("IB", "mixed") and announced else None),
        hcas=[Hca(index=i, name=k[0], port=k[1], link_layer=k[2]) for k, i in by_index],
        relaxed_ordering=acc.relaxed_ordering,
        oob=acc.oob,
        socket_ifs=[
            SocketIf(index=i, name=k[0], address=k[1])
            for k, i in sorted(acc.socket_ifs.items(), key=lambda kv: kv[1])
        ],
        gdr=_gdr(Counter(acc.gdr_hcas.values())),
        channels={k: len(v) for k, v in acc.channels.items()},
        ranks=sorted(acc.ranks),
        hosts=list(acc.hosts),
        devices=list(acc.devices),
        ib_no_device=acc.ib_no_device,
        plugins=list(acc.plugins),
        gdr_channels=_gdr(acc.gdr_channels),
    )


def _attribute(by_source: dict[tuple[str, str], _Acc], host_ip: dict[str, str],
               default_node: str) -> dict[str, _Acc]:
    """The accumulations per node from those per source: Ray's `ip=` is the node; an NCCL host
    seen behind a Ray `ip=` elsewhere is that node; another host is the node at its own OOB or
    socket address when that is a node already (or the default node), else, when it is the only
    such host, the driver's node (default_node); else its address, else its name. Two hosts are
    never one node."""
    nodes: dict[str, _Acc] = {}

    def into(name: str, acc: _Acc) -> None:
        nodes.setdefault(name, _Acc()).merge(acc)

    strays = [key for (what, key) in by_source if what == "host" and key not in host_ip]
    known = {key for (what, key) in by_source if what == "ip"} | {default_node}
    for (what, key), acc in by_source.items():  # in the order the sources first appear
        if what == "ip":
            into(key, acc)
        elif what == "default":
            into(default_node, acc)
        elif key in host_ip:
            into(host_ip[key], acc)
        elif (address := acc.address()) and address in known:
            into(address, acc)
        elif len(strays) == 1:
            into(default_node, acc)
        else:
            into(address or key, acc)
    return nodes


def parse_transport(text: str, default_node: str) -> TransportReport:
    """Per-node NCCL transport from log text (see the module docstring for the attribution)."""
    truncated = len(text) > MAX_CHARS
    if truncated:
        text = text[-MAX_CHARS:]
        text = text[text.find("\n") + 1 :]  # the first line is probably cut
    ends_whole = text.endswith(("\n", "\r"))
    lines = text.replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    by_source: dict[tuple[str, str], _Acc] = {}
    host_ip: dict[str, str] = {}
    repeated = 0
    for number, raw in enumerate(lines):
        if not any(word in raw for word in _WORDS):
            continue  # cheap filter: every form read names one of these
        complete = len(raw) <= MAX_LINE and (ends_whole or number < len(lines) - 1)
        parsed = _message(raw[:MAX_LINE])
        if parsed is None:
            continue
        ip, msg, host, times = parsed
        if ip and host:
            host_ip.setdefault(host, ip)
        source = ("ip", ip) if ip else ("host", host) if host else ("default", "")
        acc = by_source.setdefault(source, _Acc())
        if _read(acc, msg, complete):
            repeated += times
            if host:
                acc.hosts[host] = None
    accs = _attribute(by_source, host_ip, default_node)
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


READ_FIX = ("check that nccl.debug is INFO and NCCL_DEBUG reached every rank, and read the "
            "lines with `docker logs <the stack's vllm serve container> 2>&1 | grep 'NCCL INFO'`")


def verdict(report: TransportReport, *, names: Mapping[str, str], rdma: bool, strict: bool,
            nccl_debug: str, expected: Sequence[str] | None = None) -> Verdict:
    """Judge the transport. With `rdma`, fail closed: a Socket fallback, a node of `expected`
    (node names; None: every node seen, and at least one) whose transport the log does not
    show, a transport the log names no network for, or an nccl.debug that hides NCCL's choice
    is a problem when `strict` (outside dev) and a warning otherwise. `names` maps the addresses
    the report's nodes carry (Ray's `ip=`, NCCL's OOB address) to node names. Without `rdma`
    nothing is required (the lab's dev stack: Socket by design)."""
    lines = {names.get(n.node, n.node): n.line() for n in report.nodes}
    problems: list[str] = []
    warnings: list[str] = []
    sink = problems if strict else warnings
    seeing = nccl_debug in ("INFO", "TRACE")
    if not report.nodes:
        hint = ("the log holds no NCCL line that names a network, device or channel"
                if seeing else f"nccl.debug is {nccl_debug}; INFO shows NCCL's choice")
        lines = {"all": f"unknown: no NCCL transport lines ({hint})"}
    if not rdma:
        return Verdict(lines, problems, warnings)
    if not seeing:
        sink.append(f"the NCCL transport cannot be verified although nccl.rdma is true: "
                    f"nccl.debug is {nccl_debug}, and NCCL states its choice only at INFO; "
                    "set spark-vllm:nccl.debug INFO")
        return Verdict(lines, problems, warnings)
    for node in socket_fallback(report):
        name = names.get(node, node)
        sink.append(f"{name}: NCCL fell back to TCP sockets although nccl.rdma is true "
                    f"({lines[name]}); check the RoCE devices (ibdev2netdev, ibstat), "
                    "NCCL_IB_HCA and that the image carries libibverbs")
    by_name = {names.get(n.node, n.node): n for n in report.nodes}
    want = list(expected) if expected is not None else list(by_name)
    if not report.nodes and want:
        sink.append(f"the NCCL transport of {', '.join(want)} cannot be established from the "
                    "vLLM log although nccl.rdma is true (no NCCL line names a network, "
                    f"device or channel), so RDMA is not proven: {READ_FIX}")
        return Verdict(lines, problems, warnings)
    if not report.nodes:  # nothing expected and nothing seen (expected=[]: one node)
        if expected is None:
            sink.append("the NCCL transport cannot be established from the vLLM log although "
                        f"nccl.rdma is true (no NCCL transport line at all): {READ_FIX}")
        return Verdict(lines, problems, warnings)
    for name in want:
        seen = by_name.get(name)
        if seen is None:
            others = ", ".join(sorted(by_name)) or "none"
            sink.append(f"{name}: no NCCL transport line from this node in the vLLM log although "
                        f"nccl.rdma is true (lines seen from: {others}), so its transport "
                        f"cannot be established: {READ_FIX}")
        elif seen.transport == "unknown":
            sink.append(f"{name}: NCCL's lines from this node name no network transport "
                        f"({lines[name]}), so RDMA is not proven although nccl.rdma is true: "
                        f"{READ_FIX}")
    return Verdict(lines, problems, warnings)
