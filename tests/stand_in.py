"""Stand-in programs the tests put first on PATH (a fake `docker`, say), written so that they
run from any checkout: the README invites cloning into a path with a space, and a shebang line
cannot hold one (`#!/tmp/my clone/venv/bin/python` runs `/tmp/my` with `clone/venv/bin/python`
as its argument; the shell then falls through to the next `docker` on PATH, the real one).

A Python stand-in is therefore two files: the program (`<name>.py`, beside the stand-in) and
`<name>` itself, a /bin/sh script that execs the interpreter on it with every argument, the
interpreter's path quoted for the shell."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def python_stand_in(path: Path, source: str, interpreter: str = sys.executable) -> Path:
    """Write the Python program `source` as the executable `path` (run by `interpreter`, this
    test run's own Python by default) and return `path`."""
    program = path.with_name(path.name + ".py")
    program.write_text(source)
    path.write_text(
        f'#!/bin/sh\nexec {shlex.quote(interpreter)} {shlex.quote(str(program))} "$@"\n')
    path.chmod(0o755)
    return path
