"""The exact forms of the values that name things: commits, digests, image and container IDs,
sizes and ports. One definition each, shared by the config, the components and the tools.

Patterns are used with `fullmatch` only: `re.match(r"^...$")` also accepts a trailing newline.
"""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3

# The stack config's namespace (`spark-vllm:<key>`), the keys that are only ever Pulumi secrets
# (config/load.py reads them; promotion never copies them), and the word that marks a value of a
# checked-in stack file as not real yet (a host key: refused in prod, skipped by recon).
NAMESPACE = "spark-vllm"
SECRET_KEYS = ("hfToken", "vllmApiKey", "sshPrivateKey", "gatewayTlsKey",
               "alertingSecrets")
PLACEHOLDER = "PLACEHOLDER"

# What preflight (preflight.osReserveBytes) leaves the OS of a node's unified memory by default.
# The policy pack's memory-fit default (policies/rules/_common.py DEFAULTS) cannot import this
# (the pack runs in its own virtualenv); tests/policies/test_policy_rules.py holds it equal.
OS_RESERVE_BYTES = 8 * GIB

COMMIT = re.compile(r"[0-9a-f]{40}")
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
DIGEST_REF = re.compile(r"(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})")
CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
# A file of a model commit as the hub lists it (hostscripts.models.ModelFile): its etag names
# its blob in the HF cache (the LFS sha256, or the git blob id), its path names its snapshot link.
ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
MAX_MODEL_FILE_BYTES = 2**40  # 1 TiB: far above any file the hub holds, far below a bogus size
MAX_REPO_PATH = 1024  # a snapshot link's path below its folder; the hub's are far shorter
# Docker's rule for a container name ([a-zA-Z0-9][a-zA-Z0-9_.-]+), bounded: a name the stack
# puts into a shell, accepts in config or reads back from a host
CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")


def is_commit(value: object) -> bool:
    """A full 40-hex git commit (what a model revision resolves to)."""
    return isinstance(value, str) and COMMIT.fullmatch(value) is not None


def is_image_id(value: object) -> bool:
    """`sha256:` + 64 hex, as a Docker daemon reports an image ID."""
    return isinstance(value, str) and IMAGE_ID.fullmatch(value) is not None


def is_digest_ref(value: object) -> bool:
    """`<repository>@sha256:<64 hex>`: an image reference pinned by digest."""
    return isinstance(value, str) and DIGEST_REF.fullmatch(value) is not None


def check_repo_path(path: object) -> str | None:
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


def check_model_file(path: object, size: object, etag: object) -> str | None:
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


def check_port(value: int) -> int:
    """A TCP port, for pydantic validators (raises ValueError with the expected form)."""
    if not 1 <= value <= 65535:
        raise ValueError("expected a TCP port between 1 and 65535")
    return value


# The folders of the stack's files on every node (hostscripts/paths.py: one folder per stack in
# STATE_DIR/stacks, Ray's session folders in RUN_DIR/stacks): no cache folder may be one of them,
# be in one or hold one (config.models.cache_dir_problem).
STATE_DIR = "/var/lib/spark-vllm"
RUN_DIR = "/run/spark-vllm"

# The seeders' ports on the head's fabric address (hostscripts/images.py, hostscripts/models.py):
# no other port of the stack may take them.
IMAGE_SEED_PORT = 18471
MODEL_SEED_PORT = 18472
SEEDER_PORTS = (IMAGE_SEED_PORT, MODEL_SEED_PORT)
# The `<what>` of the stack's own containers, `spark-vllm-<stack>-<what>`
# (hostscripts/paths.StackNames): a service's container is `spark-vllm-<stack>-<service>`, so no
# service may be named one of these.
STACK_CONTAINERS = ("serve", "ray-head", "ray-worker", "model-seeder", "gateway", "prometheus",
                    "node-exporter", "collective", "alertmanager")


def check_ref_name(name: str) -> str | None:
    """Why `name` is not a valid git branch/tag name (git check-ref-format's rules), or None.

    A revision names a folder in the HF cache (refs/<revision>): `../../x` must never pass.
    """
    if not name:
        return "empty"
    if len(name) > 255:
        return "longer than 255 characters"
    if any(ord(c) < 33 or ord(c) == 127 for c in name):
        return "contains a space or a control character"
    bad = next((c for c in "~^:?*[\\" if c in name), None)
    if bad:
        return f"contains {bad!r}"
    if ".." in name or "@{" in name or "//" in name:
        return "contains '..', '@{' or '//'"
    if name.startswith(("/", "-")) or name.endswith(("/", ".", ".lock")) or name == "@":
        return "starts with '/' or '-', ends with '/', '.' or '.lock', or is '@'"
    if any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        return "a component starts with '.' or ends with '.lock'"
    return None


def credential_in_url(url: str) -> bool:
    """`scheme://user:password@host`: a credential in a URL (it would reach scripts and state)."""
    rest = url.split("://", 1)[-1]
    return "@" in rest.split("/", 1)[0]


_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|PRIVATE_?KEY|CREDENTIAL)",
                          re.IGNORECASE)
_SECRET_VALUE = re.compile(r"(hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{16,}|-----BEGIN [A-Z ]*KEY)")


def secret_env_name(name: str) -> bool:
    """An environment variable whose name says it holds a secret (HF_TOKEN, VLLM_API_KEY...)."""
    return _SECRET_NAME.search(name) is not None


_SECRET_FLAG = re.compile(r"--?(?:[a-z0-9]+[-_])*(token|secret|password|passwd|api[-_]?key|"
                          r"private[-_]?key|credentials?)(=.*)?", re.IGNORECASE | re.DOTALL)


def secret_flag(arg: str) -> bool:
    """A command-line flag whose name says it takes a secret (`--hf-token`, `--api-key`,
    `--db-password=...`); not `--max-num-batched-tokens` or `--tokenizer`."""
    return _SECRET_FLAG.fullmatch(arg) is not None


def secret_value(value: str) -> bool:
    """A value shaped like a known token (Hugging Face, OpenAI-style keys, PEM keys)."""
    return _SECRET_VALUE.search(value) is not None


def clip(value: object, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: error messages stay readable."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'" + f" ({len(text)} chars)"
