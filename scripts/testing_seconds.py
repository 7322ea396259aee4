#!/usr/bin/env python3
"""Fill the seconds column of docs/testing.md from the JUnit XML reports of a test run.

    scripts/testing_seconds.py [REPORT_DIR ...] [--doc docs/testing.md] [--dry-run]

REPORT_DIR is a folder of JUnit XML files as scripts/run_tests.py writes them
($SPARK_VLLM_CACHE/test-reports/<run>/<tier>.xml; default: the newest run folder there that holds
any). Given several folders, a later folder's time wins for a test two of them hold (a `make
test` run, then a `make test-all` run for the long tail).

Every table of the doc with a `test` and a `seconds` column is filled. A row's test column names
its tests in backticks: `tests/x/test_y.py::test_z` (a test; a parametrized test is the sum of its
cases), `tests/x/test_y.py` (a module: the sum of its tests) or `tests/x/` (a folder: the sum). A
row whose every named test is in the reports gets the sum of their JUnit times (setup + call +
teardown, as pytest reports them); any other row is left untouched and listed at the end, with
the names that matched nothing. Tests in the reports that no row names are listed too.

Stdlib only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SPARK_VLLM_CACHE", Path.home() / ".cache" / "spark-vllm"))
REF = re.compile(r"`(tests/[^`\s]*)`")


def newest_run() -> Path | None:
    runs = sorted(p for p in (CACHE / "test-reports").glob("*") if any(p.glob("*.xml")))
    return runs[-1] if runs else None


def read_reports(folders: list[Path]) -> dict[tuple[str, str], tuple[float, str]]:
    """(classname, name) -> (seconds, outcome) of every testcase in the folders' XML files."""
    cases: dict[tuple[str, str], tuple[float, str]] = {}
    for folder in folders:
        for xml in sorted(folder.glob("*.xml")):
            for case in ET.parse(xml).getroot().iter("testcase"):
                outcome = "passed"
                for child in case:
                    if child.tag in ("failure", "error", "skipped"):
                        outcome = child.tag
                key = (case.get("classname", ""), case.get("name", ""))
                cases[key] = (float(case.get("time") or 0.0), outcome)
    return cases


def matches(ref: str, classname: str, name: str) -> bool:
    """Whether a testcase (pytest's JUnit classname and name) is one the reference names."""
    path, _, rest = ref.partition("::")
    if path.endswith("/"):  # a folder
        return classname.startswith(path.rstrip("/").replace("/", ".") + ".")
    module = re.sub(r"\.py$", "", path).replace("/", ".")
    if not rest:  # a module: its functions and its classes' methods
        return classname == module or classname.startswith(module + ".")
    *classes, test = rest.split("::")
    if classname != ".".join([module, *classes]):
        return False
    return name == test or ("[" not in test and name.startswith(test + "["))


def split_row(line: str) -> list[str]:
    """The cells of a Markdown table row, raw (spaces kept); `|` inside backticks or escaped
    as `\\|` does not split."""
    cells, cell, code, i = [], "", False, 0
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            cell += body[i:i + 2]
            i += 2
            continue
        if c == "`":
            code = not code
        if c == "|" and not code:
            cells.append(cell)
            cell = ""
        else:
            cell += c
        i += 1
    if cell.strip():
        cells.append(cell)
    return cells


def fmt(seconds: float) -> str:
    return f"{seconds:.0f}" if seconds >= 100 else f"{seconds:.1f}"


def fill(text: str, cases: dict) -> tuple[str, int, list[str], list[str], set]:
    """-> (new text, rows filled, rows left with why, rows naming no test, testcases used)."""
    lines = text.split("\n")
    filled, left, unnamed, used = 0, [], [], set()
    cols: tuple[int, int] | None = None
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            cols = None
            continue
        cells = split_row(line)
        names = [c.strip().lower() for c in cells]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if cols is None:
            if re.match(r"^\s*\|?\s*:?-{3,}", nxt) and "test" in names and "seconds" in names:
                cols = (names.index("test"), names.index("seconds"))
            continue
        if set(line.replace("|", "").strip()) <= set("-: "):
            continue  # the separator row
        t, s = cols
        if len(cells) <= max(t, s):
            continue
        refs = REF.findall(cells[t])
        if not refs:
            unnamed.append(f"line {i + 1}: {cells[t].strip()[:70]}")
            continue
        total, missing = 0.0, []
        for ref in refs:
            hit = [k for k in cases if matches(ref, *k)]
            if not hit:
                missing.append(ref)
            total += sum(cases[k][0] for k in hit)
            used.update(hit)
        if missing:
            left.append(f"line {i + 1}: no testcase for {', '.join(missing)}")
            continue
        cells[s] = f" {fmt(total)} "
        lines[i] = "|" + "|".join(cells) + "|"
        filled += 1
    return "\n".join(lines), filled, left, unnamed, used


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="*", type=Path, help="JUnit XML folder(s); default: newest run")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "testing.md")
    p.add_argument("--dry-run", action="store_true", help="report only, write nothing")
    a = p.parse_args(argv)
    folders = a.reports or [f for f in [newest_run()] if f is not None]
    if not folders:
        print(f"no JUnit reports under {CACHE / 'test-reports'}", file=sys.stderr)
        return 2
    cases = read_reports(folders)
    if not cases:
        print(f"no testcase in {', '.join(map(str, folders))}", file=sys.stderr)
        return 2
    text, filled, left, unnamed, used = fill(a.doc.read_text(), cases)
    if not a.dry_run:
        a.doc.write_text(text)
    print(f"{a.doc}: {'would fill' if a.dry_run else 'filled'} {filled} row(s) from "
          f"{len(cases)} testcase(s) in {', '.join(map(str, folders))}")
    if left:
        print(f"\n{len(left)} row(s) left as they were (a named test is not in the reports):")
        print("\n".join(f"  {x}" for x in left))
    if unnamed:
        print(f"\n{len(unnamed)} row(s) name no test:")
        print("\n".join(f"  {x}" for x in unnamed))
    not_ok = sorted(f"{c}::{n} ({o})" for (c, n), (_, o) in cases.items()
                    if (c, n) in used and o != "passed")
    if not_ok:
        print(f"\n{len(not_ok)} counted testcase(s) did not pass:")
        print("\n".join(f"  {x}" for x in not_ok))
    unused = sorted(f"{c}::{n}" for (c, n) in cases if (c, n) not in used)
    if unused:
        print(f"\n{len(unused)} testcase(s) in the reports that no row names:")
        print("\n".join(f"  {x}" for x in unused))
    return 0


if __name__ == "__main__":
    sys.exit(main())
