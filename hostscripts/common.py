"""Helpers every host script builder shares: quoting, labels, HF cache names, payload files.

Rules every script follows (hostscripts/__init__.py has the whole list): POSIX sh, `set -eu`,
idempotent; every value interpolated goes through `shlex.quote`; secrets are never interpolated
(they arrive on stdin).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from importlib import resources

q = shlex.quote


def repo_dir(repo: str) -> str:
    """The Hugging Face cache folder name of a model repo: models--<org>--<name>."""
    return "models--" + repo.replace("/", "--")


def label_flags(labels: Mapping[str, str]) -> str:
    return " ".join(f"--label {q(f'{k}={v}')}" for k, v in sorted(labels.items()))


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    """One OpenSSH known_hosts line for a pinned key (`[host]:port` form when port != 22)."""
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {host_key.strip()}"


def payload(name: str) -> str:
    """The program text of hostscripts/payloads/<name>, as it is sent to a node.

    A payload file starts with comment lines that say what it is; they stay in the repository
    (the text sent begins at the blank line after them), so the bytes a node runs do not change
    when the explanation does.
    """
    text = resources.files("hostscripts.payloads").joinpath(name).read_text()
    lines = text.split("\n")
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    return "\n".join(lines[i:])
