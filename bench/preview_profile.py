"""Where a no-op preview's time goes (`make bench`, section "changes", the no-op rows).

One preview of the converged stack runs with bench/preview_profile/ on PYTHONPATH: its
sitecustomize profiles the program's process (cProfile, from the interpreter's start to its
exit). `phases` reads those stats into the figures docs/benchmarks.md shows, each the
cumulative wall time of one function of the program's main thread:

- imports: every module import of the main thread (`importlib._bootstrap._find_and_load`,
  outermost calls only: what the program, the SDK and the providers' SDKs cost to load);
- config: `config.load_config` (reading and validating the stack's config; its imports
  counted above too);
- waiting for the look: the main thread blocked on recon's and the hub's futures after the
  components' modules loaded (`Future.result`), i.e. what the nodes' survey and the hub cost
  beyond the imports they overlap with;
- the graph: `components.stack.build_stack` (registering every resource; the SDK's RPCs run
  after it, below);
- the SDK's debug log RPCs: `pulumi.log.debug`, one blocking call to the engine per
  registration step (the engine drops them unless run with -v);
- after the program: the process's wall time minus the program's (`runpy`): the SDK waiting for
  the engine to register the resources and resolve their outputs.

The rest of the CLI's wall time (the process's start, the language host, the plugins, the
engine's diff) is the preview's total minus the process's wall time.
"""

from __future__ import annotations

import glob
import os
import pstats
from pathlib import Path

SITE = Path(__file__).resolve().parent / "preview_profile"
ENV = "SPARK_VLLM_BENCH_PROFILE"

# (figure, path suffix of the function's file, function name)
FUNCTIONS = (
    ("imports_s", "<frozen importlib._bootstrap>", "_find_and_load"),
    ("config_s", "config/load.py", "load_config"),
    ("waiting_for_look_s", "concurrent/futures/_base.py", "result"),
    ("graph_s", "components/stack.py", "build_stack"),
    ("sdk_debug_logs_s", "pulumi/log.py", "debug"),
    ("program_s", "<frozen runpy>", "_run_code"),
)


def env(out: Path) -> dict[str, str]:
    """The environment of the profiled preview: its stats go to `<out>.<pid>`."""
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {ENV: str(out), "PYTHONPATH": path}


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """The cumulative seconds of the function `name` in a file ending in `suffix` (summed when
    several match: the same name in two such files)."""
    total = 0.0
    for (filename, _line, func), row in stats.stats.items():  # type: ignore[attr-defined]
        if func == name and filename.endswith(suffix):
            total += row[3]
    return total


def phases(out: Path) -> dict[str, float]:
    """The figures of the profiled preview whose stats are at `<out>.<pid>` (one process)."""
    found = sorted(p for p in glob.glob(f"{out}.*") if not p.endswith(".wall"))
    if len(found) != 1:
        raise RuntimeError(f"expected the stats of one profiled program at {out}.<pid>, found "
                           f"{found or 'none'}: did the language host run the program with "
                           f"{SITE} on PYTHONPATH?")
    stats = pstats.Stats(found[0])
    figures = {key: round(cumulative(stats, suffix, name), 3)
               for key, suffix, name in FUNCTIONS}
    wall = float(Path(found[0] + ".wall").read_text())
    figures["process_s"] = round(wall, 3)
    figures["after_program_s"] = round(wall - figures["program_s"], 3)
    return figures
