"""`spark-vllm:guard`: what each node does when its memory runs out (components/guard.py; what
runs on the nodes: hostscripts/guard.py; docs/design.md "A node that survives memory
exhaustion").

On a DGX Spark the GPU's memory is the system's memory: a prefill, a KV cache or a second model
that pushes the node past it takes the whole node with it (sshd stops answering, or the node
resets) unless something acts first. With `enabled` (the default) the stack keeps, per node:

* sshd and dockerd out of the kernel OOM killer's way: systemd drop-ins of the stack's own
  (`OOMScoreAdjust=protectScoreAdj` for ssh.service and docker.service), applied to the running
  daemons too; containerd keeps its own unit's -999;
* the stack's vLLM processes the first ones any OOM killer takes: they raise their own
  `oom_score_adj` to `vllmScoreAdj` when their container starts;
* an early OOM killer that acts at the stack's OS reserve (`preflight.osReserveBytes`), before
  the kernel has to: `killer: earlyoom` (Debian/Ubuntu's package, configured by a drop-in of
  the stack's: SIGTERM below the reserve, SIGKILL below half of it, the stack's vLLM processes
  preferred, sshd, dockerd, containerd, systemd and the stack's gateway and Prometheus
  avoided), or `systemd-oomd` (systemd's own, which acts on memory pressure, not on the
  reserve: where the operator prefers it);
* a record of every kill (the node's available memory at that moment), read by vLLM's
  watchdog, `spark-vllm status`, the next preview's preflight and Prometheus's
  SparkVllmOomKilled alert.

Keys (camelCase in the file):

    enabled            the guard on every node (default true); false: the stack changes nothing
                       of the nodes' OOM handling (and removes what it set, on the next `up`)
    killer             `earlyoom` (default) or `systemd-oomd`
    install            install the killer's Debian/Ubuntu package on a node that lacks it
                       (`apt-get install earlyoom`, or `systemd-oomd`); installing a package is
                       the operator's decision: false (the default) leaves a node without it to
                       preflight, which says what is missing and how to add it. The lab's dev
                       stack file sets true; staging and prod say their choice explicitly
    protectScoreAdj    sshd's and dockerd's oom_score_adj (-1000..0; -1000 would make them
                       unkillable, and every process started over ssh inherits sshd's value)
    vllmScoreAdj       the stack's vLLM processes' oom_score_adj (0..1000)
    oomBackoffSeconds  how long vLLM's watchdog waits before starting vLLM again after an OOM
                       kill (doubling with every OOM kill within
                       health.liveness.crashLoopWindowSeconds), so that a crash loop caused by
                       memory does not restart into the same pressure at once
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from config.types import ConfigModel

Killer = Literal["earlyoom", "systemd-oomd"]
# the Debian/Ubuntu package of each killer (what `install` installs, what preflight names)
KILLER_PACKAGES: dict[str, str] = {"earlyoom": "earlyoom", "systemd-oomd": "systemd-oomd"}


class GuardConfig(ConfigModel):
    enabled: bool = True
    killer: Killer = "earlyoom"
    install: bool = False
    protect_score_adj: int = Field(default=-900, ge=-999, le=0)
    vllm_score_adj: int = Field(default=1000, ge=0, le=1000)
    oom_backoff_seconds: int = Field(default=60, ge=0, le=3600)

    @property
    def package(self) -> str:
        return KILLER_PACKAGES[self.killer]
