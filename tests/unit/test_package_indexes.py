"""The repository's own indexes stay true: the module list in config/__init__.py and
hostscripts/__init__.py names every module of its package and nothing that is gone, and every
test file a .py or .md file names (`tests/...py`) exists."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INDEXED = ("config", "hostscripts")
# an index line: four spaces, a module (`name.py`) or a folder (`name/`), then its description
ENTRY = re.compile(r"^ {4}([A-Za-z0-9_]+\.py|[A-Za-z0-9_]+/)(?: |$)", re.M)
# a test file named in text (not `tests/...py`, which names them all); not one at a commit (`2b97ce0:tests/...`, as it was then) or in a
# URL (`.../blob/main/tests/...`)
TEST_PATH = re.compile(r"(?<![\w/.:-])tests/[A-Za-z0-9_][A-Za-z0-9_/.-]*?\.py\b")
EXAMPLES = {"tests/x/test_y.py"}  # scripts/testing_seconds.py's example of the form
SKIP_DIRS = {".git", "venv", ".venv", "node_modules", "__pycache__"}
HISTORY = {"CHANGELOG.md"}  # names paths as they were when each entry was written


def listed(doc: str) -> set[str]:
    return set(ENTRY.findall(doc))


def present(package: Path) -> set[str]:
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    folders = {p.name + "/" for p in package.iterdir()
               if p.is_dir() and p.name != "__pycache__" and any(p.iterdir())}
    return modules | folders


@pytest.mark.parametrize("package", INDEXED)
def test_the_package_index_lists_every_module_and_nothing_gone(package):
    pkg = ROOT / package
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    names = listed(doc)
    modules = {n for n in present(pkg) if n.endswith(".py")}
    assert sorted(modules - names) == [], f"{package}/__init__.py does not list these modules"
    assert sorted(names - present(pkg)) == [], f"{package}/__init__.py lists what is not there"


def test_the_index_reader_sees_modules_and_folders_only():
    doc = ("Intro naming paths.py in prose.\n\n    a.py        one\n    b_c.py\n"
           "    data/       files\n        d.py    indented deeper: a continuation\n")
    assert listed(doc) == {"a.py", "b_c.py", "data/"}


def text_files() -> list[Path]:
    out = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        out += [Path(top) / f for f in files
                if f.endswith((".py", ".md")) and f not in HISTORY]
    return [p for p in out if p != Path(__file__).resolve()]  # this file's examples


def named_test_paths(text: str) -> set[str]:
    return {m for m in TEST_PATH.findall(text) if m not in EXAMPLES}


def test_every_test_file_named_in_the_repository_exists():
    missing = []
    for path in text_files():
        for name in named_test_paths(path.read_text(errors="replace")):
            if not (ROOT / name).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []


def test_the_path_reader_skips_commits_urls_and_examples():
    text = ("see tests/unit/a/test_b.py and `tests/e2e/test_c.py::test_d`; was "
            "2b97ce0:tests/promote/test_old.py; https://github.com/o/r/blob/main/tests/t.py; "
            "form tests/x/test_y.py, or any: tests/...py")
    assert named_test_paths(text) == {"tests/unit/a/test_b.py", "tests/e2e/test_c.py"}
