"""1. memory-fit: weights, runtime overhead and a minimum KV cache fit the vLLM budget on every
node, and on unified memory the budget leaves the OS its reserve."""
from __future__ import annotations

from dataclasses import dataclass

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from ._common import (
    DEFAULTS,
    VLLM_SERVER,
    Json,
    Props,
    Report,
    conf,
    elements,
    flag,
    get,
    gib,
    num,
    text,
)
from ._schema import schema


@dataclass(frozen=True)
class _Shard:
    """What one GPU holds when the model is split tp x pp ways."""

    tp: float
    pp: float
    model_bytes: float
    weights: float  # per GPU
    kv: float  # minimum KV cache per GPU


def _shard(props: Props, tp: float, pp: float, model_bytes: float, kv_min: float,
           kv_per_token: float) -> _Shard:
    shards = tp * pp
    max_len = num(get(props, "maxModelLen"))
    kv = kv_min
    if kv_per_token and max_len:
        kv = max(kv_min, kv_per_token * max_len / shards)
    return _Shard(tp, pp, model_bytes, model_bytes / shards, kv)


def _node_findings(node: Json, util: float, shard: _Shard | None, overhead: float,
                   os_reserve: float) -> list[str]:
    name = text(get(node, "name")) or "?"
    mem = num(get(node, "memTotalBytes"))
    if mem is None or mem <= 0:
        return []
    out: list[str] = []
    budget = util * mem
    if shard is not None:
        need = shard.weights + overhead + shard.kv
        if need > budget:
            out.append(
                f"node {name}: weights per GPU {gib(shard.weights)} (modelBytes "
                f"{gib(shard.model_bytes)} / (tp {shard.tp:g} x pp {shard.pp:g})) + runtime "
                f"overhead {gib(overhead)} + minimum KV cache {gib(shard.kv)} = {gib(need)} "
                f"exceeds the vLLM budget {gib(budget)} (gpuMemoryUtilization {util:.2f} x "
                f"memTotal {gib(mem)}); short by {gib(need - budget)}")
    if flag(get(node, "unifiedMemory")) and budget > mem - os_reserve:
        out.append(
            f"node {name}: vLLM budget {gib(budget)} (gpuMemoryUtilization {util:.2f} x memTotal "
            f"{gib(mem)}) leaves {gib(mem - budget)} for the OS on unified memory, less than "
            f"the OS reserve {gib(os_reserve)}; highest safe utilization "
            f"{max(0.0, (mem - os_reserve) / mem):.2f}")
    return out


def memory_fit_findings(props: Props, os_reserve: float, overhead: float, kv_min: float,
                        kv_per_token: float = 0) -> list[str]:
    """Per node: weights/(tp*pp) + overhead + KV minimum <= util * memTotal, and on unified memory
    util * memTotal <= memTotal - osReserve. Each half runs when its own inputs are known (during a
    first preview modelBytes may be unknown; the reserve check still runs)."""
    util = num(get(props, "gpuMemoryUtilization"))
    if util is None:
        return []  # unknown during preview or not given: nothing to judge
    if not 0 < util <= 1:
        return [f"gpuMemoryUtilization {util:g} must be in (0, 1]"]
    tp = num(get(props, "tensorParallelSize"))
    pp = num(get(props, "pipelineParallelSize", default=1))
    model_bytes = num(get(props, "modelBytes"))
    shard = None
    if tp is not None and pp is not None and model_bytes is not None:
        if tp < 1 or pp < 1:
            return [f"tensorParallelSize {tp:g} x pipelineParallelSize {pp:g} must be at least 1"]
        shard = _shard(props, tp, pp, model_bytes, kv_min, kv_per_token)
    out: list[str] = []
    for node in elements(get(props, "nodes")):
        out.extend(_node_findings(node, util, shard, overhead, os_reserve))
    return out


def validate_memory_fit(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    for msg in memory_fit_findings(args.props, float(conf(args, "osReserveBytes")),
                                   float(conf(args, "runtimeOverheadBytes")),
                                   float(conf(args, "kvMinBytes")),
                                   float(conf(args, "kvBytesPerToken"))):
        report(msg, None)


memory_fit = ResourceValidationPolicy(
    name="memory-fit",
    description="On every node, weights per GPU + minimum KV cache + runtime overhead fit in "
                "the vLLM budget (gpuMemoryUtilization x memTotal), and the budget keeps the OS "
                "reserve on unified-memory nodes.",
    validate=validate_memory_fit,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Raise tensorParallelSize/pipelineParallelSize (more nodes), choose a "
                      "smaller or more quantized model, or adjust vllm.gpuMemoryUtilization so "
                      "that utilization x memTotal covers weights + overhead + KV and stays below "
                      "memTotal - osReserveBytes.",
    config_schema=schema(
        osReserveBytes={"type": "number", "minimum": 0, "default": DEFAULTS["osReserveBytes"],
                        "description": "memory kept for the OS on unified-memory nodes"},
        runtimeOverheadBytes={"type": "number", "minimum": 0,
                              "default": DEFAULTS["runtimeOverheadBytes"],
                              "description": "CUDA context, activations, CUDA graphs, "
                                             "NCCL buffers"},
        kvMinBytes={"type": "number", "minimum": 0, "default": DEFAULTS["kvMinBytes"],
                    "description": "smallest useful KV cache per GPU"},
        kvBytesPerToken={"type": "number", "minimum": 0, "default": 0,
                         "description": "if > 0, the KV minimum is at least one "
                                        "maxModelLen sequence"},
    ),
)
