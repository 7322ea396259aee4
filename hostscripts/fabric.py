"""The fabric between nodes: an unfragmented ping at the configured MTU on every link.

Recon looks at each node alone: an interface can report MTU 9000 with carrier while the switch
port, the cable or the twin at the other end carries less, and then NCCL and the fan-outs stall
or fall back on the first large packet. Before anything travels on the fabric, each node pings
every other node's address on each of its carrier-up twins with `ping -M do` (the don't-fragment
bit: a packet larger than the path carries is dropped, not split) at `MTU - 28` bytes of payload
(20 of IPv4 header, 8 of ICMP). Each node runs its own check, so every pair is tested in both
directions.

When a pair fails, the script finds the largest size that passes (a binary search, one ping of
1 s each, at most 14 steps) and names both nodes, the interface, the address and that size, so
the operator knows whether the path is down or only short of the MTU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hostscripts.common import q

IP_ICMP_HEADERS = 28  # IPv4 header (20) + ICMP echo header (8)


@dataclass(frozen=True)
class FabricPair:
    """One link to test from this node: our interface, the peer node, the peer's address."""

    interface: str
    peer: str
    peer_ip: str


def fabric_check(node: str, pairs: Sequence[FabricPair], mtu: int) -> str:
    """On `node`: ping each pair at `mtu` without fragmentation; fail naming every pair that
    does not carry it, with the largest MTU that does."""
    size = mtu - IP_ICMP_HEADERS
    lines = [
        "set -eu",
        "command -v ping >/dev/null || { echo 'fabric check: ping is not installed on this node "
        "(apt-get install iputils-ping)' >&2; exit 1; }",
        f"me={q(node)}; mtu={int(mtu)}; size={int(size)}",
        "bad=0",
        "try() { ping -n -q -M do -c 1 -W 1 -s \"$3\" -I \"$1\" \"$2\" >/dev/null 2>&1; }",
        "check() {",
        "  iface=$1; peer=$2; ip=$3",
        "  if ping -n -q -M do -c 3 -i 0.2 -w 4 -s \"$size\" -I \"$iface\" \"$ip\" "
        ">/dev/null 2>&1; then",
        "    echo \"ok $me $iface -> $peer $ip at MTU $mtu\"; return 0",
        "  fi",
        "  bad=1",
        "  if ! try \"$iface\" \"$ip\" 0; then",
        "    echo \"fabric check failed: $me $iface -> $peer $ip: no reply at any size "
        "(link down, wrong address or a firewall)\" >&2; return 0",
        "  fi",
        "  lo=0; hi=$size; best=0",
        "  while [ \"$lo\" -le \"$hi\" ]; do",
        "    mid=$(( (lo + hi) / 2 ))",
        "    if try \"$iface\" \"$ip\" \"$mid\"; then best=$mid; lo=$(( mid + 1 )); "
        "else hi=$(( mid - 1 )); fi",
        "  done",
        "  echo \"fabric check failed: $me $iface -> $peer $ip does not carry MTU $mtu "
        f"unfragmented; the largest that passed is MTU $(( best + {IP_ICMP_HEADERS} )); set the "
        "same MTU on both nodes and on every switch port between them (ip link set $iface mtu "
        "$mtu)\" >&2",
        "}",
    ]
    for p in pairs:
        lines.append(f"check {q(p.interface)} {q(p.peer)} {q(p.peer_ip)}")
    lines.append("exit $bad")
    return "\n".join(lines)
