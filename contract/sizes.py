"""Sizes and the memory reserves both sides use: preflight and the memory estimate (the program)
and memory-fit's defaults (the pack: policies/rules/_common.py DEFAULTS)."""
from __future__ import annotations

from typing import Final

KIB: Final = 1024
MIB: Final = 1024**2
GIB: Final = 1024**3

# What preflight (preflight.osReserveBytes) leaves the OS of a node's unified memory by default,
# and memory-fit's default osReserveBytes (policies/config.prod.json leaves it to this default).
OS_RESERVE_BYTES: Final = 8 * GIB
# vLLM's runtime beside its weights and KV cache on a rank (CUDA context, activations, CUDA
# graphs): inspection/memory_fit.py's overhead term and memory-fit's runtimeOverheadBytes.
RUNTIME_OVERHEAD_BYTES: Final = 6 * GIB
