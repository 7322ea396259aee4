"""Host keys pinned through an OpenSSH known_hosts file (spark-vllm:ssh.knownHostsFile)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

from config.errors import ConfigError, key_path
from config.models import HOST_KEY, PINNABLE, StackConfig

_KEY_PREFERENCE = ("ssh-ed25519", "ecdsa-sha2-nistp521", "ecdsa-sha2-nistp384",
                   "ecdsa-sha2-nistp256")


def known_host_keys(text: str, host: str, port: int) -> list[str]:
    """The keys an OpenSSH known_hosts text holds for host:port, as '<type> <base64>'.

    Plain (`host`, `[host]:port`, comma lists) and hashed (`|1|salt|hmac`) host fields;
    @revoked lines and @cert-authority lines are never taken as a pin.
    """
    names = {host} if port == 22 else set()
    names.add(f"[{host}]:{port}")
    keys = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[0].startswith("#") or parts[0].startswith("@"):
            continue
        hosts, kind, blob = parts[0], parts[1], parts[2]
        matched = False
        if hosts.startswith("|1|"):
            try:
                _, _, salt, digest = hosts.split("|", 3)
                key = base64.b64decode(salt)
                for name in names:
                    mac = hmac.new(key, name.encode(), hashlib.sha1).digest()
                    if hmac.compare_digest(base64.b64encode(mac).decode(), digest):
                        matched = True
            except ValueError:
                continue
        else:
            matched = bool(names & set(hosts.split(",")))
        candidate = f"{kind} {blob}"
        if matched and kind in PINNABLE and HOST_KEY.fullmatch(candidate) and candidate not in keys:
            keys.append(candidate)
    keys.sort(key=lambda k: _KEY_PREFERENCE.index(k.split()[0]))
    return keys


def pin_host_keys(cfg: StackConfig) -> StackConfig:
    """Every node with its host key: from the stack file, else from `ssh.knownHostsFile`.

    Raises ConfigError naming the node when neither pins a key (an unpinned node is never
    contacted). When the file holds several keys for a host, the strongest type is pinned.
    """
    if all(n.host_key is not None for n in cfg.nodes):
        return cfg
    path = cfg.ssh.known_hosts_file
    text = None
    if path is not None:
        try:
            text = Path(os.path.expanduser(path)).read_text()
        except OSError as exc:
            raise ConfigError([
                f"{key_path(('ssh', 'knownHostsFile'))}: got {path!r}; expected a readable "
                "known_hosts "
                f"file ({exc.strerror})"
            ]) from None
    problems, nodes = [], []
    for i, node in enumerate(cfg.nodes):
        if node.host_key is not None:
            nodes.append(node)
            continue
        found = known_host_keys(text, node.host, node.port) if text is not None else []
        if not found:
            where = (f"no entry for {node.host} port {node.port} in {path}" if path
                     else "and spark-vllm:ssh.knownHostsFile is not set")
            problems.append(
                f"{key_path(('nodes', i, 'hostKey'))}: missing ({where}); expected the "
                "node's SSH host "
                "key ('ssh-keyscan -t ed25519 <host>' without the host name) or a known_hosts file "
                "that lists it"
            )
            continue
        nodes.append(node.model_copy(update={"host_key": found[0]}))
    if problems:
        raise ConfigError(problems)
    return cfg.model_copy(update={"nodes": nodes})
