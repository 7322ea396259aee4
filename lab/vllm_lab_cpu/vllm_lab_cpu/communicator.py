"""LAB ONLY: vLLM's CPU communicator, with shared memory only where the ranks really share it."""

import os
import uuid

import torch.distributed as dist
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
from vllm.logger import init_logger

logger = init_logger("vllm.lab_cpu.communicator")  # under "vllm": vLLM's log handler prints it


class LabCpuCommunicator(CpuCommunicator):
    """CpuCommunicator whose transport decision also checks that /dev/shm is really shared.

    CpuCommunicator.__init__ calls `_all_group_ranks_share_shm_group_name()` (a collective, on
    every rank of a tp*/pp* group) to decide between its /dev/shm transport and
    torch.distributed. The stock check compares names only; here every rank also drops a probe
    file in /dev/shm and reports whether it sees everyone's probe, and the votes are all-gathered,
    so all ranks decide alike. On separate hosts the answer is torch.distributed on the group's
    gloo device group: every all_reduce / all_gather / gather (and MoE's all2all) is TCP between
    the ranks' VLLM_HOST_IPs. Everything else is the base class.
    """

    def _all_group_ranks_share_shm_group_name(self) -> bool:
        mode = os.environ.get("VLLM_LAB_CPU_COMM", "auto")
        same_name = super()._all_group_ranks_share_shm_group_name()
        shared = self._ranks_share_dev_shm()  # collective: every rank must take part
        use_shm = mode != "gloo" and same_name and shared
        logger.info("LabCpuCommunicator group=%s ranks=%s mode=%s shared_dev_shm=%s -> %s",
                    self.unique_name, self.ranks, mode, shared,
                    "shm" if use_shm else "torch.distributed(gloo)")
        return use_shm

    def _ranks_share_dev_shm(self) -> bool:
        name = f"vllm-lab-probe-{uuid.uuid4().hex}"
        path = os.path.join("/dev/shm", name)
        try:
            with open(path, "w"):
                pass
        except OSError:
            name = None
        names = [None] * self.world_size
        dist.all_gather_object(names, name, group=self.device_group)
        sees_all = all(n is not None and os.path.exists(os.path.join("/dev/shm", n))
                       for n in names)
        votes = [None] * self.world_size
        dist.all_gather_object(votes, sees_all, group=self.device_group)
        if name is not None:
            os.unlink(path)
        return all(votes)
