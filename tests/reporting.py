"""What the tests measure and report, beside pass/fail: recovery times, wall times of an `up`.

A test calls `record("what", seconds)`; the session prints every record at its end in a section
of its own (tests/conftest.py, pytest_terminal_summary), so a measured figure is a report of the
run, never a "test" that only prints. Records are per pytest process (one tier).
"""

from __future__ import annotations

_RECORDS: list[str] = []


def record(what: str, seconds: float, detail: str = "") -> None:
    """Keep one measured time for the end-of-run report (and print it where it happened)."""
    line = f"{seconds:8.1f} s  {what}" + (f"  ({detail})" if detail else "")
    _RECORDS.append(line)
    print(f"[time] {what}: {seconds:.1f} s" + (f" ({detail})" if detail else ""), flush=True)


def collected() -> list[str]:
    return list(_RECORDS)
