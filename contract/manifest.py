# The hub-manifest rules, once: what a model commit's listing (the hub's, or a mirror's, or
# whoever sits on the path to it) must be before its values name a blob, a snapshot link or a
# folder in an HF cache, where every node writes them as root (issue 31).
#
# Two sides read this one text. The program imports it (config/forms.py re-exports the file
# rules; hostscripts/models.py checks every listing it puts into a manifest with them). The node
# payloads that read a manifest (hostscripts/payloads/model_verify.py, model_sync.py, and
# model_ref.py for the commit and repo-dir forms) run it as a prelude: hostscripts/common.py
# `payload()` joins this file's text, from the first line after this comment header, in front
# of theirs. So it imports nothing outside the standard library, needs no `from __future__`
# (a prelude is not the top of the text run) and defines only names the payloads do not.
# Patterns are used with `fullmatch` only: `re.match(r"^...$")` also accepts a trailing newline.
# The lines above are not sent to the node.

import re

COMMIT = re.compile(r"[0-9a-f]{40}")
# A file's etag names its blob in the HF cache: the LFS sha256, or the git blob id.
ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# A repo's HF cache folder, models--<org>--<name> (hostscripts/common.py repo_dir).
REPO_DIR = re.compile(r"models--[A-Za-z0-9][A-Za-z0-9._-]*--[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_MODEL_FILE_BYTES = 2**40  # 1 TiB: far above any file the hub holds, far below a bogus size
MAX_REPO_PATH = 1024  # a snapshot link's path below its folder; the hub's are far shorter


def clip(value: object, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: error messages stay readable."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'" + f" ({len(text)} chars)"


def check_repo_path(path: object) -> "str | None":
    """Why `path` is not the path of a file inside a repo (relative, normalised, no '.' or '..'
    component, no control character, valid UTF-8), or None. It is joined under a snapshot
    folder on every node, as root: `../x` or `/x` must never pass."""
    if not isinstance(path, str) or not path:
        return "not a non-empty string"
    if len(path) > MAX_REPO_PATH:
        return f"longer than {MAX_REPO_PATH} characters"
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if any(b < 32 or b == 127 for b in raw):
        return "contains a control character"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "not relative and normalised (an empty, '.' or '..' component, or a leading or " \
               "trailing '/')"
    if any(len(p.encode("utf-8")) > 255 for p in parts):
        return "a component longer than 255 bytes"
    return None


def check_model_file(path: object, size: object, etag: object) -> "str | None":
    """Why a file the hub lists cannot name a blob and a link in the HF cache, or None: the
    etag 40 or 64 lowercase hex, the path relative and normalised, the size a byte count."""
    if not isinstance(etag, str) or ETAG.fullmatch(etag) is None:
        return f"etag {clip(etag)} is not 40 or 64 lowercase hex digits"
    problem = check_repo_path(path)
    if problem is not None:
        return f"path {clip(path)} is {problem}" if problem.startswith("not") \
            else f"path {clip(path)}: {problem}"
    if type(size) is not int or not 0 <= size <= MAX_MODEL_FILE_BYTES:
        return f"size {clip(size)} of {path} is not a byte count (0 to {MAX_MODEL_FILE_BYTES})"
    return None


def listing_problem(files: "list[tuple[str, int, str]]") -> "str | None":
    """Why a commit's files, (path, size, etag) each, cannot all live in one snapshot folder, or
    None: a path listed twice, a path that is also a folder of another path, an etag listed
    with two sizes (one blob per etag)."""
    paths: set[str] = set()
    sizes: dict[str, int] = {}
    for path, size, etag in files:
        if path in paths:
            return f"it lists {clip(path)} twice"
        paths.add(path)
        if sizes.setdefault(etag, size) != size:
            return f"it lists blob {etag} with two sizes ({sizes[etag]} and {size})"
    for path in sorted(paths):
        parts = path.split("/")
        folder = next(("/".join(parts[:i]) for i in range(1, len(parts))
                       if "/".join(parts[:i]) in paths), None)
        if folder is not None:
            return f"it lists {clip(folder)} as a file and as the folder of {clip(path)}"
    return None


def manifest_problem(m: object) -> "str | None":
    """Why a manifest as the payloads read it ({"repoDir", "commit", "files": [{"path", "size",
    "etag"}]}: hostscripts/models.py verify_manifest_json, model_manifest_json) cannot name
    files in an HF cache, or None: every value is checked before a file is touched."""
    if not isinstance(m, dict) or not isinstance(m.get("files"), list):
        return "no file list"
    if not isinstance(m.get("commit"), str) or COMMIT.fullmatch(m["commit"]) is None:
        return f"commit {clip(m.get('commit'))} is not 40 lowercase hex digits"
    if not isinstance(m.get("repoDir"), str) or REPO_DIR.fullmatch(m["repoDir"]) is None:
        return f"repoDir {clip(m.get('repoDir'))} is not models--<org>--<name>"
    for f in m["files"]:
        if not isinstance(f, dict):
            return f"a file entry {clip(f)} is not an object"
        problem = check_model_file(f.get("path"), f.get("size"), f.get("etag"))
        if problem is not None:
            return problem
    return listing_problem([(f["path"], f["size"], f["etag"]) for f in m["files"]])
