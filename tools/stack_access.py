"""What every `spark-vllm` subcommand needs to reach a stack's nodes: the stack's config from
Pulumi.<stack>.yaml (tools/recon_report.load_stack_config: validated like the program does, no
secrets decrypted) and an ssh command to one node that trusts only the node's pinned host key,
with the same options recon and the docker provider use (config/ssh.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from config import NodeConfig, StackConfig
from config.ssh import known_hosts_line
from inspection import recon


def key_file(cfg: StackConfig, key: str | None) -> str:
    """The private key to use: --key, else spark-vllm:ssh.privateKeyPath (a stack that keeps its
    key in the secret sshPrivateKey needs --key: the tools never decrypt secrets)."""
    return os.path.expanduser(key or cfg.ssh.private_key_path)


@contextmanager
def ssh_argv(cfg: StackConfig, node: NodeConfig, *, key: str | None) -> Iterator[list[str]]:
    """`ssh ... node bash -s` trusting only the node's pinned key (a known_hosts file of its own,
    removed on exit): the script goes on stdin, never on the command line."""
    with tempfile.TemporaryDirectory(prefix="spark-vllm-cli-") as tmp:
        known_hosts = os.path.join(tmp, "known_hosts")
        with open(known_hosts, "w") as fh:
            fh.write(known_hosts_line(node))
        yield recon.ssh_argv(cfg, node, key_path=key_file(cfg, key), known_hosts=known_hosts)
