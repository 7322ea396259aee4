"""11. gpu-memory-utilization-advisory and 12. enforce-eager-advisory: settings that work but cost
stability or throughput; reported, never blocking."""
from __future__ import annotations

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from ._common import (
    DEFAULTS,
    VLLM_SERVER,
    Report,
    conf,
    elements,
    environment_of,
    flag,
    get,
    num,
    text,
)
from ._schema import ENV_PROP, env_list_prop, schema


def validate_utilization_advisory(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    util = num(get(args.props, "gpuMemoryUtilization"))
    threshold = num(conf(args, "utilizationThreshold")) or 0.85
    if util is None or util <= threshold:
        return
    unified = [text(get(n, "name")) or "?" for n in elements(get(args.props, "nodes"))
               if flag(get(n, "unifiedMemory")) is True]
    if unified:
        report(f"gpuMemoryUtilization {util:.2f} is above {threshold:.2f} on unified-memory nodes "
               f"{', '.join(unified)}: CPU, page cache and the container share that memory", None)


def validate_enforce_eager_advisory(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    if flag(get(args.props, "enforceEager")) is not True:
        return
    env = environment_of(args.props, args)
    if env in set(conf(args, "prodEnvironments") or []):
        report(f"environment '{env}': enforceEager disables CUDA graphs and costs decode "
               f"throughput; use it to debug, not in production", None)


gpu_memory_utilization_advisory = ResourceValidationPolicy(
    name="gpu-memory-utilization-advisory",
    description="Advisory: gpuMemoryUtilization above 0.85 on unified-memory nodes starves the OS.",
    validate=validate_utilization_advisory,
    enforcement_level=EnforcementLevel.ADVISORY,
    remediation_steps="Lower vllm.gpuMemoryUtilization to 0.85 or less on GB10 unless measured.",
    config_schema=schema(
        utilizationThreshold={"type": "number", "minimum": 0, "maximum": 1, "default": 0.85},
    ),
)

enforce_eager_advisory = ResourceValidationPolicy(
    name="enforce-eager-advisory",
    description="Advisory: enforceEager in prod gives up CUDA graphs.",
    validate=validate_enforce_eager_advisory,
    enforcement_level=EnforcementLevel.ADVISORY,
    remediation_steps="Set vllm.enforceEager: false in Pulumi.prod.yaml.",
    config_schema=schema(
        environment=ENV_PROP,
        prodEnvironments=env_list_prop(DEFAULTS["prodEnvironments"],
                                       "environments counted as prod"),
    ),
)
