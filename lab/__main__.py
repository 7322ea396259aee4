"""`python3 -m lab <verb>` from the repository root: the same CLI as `python3 lab/lab.py <verb>`."""

from lab.cli import main

main()
