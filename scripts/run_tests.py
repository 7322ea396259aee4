#!/usr/bin/env python3
"""`make test` / `make test-all`: every tier of the suite as its own pytest process, measured.

    scripts/run_tests.py [--all] [--tiers fast,engine,...]

A tier is a separate pytest process: the unit tier installs Pulumi's global mock monitor, which
the engine tiers must not inherit. Every tier runs with `--durations=15` and writes a JUnit XML
report outside the checkout ($SPARK_VLLM_CACHE/test-reports/<run>/); at the end (also after a
failure) the run prints each tier's wall time and result and the 15 slowest tests of the run.

Strict, as CI needs it: SPARK_VLLM_STRICT_SKIPS=1 makes any skipped test fail its tier
(tests/conftest.py), and a run that needs the lab refuses at once when not run as root instead
of skipping whole tiers. A run that needs the lab holds the lab's session lock from its first
tier to its last (lab/layout.py SESSION_LOCK), so a `make lab-down` or `make demo` from another
shell waits for the whole run, not only for one tier. `--all` adds the long tail (tests marked
`long`, docs/testing.md) to the lab and e2e tiers.

Stdlib only; run it with the project's virtualenv python (the Makefile does).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.layout import SESSION_ENV, SESSION_LOCK  # noqa: E402  (stdlib only)

CACHE = Path(os.environ.get("SPARK_VLLM_CACHE", Path.home() / ".cache" / "spark-vllm"))


@dataclass
class Tier:
    name: str
    paths: list[str]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    root: bool = False  # needs root (the lab)
    long_tail: bool = False  # takes `--all` into account (marker `long`)


# In the order they run. The lab tier's down/up test (test_zz_down) runs last, on its own: it
# wipes the nodes' HF and compile caches, which the e2e tier reuses from the lab tier.
TIERS = [
    # unit + policies: mocks only, no hosts; two workers (pytest-xdist) on this 2-core machine,
    # each module's tests on one worker in file order (--dist loadfile): the fuzz modules count
    # their cases in the process and check the count in their last test
    Tier("fast", ["tests/unit", "tests/policies"], ["-n", "2", "--dist", "loadfile"]),
    Tier("engine", ["tests/engine"]),
    # promotion through the engine with a fake program (the lab round trip is in tests/e2e)
    Tier("promote", ["tests/promote"]),
    Tier("lab", ["tests/lab"], ["--deselect", "tests/lab/test_zz_down.py"], {"LAB_AUTO": "1"},
         root=True, long_tail=True),
    Tier("e2e", ["tests/e2e"], root=True, long_tail=True),
    Tier("lab-down-up", ["tests/lab/test_zz_down.py"], [], {"LAB_AUTO": "1"}, root=True),
]
DEFAULT = [t.name for t in TIERS]


@dataclass
class Result:
    tier: str
    code: int
    seconds: float
    counts: dict[str, int]
    tests: list[tuple[float, str]]


def read_junit(path: Path) -> tuple[dict[str, int], list[tuple[float, str]]]:
    """(counts by outcome, [(seconds, test id)]) from a pytest JUnit XML report."""
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    tests: list[tuple[float, str]] = []
    if not path.exists():
        return counts, tests
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        counts[outcome] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tests.append((float(case.get("time") or 0.0), name))
    return counts, tests


def run_tier(tier: Tier, reports: Path, long_tail: bool) -> Result:
    junit = reports / f"{tier.name}.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=15",
            f"--junitxml={junit}", "-o", "junit_family=xunit2", *tier.args, *tier.paths]
    if tier.long_tail and not long_tail:
        argv[4:4] = ["-m", "not long"]
    env = {**os.environ, "SPARK_VLLM_STRICT_SKIPS": "1", **tier.env}
    print(f"\n===== tier {tier.name}: {' '.join(argv[1:])}", flush=True)
    t0 = time.monotonic()
    code = subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode
    secs = time.monotonic() - t0
    counts, tests = read_junit(junit)
    return Result(tier.name, code, secs, counts, tests)


def summary(results: list[Result], total: float) -> str:
    lines = ["", "===== spark-vllm test run: tiers", f"{'tier':<12} {'result':<7} {'time':>9}  "
             "passed failed error skipped"]
    for r in results:
        c = r.counts
        lines.append(f"{r.tier:<12} {'ok' if r.code == 0 else f'exit {r.code}':<7} "
                     f"{_mmss(r.seconds):>9}  {c['passed']:>6} {c['failed']:>6} {c['error']:>5} "
                     f"{c['skipped']:>7}")
    lines.append(f"{'total':<12} {'':<7} {_mmss(total):>9}")
    slow = sorted(((s, f"{r.tier}: {name}") for r in results for s, name in r.tests),
                  reverse=True)[:15]
    if slow:
        lines += ["", "===== the 15 slowest tests of the run (setup + call + teardown)"]
        lines += [f"{_mmss(s):>9}  {name}" for s, name in slow]
    return "\n".join(lines)


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--all", action="store_true", help="the long tail too (make test-all)")
    p.add_argument("--tiers", default=",".join(DEFAULT),
                   help=f"comma-separated, in run order (default: {','.join(DEFAULT)})")
    a = p.parse_args(argv)
    names = [n for n in a.tiers.split(",") if n]
    unknown = sorted(set(names) - set(DEFAULT))
    if unknown:
        p.error(f"unknown tier(s) {', '.join(unknown)}; known: {', '.join(DEFAULT)}")
    chosen = [t for t in TIERS if t.name in names]
    needs_root = [t.name for t in chosen if t.root]
    if needs_root and os.geteuid() != 0:
        print(f"make test: the tiers {', '.join(needs_root)} drive the lab (network namespaces, "
              "a dockerd per simulated Spark), which needs root; run it as root (e.g. "
              "`sudo make test`). Nothing was run.", file=sys.stderr)
        return 2
    if needs_root:
        lock = open(SESSION_LOCK, "a")  # noqa: SIM115  (held until this process exits)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the lab: another session (make demo, a test run) holds "
                  f"{SESSION_LOCK}", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        os.environ[SESSION_ENV] = str(os.getpid())  # the tiers' lab users are this session's
    reports = CACHE / "test-reports" / time.strftime("%Y%m%d-%H%M%S")
    reports.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    t0 = time.monotonic()
    for tier in chosen:
        results.append(run_tier(tier, reports, a.all))
        if results[-1].code != 0:
            print(f"\ntier {tier.name} failed (exit {results[-1].code}); the later tiers "
                  f"({', '.join(t.name for t in chosen[len(results):]) or 'none'}) did not run",
                  flush=True)
            break
    print(summary(results, time.monotonic() - t0))
    print(f"JUnit reports: {reports}")
    failed = [r for r in results if r.code != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
