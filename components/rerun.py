"""Commands that must run again when a node lost what they made.

Remote commands have no Read: a file or cache wiped behind the stack's back would stay wiped.
Recon looks before the run; where something a command made is gone, the command gets a value in
`triggers` never seen before (`fresh_trigger`), so the engine runs it again. Where everything is
in place, `ignore_changes=["triggers"]` keeps whatever value the state holds: no diff. `Again`
is that pair, used by ModelCache (the model's fetch, sync, seeder and verify), RayCluster (the
Ray token file) and VllmServer (the API key file).

A gate whose container recon found stopped behind the stack runs again the same way: recon's
reason, with the time, is a marker never seen before (`Again.because`); without a reason the
marker is "none" and `ignore_changes` keeps whatever marker the state holds (the gates of
VllmServer, VllmService, Gateway and Monitoring, and Monitoring's exporter starts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def fresh_trigger(now: Callable[[], int] = time.time_ns) -> str:
    """A value never seen before: set as `triggers`, it makes the engine run a command again.
    (A marker for the engine only; no secret, unlike the Ray token.)"""
    return f"repair-{now()}"


@dataclass(frozen=True)
class Again:
    """`triggers` + `ignore_changes` for a command that must run again when a node lost its copy
    (a fresh trigger), and must not diff when every node is intact (the state's value is kept)."""

    triggers: list[str]
    ignore_changes: list[str] | None

    @property
    def marker(self) -> str:
        """The one value of `triggers` (a marker may travel elsewhere too: VllmServer's ranks
        restart takes it on stdin)."""
        return " ".join(self.triggers)

    @staticmethod
    def because(reason: str | None, now: Callable[[], int] | None = None) -> Again:
        """For a command that must run again when recon found a reason (a container not
        running: the reason, with the time, is a marker never seen before), and must not diff
        when there is none ("none", and the state's marker is kept)."""
        if reason is None:
            return Again(["none"], ["triggers"])
        return Again([f"{reason} @{(now or time.time_ns)()}"], None)

    @staticmethod
    def when_wiped(triggers: Sequence[str]) -> Again:
        if triggers:
            return Again([" ".join(triggers)], None)
        return Again(["intact"], ["triggers"])
