"""1. memory-fit: weights, runtime overhead and the KV cache fit the vLLM budget on every node,
and on unified memory the budget leaves the OS its reserve.

The KV cache comes from the VllmServer prop `memoryFit`: inspection/memory_fit.estimate on the
model's config.json (the layers that hold a KV cache, KV heads per rank, head dim, kvCacheDtype)
times maxModelLen x maxNumSeqs, plus the fixed per-sequence state of linear-attention layers;
the same function preflight uses. The pack runs in its own virtualenv and cannot import the
program, so the component computes the numbers and this rule only adds them up, the way
`memory_fit.kv_held` does: kvCacheMemoryBytes when configured (vLLM sizes the cache to exactly
that), else max(kvMinBytes, KV cache + state); kvMinBytes alone when the estimate has no KV
figure (an unreadable config.json, an older component), and the message says so."""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from contract.props import MemoryFitProps, ServerNodeProps

from ._common import (
    DEFAULTS,
    VLLM_SERVER,
    VLLM_SERVICE,
    Json,
    ModelProps,
    Report,
    conf,
    each,
    flag,
    gib,
    mapping_items,
    model_props,
    num,
    props_as,
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
    kv: float  # the KV cache counted per GPU
    kv_text: str  # how `kv` was arrived at


def _fit(props: ModelProps) -> MemoryFitProps:
    """The estimate's numbers (`memoryFit`, an Output on the VllmServer's side)."""
    return props_as(props["memoryFit"], MemoryFitProps)


def _kv(props: ModelProps, kv_min: float) -> tuple[float, str]:
    """The KV cache per GPU the fit counts, and its explanation (mirrors memory_fit.kv_held)."""
    configured = num(props["kvCacheMemoryBytes"])
    if configured is not None:
        return configured, f"KV cache {gib(configured)} (kvCacheMemoryBytes)"
    fit = _fit(props)
    kv = num(fit["kvCacheBytesPerRank"])
    basis = text(fit["basis"])
    if kv is None:
        why = f"; KV cache not estimated: {basis}" if basis else ""
        return kv_min, f"minimum KV cache {gib(kv_min)} (kvMinBytes{why})"
    kv += num(fit["stateBytesPerRank"]) or 0
    seqs, length = num(fit["maxNumSeqs"]), num(fit["maxModelLen"])
    dtype = text(fit["kvCacheDtype"]) or "?"
    what = (f"KV cache {gib(kv)} for {seqs or 0:g} x {length or 0:g} tokens at {dtype} "
            f"({basis or 'estimated from the model config'})")
    if kv < kv_min:
        return kv_min, f"{what}, raised to kvMinBytes {gib(kv_min)}"
    return kv, what


def _shard(props: ModelProps, tp: float, pp: float, model_bytes: float, kv_min: float) -> _Shard:
    # modelBytes / (tp x pp): memory_fit.weights_per_rank (memoryFit.weightsBytesPerRank shows it)
    kv, kv_text = _kv(props, kv_min)
    return _Shard(tp, pp, model_bytes, model_bytes / (tp * pp), kv, kv_text)


def _node_findings(node: ServerNodeProps, util: float, shard: _Shard | None, overhead: float,
                   os_reserve: float) -> list[str]:
    name = text(node["name"]) or "?"
    mem = num(node["memTotalBytes"])
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
                f"overhead {gib(overhead)} + {shard.kv_text} = {gib(need)} "
                f"exceeds the vLLM budget {gib(budget)} (gpuMemoryUtilization {util:.2f} x "
                f"memTotal {gib(mem)}); short by {gib(need - budget)}")
    # the services the stack places on the node (spark-vllm:services) take their shares too
    shares = [(s, u) for s, v in mapping_items(node["services"]) if (u := num(v)) is not None]
    total = util + sum(u for _, u in shares)
    if flag(node["unifiedMemory"]) and total * mem > mem - os_reserve:
        what = (f"vLLM budget {gib(budget)} (gpuMemoryUtilization {util:.2f} x memTotal "
                f"{gib(mem)})")
        if shares:
            what = (f"vLLM budgets {gib(total * mem)} (gpuMemoryUtilization {util:.2f} + "
                    + " + ".join(f"service {s} {u:.2f}" for s, u in shares)
                    + f" = {total:.2f} x memTotal {gib(mem)})")
        out.append(
            f"node {name}: {what} leave {gib(mem - total * mem)} for the OS on unified memory, "
            f"less than the OS reserve {gib(os_reserve)}; highest safe utilization "
            f"{max(0.0, (mem - os_reserve) / mem):.2f}"
            + (" for all of them together" if shares else ""))
    return out


def _one_sequence(props: ModelProps) -> list[str]:
    """With kvCacheMemoryBytes vLLM refuses to start when one maxModelLen sequence does not fit."""
    configured = num(props["kvCacheMemoryBytes"])
    fit = _fit(props)
    one = num(fit["oneSequenceBytesPerRank"])
    if configured is None or one is None or one <= configured:
        return []
    length = num(fit["maxModelLen"]) or 0
    return [f"kvCacheMemoryBytes {gib(configured)} holds less than one maxModelLen sequence "
            f"({length:g} tokens need {gib(one)} per GPU: "
            f"{text(fit['basis']) or 'estimated from the model config'}); "
            "vLLM refuses to start"]


def memory_fit_findings(props: Json, os_reserve: float, overhead: float,
                        kv_min: float) -> list[str]:
    """Per node: weights/(tp*pp) + overhead + KV cache <= util * memTotal, and on unified memory
    util * memTotal <= memTotal - osReserve. Each half runs when its own inputs are known (during a
    first preview modelBytes may be unknown; the reserve check still runs)."""
    props = model_props(props)
    util = num(props["gpuMemoryUtilization"])
    if util is None:
        return []  # unknown during preview or not given: nothing to judge
    if not 0 < util <= 1:
        return [f"gpuMemoryUtilization {util:g} must be in (0, 1]"]
    tp = num(props["tensorParallelSize"])
    pp = num(props.get("pipelineParallelSize", 1))
    model_bytes = num(props["modelBytes"])
    shard = None
    if tp is not None and pp is not None and model_bytes is not None:
        if tp < 1 or pp < 1:
            return [f"tensorParallelSize {tp:g} x pipelineParallelSize {pp:g} must be at least 1"]
        shard = _shard(props, tp, pp, model_bytes, kv_min)
    out: list[str] = _one_sequence(props)
    # a service's nodes are ServiceNodeProps: the same keys but `services`, which they never carry
    for node in each(cast(list[ServerNodeProps], props["nodes"])):
        out.extend(_node_findings(node, util, shard, overhead, os_reserve))
    return out


def validate_memory_fit(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type not in (VLLM_SERVER, VLLM_SERVICE):
        return
    service = args.resource_type == VLLM_SERVICE
    for msg in memory_fit_findings(
            args.props, float(conf(args, "osReserveBytes")),
            float(conf(args, "serviceOverheadBytes" if service else "runtimeOverheadBytes")),
            float(conf(args, "serviceKvMinBytes" if service else "kvMinBytes"))):
        report(msg, None)


memory_fit = ResourceValidationPolicy(
    name="memory-fit",
    description="For the main model and every service, on every node: weights per GPU + the "
                "KV cache (from the model's config.json x maxModelLen x maxNumSeqs, at least "
                "kvMinBytes) + runtime overhead fit in the vLLM budget (gpuMemoryUtilization x "
                "memTotal), and the budgets of the main model and the services on a node "
                "together keep the OS reserve on unified-memory nodes.",
    validate=validate_memory_fit,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Raise tensorParallelSize/pipelineParallelSize (more nodes), choose a "
                      "smaller or more quantized model, lower vllm.maxModelLen / maxNumSeqs or "
                      "use kvCacheDtype fp8, or adjust vllm.gpuMemoryUtilization so that "
                      "utilization x memTotal covers weights + overhead + KV and stays below "
                      "memTotal - osReserveBytes.",
    config_schema=schema(
        osReserveBytes={"type": "number", "minimum": 0, "default": DEFAULTS["osReserveBytes"],
                        "description": "memory kept for the OS on unified-memory nodes"},
        runtimeOverheadBytes={"type": "number", "minimum": 0,
                              "default": DEFAULTS["runtimeOverheadBytes"],
                              "description": "CUDA context, activations, CUDA graphs, "
                                             "NCCL buffers"},
        kvMinBytes={"type": "number", "minimum": 0, "default": DEFAULTS["kvMinBytes"],
                    "description": "smallest useful KV cache per GPU; the KV cache counted "
                                   "when the model's config gives no estimate"},
        serviceOverheadBytes={"type": "number", "minimum": 0,
                              "default": DEFAULTS["serviceOverheadBytes"],
                              "description": "runtimeOverheadBytes of a service's vLLM "
                                             "(spark-vllm:services: small models)"},
        serviceKvMinBytes={"type": "number", "minimum": 0,
                           "default": DEFAULTS["serviceKvMinBytes"],
                           "description": "kvMinBytes of a service's vLLM"},
    ),
)
