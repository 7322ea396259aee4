"""config.json of the models the tests size, with where every number comes from.

QWEN35_122B_A10B_FP8: the relevant keys of Qwen/Qwen3.5-122B-A10B-FP8's config.json. The file
itself was not found in a public repository that vendors it (searched 2026-12: the code index,
the docs and pages corpora), so it is assembled from these public sources; UNVERIFIED against
the real file where marked:
  * 48 layers, 36 Gated DeltaNet (linear attention) + 12 full attention in a 3:1 pattern, a
    1-layer MTP module, 262,144 context: the model cards of btbtyler09/Qwen3.5-122B-A10B-GPTQ-4bit
    (hugingapi.com mirror) and olka-fi/Qwen3.5-122B-A10B-MXFP4 (huface.ru mirror); "full attention
    every fourth layer": NVIDIA Dynamo's Qwen3.5-122B-A10B recipe
    (https://docs.nvidia.com/dynamo/recipes/qwen3-5-122b).
  * hidden 3072, 32 attention heads: https://docs.vultr.com/models/alibaba-qwen-35/qwen3.5-122b-a10b/nvidia
  * 2 KV heads of head_dim 256, linear attention 16 key heads / 64 value heads of 128, conv kernel
    4, 256 experts (8 routed) of 1024: two independent public test fixtures of the 122B found in
    the code index (a torchrun `run_qwen3_5_moe_122B` test config and a qwen_exo_booster
    `write_model(large_moe=True)` config) that agree on every one of these numbers.
  * dtype bfloat16, mamba_ssm_dtype float32, model_type names, nesting under text_config: the
    published Qwen3.5 family configs (e.g. Qwen3.5-27B / 35B-A3B text configs); UNVERIFIED for
    the 122B FP8 file.
  * quantization_config: the FP8 checkpoints' block-wise fp8; UNVERIFIED, and not read by the
    estimate (weights come from the file sizes).
"""

from __future__ import annotations

QWEN35_122B_LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]

QWEN35_122B_A10B_FP8 = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "dtype": "bfloat16",  # UNVERIFIED (family)
        "num_hidden_layers": 48,
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "full_attention_interval": 4,
        "layer_types": QWEN35_122B_LAYER_TYPES * 12,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 64,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "mamba_ssm_dtype": "float32",  # UNVERIFIED (family)
        "mtp_num_hidden_layers": 1,
        "max_position_embeddings": 262144,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 1024,
        "shared_expert_intermediate_size": 1024,
        "vocab_size": 248320,
    },
    "vision_config": {"depth": 27, "hidden_size": 1152},
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},  # UNVERIFIED
}

# The lab's model spark-lab/tiny-moe (lab/tinymodel.py `config`, Qwen3-MoE): hidden 128, 2 layers,
# 6 attention and 6 KV heads of 32, bfloat16, max_position_embeddings 4096.
TINY_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "num_experts": 4,
    "num_experts_per_tok": 2,
}

# meta-llama/Llama-3.1-8B-Instruct (the model of tests/fixtures/gb10/vllm-startup-log-llm-
# elizabetht.txt): 32 layers, 32 heads, 8 KV heads, hidden 4096 (LMCache's
# examples/kv_cache_calculator/modelconfig.json lists the same), bfloat16.
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}

# A tiny dense Qwen3 served as an embedding model (the lab's spark-lab/tiny-embed kind): hidden 128.
TINY_EMBED = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}

# Qwen/Qwen3-Embedding-0.6B and Qwen/Qwen3-Reranker-0.6B (both Qwen3ForCausalLM, 28 layers,
# 16 heads, 8 KV heads of 128, hidden 1024, 32768 positions, bfloat16), as their model cards at
# https://huggingface.co/Qwen/Qwen3-Embedding-0.6B describe them; UNVERIFIED here (no hub).
QWEN3_06B_POOLING = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}

CONFIGS = {
    "Qwen/Qwen3.5-122B-A10B-FP8": QWEN35_122B_A10B_FP8,
    "spark-lab/tiny-moe": TINY_MOE,
    "spark-lab/tiny-embed": TINY_EMBED,
    "Qwen/Qwen3-Embedding-0.6B": QWEN3_06B_POOLING,
    "Qwen/Qwen3-Reranker-0.6B": QWEN3_06B_POOLING,
}
