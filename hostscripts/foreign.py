"""Foreign containers (preflight.foreignContainers: stop): stopped with a marker recon reads,
given back on destroy."""

from __future__ import annotations

from hostscripts.common import container_name, q
from hostscripts.paths import STOPPED_DIR


def stop_foreign_container(name: str, stack: str) -> str:
    """Stop a container the stack does not own, leaving a marker so recon keeps reporting it.

    `name` comes from recon (the node's `docker ps`): only a container name's exact form may
    become a path and a command argument."""
    name = container_name(name)
    return "\n".join(
        [
            "set -eu",
            f"mkdir -p {q(STOPPED_DIR)}",
            f"printf '%s\\n' {q(stack)} > {q(STOPPED_DIR + '/' + name)}",
            f"docker stop {q(name)} >/dev/null",
            f"echo stopped {q(name)}",
        ]
    )


def start_foreign_container(name: str) -> str:
    """Give back a container the stack stopped (runs on destroy)."""
    name = container_name(name)
    return "\n".join(
        [
            "set -eu",
            f"docker start {q(name)} >/dev/null",
            f"rm -f {q(STOPPED_DIR + '/' + name)}",
            f"echo started {q(name)}",
        ]
    )
