"""11. gpu-memory-utilization-advisory, 12. enforce-eager-advisory and 18. nccl-build-advisory:
settings that work but cost stability or throughput, and NCCL builds known to misbehave;
reported, never blocking."""
from __future__ import annotations

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from contract.props import CollectiveGateProps, VllmServerProps

from ._common import (
    COLLECTIVE_GATE,
    DEFAULTS,
    VLLM_SERVER,
    Report,
    conf,
    each,
    elements,
    environment_of,
    flag,
    get,
    mapping_items,
    num,
    props_as,
    props_of,
    text,
)
from ._schema import ENV_PROP, env_list_prop, schema


def validate_utilization_advisory(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    props = props_of(args, VllmServerProps)
    util = num(props["gpuMemoryUtilization"])
    threshold = num(conf(args, "utilizationThreshold")) or 0.85
    if util is None or util <= threshold:
        return
    unified = [text(n["name"]) or "?" for n in each(props["nodes"])
               if flag(n["unifiedMemory"]) is True]
    if unified:
        report(f"gpuMemoryUtilization {util:.2f} is above {threshold:.2f} on unified-memory nodes "
               f"{', '.join(unified)}: CPU, page cache and the container share that memory", None)


def validate_enforce_eager_advisory(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    if flag(props_of(args, VllmServerProps)["enforceEager"]) is not True:
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


# NCCL builds known to misbehave on DGX Sparks, each with what shows it and the fix. A build is
# named by where it comes from and its version (and, where known, its GNU build ID's start: the
# probe reads the ID, payloads/nccl_library.py), since two builds of one version differ.
KNOWN_BAD_NCCL: list[dict[str, str]] = [
    {
        "source": "pip",
        "version": "2.28.9",
        "why": "two-Spark TP=2 serving hangs after 20-26 minutes under load (a rank spinning in "
               "ncclAllReduce, an _ALLGATHER_BASE watchdog timeout), traced to pip's "
               "nvidia-nccl-cu13 2.28.9, a different build from DGX OS's libnccl2 2.28.9 "
               "(https://github.com/vllm-project/vllm/issues/42354, "
               "https://github.com/vllm-project/vllm/issues/41725)",
        "fix": "load the system's build instead: VLLM_NCCL_SO_PATH=<the system libnccl.so.2, "
               "e.g. /usr/lib/aarch64-linux-gnu/libnccl.so.2 from libnccl2> in the serving "
               "containers, or an image that ships another NCCL (the wheel's libnccl.so.2 "
               "replaced by the system's, as the issues did)",
    },
]


def known_bad(lib: object) -> dict[str, str] | None:
    """The KNOWN_BAD_NCCL entry a library (a payloads/nccl_library.py description) matches."""
    source, version = text(get(lib, "source")), text(get(lib, "version"))
    return next((b for b in KNOWN_BAD_NCCL
                 if b["source"] == source and b["version"] == version), None)


def nccl_build_findings(props: object) -> list[str]:
    """Per node, a known-bad NCCL build the serving vLLM loads, with the host's library of the
    same version when it has one (the fix's candidate)."""
    out = []
    for node, builds in mapping_items(props_as(props, CollectiveGateProps)["ncclBuilds"]):
        lib = get(builds, "vllm")
        bad = known_bad(lib)
        if bad is None:
            continue
        build = text(get(lib, "build")) or "no build ID"
        where = text(get(lib, "realPath")) or text(get(lib, "path")) or "?"
        host = [h for h in elements(get(builds, "host"))
                if text(get(h, "version")) == bad["version"] and text(get(h, "source")) != "pip"]
        alt = (f"; the host has {bad['version']} as {text(get(host[0], 'package')) or 'a library'}"
               f" at {text(get(host[0], 'realPath')) or text(get(host[0], 'path'))} (build "
               f"{(text(get(host[0], 'build')) or '?')[:12]})" if host else "")
        out.append(f"{node}: vLLM loads NCCL {bad['version']} from {bad['source']} ({where}, "
                   f"build {build[:12]}): {bad['why']}. Fix: {bad['fix']}{alt}")
    return out


def validate_nccl_build_advisory(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != COLLECTIVE_GATE:
        return
    for msg in nccl_build_findings(args.props):
        report(msg, None)


nccl_build_advisory = ResourceValidationPolicy(
    name="nccl-build-advisory",
    description="Advisory: the serving vLLM loads an NCCL build known to misbehave on Sparks.",
    validate=validate_nccl_build_advisory,
    enforcement_level=EnforcementLevel.ADVISORY,
    remediation_steps="Serve with the system's NCCL (VLLM_NCCL_SO_PATH) or an image that ships "
                      "another build; the finding names the build and the issue.",
    config_schema=schema(),
)
