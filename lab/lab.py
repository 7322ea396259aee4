#!/usr/bin/env python3
"""Entry script: `python3 lab/lab.py <verb>` from any directory (the CLI is lab/cli.py)."""

import os
import sys

# This file sits inside the package it starts: its own folder must not shadow the package `lab`.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
sys.path.insert(0, os.path.dirname(_here))

from lab.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
