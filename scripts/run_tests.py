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
import threading
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
    # started at the run's beginning beside the others (its output to <reports>/<name>.log);
    # `nice` > 0 gives it only the CPU the foreground tiers leave idle
    background: bool = False
    nice: int = 0
    after: str | None = None  # a background tier that must have passed before this one starts


# In the order they run. Two cores must carry ~70 minutes of tests in under 55: the engine and
# promote tiers (Pulumi's engine over temporary file backends: no lab, no fixed port) run in the
# background at nice 10 from the start, filling the CPU the lab's e2e cases leave idle while they
# wait (vLLM's health polls, Docker's restart back-off, alert windows); the lab tier runs beside
# the fast tier (mostly waiting on the lab's bring-up) and the e2e tier waits for it. The lab
# tier's down/up test (test_zz_down) runs last, on its own: it wipes the nodes' HF and compile
# caches, which the e2e tier reuses from the lab tier. docs/testing.md: the measured effect.
TIERS = [
    # unit + policies: mocks only, no hosts; two workers (pytest-xdist) on this 2-core machine,
    # each module's tests on one worker in file order (--dist loadfile): the fuzz modules count
    # their cases in the process and check the count in their last test
    Tier("fast", ["tests/unit", "tests/policies"], ["-n", "2", "--dist", "loadfile"]),
    Tier("engine", ["tests/engine"], background=True, nice=10),
    # promotion through the engine with a fake program (the lab round trip is in tests/e2e)
    Tier("promote", ["tests/promote"], background=True, nice=10),
    Tier("lab", ["tests/lab"], ["--deselect", "tests/lab/test_zz_down.py"], {"LAB_AUTO": "1"},
         root=True, long_tail=True, background=True),
    Tier("e2e", ["tests/e2e"], root=True, long_tail=True, after="lab"),
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


def _argv(tier: Tier, junit: Path, long_tail: bool) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=15",
            f"--junitxml={junit}", "-o", "junit_family=xunit2", *tier.args, *tier.paths]
    if tier.long_tail and not long_tail:
        argv[4:4] = ["-m", "not long"]
    return argv


def _env(tier: Tier) -> dict[str, str]:
    return {**os.environ, "SPARK_VLLM_STRICT_SKIPS": "1", **tier.env}


def run_tier(tier: Tier, reports: Path, long_tail: bool) -> Result:
    junit = reports / f"{tier.name}.xml"
    argv = _argv(tier, junit, long_tail)
    print(f"\n===== tier {tier.name}: {' '.join(argv[1:])}", flush=True)
    t0 = time.monotonic()
    code = subprocess.run(argv, cwd=ROOT, env=_env(tier), check=False).returncode
    secs = time.monotonic() - t0
    counts, tests = read_junit(junit)
    return Result(tier.name, code, secs, counts, tests)


@dataclass
class Background:
    """A tier running beside the others; its output goes to <reports>/<name>.log."""

    tier: Tier
    proc: subprocess.Popen[bytes]
    log: Path
    junit: Path
    t0: float
    ended: float | None = None  # when its process exited (a thread waits for it)
    result: Result | None = None

    def __post_init__(self) -> None:
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    @classmethod
    def start(cls, tier: Tier, reports: Path, long_tail: bool) -> Background:
        junit, log = reports / f"{tier.name}.xml", reports / f"{tier.name}.log"
        argv = _argv(tier, junit, long_tail)
        how = f"in the background, nice {tier.nice}" if tier.nice else "in the background"
        print(f"\n===== tier {tier.name} ({how}; output in {log}): {' '.join(argv[1:])}",
              flush=True)
        nice = tier.nice
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=_env(tier), stdout=out,
                                    stderr=subprocess.STDOUT,
                                    preexec_fn=(lambda: os.nice(nice)) if nice else None)
        return cls(tier, proc, log, junit, time.monotonic())

    def wait(self) -> Result:
        """Its result once it has ended (its log's last lines printed, all of them on failure
        up to 200)."""
        if self.result is None:
            self._watcher.join()  # it records the exit's time
            code, ended = self.proc.wait(), self.ended
            assert ended is not None
            secs = ended - self.t0
            counts, tests = read_junit(self.junit)
            self.result = Result(self.tier.name, code, secs, counts, tests)
            lines = self.log.read_text(errors="replace").splitlines()
            shown = lines[-200:] if code else lines[-3:]
            print(f"\n===== tier {self.tier.name} (background) ended: "
                  f"{'ok' if code == 0 else f'exit {code}'} after {_mmss(secs)}; "
                  f"the last {len(shown)} lines of {self.log}:", flush=True)
            print("\n".join(shown), flush=True)
        return self.result


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
    background = {t.name: Background.start(t, reports, a.all) for t in chosen if t.background}
    foreground = [t for t in chosen if not t.background]
    for i, tier in enumerate(foreground):
        if tier.after in background:
            needed = background[tier.after].wait()
            if needed.code != 0:
                print(f"\ntier {needed.tier} failed (exit {needed.code}); the tiers that need it "
                      f"({', '.join(t.name for t in foreground[i:])}) did not run", flush=True)
                break
        results.append(run_tier(tier, reports, a.all))
        if results[-1].code != 0:
            print(f"\ntier {tier.name} failed (exit {results[-1].code}); the later tiers "
                  f"({', '.join(t.name for t in foreground[i + 1:]) or 'none'}) did not run",
                  flush=True)
            break
    results += [b.wait() for b in background.values()]
    results.sort(key=lambda r: [t.name for t in TIERS].index(r.tier))
    print(summary(results, time.monotonic() - t0))
    print(f"JUnit reports: {reports}")
    failed = [r for r in results if r.code != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
