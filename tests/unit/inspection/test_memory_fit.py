"""inspection/memory_fit.py: the shape read from config.json and the per-rank estimate, in bytes.

Numbers for Qwen3.5-122B-A10B-FP8 (model_configs.py says where each config value comes from),
the lab's tiny model, and Llama-3.1-8B checked against a vLLM log recorded on a GB10.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inspection import memory_fit as mf
from tests.unit.inspection.model_configs import LLAMA_31_8B, QWEN35_122B_A10B_FP8, TINY_MOE
from tests.unit.inspection.recon_helpers import MODEL_BYTES, gb10

GIB = 1024**3
QWEN = mf.shape_from_config(QWEN35_122B_A10B_FP8)
MTP = {"method": "mtp", "num_speculative_tokens": 1}  # Pulumi.staging.yaml / Pulumi.prod.yaml


def staging(max_model_len: int = 65536, **kw):
    """Pulumi.staging.yaml / Pulumi.prod.yaml: TP 2, maxNumSeqs 4, fp8 KV, MTP 1, prefix caching."""
    args = dict(model_bytes=MODEL_BYTES, tensor_parallel_size=2, max_model_len=max_model_len,
                max_num_seqs=4, kv_cache_dtype="fp8", speculative_config=MTP,
                prefix_caching=True)
    args.update(kw)
    return mf.estimate(QWEN, **args)


# --------------------------------------------------------------------------- the shape

def test_the_122b_shape_from_its_nested_text_config():
    assert QWEN.known and QWEN.model_type == "qwen3_5_moe_text"
    assert (QWEN.layers, QWEN.full_layers, QWEN.linear_layers) == (48, 12, 36)
    assert (QWEN.kv_heads, QWEN.head_dim, QWEN.dtype_bytes, QWEN.mtp_layers) == (2, 256, 2, 1)
    assert QWEN.linear == mf.LinearState(k_heads=16, v_heads=64, k_dim=128, v_dim=128,
                                         conv_kernel=4, ssm_dtype_bytes=4)
    assert QWEN.max_position_embeddings == 262144
    assert QWEN.describe() == ("12 of 48 layers hold a KV cache (2 KV heads of 256), 36 "
                               "linear-attention layers a fixed state per sequence")


def test_full_attention_interval_without_layer_types():
    """Qwen3-Next style: every 4th layer is full attention."""
    cfg = copy.deepcopy(QWEN35_122B_A10B_FP8)
    del cfg["text_config"]["layer_types"]
    shape = mf.shape_from_config(cfg)
    assert (shape.full_layers, shape.linear_layers) == (12, 36)


def test_a_plain_transformer_counts_every_layer():
    shape = mf.shape_from_config(TINY_MOE)
    assert (shape.layers, shape.full_layers, shape.linear_layers) == (2, 2, 0)
    assert (shape.kv_heads, shape.head_dim) == (6, 32)
    llama = mf.shape_from_config(LLAMA_31_8B)
    assert (llama.kv_heads, llama.head_dim) == (8, 128)  # 4096 / 32: derived


@pytest.mark.parametrize("config,problem", [
    ([], "config.json is not a JSON object"),
    ({}, "config.json: no num_hidden_layers / num_layers / n_layer / n_layers"),
    ({"num_hidden_layers": "48"}, "config.json: num_hidden_layers is '48', not a positive integer"),
    ({"num_hidden_layers": True}, "config.json: num_hidden_layers is True, not a positive integer"),
    ({"num_hidden_layers": 2}, "config.json: no num_key_value_heads and no num_attention_heads"),
    ({"num_hidden_layers": 2, "num_key_value_heads": 2},
     "config.json: no head_dim, and no hidden_size / num_attention_heads to derive it from"),
    ({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 64,
      "layer_types": ["full_attention", "mamba"]},
     "config.json: layer_types has 'mamba', a layer kind this estimate does not know (known: "
     "attention, full_attention, linear_attention, sliding_attention)"),
    ({"num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 64,
      "layer_types": ["full_attention"]},
     "config.json: layer_types is not a list of num_hidden_layers (3) names"),
    ({"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 64,
      "full_attention_interval": 4},
     "config.json: no linear_num_key_heads"),
])
def test_a_config_it_cannot_read_is_a_clear_problem(config, problem):
    shape = mf.shape_from_config(config)
    assert not shape.known and shape.problem == problem
    est = mf.estimate(shape, model_bytes=10 * GIB, tensor_parallel_size=2, max_model_len=1024,
                      max_num_seqs=2, kv_floor_bytes=GIB)
    assert est.kv_cache_bytes is None and est.kv_bytes_per_token is None
    assert est.basis == f"model shape unknown: {problem}"
    assert est.kv_held_bytes == GIB  # the floor stands in for the KV cache
    assert est.total_bytes == 5 * GIB + GIB


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
        st.sampled_from(["num_hidden_layers", "num_key_value_heads", "head_dim", "hidden_size",
                         "num_attention_heads", "layer_types", "full_attention_interval",
                         "text_config", "linear_num_key_heads", "linear_num_value_heads",
                         "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                         "mamba_ssm_dtype", "torch_dtype", "kv_lora_rank", "x"]) | st.text(),
        inner, max_size=8),
    max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(JSON)
def test_any_json_gives_a_shape_or_a_problem_never_a_traceback(config):
    shape = mf.shape_from_config(config)
    est = mf.estimate(shape, model_bytes=GIB, tensor_parallel_size=2, max_model_len=4096,
                      max_num_seqs=4, speculative_config={"method": "mtp",
                                                          "num_speculative_tokens": 2})
    assert shape.known == (shape.problem is None)
    assert (est.kv_cache_bytes is None) or est.kv_cache_bytes >= 0
    json.dumps(est.props())  # what the component hands the policy pack is plain JSON


# --------------------------------------------------------------------------- the 122B, TP 2

def test_122b_staging_and_prod_settings_per_rank():
    est = staging()
    # 13 KV layers (12 full attention + the MTP layer) x 2 (K, V) x 1 KV head (2 over TP 2)
    # x head_dim 256 x 1 byte (fp8)
    assert est.kv_bytes_per_token == 13 * 2 * 1 * 256 * 1 == 6656
    assert est.kv_cache_bytes == 6656 * 65536 * 4 == 1_744_830_464  # 1.625 GiB
    # Gated DeltaNet state per layer: conv (4 - 1 + 1 spec) x (2 x 16 x 128 + 64 x 128) / 2 x 2 B
    # + recurrent 64 / 2 x 128 x 128 x 4 B (float32), kept 1 + 1 spec + 1 (prefix caching) times
    per_layer = 4 * 6144 * 2 + 32 * 128 * 128 * 4
    assert per_layer == 2_146_304
    assert est.state_bytes_per_sequence == 36 * per_layer * 3 == 231_800_832  # 221.1 MiB
    assert est.state_bytes == 4 * 231_800_832 == 927_203_328
    assert est.one_sequence_bytes == 6656 * 65536 + 231_800_832
    assert est.weights_bytes == MODEL_BYTES // 2 == 59_500_000_000
    assert est.kv_held_bytes == 1_744_830_464 + 927_203_328  # 2.5 GiB
    assert est.basis == ("13 KV layers (incl. MTP) x 1 of 2 KV heads x 256 x 1 B (fp8) = 6656 "
                         "B/token/rank; 65536 tokens x 4 seqs; 36 linear-attention layers keep "
                         "221.1 MiB state per sequence")
    with_overhead = staging(overhead_bytes=mf.RUNTIME_OVERHEAD_BYTES)
    assert with_overhead.total_bytes == 59_500_000_000 + 2_672_033_792 + 6 * GIB  # 63.9 GiB


def test_122b_at_its_full_262144_context():
    est = staging(262144)
    assert est.kv_cache_bytes == 6656 * 262144 * 4 == 6_979_321_856  # 6.5 GiB
    assert est.kv_held_bytes == 6_979_321_856 + 927_203_328  # 7.4 GiB


def test_kv_dtype_heads_per_rank_and_the_drafter():
    plain = dict(speculative_config=None)
    assert staging(**plain).kv_bytes_per_token == 12 * 2 * 256 == 6144  # no MTP layer
    assert staging(**plain).kv_cache_bytes == 1_610_612_736  # 1.5 GiB
    assert staging(kv_cache_dtype="auto", **plain).kv_bytes_per_token == 12288  # bfloat16
    assert staging(kv_cache_dtype="fp8_e4m3", **plain).kv_bytes_per_token == 6144
    assert staging(tensor_parallel_size=1, **plain).kv_bytes_per_token == 12288  # 2 heads on 1
    # 2 KV heads over 4 ranks: vLLM replicates, one head per rank
    assert staging(tensor_parallel_size=4, **plain).kv_bytes_per_token == 6144
    assert staging(kv_cache_dtype="nvfp8x", **plain).kv_cache_bytes is None  # unknown: no guess
    # without prefix caching and speculation: one state per sequence, 3 conv rows
    est = staging(prefix_caching=False, **plain)
    assert est.state_bytes_per_sequence == 36 * (3 * 6144 * 2 + 32 * 128 * 128 * 4)


def test_pipeline_parallelism_splits_layers_and_weights():
    est = staging(tensor_parallel_size=1, pipeline_parallel_size=2, speculative_config=None)
    assert est.kv_bytes_per_token == 6 * 2 * 2 * 256  # 12 full layers over 2 stages
    assert est.weights_bytes == MODEL_BYTES // 2


def test_kv_cache_memory_bytes_is_what_vllm_holds_and_the_floor():
    est = staging(kv_cache_memory_bytes=8 * GIB, kv_floor_bytes=16 * GIB)
    assert est.kv_held_bytes == 8 * GIB and est.kv_cache_bytes == 1_744_830_464
    assert staging(kv_floor_bytes=4 * GIB).kv_held_bytes == 4 * GIB


def test_defaults_one_sequence_and_the_models_context():
    est = mf.estimate(QWEN, model_bytes=MODEL_BYTES, tensor_parallel_size=2,
                      kv_cache_dtype="fp8")
    assert est.max_model_len == 262144 and est.max_num_seqs == 1
    assert est.kv_cache_bytes == 12 * 2 * 256 * 262144
    assert "maxNumSeqs unset: one sequence counted" in est.notes


# --------------------------------------------------------------------------- other models

def test_the_labs_tiny_model():
    """Pulumi.dev.yaml: TP 2, maxModelLen 2048, maxNumSeqs 4, kvCacheDtype auto, 64 MiB KV."""
    shape = mf.shape_from_config(TINY_MOE)
    est = mf.estimate(shape, model_bytes=9_002_011, tensor_parallel_size=2, max_model_len=2048,
                      max_num_seqs=4, kv_cache_dtype="auto", kv_cache_memory_bytes=64 * 1024**2)
    assert est.kv_bytes_per_token == 2 * 2 * 3 * 32 * 2 == 768  # 6 KV heads, 3 per rank, bf16
    assert est.kv_cache_bytes == 768 * 2048 * 4 == 6_291_456  # 6 MiB
    assert est.state_bytes == 0
    assert est.kv_held_bytes == 64 * 1024**2  # vLLM sizes the cache to kvCacheMemoryBytes
    assert est.weights_bytes == 4_501_005


def test_llama_31_8b_matches_the_kv_cache_vllm_logged_on_a_gb10():
    """tests/fixtures/gb10/vllm-startup-log-llm-elizabetht.txt (INDEX.md: vLLM v0.13.0,
    Llama-3.1-8B-Instruct on spark-01): 'Available KV cache memory: 17.96 GiB' and
    'GPU KV cache size: 147,152 tokens'."""
    log = gb10("vllm-startup-log-llm-elizabetht.txt")
    assert "Available KV cache memory: 17.96 GiB" in log and "GPU KV cache size: 147,152 tokens" in log
    per_token = mf.kv_bytes_per_token(mf.shape_from_config(LLAMA_31_8B), 1)
    assert per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert round(147_152 * per_token / GIB, 2) == 17.96


def test_mla_keeps_one_latent_per_token_on_every_rank():
    deepseek = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
                "kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 7168,
                "torch_dtype": "bfloat16"}
    shape = mf.shape_from_config(deepseek)
    assert mf.kv_bytes_per_token(shape, 8) == mf.kv_bytes_per_token(shape, 1) == 61 * 576 * 2


def test_float32_checkpoints_are_served_in_16_bit():
    cfg = {**TINY_MOE, "torch_dtype": "float32"}
    assert mf.kv_bytes_per_token(mf.shape_from_config(cfg), 2) == 768
