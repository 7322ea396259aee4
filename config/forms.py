"""The exact forms of the values that name things: commits, digests, image and container IDs,
sizes and ports. One definition each, shared by the config, the components and the tools.

Patterns are used with `fullmatch` only: `re.match(r"^...$")` also accepts a trailing newline.
"""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3

COMMIT = re.compile(r"[0-9a-f]{40}")
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
DIGEST_REF = re.compile(r"(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})")
CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")


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
