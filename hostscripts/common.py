"""Helpers every host script builder shares: quoting, labels, HF cache names, payload files.

Rules every script follows (hostscripts/__init__.py has the whole list): POSIX sh, `set -eu`,
idempotent; every value interpolated goes through `shlex.quote`; secrets are never interpolated
(they arrive on stdin).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources, util
from pathlib import Path

from config.forms import CONTAINER_ID, CONTAINER_NAME, clip, is_image_id
from hostscripts.paths import StackNames

q = shlex.quote


def repo_dir(repo: str) -> str:
    """The Hugging Face cache folder name of a model repo: models--<org>--<name>."""
    return "models--" + repo.replace("/", "--")


def label_flags(labels: Mapping[str, str]) -> str:
    return " ".join(f"--label {q(f'{k}={v}')}" for k, v in sorted(labels.items()))


class RemoteValueError(ValueError):
    """A value read back from a host (an image ID, a container ID or name) is not of its exact
    form: it never reaches another host's shell."""


def image_id(value: str) -> str:
    """`sha256:` + 64 hex, as a Docker daemon reports it, or RemoteValueError."""
    if not is_image_id(value):
        raise RemoteValueError(f"not an image ID (sha256:<64 hex>): {clip(value)}")
    return value


def container_ids(values: str) -> str:
    """Space-separated container IDs (12-64 hex each), or RemoteValueError."""
    ids = values.split(" ")
    if not ids or any(CONTAINER_ID.fullmatch(i) is None for i in ids):
        raise RemoteValueError(f"not container IDs (12-64 hex, space-separated): {clip(values)}")
    return values


def container_name(value: str) -> str:
    """A Docker container name (what `docker ps` reports), or RemoteValueError."""
    if CONTAINER_NAME.fullmatch(value) is None:
        raise RemoteValueError(f"not a container name: {clip(value)}")
    return value


# A value that may stand in a comment or an unquoted echo word of a script: quoting does not
# protect a comment (a newline ends it and what follows runs), so builders check instead.
_PLAIN = re.compile(r"[A-Za-z0-9._:/@+=,-]{1,512}")


def plain(value: str) -> str:
    """`value`, when it is plain (letters, digits and ._:/@+=,- only, 1 to 512 of them), for a
    comment line or an unquoted echo word; ValueError otherwise. Builders use it for every value
    they put there, whatever validated it before."""
    if not isinstance(value, str) or _PLAIN.fullmatch(value) is None:
        raise ValueError(f"not a plain value for a comment or echo line: {clip(value)}")
    return value


# The run's token, made on the head by each seeder's start (32 random bytes as 64 hex): printed
# on the start's stdout (a secret the program hands to the nodes' pulls or syncs on stdin),
# its sha256 only on the seeder's command line.
MAKE_TOKEN = [
    "tok=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')",
    "[ ${#tok} -eq 64 ] || { echo 'seeder: no random token (od, /dev/urandom)' >&2; exit 1; }",
    "sum=$(printf %s \"$tok\" | sha256sum | cut -d' ' -f1)",
]


# The texts a payload may ask to run after (its header's `# Prelude: <name>, ...` line), each
# once, for the rules several payloads share: a payload cannot import (it is sent as text), so
# its preludes are joined in front of it, in the order its line names them.
PRELUDES = {
    # cache_fs.py's Tree: every root write, remove and rename under a cache (issue 46)
    "cache_fs": ("hostscripts.payloads", "cache_fs.py"),
    # the hub-manifest rules, which config/forms.py imports too
    "manifest": ("contract", "manifest.py"),
    # the manifest on stdin, read and refused with those rules; paths checked where joined
    "manifest_read": ("hostscripts.payloads", "manifest_read.py"),
    # size and clock formatting of the copies' progress lines
    "progress": ("hostscripts.payloads", "progress.py"),
    # the seeders' HTTP server and their bearer-token check
    "seeder": ("hostscripts.payloads", "seeder.py"),
}
_PRELUDE_LINE = re.compile(r"# Prelude: ([a-z_]+(?:, [a-z_]+)*)\.?")


def _text(package: str, name: str) -> str:
    """The program text of a file: the file minus the comment lines it starts with, which stay
    in the repository (the text sent begins at the blank line after them), so the bytes a node
    runs do not change when the explanation does."""
    if package == "hostscripts.payloads":
        text = resources.files(package).joinpath(name).read_text()
    else:  # a module of the program's own packages (contract/ is a namespace package)
        spec = util.find_spec(f"{package}.{name.removesuffix('.py')}")
        if spec is None or spec.origin is None:
            raise FileNotFoundError(f"{package}/{name}")
        text = Path(spec.origin).read_text()
    lines = text.split("\n")
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        i += 1
    return "\n".join(lines[i:])


def preludes(name: str) -> list[str]:
    """The preludes hostscripts/payloads/<name> asks for (its header's `# Prelude:` line), in
    order; none when it has no such line."""
    text = resources.files("hostscripts.payloads").joinpath(name).read_text()
    for line in text.split("\n"):
        if not line.startswith("#"):
            break
        m = _PRELUDE_LINE.fullmatch(line)
        if m is not None:
            wanted = m.group(1).split(", ")
            unknown = [w for w in wanted if w not in PRELUDES]
            if unknown or len(set(wanted)) != len(wanted):
                raise ValueError(f"{name}: unknown or repeated preludes {wanted}")
            return wanted
    return []


def own_text(name: str) -> str:
    """The program text of hostscripts/payloads/<name> alone, without its comment header and
    without the preludes `payload` joins in front of it."""
    return _text("hostscripts.payloads", name)


def payload(name: str) -> str:
    """The program text of hostscripts/payloads/<name>, as it is sent to a node: the text of
    each prelude its header names (PRELUDES), then its own, each without its comment header.
    A payload that names none is sent as its own text."""
    return "".join(_text(*PRELUDES[p]) for p in preludes(name)) + own_text(name)


def secret_file_write(path: str, what: str) -> str:
    """On a node: a secret (stdin) into a root-only file, replaced atomically; prints
    `<what> <sha256 of the file>` (containers carry the hash in a label, so a new secret replaces
    them; the hash of a random token or key tells nothing about it)."""
    d = path.rsplit("/", 1)[0]
    return "\n".join(
        [
            "set -eu",
            "umask 077",
            f"mkdir -p {q(d)}",
            f"chmod 700 {q(d)}",
            # a leftover .new (an interrupted run) is removed, never written through: its mode
            # (or a symlink's target) would become the secret's; noclobber makes the new one
            # exclusively, and it is 0600 before it takes the secret's name
            f"rm -f {q(path + '.new')}",
            f"(set -C; cat > {q(path + '.new')})",
            f"chmod 600 {q(path + '.new')}",
            f"test -s {q(path + '.new')}",
            f"mv {q(path + '.new')} {q(path)}",
            f"echo \"{what} $(sha256sum {q(path)} | cut -d' ' -f1)\"",
        ]
    )


def stack_path_remove(names: StackNames, *paths: str, tree: bool = False) -> str:
    """Paths of the stack's folder (StackNames.dir) removed, then their folder and those above
    it up to the stack's as far as they are empty (another file of the stack may keep them).
    `paths` share one folder; `tree`: they may be folders (`rm -rf`), else files (`rm -f`).
    ValueError for a path outside the stack's folder, relative, or one that is not in its one
    plain form (`..`, `.`, `//`, a trailing `/`): the rmdir walk reads the path's text."""
    if not paths:
        raise ValueError("no path to remove")
    for path in paths:
        parts = path.split("/")
        if not path.startswith(names.dir + "/") or "" in parts[1:] or ".." in parts or \
                "." in parts:
            raise ValueError(f"{path} is not in the stack's folder {names.dir}")
    parents = {p.rsplit("/", 1)[0] for p in paths}
    if len(parents) != 1:
        raise ValueError(f"paths of one folder only: {sorted(parents)}")
    folders, d = [], parents.pop()
    while len(d) >= len(names.dir):
        folders.append(d)
        d = d.rsplit("/", 1)[0]
    rm = "rm -rf" if tree else "rm -f"
    return (f"{rm} {' '.join(q(p) for p in paths)}; "
            f"rmdir {' '.join(q(f) for f in folders)} 2>/dev/null || true")


def legacy_file_remove(path: str) -> str:
    """A file an older version kept at a fixed place (hostscripts/paths LEGACY_*), with its
    folder when that is empty."""
    return f"rm -f {q(path)}; rmdir {q(path.rsplit('/', 1)[0])} 2>/dev/null || true"


def verdict_script(title: str, lines: Sequence[str], problems: Sequence[str],
                   warnings: Sequence[str] = ()) -> str:
    """A script that only reports a verdict the program made: the lines on stdout, warnings and
    problems on stderr, exit 1 when there are problems. Its text changes exactly when the
    verdict does, so it runs again only then."""
    out = ["set -eu", *(f"echo {q(line)}" for line in lines)]
    out += [f"echo {q(f'{title} warning: {w}')} >&2" for w in warnings]
    out += [f"echo {q(f'{title} failed: {p}')} >&2" for p in problems]
    if problems:
        out.append("exit 1")
    return "\n".join(out)
