"""What one `spark-vllm reconcile` run leaves behind (tools/reconcile.py): one line (what it
saw, what it did, how long), a JSON record, and its result as metrics for Prometheus.

Where the metrics go, and why there: the control machine that runs the reconcile may be no node
of the stack (a laptop, a CI runner), so a file only it holds would reach no Prometheus. The
run already reaches the head over SSH with the stack's pinned host key, and the head's node
exporter reads the `*.prom` files of the stack's textfile folder
(hostscripts/monitoring.textfile_dir, its textfile collector): the run writes `reconcile.prom`
there, atomically (a temporary file renamed), when the stack has monitoring on. The stack's own
Prometheus then scrapes it with the head's other node metrics and its rules
(SparkVllmDriftNotRepaired, SparkVllmReconcileFailed, SparkVllmReconcileStale) send what needs
a person to Alertmanager, hence to the stack's receivers. No pushgateway, no port of its own. A
copy stays on the control machine ($SPARK_VLLM_HOME/reconcile/<stack>.prom, for a node exporter
there and for `cat`). A head the run cannot reach keeps the previous file: its timestamp ages
and SparkVllmReconcileStale fires after three intervals.

Metrics (text format: https://prometheus.io/docs/instrumenting/exposition_formats/):
`spark_vllm_reconcile_result{result}` 1 for the run's result, 0 for the others;
`spark_vllm_reconcile_last_run_timestamp_seconds`, `..._duration_seconds`,
`..._interval_seconds` (how often it runs: the stale rule's measure),
`..._changes{class}` the changes the preview found per repair class (`unrepaired`: in none),
`..._last_repair_timestamp_seconds` (the last run that repaired, kept across runs).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = ("clean", "repaired", "refused", "failed", "skipped")
PREFIX = "spark_vllm_reconcile"
FILE = "reconcile.prom"
_LABEL = re.compile(r"[^\x20-\x7e]|[\"\\]")


@dataclass
class RunResult:
    """One run: `result` one of RESULTS; `saw` what the preview found (by repair class, and the
    changes in none); `did` what it did; `why` why it did not apply (refused, failed, skipped)."""

    stack: str
    result: str
    started: float
    seconds: float = 0.0
    saw: dict[str, list[str]] = field(default_factory=dict)  # class -> ["<name> <op>", ...]
    unrepaired: list[str] = field(default_factory=list)
    did: list[str] = field(default_factory=list)
    why: str = ""
    notes: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # preview, up: seconds

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"not a reconcile result: {self.result!r}")

    def line(self) -> str:
        """One line: when, the stack, the result, what it saw, what it did, how long."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started))
        saw = "; ".join(f"{cls}: {', '.join(items)}" for cls, items in self.saw.items())
        if self.unrepaired:
            saw = "; ".join(filter(None, [saw, "not repaired: " + ", ".join(self.unrepaired)]))
        parts = [f"{when} reconcile {self.stack}: {self.result}",
                 f"saw {saw or 'no change'}"]
        if self.did:
            parts.append(f"did {', '.join(self.did)}")
        if self.why:
            parts.append(f"why {self.why}")
        timing = f"in {self.seconds:.1f} s"
        if self.phases:
            timing += " (" + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()) + ")"
        parts.append(timing)
        parts += [f"note {n}" for n in self.notes]
        return " | ".join(_oneline(p) for p in parts)

    def as_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "result": self.result, "started": self.started,
                "seconds": round(self.seconds, 3), "saw": self.saw,
                "unrepaired": self.unrepaired, "did": self.did, "why": self.why,
                "notes": self.notes, "phases": {k: round(v, 3) for k, v in self.phases.items()}}


def _oneline(text: str) -> str:
    return " ".join(text.split())


def _label_value(value: str) -> str:
    return _LABEL.sub("_", value)[:100]


def metrics_text(r: RunResult, interval: float, last_repair: float | None) -> str:
    """The run as Prometheus's text format (what the head's exporter serves)."""
    lines = [
        f"# HELP {PREFIX}_result The last spark-vllm reconcile run's result (1), the others 0.",
        f"# TYPE {PREFIX}_result gauge",
        *(f'{PREFIX}_result{{result="{x}"}} {1 if x == r.result else 0}' for x in RESULTS),
        f"# HELP {PREFIX}_last_run_timestamp_seconds When the last run started (Unix time).",
        f"# TYPE {PREFIX}_last_run_timestamp_seconds gauge",
        f"{PREFIX}_last_run_timestamp_seconds {r.started:.3f}",
        f"# HELP {PREFIX}_duration_seconds How long the last run took.",
        f"# TYPE {PREFIX}_duration_seconds gauge",
        f"{PREFIX}_duration_seconds {r.seconds:.3f}",
        f"# HELP {PREFIX}_interval_seconds How often the reconcile runs.",
        f"# TYPE {PREFIX}_interval_seconds gauge",
        f"{PREFIX}_interval_seconds {interval:.0f}",
        f"# HELP {PREFIX}_changes The changes the last run's preview found, per repair class "
        "(unrepaired: in none).",
        f"# TYPE {PREFIX}_changes gauge",
    ]
    counts = {cls: len(items) for cls, items in r.saw.items()}
    counts["unrepaired"] = len(r.unrepaired)
    lines += [f'{PREFIX}_changes{{class="{_label_value(c)}"}} {n}'
              for c, n in sorted(counts.items())]
    if last_repair is not None:
        lines += [f"# HELP {PREFIX}_last_repair_timestamp_seconds When a run last repaired "
                  "drift (Unix time).",
                  f"# TYPE {PREFIX}_last_repair_timestamp_seconds gauge",
                  f"{PREFIX}_last_repair_timestamp_seconds {last_repair:.3f}"]
    return "\n".join(lines) + "\n"


def last_repair_of(text: str) -> float | None:
    """The last repair's time a previous metrics file recorded, or None."""
    m = re.search(rf"^{PREFIX}_last_repair_timestamp_seconds ([0-9.]+)$", text, re.M)
    return float(m.group(1)) if m else None


def write_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file renamed over it (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def head_script(folder: str, text: str) -> str:
    """The script the head runs (bash -s, over the stack's ssh): the metrics into `folder`
    (hostscripts/monitoring.textfile_dir), through a temporary file renamed over
    reconcile.prom; nothing secret is in it."""
    from hostscripts.common import q

    tmp = f"{folder}/.{FILE}.tmp"
    return "\n".join([
        "set -eu",
        "umask 022",
        f"mkdir -p {q(folder)}",
        f"printf '%s' {q(text)} > {q(tmp)}",
        f"mv {q(tmp)} {q(folder + '/' + FILE)}",
        "echo written",
    ]) + "\n"


def record(r: RunResult) -> str:
    """The run as one JSON line."""
    return json.dumps(r.as_json(), sort_keys=True)
