"""Docker container and command helpers: argv and shell tokenizing, `--flag` values, container
labels and envs (`env_pairs` knows when they are unknown), which containers run Ray, the host
behind a docker provider."""
from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pulumi_policy import PolicyResource

from contract import labels

from ._common import UNKNOWN, Json, elements, get, text


def _words(item: str) -> list[str]:
    """One command item as argv words: a shell string (`bash -lc "..."`) is split, a plain word
    is kept whole."""
    if not any(ch.isspace() for ch in item):
        return [item]
    try:
        return shlex.split(item)
    except ValueError:
        return item.split()


def command_tokens(props: Json, key: str = "command") -> list[str]:
    """A container's command as argv tokens; shell strings (`bash -lc "..."`) are split too."""
    tokens: list[str] = []
    for item in elements(get(props, key)):
        if isinstance(item, str):
            tokens.extend(_words(item))
    return tokens


def shell_tokens(script: str | None, depth: int = 0) -> list[str]:
    """Words of a shell script, descending into quoted `sh -c '...'` bodies (one level per
    quoting) so an inline `VAR=literal` in a nested script is seen too."""
    if not script:
        return []
    try:
        words = shlex.split(script, comments=True)
    except ValueError:
        words = script.split()
    out: list[str] = []
    for word in words:
        out.append(word)
        if depth < 3 and any(ch.isspace() for ch in word):
            out.extend(shell_tokens(word, depth + 1))
    return out


def flag_value(tokens: Sequence[str], name: str) -> str | None:
    """The value of `--name=v` or `--name v` (the last occurrence wins, like argparse)."""
    found = None
    for i, tok in enumerate(tokens):
        if tok == name and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            found = tokens[i + 1]
        elif tok.startswith(name + "="):
            found = tok[len(name) + 1:]
    return found


def has_flag(tokens: Sequence[str], name: str) -> bool:
    return any(t == name or t.startswith(name + "=") for t in tokens)


def is_literal(value: str | None) -> bool:
    """A literal value, as opposed to a shell/env reference (`$VAR`, `${VAR}`) or empty."""
    if not value:
        return False
    return not value.startswith("$") and value not in ('""', "''")


def labels_of(props: Json) -> dict[str, Json]:
    """Container `labels` (list of {label, value}) as a dict."""
    out: dict[str, Json] = {}
    for item in elements(get(props, "labels")):
        label = text(get(item, "label"))
        if label:
            out[label] = get(item, "value")
    return out


def envs_of(props: Json) -> dict[str, str]:
    """Container `envs` (list of K=V) as a dict; an unknown entry is skipped."""
    out: dict[str, str] = {}
    for item in elements(get(props, "envs")):
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out


def env_pairs(props: Json) -> list[tuple[str, str]] | None:
    """Container `envs` as (name, value) pairs in order; None when the list or any entry is
    unknown (during preview), so that nothing is concluded from what is missing."""
    raw = get(props, "envs")
    if raw is UNKNOWN:
        return None
    out: list[tuple[str, str]] = []
    for item in elements(raw):
        if item is UNKNOWN:
            return None
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out.append((k, v))
    return out


def is_ray_container(props: Json) -> bool:
    role = text(labels_of(props).get(labels.ROLE)) or ""
    if role.startswith("ray"):
        return True
    tokens = command_tokens(props)
    return any(t.endswith("ray") and i + 1 < len(tokens) and tokens[i + 1] == "start"
               for i, t in enumerate(tokens))


def provider_host(resource: PolicyResource) -> str | None:
    """The management address behind a docker provider (`host: ssh://user@10.77.0.11:22`)."""
    provider = getattr(resource, "provider", None)
    if provider is None:
        return None
    host = text(get(provider.props, "host"))
    if not host:
        return None
    m = re.match(r"^[a-z]+://(?:[^@/]*@)?(\[[^\]]+\]|[^:/]+)", host)
    return m.group(1).strip("[]") if m else None
