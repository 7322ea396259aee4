"""LAB ONLY: vLLM's CPU platform with a Ray device key and the lab's communicator."""

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

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        if os.environ.get("VLLM_LAB_CPU_COMM", "auto") == "shm":
            return super().get_device_communicator_cls()
        return "vllm_lab_cpu.communicator.LabCpuCommunicator"
