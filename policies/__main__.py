"""The spark-vllm policy pack. Only builds the PolicyPack: its constructor starts the analyzer
gRPC server and blocks, so all logic lives in rules.py (importable, unit-tested)."""
from pulumi_policy import EnforcementLevel, PolicyPack

from rules import (
    enforce_eager_advisory,
    fabric_mtu,
    gpu_memory_utilization_advisory,
    hf_token_secret,
    memory_fit,
    nccl_rdma_interfaces,
    no_privileged_containers,
    parallelism_matches_gpus,
    prod_pinned,
    ray_not_exposed,
    same_image_everywhere,
    vllm_api_key,
)

PolicyPack(
    name="spark-vllm",
    enforcement_level=EnforcementLevel.MANDATORY,
    description="Reviews spark-vllm previews: memory fit, one image, parallelism, NCCL/fabric, "
                "container privileges, Ray exposure, secrets, prod pinning.",
    policies=[
        memory_fit,
        same_image_everywhere,
        parallelism_matches_gpus,
        nccl_rdma_interfaces,
        fabric_mtu,
        no_privileged_containers,
        ray_not_exposed,
        vllm_api_key,
        hf_token_secret,
        prod_pinned,
        gpu_memory_utilization_advisory,
        enforce_eager_advisory,
    ],
)
