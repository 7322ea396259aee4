"""The tests' stand-in programs run from a checkout whose path has a space (the README invites
one). A shebang cannot hold a space: a stand-in written as `#!<this venv's python>` from such a
checkout is run as `/tmp/my` and the shell falls through to the real program on PATH (seen: 12
fast-tier tests reached the real `docker`). tests/stand_in.py writes them through /bin/sh."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.stand_in import python_stand_in

PROGRAM = "import sys\nprint('stand-in', sys.argv[1:])\n"


def test_a_python_stand_in_runs_from_a_folder_and_an_interpreter_with_spaces(tmp_path):
    """The interpreter as a checkout with a space would have it (a link to this Python in
    `my clone/venv/bin`), the stand-in in a folder with a space, found on PATH by name."""
    venv_bin = tmp_path / "my clone" / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").symlink_to(sys.executable)
    bin_dir = tmp_path / "stand ins"
    bin_dir.mkdir()
    python_stand_in(bin_dir / "docker", PROGRAM, interpreter=str(venv_bin / "python"))
    done = subprocess.run(["docker", "ps", "a b"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stand-in ['ps', 'a b']\n"


# A shebang line whose interpreter is filled in by code: f"#!{...}" or "#!" + ... .
FILLED_SHEBANG = re.compile(r"""['"]#!(\{|['"]\s*\+)""")


def test_no_test_or_lab_code_writes_a_shebang_from_a_variable():
    """Every script the tests, the lab and the bench write names a fixed interpreter
    (/bin/sh, /bin/bash) or goes through tests/stand_in.py."""
    offenders = []
    for folder in ("tests", "lab", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "fixtures" in path.parts or path == Path(__file__):  # this file shows the form
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if FILLED_SHEBANG.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_lint_finds_the_shebang_it_is_for(tmp_path):
    """The pattern above matches the forms that broke (so the lint can fail)."""
    # the form that broke, assembled here so that no line of the tree holds it whole
    broken = 'docker.write_text(f"#!' + '{sys.executable}\\n{FAKE}")'
    assert FILLED_SHEBANG.search(broken)
    assert FILLED_SHEBANG.search("x = '#!' + sys.executable")
    assert not FILLED_SHEBANG.search('write_text("#!/bin/sh\\n" + body)')

