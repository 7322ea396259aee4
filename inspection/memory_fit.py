"""What vLLM holds per rank: weights, the KV cache and fixed per-sequence state, from config.json.

Pure (no I/O, no Pulumi): `shape_from_config` reads a model's config.json into a `ModelShape`;
`estimate` turns a shape and the serve settings into an `Estimate` per rank (one rank = one GPU =
one Spark). Preflight (inspection/preflight.py) and the VllmServer props the policy pack reviews
(components/vllm_server.py `_props`, policies/rules/memory.py) use the same `estimate`; the pack
runs in its own virtualenv and cannot import this module, so the props carry the numbers.

How vLLM sizes the cache, and what is modelled here (vLLM v1, vllm/v1/kv_cache_interface.py,
vllm/model_executor/layers/mamba/mamba_utils.py, vllm/model_executor/models/qwen3_5.py):
  * A full-attention layer keeps K and V for every token: 2 x kv_heads_per_rank x head_dim x
    bytes(kv_cache_dtype) per token. vLLM gives each rank max(1, num_key_value_heads // tp)
    KV heads (replicated when there are fewer KV heads than ranks).
  * MLA layers (DeepSeek-style: kv_lora_rank) keep one latent of kv_lora_rank +
    qk_rope_head_dim per token, not split across ranks.
  * Linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5) keep no per-token KV but a
    fixed state per sequence: a conv state of (conv_kernel - 1 + speculative tokens) rows of
    (2 x k_heads x k_dim + v_heads x v_dim) / tp values in the model dtype, and a recurrent state
    of v_heads / tp x v_dim x k_dim values in mamba_ssm_dtype (float32 in Qwen3.5's configs).
    vLLM keeps 1 + speculative tokens such states per running sequence, one more with prefix
    caching (mamba_cache_mode "align").
  * `layer_types` ("full_attention" / "linear_attention" / "sliding_attention") or
    `full_attention_interval` (every N-th layer is full attention) say which layer is which;
    without either every layer is full attention. Sliding-window layers are counted as full
    attention (an over-estimate: vLLM keeps only the window).
  * With the MTP drafter (`speculative_config.method == "mtp"`) the model's
    `mtp_num_hidden_layers` (or `num_nextn_predict_layers`) full-attention layers hold KV too.
  * KV dtype: "auto" is the model's dtype (vLLM serves float32 checkpoints in 16 bit, and so
    does this estimate); "fp8*" 1 byte; "bfloat16"/"float16"/"half" 2; "float32"/"float" 4.
  * Pipeline parallelism: ceil(layers / pp) of each kind on the heaviest stage.
Not modelled (each is small or unknowable before vLLM runs): the rounding of the cache to
blocks (vLLM raises a hybrid model's block size until an attention page holds a linear layer's
state: for Qwen3.5-122B at TP 2 and fp8 a block is 4192 tokens, so up to 4191 tokens per
sequence), the padding of pages, activations and CUDA graphs (the runtime overhead term), and a
draft model's own KV for speculative methods other than MTP.

A config this module cannot read gives a `ModelShape` whose `problem` says why; the estimate then
has no KV figure (the policy falls back to its kvMinBytes floor) and says so. Never a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from config.forms import MIB
from contract import sizes
from contract.props import MemoryFitProps

# What vLLM needs beside weights and KV (CUDA context, activations, CUDA graphs, NCCL buffers),
# the policy pack's default runtimeOverheadBytes. Recorded GB10 logs (tests/fixtures/gb10/INDEX.md)
# leave 2.9 GiB (Llama-3.1-8B at utilization 0.3) and 6.7 GiB (Gemma-4-26B at 0.8) for it.
RUNTIME_OVERHEAD_BYTES = sizes.RUNTIME_OVERHEAD_BYTES  # memory-fit's default too

# Where multimodal / composite configs keep the language model (Qwen3.5-MoE: text_config).
_TEXT_KEYS = ("text_config", "llm_config", "language_config")

_DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}

FULL, LINEAR, SLIDING = "full_attention", "linear_attention", "sliding_attention"
_LAYER_KINDS = {FULL: FULL, "attention": FULL, SLIDING: SLIDING, LINEAR: LINEAR}


@dataclass(frozen=True)
class LinearState:
    """Gated DeltaNet geometry of one linear-attention layer (config.json linear_* keys)."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    ssm_dtype_bytes: int  # mamba_ssm_dtype, else the model dtype


@dataclass(frozen=True)
class ModelShape:
    """What of a model's config.json decides its KV cache. `problem` set: the KV cache cannot be
    estimated (the other fields are then whatever could be read)."""

    model_type: str = ""
    dtype: str = ""  # torch_dtype / dtype as written ("" when absent)
    dtype_bytes: int = 2  # what vLLM's dtype "auto" serves in (float32 checkpoints in 16 bit)
    layers: int = 0  # num_hidden_layers
    full_layers: int = 0  # layers with a per-token KV cache (full or sliding attention)
    linear_layers: int = 0  # layers with a fixed per-sequence state instead
    kv_heads: int = 0  # num_key_value_heads (all ranks)
    head_dim: int = 0
    mla_latent: int = 0  # kv_lora_rank + qk_rope_head_dim for MLA models, else 0
    linear: LinearState | None = None
    mtp_layers: int = 0  # mtp_num_hidden_layers / num_nextn_predict_layers
    max_position_embeddings: int | None = None
    hidden_size: int | None = None  # an embedding model's vector length (no projection)
    notes: tuple[str, ...] = ()  # assumptions made while reading
    problem: str | None = None

    @property
    def known(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        if self.problem:
            return f"model shape unknown: {self.problem}"
        kv = (f"MLA latent {self.mla_latent}" if self.mla_latent
              else f"{self.kv_heads} KV heads of {self.head_dim}")
        text = f"{self.full_layers} of {self.layers} layers hold a KV cache ({kv})"
        if self.linear_layers:
            text += f", {self.linear_layers} linear-attention layers a fixed state per sequence"
        return text


@dataclass(frozen=True)
class Estimate:
    """Per rank, in bytes. `kv_held_bytes` is what the fit counts for the KV cache:
    kvCacheMemoryBytes when configured (vLLM sizes the cache to exactly that), else the cache
    for max_num_seqs sequences of max_model_len plus their state (at least `kv_floor`)."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    weights_bytes: int | None  # model bytes / (tp x pp)
    kv_dtype: str
    kv_dtype_bytes: int | None
    kv_bytes_per_token: int | None
    max_model_len: int | None
    max_num_seqs: int
    kv_cache_bytes: int | None  # max_num_seqs x max_model_len tokens
    state_bytes_per_sequence: int | None
    state_bytes: int | None  # max_num_seqs sequences
    one_sequence_bytes: int | None  # KV + state of one max_model_len sequence: vLLM's minimum
    kv_cache_memory_bytes: int | None  # vllm.kvCacheMemoryBytes as configured
    kv_floor_bytes: int
    kv_held_bytes: int
    overhead_bytes: int
    total_bytes: int | None  # weights + kv_held + overhead (None without the weights)
    basis: str  # how the KV figure was derived, or why there is none
    notes: tuple[str, ...] = field(default=())

    @property
    def kv_known(self) -> bool:
        return self.kv_cache_bytes is not None

    def props(self) -> MemoryFitProps:
        """The camelCase numbers the VllmServer component hands the policy pack."""
        return {
            "weightsBytesPerRank": self.weights_bytes,
            "kvBytesPerTokenPerRank": self.kv_bytes_per_token,
            "kvCacheBytesPerRank": self.kv_cache_bytes,
            "stateBytesPerRank": self.state_bytes,
            "oneSequenceBytesPerRank": self.one_sequence_bytes,
            "maxModelLen": self.max_model_len,
            "maxNumSeqs": self.max_num_seqs,
            "kvCacheDtype": self.kv_dtype,
            "basis": self.basis,
        }


# --------------------------------------------------------------------------- config.json

class _Unreadable(Exception):
    pass


def _optional(section: Mapping[str, Any], top: Mapping[str, Any], *keys: str) -> int | None:
    """The first of `keys` in the text section, else at the top level, as a positive int."""
    for scope in (section, top):
        for key in keys:
            if key in scope and scope[key] is not None:
                value = scope[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise _Unreadable(f"{key} is {value!r}, not a positive integer")
                return value
    return None


def _required(section: Mapping[str, Any], top: Mapping[str, Any], *keys: str) -> int:
    value = _optional(section, top, *keys)
    if value is None:
        raise _Unreadable(f"no {' / '.join(keys)}")
    return value


def _text(section: Mapping[str, Any], top: Mapping[str, Any], *keys: str) -> str:
    for scope in (section, top):
        for key in keys:
            value = scope.get(key)
            if isinstance(value, str) and value:
                return value
    return ""


def dtype_bytes(name: str) -> int | None:
    """Bytes per element of a torch dtype name ('bfloat16', 'torch.float16', 'float32')."""
    return _DTYPE_BYTES.get(name.lower().removeprefix("torch."))


def _layer_split(section: Mapping[str, Any], top: Mapping[str, Any],
                 layers: int, notes: list[str]) -> tuple[int, int]:
    """-> (layers with a per-token KV cache, linear-attention layers)."""
    types = section.get("layer_types", top.get("layer_types"))
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise _Unreadable(f"layer_types is not a list of num_hidden_layers ({layers}) names")
        kinds = []
        for t in types:
            kind = _LAYER_KINDS.get(t) if isinstance(t, str) else None
            if kind is None:
                raise _Unreadable(f"layer_types has {t!r}, a layer kind this estimate does not "
                                  f"know (known: {', '.join(sorted(_LAYER_KINDS))})")
            kinds.append(kind)
        if SLIDING in kinds:
            notes.append(f"{kinds.count(SLIDING)} sliding-window layers counted as full attention "
                         "(an over-estimate)")
        return kinds.count(FULL) + kinds.count(SLIDING), kinds.count(LINEAR)
    interval = _optional(section, top, "full_attention_interval")
    if interval is not None:
        full = layers // interval  # layers i with (i + 1) % interval == 0
        return full, layers - full
    return layers, 0


def _linear_state(section: Mapping[str, Any], top: Mapping[str, Any],
                  model_bytes: int) -> LinearState:
    def get(key: str) -> int:
        return _required(section, top, key)

    ssm = _text(section, top, "mamba_ssm_dtype")
    ssm_bytes = dtype_bytes(ssm) if ssm else model_bytes
    if ssm_bytes is None:
        raise _Unreadable(f"mamba_ssm_dtype {ssm!r} is not a dtype this estimate knows")
    return LinearState(k_heads=get("linear_num_key_heads"), v_heads=get("linear_num_value_heads"),
                       k_dim=get("linear_key_head_dim"), v_dim=get("linear_value_head_dim"),
                       conv_kernel=get("linear_conv_kernel_dim"), ssm_dtype_bytes=ssm_bytes)


def shape_from_config(config: Any) -> ModelShape:
    """config.json (parsed) -> ModelShape. Never raises: what cannot be read is `problem`."""
    if not isinstance(config, Mapping):
        return ModelShape(problem="config.json is not a JSON object")
    top: Mapping[str, Any] = config
    section: Mapping[str, Any] = top
    for key in _TEXT_KEYS:
        nested = top.get(key)
        if isinstance(nested, Mapping):
            section = nested
            break
    model_type = _text(section, top, "model_type")
    dtype = _text(section, top, "torch_dtype", "dtype")
    notes: list[str] = []
    size = dtype_bytes(dtype) if dtype else None
    if size is None or size > 2:
        # vLLM's --dtype auto serves float32 (and unnamed) checkpoints in 16 bit
        if not dtype:
            notes.append("no torch_dtype in config.json: 16-bit as vLLM's dtype auto")
        size = 2
    partial = ModelShape(model_type=model_type, dtype=dtype, dtype_bytes=size)
    try:
        layers = _required(section, top, "num_hidden_layers", "num_layers", "n_layer", "n_layers")
        full, linear_layers = _layer_split(section, top, layers, notes)
        partial = ModelShape(model_type=model_type, dtype=dtype, dtype_bytes=size, layers=layers,
                             full_layers=full, linear_layers=linear_layers)
        lora = _optional(section, top, "kv_lora_rank")
        mla = 0
        kv_heads = head_dim = 0
        if lora is not None:
            rope = _optional(section, top, "qk_rope_head_dim") or 0
            mla = lora + rope
        else:
            heads = _optional(section, top, "num_attention_heads", "n_head")
            kv = _optional(section, top, "num_key_value_heads", "num_kv_heads",
                           "multi_query_group_num")
            if kv is None:
                if heads is None:
                    raise _Unreadable("no num_key_value_heads and no num_attention_heads")
                kv = heads  # multi-head attention: one KV head per query head
            hd = _optional(section, top, "head_dim")
            if hd is None:
                hidden = _optional(section, top, "hidden_size", "n_embd")
                if hidden is None or heads is None:
                    raise _Unreadable("no head_dim, and no hidden_size / num_attention_heads to "
                                      "derive it from")
                hd = hidden // heads
            kv_heads, head_dim = kv, hd
        state = _linear_state(section, top, size) if linear_layers else None
        mtp = _optional(section, top, "mtp_num_hidden_layers", "num_nextn_predict_layers") or 0
        max_pos = _optional(section, top, "max_position_embeddings")
        hidden_size = _optional(section, top, "hidden_size", "n_embd")
    except _Unreadable as exc:
        return replace(partial, notes=tuple(notes), problem=f"config.json: {exc}")
    return ModelShape(model_type=model_type, dtype=dtype, dtype_bytes=size, layers=layers,
                      full_layers=full, linear_layers=linear_layers, kv_heads=kv_heads,
                      head_dim=head_dim, mla_latent=mla, linear=state, mtp_layers=mtp,
                      max_position_embeddings=max_pos, hidden_size=hidden_size,
                      notes=tuple(notes))


# --------------------------------------------------------------------------- per rank

def kv_dtype_bytes(kv_cache_dtype: str, shape: ModelShape) -> int | None:
    """Bytes per cached element for vLLM's --kv-cache-dtype; None when unknown."""
    name = kv_cache_dtype.lower()
    if name == "auto":
        return shape.dtype_bytes
    if name.startswith("fp8") or name == "int8_per_token_head":
        return 1
    return dtype_bytes(name)


def kv_heads_per_rank(shape: ModelShape, tensor_parallel_size: int) -> int:
    """vLLM splits KV heads across TP ranks, at least one per rank (replicated beyond that)."""
    return max(1, shape.kv_heads // max(1, tensor_parallel_size))


def _speculative(speculative_config: Mapping[str, Any] | None) -> tuple[int, bool, str]:
    """-> (speculative tokens, MTP drafter, method)."""
    if not speculative_config:
        return 0, False, ""
    method = speculative_config.get("method")
    method = method if isinstance(method, str) else ""
    tokens = speculative_config.get("num_speculative_tokens")
    tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 \
        else 0
    return tokens, "mtp" in method.lower(), method


def kv_bytes_per_token(shape: ModelShape, tensor_parallel_size: int,
                       pipeline_parallel_size: int = 1, kv_cache_dtype: str = "auto",
                       mtp: bool = False) -> int | None:
    """KV bytes one token costs on the heaviest rank; None when the shape or dtype is unknown."""
    element = kv_dtype_bytes(kv_cache_dtype, shape)
    if not shape.known or element is None:
        return None
    layers = math.ceil((shape.full_layers + (shape.mtp_layers if mtp else 0))
                       / max(1, pipeline_parallel_size))
    if shape.mla_latent:
        return layers * shape.mla_latent * element
    return layers * 2 * kv_heads_per_rank(shape, tensor_parallel_size) * shape.head_dim * element


def state_bytes_per_sequence(shape: ModelShape, tensor_parallel_size: int,
                             pipeline_parallel_size: int = 1, speculative_tokens: int = 0,
                             prefix_caching: bool = True) -> int | None:
    """Fixed per-sequence state of the linear-attention layers on the heaviest rank (0 without
    such layers; None when the shape is unknown)."""
    if not shape.known:
        return None
    s = shape.linear
    if not shape.linear_layers or s is None:
        return 0
    tp = max(1, tensor_parallel_size)
    conv_dim = (2 * s.k_heads * s.k_dim + s.v_heads * s.v_dim) // tp
    conv = (s.conv_kernel - 1 + speculative_tokens) * conv_dim * shape.dtype_bytes
    recurrent = (s.v_heads // tp) * s.v_dim * s.k_dim * s.ssm_dtype_bytes
    copies = 1 + speculative_tokens + (1 if prefix_caching else 0)
    layers = math.ceil(shape.linear_layers / max(1, pipeline_parallel_size))
    return layers * (conv + recurrent) * copies


def weights_per_rank(model_bytes: int, tensor_parallel_size: int,
                     pipeline_parallel_size: int = 1) -> int:
    return model_bytes // (max(1, tensor_parallel_size) * max(1, pipeline_parallel_size))


def kv_held(kv_cache_bytes: int | None, state_bytes: int | None,
            kv_cache_memory_bytes: int | None, kv_floor_bytes: int) -> int:
    """What a memory fit counts for the KV cache. The policy pack (policies/rules/memory.py)
    applies the same rule to the props (it cannot import this module)."""
    if kv_cache_memory_bytes is not None:
        return kv_cache_memory_bytes
    if kv_cache_bytes is None:
        return kv_floor_bytes
    return max(kv_floor_bytes, kv_cache_bytes + (state_bytes or 0))


def estimate(shape: ModelShape | None, *, model_bytes: int | None, tensor_parallel_size: int,
             pipeline_parallel_size: int = 1, max_model_len: int | None = None,
             max_num_seqs: int | None = None, kv_cache_dtype: str = "auto",
             kv_cache_memory_bytes: int | None = None,
             speculative_config: Mapping[str, Any] | None = None, prefix_caching: bool = True,
             overhead_bytes: int = 0, kv_floor_bytes: int = 0) -> Estimate:
    """Weights per rank + the KV cache for max_num_seqs sequences of max_model_len (+ their fixed
    state) + overhead. max_model_len unset: the model's max_position_embeddings (vLLM's default).
    max_num_seqs unset: one sequence (the least vLLM needs to start)."""
    tp, pp = max(1, tensor_parallel_size), max(1, pipeline_parallel_size)
    shape = shape if shape is not None else ModelShape(problem="the model's config.json was not "
                                                               "read")
    spec_tokens, mtp, method = _speculative(speculative_config)
    notes = list(shape.notes)
    seqs = max_num_seqs or 1
    if max_num_seqs is None:
        notes.append("maxNumSeqs unset: one sequence counted")
    length = max_model_len or shape.max_position_embeddings
    per_token = kv_bytes_per_token(shape, tp, pp, kv_cache_dtype, mtp)
    element = kv_dtype_bytes(kv_cache_dtype, shape)
    per_seq_state = state_bytes_per_sequence(shape, tp, pp, spec_tokens, prefix_caching)
    if spec_tokens and not mtp and method != "ngram":
        notes.append(f"speculative method {method or '?'}: the drafter's own KV is not counted")
    kv = state = one = None
    if not shape.known:
        basis = shape.describe()
    elif element is None:
        basis = f"KV cache dtype {kv_cache_dtype!r} unknown to this estimate"
    elif length is None:
        basis = "no maxModelLen and no max_position_embeddings in config.json"
    else:
        assert per_token is not None and per_seq_state is not None
        kv, state = per_token * length * seqs, per_seq_state * seqs
        one = per_token * length + per_seq_state
        layers = shape.full_layers + (shape.mtp_layers if mtp else 0)
        what = (f"MLA latent {shape.mla_latent}" if shape.mla_latent else
                f"{kv_heads_per_rank(shape, tp)} of {shape.kv_heads} KV heads x {shape.head_dim}")
        basis = (f"{layers} KV layers{' (incl. MTP)' if mtp and shape.mtp_layers else ''}"
                 f"{f' / pp {pp}' if pp > 1 else ''} x {what} x {element} B "
                 f"({kv_cache_dtype}) = {per_token} B/token/rank; {length} tokens x {seqs} seqs")
        if per_seq_state:
            basis += (f"; {shape.linear_layers} linear-attention layers keep "
                      f"{per_seq_state / MIB:.1f} MiB state per sequence")
    weights = weights_per_rank(model_bytes, tp, pp) if model_bytes else None
    held = kv_held(kv, state, kv_cache_memory_bytes, kv_floor_bytes)
    total = None if weights is None else weights + held + overhead_bytes
    return Estimate(tensor_parallel_size=tp, pipeline_parallel_size=pp, weights_bytes=weights,
                    kv_dtype=kv_cache_dtype, kv_dtype_bytes=element, kv_bytes_per_token=per_token,
                    max_model_len=length, max_num_seqs=seqs, kv_cache_bytes=kv,
                    state_bytes_per_sequence=per_seq_state if kv is not None else None,
                    state_bytes=state, one_sequence_bytes=one,
                    kv_cache_memory_bytes=kv_cache_memory_bytes, kv_floor_bytes=kv_floor_bytes,
                    kv_held_bytes=held, overhead_bytes=overhead_bytes, total_bytes=total,
                    basis=basis, notes=tuple(notes))
