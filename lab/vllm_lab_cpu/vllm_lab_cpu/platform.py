"""LAB ONLY: vLLM's CPU platform with a Ray device key, the lab's communicator and forked
engine processes."""

import os

import torch
from vllm.platforms.cpu import CpuPlatform


def _request_amx_permission() -> None:
    """arch_prctl(ARCH_REQ_XCOMP_PERM) for AMX tiles, once per process (a no-op without AMX)."""
    try:
        if torch.cpu._is_amx_tile_supported():
            torch.cpu._init_amx()
    except (AttributeError, RuntimeError):  # not x86, or a torch without these helpers
        pass


_request_amx_permission()  # every vLLM process imports this module when it resolves the platform


class LabCpuPlatform(CpuPlatform):
    # vLLM requests one unit of this Ray resource per worker (CpuPlatform has none and refuses
    # Ray). Every lab node runs `ray start --num-gpus 1`, like a Spark with its one GB10.
    ray_device_key: str = "GPU"
    # vLLM's helper functions decorated with torch.compile (the vocab-parallel embedding's mask
    # at TP > 1, ...) compile with this backend on their first call: inductor made the lab's
    # first request after every start take ~4 s instead of ~0.5 (C++ codegen or a cache load
    # for a few pointwise ops of a tiny model). "eager" runs them as they are. The model's own
    # compilation (vllm.enforceEager false: `make bench`'s compile-cache rows) is unaffected.
    simple_compile_backend: str = "eager"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        if os.environ.get("VLLM_LAB_CPU_COMM", "auto") == "shm":
            return super().get_device_communicator_cls()
        return "vllm_lab_cpu.communicator.LabCpuCommunicator"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:  # type: ignore[no-untyped-def]
        super().check_and_update_config(vllm_config)
        # CpuPlatform sets VLLM_WORKER_MULTIPROC_METHOD=spawn here, so every process vLLM starts
        # (the engine core, mp workers) imports vLLM and torch again: 6-10 s each on the lab's
        # two shared cores, the largest part of a lab vLLM start (measured: TP 1 to /health
        # 32.4 s spawned, 14.6 s forked). The lab forks them from the process that has them
        # imported. VLLM_LAB_CPU_START=spawn restores the stock behaviour (diagnosis only).
        if os.environ.get("VLLM_LAB_CPU_START", "fork") == "fork":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
