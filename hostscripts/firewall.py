"""A port of the stack kept off every interface but loopback and the fabric, with the node's own
iptables: vLLM's rendezvous port with `vllm.executor: mp` on more than one node.

Why a packet filter: the head's rank 0 serves torch.distributed's TCPStore on `--master-port`
(the other nodes' ranks rendezvous there), and PyTorch binds that store on every address of the
node whatever `--master-addr` says. Nothing in vLLM's flags narrows it, so the head's filter
does: in the stack's own chain (StackNames.guard_chain), connections to that port from any
interface but `lo` and the node's fabric interfaces are reset. The chain is jumped to first in
INPUT (and in ip6tables' INPUT, the store listens on IPv6 too); removing it removes both.

Recon reads whether the chain is there (a reboot empties the filter): when it is not, the guard
runs again before anything else (components/rerun.py). Hosts need `iptables` (and `ip6tables`
when IPv6 is on) for mp on several nodes; without them the guard fails and with it the `up`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hostscripts.common import q

_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")  # config.models' interface names
_CHAIN = re.compile(r"SVLLM-[0-9A-F]{16}")


def _check(chain: str, interfaces: Sequence[str]) -> None:
    if not _CHAIN.fullmatch(chain):
        raise ValueError(f"not a stack guard chain: {chain!r}")
    bad = [i for i in interfaces if not _IFNAME.fullmatch(i) or i == "lo"]
    if bad or not interfaces:
        raise ValueError(f"not fabric interface names: {list(interfaces)}")


def guard_port(chain: str, port: int, interfaces: Sequence[str]) -> str:
    """On a node: TCP to `port` only from `lo` and `interfaces` (the fabric); anything else is
    reset. Idempotent: the chain is rebuilt, the jump made once. Prints what it set."""
    _check(chain, interfaces)
    c = q(chain)
    rules = [f"-A {c} -i lo -j RETURN",
             *(f"-A {c} -i {q(i)} -j RETURN" for i in interfaces),
             f"-A {c} -p tcp --dport {int(port)} -j REJECT --reject-with tcp-reset"]
    lines = [
        "set -eu",
        "guard() {  # $1: iptables or ip6tables",
        f"  $1 -w -N {c} 2>/dev/null || $1 -w -F {c}",
        *(f"  $1 -w {r}" for r in rules),
        f"  $1 -w -C INPUT -j {c} 2>/dev/null || $1 -w -I INPUT 1 -j {c}",
        "}",
        "command -v iptables >/dev/null || { echo 'iptables is missing: vLLM'\"'\"'s rendezvous "
        "port cannot be kept off the management network' >&2; exit 1; }",
        "guard iptables",
        "if [ -e /proc/net/if_inet6 ]; then",
        "  command -v ip6tables >/dev/null || { echo 'ip6tables is missing (IPv6 is on)' >&2; "
        "exit 1; }",
        "  guard ip6tables",
        "fi",
        f"echo {q(f'port {int(port)}: only lo, ' + ', '.join(interfaces) + f' ({chain})')}",
    ]
    return "\n".join(lines)


def unguard(chain: str) -> str:
    """The stack's chain and its jump removed (both filters), as far as they are there."""
    if not _CHAIN.fullmatch(chain):
        raise ValueError(f"not a stack guard chain: {chain!r}")
    c = q(chain)
    parts = []
    for tool in ("iptables", "ip6tables"):
        parts.append(f"if command -v {tool} >/dev/null; then "
                     f"while {tool} -w -D INPUT -j {c} 2>/dev/null; do :; done; "
                     f"{tool} -w -F {c} 2>/dev/null || true; {tool} -w -X {c} 2>/dev/null || true; "
                     "fi")
    return "\n".join(parts)
