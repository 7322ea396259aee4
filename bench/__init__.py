"""The benchmarks (Makefile bench, bench-serve): scripts that drive the program and the lab; nothing
imports them (pyproject.toml [tool.importlinter])."""
