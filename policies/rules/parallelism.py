"""3. parallelism-matches-gpus: tensorParallelSize x pipelineParallelSize equals the GPUs in the
Ray cluster."""
from __future__ import annotations

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from contract.props import VllmServerProps

from ._common import VLLM_SERVER, Report, num, props_of


def validate_parallelism(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    props = props_of(args, VllmServerProps)
    tp = num(props["tensorParallelSize"])
    pp = num(props.get("pipelineParallelSize", 1))
    gpus = num(props["clusterGpus"])
    if tp is None or pp is None or gpus is None:
        return
    if tp * pp != gpus:
        report(f"tensorParallelSize {tp:g} x pipelineParallelSize {pp:g} = {tp * pp:g} but the Ray "
               f"cluster has {gpus:g} GPUs; vLLM would wait for missing GPUs or leave GPUs idle",
               None)


parallelism_matches_gpus = ResourceValidationPolicy(
    name="parallelism-matches-gpus",
    description="tensorParallelSize x pipelineParallelSize equals the GPUs in the Ray cluster.",
    validate=validate_parallelism,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set vllm.tensorParallelSize x vllm.pipelineParallelSize to the number of "
                      "nodes (one GB10 GPU each), or add/remove nodes.",
)
