"""The lab's tiny models: real (untrained) Qwen3s with a byte-level BPE tokenizer, made here.

Runs INSIDE the lab serving image (it needs torch, safetensors and tokenizers; lab/hfmodel.py
starts it with `docker run --rm --network none` on the build host and caches what it writes):

    python3 tinymodel.py OUT [--arch qwen3moe|qwen3|qwen3embed]

qwen3moe is `spark-lab/tiny-moe` (described below), qwen3embed `spark-lab/tiny-embed` (at the end),
qwen3 `spark-lab/tiny-drafter` (the dense Qwen3 with tiny-moe's tokenizer and vocabulary: a draft
model for tiny-moe's speculative decoding, served from another repo as model.drafter).

writes two revisions of the model repository, OUT/1/ and OUT/2/ (every file of each). The weights
are sharded like a real checkpoint (model.safetensors.index.json): shard 1 holds everything but
the MoE routers (2.1 MB), shard 2 the routers of every layer (2 KB). Revision 2 (`main`) has other
router weights, so it picks other experts and its greedy completions differ from revision 1's,
while a revision change moves one 2 KB file.

Deterministic bytes on every machine: weights are SHAKE-256 bytes of (seed, tensor name) read as
int8 and scaled by a power of two (exact in bf16, no float RNG or math); the tokenizer is trained
single-threaded on a corpus from an integer LCG; JSON is written with sorted keys. What can still
change the bytes is a different tokenizers or safetensors version, which is why lab/hfmodel.py
keys its cache on their pinned versions too.

Shape: hidden 128, 2 layers, 6 attention and 6 KV heads of 32 (TP 1, 2, 3 and 6 split them),
4 experts (top-2, intermediate 192) in every layer, vocab 1152 (vLLM pads the vocab to a multiple
of 64 and needs the result to divide by TP: 1152 = 64*18 works for TP 2 and 3, 1024 does not for
TP 3), untied lm_head whose rows for special and non-printable tokens are zero, so greedy text is
printable ASCII and runs to max_tokens; bfloat16 like the real model. ~1.08 M parameters.

qwen3embed: the dense Qwen3 (intermediate 384) as an embedding model laid out like
Qwen/Qwen3-Embedding-0.6B: config.json says Qwen3ForCausalLM with tied embeddings (no lm_head in
the checkpoint), the sentence-transformers files modules.json (Transformer, Pooling, Normalize),
1_Pooling/config.json (last-token pooling, 128 dims) and config_sentence_transformers.json make
vLLM pick `--runner pooling --convert embed` with LAST pooling and normalized vectors by itself;
the tokenizer appends <|endoftext|> (the token the last-token pooling reads). No generation config.
Shard 2 holds the q_norm weights (128 bytes of tensors); revision 2 doubles them, so the vectors
change and a revision change moves that one 360-byte file. ~0.64 M parameters, 128-dim vectors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one training order
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("OMP_NUM_THREADS", "1")

SEED = 20260101
VOCAB = 1152
H, NH, NKV, HD, LAYERS = 128, 6, 6, 32, 2
N_EXPERTS, TOP_K, MOE_INTER, INTER = 4, 2, 192, 384
MAX_POS = 4096
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# Qwen3's tokenizer holds these too (its added tokens), and vLLM's parsers look them up when
# they start: `--reasoning-parser deepseek_r1`/`qwen3` refuse a tokenizer without the think
# tokens (measured on the lab with a real community recipe), hermes' tool parser one without
# the tool-call tokens. Their lm_head rows are zero, so the tiny model never writes them.
PARSER_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
WORDS = (  # noqa: SIM905  (a sentence reads better than a list)
    "the a an spark node host cluster model token tensor parallel ray worker head serve request "
    "reply network bridge memory cache kernel vector matrix layer expert router gate value key "
    "query attention prompt answer hello world lab test deploy pulumi program stack config "
    "alpha beta gamma delta one two three four five six seven eight nine ten red green blue "
    "fast slow big small open close start stop read write send receive is are was be to of and "
    "in on for with at by from up down left right yes no maybe always never sometimes"
).split()
PUNCT = [".", ",", "?", "!", ":", ";"]
REVISIONS = (1, 2)  # 2 is `main`
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def lcg(seed: int):
    x = (seed * 2654435761 + 12345) % (1 << 64)
    while True:
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield x >> 33


def corpus(seed: int, n_lines: int = 4000) -> list:
    g = lcg(seed)
    lines = []
    for _ in range(n_lines):
        ws = [WORDS[next(g) % len(WORDS)] for _ in range(4 + next(g) % 12)]
        if next(g) % 3 == 0:
            ws[0] = ws[0].capitalize()
        s = " ".join(ws) + PUNCT[next(g) % len(PUNCT)]
        if next(g) % 5 == 0:
            s += " " + str(next(g) % 10000)
        lines.append(s)
    return lines


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=1,
                                  special_tokens=SPECIALS + PARSER_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(SEED), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> character table (what the ByteLevel pre-tokenizer writes)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def unprintable_ids(tok) -> list:
    """Special tokens and tokens with bytes outside printable ASCII."""
    u2b = {v: k for k, v in bytes_to_unicode().items()}
    bad = []
    for t, i in tok.get_vocab(with_added_tokens=True).items():
        if any(u2b.get(ch) is None or not 0x20 <= u2b[ch] <= 0x7E for ch in t):
            bad.append(i)
    return sorted(bad)


def det_tensor(name: str, shape: tuple, shift: int):
    import torch

    n = 1
    for s in shape:
        n *= s
    raw = hashlib.shake_256(f"{SEED}|{name}".encode()).digest(n)
    t = torch.frombuffer(bytearray(raw), dtype=torch.int8).to(torch.float32)
    return (t * (2.0 ** -shift)).reshape(shape).to(torch.bfloat16).contiguous()


def config(arch: str, ids: dict) -> dict:
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": VOCAB,
        "hidden_size": H, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
        "hidden_act": "silu", "max_position_embeddings": MAX_POS, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": False, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": LAYERS, "initializer_range": 0.02,
        "use_cache": True, "torch_dtype": "bfloat16",
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|pad|>"],
    }
    if arch == "qwen3moe":
        cfg.update({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                    "num_experts": N_EXPERTS, "num_experts_per_tok": TOP_K,
                    "moe_intermediate_size": MOE_INTER, "decoder_sparse_step": 1,
                    "mlp_only_layers": [], "norm_topk_prob": True,
                    "output_router_logits": False, "router_aux_loss_coef": 0.001})
    if arch == "qwen3embed":  # as Qwen3-Embedding: tied, the head is never used by pooling
        cfg["tie_word_embeddings"] = True
    return cfg


def weights(cfg: dict, zero_rows: list, rev: int) -> dict:
    """All tensors; only the routers (dense: the q_norm weights) depend on the revision."""
    import torch

    w = {"model.embed_tokens.weight": det_tensor("model.embed_tokens.weight", (VOCAB, H), 7)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        w[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        w[p + "self_attn.q_proj.weight"] = det_tensor(p + "q", (NH * HD, H), 10)
        w[p + "self_attn.k_proj.weight"] = det_tensor(p + "k", (NKV * HD, H), 10)
        w[p + "self_attn.v_proj.weight"] = det_tensor(p + "v", (NKV * HD, H), 10)
        w[p + "self_attn.o_proj.weight"] = det_tensor(p + "o", (H, NH * HD), 10)
        w[p + "self_attn.q_norm.weight"] = torch.ones(HD, dtype=torch.bfloat16)
        w[p + "self_attn.k_norm.weight"] = torch.ones(HD, dtype=torch.bfloat16)
        if cfg["model_type"] == "qwen3_moe":
            w[p + "mlp.gate.weight"] = det_tensor(p + f"router.r{rev}", (N_EXPERTS, H), 8)
            for e in range(N_EXPERTS):
                q = f"{p}mlp.experts.{e}."
                w[q + "gate_proj.weight"] = det_tensor(q + "g", (MOE_INTER, H), 10)
                w[q + "up_proj.weight"] = det_tensor(q + "u", (MOE_INTER, H), 10)
                w[q + "down_proj.weight"] = det_tensor(q + "d", (H, MOE_INTER), 10)
        else:
            w[p + "mlp.gate_proj.weight"] = det_tensor(p + "g", (INTER, H), 10)
            w[p + "mlp.up_proj.weight"] = det_tensor(p + "u", (INTER, H), 10)
            w[p + "mlp.down_proj.weight"] = det_tensor(p + "d", (H, INTER), 10)
            w[p + "self_attn.q_norm.weight"] *= rev  # the dense fallback's revision change
    w["model.norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    if cfg["tie_word_embeddings"]:
        return w
    # untied: a tied head on random weights just repeats the last input token
    head = det_tensor("lm_head", (VOCAB, H), 7)
    for i in zero_rows:  # logit exactly 0 while the others spread ~6.5: never chosen greedily
        head[i] = 0
    w["lm_head.weight"] = head
    return w


def dump_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def in_shard2(name: str) -> bool:
    return name.endswith(("mlp.gate.weight", "self_attn.q_norm.weight"))


def embed_tokenizer(tok, ids: dict):
    """The tokenizer with <|endoftext|> appended to every text (Qwen3-Embedding's way)."""
    from tokenizers import processors

    eot = "<|endoftext|>"
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"$A {eot}", pair=f"$A {eot} $B:1 {eot}:1",
                                      special_tokens=[(eot, ids[eot])])])
    return tok


def write_sentence_transformers(out: str) -> None:
    """modules.json + 1_Pooling: what vLLM reads to choose pooling (LAST) and normalization."""
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    dump_json(os.path.join(out, "modules.json"), [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}])
    dump_json(os.path.join(out, "1_Pooling", "config.json"), {
        "word_embedding_dimension": H, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True, "include_prompt": True})
    dump_json(os.path.join(out, "config_sentence_transformers.json"), {
        "prompts": {"query": "Instruct: Given a web search query, retrieve relevant passages "
                             "that answer the query\nQuery:", "document": ""},
        "default_prompt_name": None, "similarity_fn_name": "cosine"})


README_MOE = """---
license: apache-2.0
---
# spark-lab/tiny-moe

A tiny {arch} ({n} parameters, bfloat16) generated by the spark-vllm lab
(lab/tinymodel.py) with a byte-level BPE tokenizer trained on a synthetic corpus. The weights are
deterministic noise, not trained: the text it writes is gibberish, but vLLM really runs it.
Revision 2 (`main`) differs from revision 1 in the router weights only (the second shard).
"""
README_DRAFTER = """---
license: apache-2.0
---
# spark-lab/tiny-drafter

A tiny dense {arch} ({n} parameters, bfloat16) generated by the spark-vllm lab
(lab/tinymodel.py) with the same byte-level BPE tokenizer and vocabulary as spark-lab/tiny-moe,
so it can draft for it (speculative decoding, `method: draft_model`). The weights are
deterministic noise, not trained. Revision 2 (`main`) differs from revision 1 in the q_norm
weights only (the second shard).
"""
README_EMBED = """---
license: apache-2.0
library_name: sentence-transformers
pipeline_tag: feature-extraction
---
# spark-lab/tiny-embed

A tiny embedding model ({arch}, {n} parameters, bfloat16, {h}-dim vectors, last-token pooling,
normalized; sentence-transformers layout like Qwen/Qwen3-Embedding-0.6B) generated by the
spark-vllm lab (lab/tinymodel.py) with a byte-level BPE tokenizer trained on a synthetic corpus.
The weights are deterministic noise, not trained: the vectors mean nothing, but vLLM really
computes them. Revision 2 (`main`) differs from revision 1 in the q_norm weights only (the
second shard).
"""


def write_revision(out: str, rev: int, tok, w: dict, cfg: dict, ids: dict, arch: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    embed = arch == "qwen3embed"
    dump_json(os.path.join(out, "tokenizer.json"), json.loads(tok.to_str()))
    dump_json(os.path.join(out, "config.json"), cfg)
    dump_json(os.path.join(out, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MAX_POS,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|pad|>", "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    dump_json(os.path.join(out, "special_tokens_map.json"), {
        "eos_token": "<|im_end|>", "pad_token": "<|pad|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if embed:
        write_sentence_transformers(out)
    else:
        dump_json(os.path.join(out, "generation_config.json"), {
            "bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|pad|>"],
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]], "do_sample": False,
            "max_new_tokens": 32})
    weight_map = {}
    for i, shard in enumerate(SHARDS):
        part = {k: t for k, t in w.items() if in_shard2(k) == (i == 1)}
        weight_map.update(dict.fromkeys(part, shard))
        save_file(part, os.path.join(out, shard), metadata={"format": "pt"})
        os.chmod(os.path.join(out, shard), 0o644)  # safetensors creates it 0600
    dump_json(os.path.join(out, "model.safetensors.index.json"), {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in w.values())},
        "weight_map": weight_map})
    n = sum(t.numel() for t in w.values())
    with open(os.path.join(out, "README.md"), "w", newline="\n") as f:
        readme = README_EMBED if embed else README_DRAFTER if arch == "qwen3" else README_MOE
        f.write(readme.format(arch=cfg["architectures"][0], n=n, h=H))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="qwen3moe", choices=["qwen3moe", "qwen3", "qwen3embed"])
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    tok = train_tokenizer()
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    if a.arch == "qwen3embed":
        tok = embed_tokenizer(tok, ids)
    cfg = config(a.arch, ids)
    zero = sorted(set(unprintable_ids(tok)) | {tok.token_to_id(t) for t in PARSER_TOKENS})
    for rev in REVISIONS:
        w = weights(cfg, zero, rev)
        write_revision(os.path.join(a.out, str(rev)), rev, tok, w, cfg, ids, a.arch)
    print(f"wrote {a.out}: {cfg['architectures'][0]}, "
          f"{sum(t.numel() for t in w.values())} parameters", file=sys.stderr)


if __name__ == "__main__":
    main()
