"""The exact forms of the values that name things: commits, digests, image and container IDs,
sizes and ports. One definition each, shared by the config, the components and the tools; those
the policy pack checks too (sizes, reserves, commits, digests, container names, secret shapes)
are defined once in contract/ and re-exported here.

Patterns are used with `fullmatch` only: `re.match(r"^...$")` also accepts a trailing newline.
"""

from __future__ import annotations

import re

# re-exported (`X as X`): the program imports them from here
from contract.forms import COMMIT as COMMIT
from contract.forms import CONTAINER_ID as CONTAINER_ID
from contract.forms import CONTAINER_NAME as CONTAINER_NAME
from contract.forms import DIGEST_REF as DIGEST_REF
from contract.forms import IMAGE_ID as IMAGE_ID
from contract.forms import secret_env_name as secret_env_name
from contract.forms import secret_value as secret_value

# The hub-manifest rules (a model file's etag, path and size) are contract/manifest.py's, which
# the node payloads that read a manifest run too (hostscripts/common.py joins its text in front
# of theirs): one definition for both sides, re-exported here for the config and the builders.
from contract.manifest import check_model_file as check_model_file
from contract.manifest import check_repo_path as check_repo_path
from contract.manifest import clip as clip
from contract.sizes import GIB as GIB
from contract.sizes import KIB as KIB
from contract.sizes import MIB as MIB
from contract.sizes import OS_RESERVE_BYTES as OS_RESERVE_BYTES

# The stack config's namespace (`spark-vllm:<key>`), the keys that are only ever Pulumi secrets
# (config/load.py reads them; promotion never copies them), and the word that marks a value of a
# checked-in stack file as not real yet (a host key: refused in prod, skipped by recon).
NAMESPACE = "spark-vllm"
SECRET_KEYS = ("hfToken", "vllmApiKey", "sshPrivateKey", "gatewayTlsKey",
               "alertingSecrets")
PLACEHOLDER = "PLACEHOLDER"

# OS_RESERVE_BYTES (contract/sizes.py): what preflight (preflight.osReserveBytes) leaves the OS
# of a node's unified memory by default, and the policy pack's memory-fit default.


def is_commit(value: object) -> bool:
    """A full 40-hex git commit (what a model revision resolves to)."""
    return isinstance(value, str) and COMMIT.fullmatch(value) is not None


def is_image_id(value: object) -> bool:
    """`sha256:` + 64 hex, as a Docker daemon reports an image ID."""
    return isinstance(value, str) and IMAGE_ID.fullmatch(value) is not None


def is_digest_ref(value: object) -> bool:
    """`<repository>@sha256:<64 hex>`: an image reference pinned by digest."""
    return isinstance(value, str) and DIGEST_REF.fullmatch(value) is not None


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


# secret_env_name and secret_value: contract/forms.py (the pack flags the same shapes)
_SECRET_FLAG = re.compile(r"--?(?:[a-z0-9]+[-_])*(token|secret|password|passwd|api[-_]?key|"
                          r"private[-_]?key|credentials?)(=.*)?", re.IGNORECASE | re.DOTALL)


def secret_flag(arg: str) -> bool:
    """A command-line flag whose name says it takes a secret (`--hf-token`, `--api-key`,
    `--db-password=...`); not `--max-num-batched-tokens` or `--tokenizer`."""
    return _SECRET_FLAG.fullmatch(arg) is not None


