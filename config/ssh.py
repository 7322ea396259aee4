"""How the stack's own SSH clients reach a node: one option set for recon's ssh and for the
docker provider's ssh transport, so neither trusts more than the other.

Only the node's pinned key is trusted: a known_hosts file of the stack's own holding
`<alias> <pinned key>` lines, the alias named with HostKeyAlias (so a key of the same host in
~/.ssh/known_hosts or /etc/ssh/ssh_known_hosts is never consulted: GlobalKnownHostsFile is
/dev/null), StrictHostKeyChecking=yes (no trust on first use), only the given identity
(IdentitiesOnly), no prompts (BatchMode).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from config.models import NodeConfig


def host_key_alias(node: NodeConfig) -> str:
    return f"spark-vllm-{node.name}"


def known_hosts_line(node: NodeConfig) -> str:
    """The known_hosts entries that pin a node's key: under its alias (what every ssh of the
    stack looks up, HostKeyAlias), and under its address for docker providers configured by a
    release before 0.14, whose ssh options had no alias: `pulumi up --refresh` refreshes with
    the provider settings kept in the state, before the program runs, and found no key. The
    same pinned key either way."""
    addr = node.host if node.port == 22 else f"[{node.host}]:{node.port}"
    return f"{host_key_alias(node)} {node.pinned_host_key}\n{addr} {node.pinned_host_key}\n"


def ssh_options(node: NodeConfig, *, key_path: str, known_hosts: str,
                connect_timeout: int) -> list[str]:
    """ssh's arguments before the destination, for this node."""
    return [
        "-i", key_path,
        "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"HostKeyAlias={host_key_alias(node)}",
        "-o", "CheckHostIP=no",
        "-o", f"ConnectTimeout={connect_timeout}",
    ]


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (0600), atomically, without following a
    symlink planted at `path` or trusting an existing file's mode: a fresh temporary file in
    the same folder, then a rename over `path`."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.parent.is_symlink():
        raise OSError(f"{path.parent} is a symlink; refusing to write a private file there")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # O_EXCL, mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
