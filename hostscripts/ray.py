"""Ray on the nodes: the cluster token's file, and readiness (the head waits until `ray status`
shows every node and every GPU)."""

from __future__ import annotations

import ipaddress

from hostscripts.common import container_ids as checked_ids
from hostscripts.common import (
    legacy_file_remove,
    payload,
    q,
    secret_file_write,
    stack_path_remove,
)
from hostscripts.paths import LEGACY_RAY_TOKEN_FILE, StackNames

_DRAIN_PY = payload("ray_drain.py")


def ray_token_write(names: StackNames) -> str:
    """On every node: the Ray cluster token (stdin) into its root-only file in the stack's folder
    (secret_file_write), then the copy an older version kept at the fixed LEGACY_RAY_TOKEN_FILE
    removed: an upgrade leaves no second copy of the secret behind."""
    return "\n".join([secret_file_write(names.ray_token_file, "token"),
                      legacy_file_remove(LEGACY_RAY_TOKEN_FILE)])


def compile_cache_dir(names: StackNames) -> str:
    """On every node: the folder the stack's GPU containers keep vLLM's, torch inductor's,
    Triton's, FlashInfer's and CUDA's compile caches in (a bind mount needs it to exist), the
    stack's own (StackNames.compile_cache_dir), root only like the stack's folder it is in. The
    stack never deletes it: like the model, a cache is expensive to rebuild and harmless to
    keep."""
    folder = names.compile_cache_dir
    return "\n".join(
        [
            "set -eu",
            "umask 077",
            f"mkdir -p {q(folder)}",
            f"chmod 700 {q(names.dir)} {q(folder)}",
            f"echo \"compile cache $(du -sh {q(folder)} | cut -f1)\"",
        ]
    )


def ray_token_remove(names: StackNames) -> str:
    """The token file and the stack's folders, as far as they are empty."""
    return stack_path_remove(names, names.ray_token_file)


def ray_ready(container: str, nodes: int, gpus: int, timeout: int, container_ids: str,
              addresses: list[str] | None = None) -> str:
    """On the head: poll `ray status` until every node and GPU has joined, or fail loudly.

    With `addresses` (the stack's nodes' Ray addresses, validated IPv4 from the config): when
    `ray status` shows more nodes than the stack has, the extra ones left the stack and are
    drained first (payloads/ray_drain.py), so the vLLM that starts after this places no rank on
    a node whose Ray container goes at the end of the update. `container_ids` (the Ray
    containers, so a replaced one re-runs this) are checked to be IDs before they land in the
    comment line."""
    container_ids = checked_ids(container_ids)
    drain = [] if addresses is None else [
        f"  if [ \"$n\" -gt {nodes} ] && [ -z \"$drained\" ]; then",
        f"    docker exec {q(container)} python3 -c {q(_DRAIN_PY)} "
        + " ".join(q(str(ipaddress.IPv4Address(a))) for a in addresses),
        "    drained=1",
        "  fi",
    ]
    return "\n".join(
        [
            "set -eu",
            f"# ray containers: {container_ids}",
            f"end=$(( $(date +%s) + {int(timeout)} ))",
            "drained=",
            "while :; do",
            f"  out=$(docker exec {q(container)} ray status 2>&1) || true",
            "  n=$(printf '%s\\n' \"$out\" | awk '/^Active:/{a=1;next} /^[A-Za-z]/{a=0} "
            "a && /node_/{n++} END{print n+0}')",
            "  g=$(printf '%s\\n' \"$out\" | awk '$2==\"GPU\"{split($1,p,\"/\"); "
            "print int(p[2]); exit}')",
            "  g=${g:-0}",
            *drain,
            f"  if [ \"$n\" -ge {nodes} ] && [ \"$g\" -ge {gpus} ]; then",
            "    echo \"ray ready: $n nodes, $g GPUs\"; exit 0",
            "  fi",
            "  if [ \"$(date +%s)\" -ge \"$end\" ]; then",
            f"    echo \"ray cluster not ready after {int(timeout)}s: want {nodes} nodes and "
            f"{gpus} GPUs, have $n nodes and $g GPUs. ray status:\" >&2",
            "    printf '%s\\n' \"$out\" >&2; exit 1",
            "  fi",
            "  sleep 2",
            "done",
        ]
    )
