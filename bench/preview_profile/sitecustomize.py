"""`make bench` only (bench/preview_profile.py): profile the Pulumi program's process.

On PYTHONPATH of one bench preview, with SPARK_VLLM_BENCH_PROFILE=<path>: the process that runs
the program (the Python language host's `pulumi-language-python-exec`) is profiled with cProfile
from its start to its exit, and the stats are written to <path>.<pid> (with the process's wall
time in <path>.<pid>.wall). Any other Python process started with this PYTHONPATH (pip, the
policy pack) is left alone. Never on the program's own path."""

import os
import sys

_OUT = os.environ.get("SPARK_VLLM_BENCH_PROFILE")
if _OUT and sys.argv and sys.argv[0].endswith("pulumi-language-python-exec"):
    import atexit
    import cProfile
    import time

    _start = time.monotonic()
    _profile = cProfile.Profile()
    _profile.enable()

    def _dump() -> None:
        _profile.disable()
        _profile.dump_stats(f"{_OUT}.{os.getpid()}")
        with open(f"{_OUT}.{os.getpid()}.wall", "w") as f:
            f.write(f"{time.monotonic() - _start:.3f}\n")

    atexit.register(_dump)
