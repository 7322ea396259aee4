"""The mp executor's rendezvous port, reachable from the fabric only (issue 31, item 5).

With `vllm.executor: mp` on more than one node, vLLM's ranks meet at `--master-addr`
`--master-port`: rank 0 (the head) hosts torch.distributed's TCPStore there. vLLM 0.32 passes
`tcp://<master-addr>:<master-port>` to `torch.distributed.init_process_group`
(vllm/distributed/parallel_state.py, `init_distributed_environment` with `nnodes > 1`), and the
store's server binds the port on every address (`::` or `0.0.0.0`, whatever the host name:
torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp, `UvTcpServer::makeWithPort`). The store has
no authentication: whoever reaches the port joins the rendezvous or reads and writes its keys.
`--master-addr` only says where the other ranks connect; it binds nothing.

So the stack binds it to the fabric the only way it can from outside vLLM: a host firewall rule
on the head, in a chain of the stack's own (`guard_chain`). TCP to the master port is let through
from the loopback interface and from each of the head's fabric interfaces with a source address
in that twin's fabric subnet, and dropped from everywhere else (the management network, IPv6).
The chain only RETURNs or DROPs, so it never opens what the host's own firewall closes. The
rules are the kernel's, not the disk's: a reboot empties them, recon sees that
(`master_port_guard_check`) and the next `up` puts them back before vLLM is started again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

from hostscripts.common import plain, q
from hostscripts.paths import StackNames

TOOLS = ("iptables", "ip6tables")


class FabricSource(NamedTuple):
    """Where the other ranks come from: one of the head's fabric interfaces and its subnet."""

    interface: str
    subnet: str


def guard_chain(names: StackNames) -> str:
    """The stack's own chain (iptables chain names are at most 28 characters)."""
    return "SVLLM-MP-" + hashlib.sha256(names.stack.encode()).hexdigest()[:12]


def _unhook(chain: str) -> list[str]:
    """Every INPUT rule that jumps to `chain` (whatever port it names), then the chain."""
    return [
        "for ipt in iptables ip6tables; do",
        "  command -v \"$ipt\" >/dev/null 2>&1 || continue",
        f"  \"$ipt\" -w -S INPUT | awk -v c={q(chain)} "
        "'$1 == \"-A\" && $NF == c {sub(/^-A/, \"-D\"); print}' |",
        "    while read -r rule; do \"$ipt\" -w $rule; done",
        f"  \"$ipt\" -w -F {q(chain)} 2>/dev/null || true",
        f"  \"$ipt\" -w -X {q(chain)} 2>/dev/null || true",
        "done",
    ]


def master_port_guard(names: StackNames, port: int, sources: Sequence[FabricSource]) -> str:
    """On the head: TCP to `port` from `sources` and the loopback only (IPv4 and IPv6), in the
    stack's chain; any earlier rule of the chain goes first (a changed port leaves nothing
    behind). Fails when iptables or ip6tables is missing: the port would stay open."""
    if not sources:
        raise ValueError("master_port_guard: no fabric interface to let the ranks in")
    chain = q(guard_chain(names))
    port = int(port)
    lines = [
        "set -eu",
        "for ipt in iptables ip6tables; do",
        "  command -v \"$ipt\" >/dev/null 2>&1 || { echo \"master port guard: $ipt is not "
        "installed on the head, so vLLM's rendezvous port would answer on every address "
        "(apt-get install iptables)\" >&2; exit 1; }",
        "done",
        *_unhook(guard_chain(names)),
        "for ipt in iptables ip6tables; do",
        f"  \"$ipt\" -w -N {chain}",
        f"  \"$ipt\" -w -A {chain} -i lo -j RETURN",
        "done",
        *(f"iptables -w -A {chain} -i {q(s.interface)} -s {q(s.subnet)} -j RETURN"
          for s in sources),
        "for ipt in iptables ip6tables; do",
        f"  \"$ipt\" -w -A {chain} -j DROP",
        f"  \"$ipt\" -w -I INPUT -p tcp --dport {port} -j {chain}",
        "done",
        f"echo \"master port {port}: fabric only (lo, "
        f"{', '.join(f'{plain(s.interface)} from {plain(s.subnet)}' for s in sources)})\"",
    ]
    return "\n".join(lines)


def master_port_unguard(names: StackNames) -> str:
    """On the head: the stack's chain and every rule that jumps to it, gone."""
    return "\n".join(["set -eu", *_unhook(guard_chain(names)), "echo master port guard removed"])


def master_port_guard_check(names: StackNames, port: int) -> str:
    """Recon (read-only): `present` when both families' INPUT send TCP to `port` into the
    stack's chain and the chain ends in DROP, else `absent` (a reboot, someone's flush)."""
    chain = q(guard_chain(names))
    return "\n".join([
        "for ipt in iptables ip6tables; do",
        f"  \"$ipt\" -w -C INPUT -p tcp --dport {int(port)} -j {chain} 2>/dev/null &&",
        f"    \"$ipt\" -w -S {chain} 2>/dev/null | tail -n 1 | grep -qx -- '-A '{chain}' -j DROP'"
        " || { echo absent; exit 0; }",
        "done",
        "echo present",
    ])
