"""The spark-vllm policy pack. Only builds the PolicyPack: its constructor starts the analyzer
gRPC server and blocks, so all logic lives in the rules package (importable, unit-tested)."""
from pulumi_policy import EnforcementLevel, PolicyPack

from rules import POLICIES

PolicyPack(
    name="spark-vllm",
    enforcement_level=EnforcementLevel.MANDATORY,
    description="Reviews spark-vllm previews: memory fit, one image, parallelism, NCCL/fabric, "
                "container privileges, Ray exposure, secrets, prod pinning.",
    policies=POLICIES,
)
