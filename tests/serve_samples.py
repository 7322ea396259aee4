"""A value for every serve key (config/serve.py), other than its default, and what it puts on
`vllm serve`: the tests that must cover every key take them from here, and
tests/unit/config/test_serve.py fails when a key has none (adding a flag = its line in
config/serve.py + its sample here).

Together they are a valid `spark-vllm:vllm` for a two-node stack (tp 2 x pp 1), given the chat
template `TEMPLATE` in the recipes folder (`recipes_with_template`) and the model pinned to a
commit (`pinned`: trustRemoteCode wants one)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hostscripts.vllm import CHAT_TEMPLATE

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TEMPLATE = "tool-args.jinja"
TEMPLATE_TEXT = "{%- for m in messages %}{{ m.content }}{% endfor %}"
RECIPE = "qwen3.5-122b-a10b-fp8"
SPEC = {"method": "mtp", "num_speculative_tokens": 2}

# key: (value, what it adds to `vllm serve`'s argv; [] for a key that adds nothing by itself)
SAMPLES: dict[str, tuple[Any, list[str]]] = {
    "servedModelName": ("qwen-verified", ["--served-model-name", "qwen-verified"]),
    "recipe": (RECIPE, []),
    "tensorParallelSize": (2, ["--tensor-parallel-size", "2"]),
    "pipelineParallelSize": (1, ["--pipeline-parallel-size", "1"]),  # 2 nodes: tp 2 x pp 1
    "executor": ("mp", ["--distributed-executor-backend", "mp"]),
    "masterPort": (29600, []),  # with the node's place (hostscripts/vllm.mp_node_flags)
    "gpuMemoryUtilization": (0.72, ["--gpu-memory-utilization", "0.72"]),
    "kvCacheMemoryBytes": (17179869184, ["--kv-cache-memory-bytes", "17179869184"]),
    "maxModelLen": (131072, ["--max-model-len", "131072"]),
    "maxNumSeqs": (8, ["--max-num-seqs", "8"]),
    "maxNumBatchedTokens": (4096, ["--max-num-batched-tokens", "4096"]),
    "kvCacheDtype": ("fp8_e4m3", ["--kv-cache-dtype", "fp8_e4m3"]),
    "enablePrefixCaching": (False, ["--no-enable-prefix-caching"]),
    "loadFormat": ("safetensors", ["--load-format", "safetensors"]),
    # with the model pinned to a commit (a config using the samples pins it: `pinned`)
    "trustRemoteCode": (True, ["--trust-remote-code"]),
    "speculativeConfig": (SPEC, ["--speculative-config",
                                 '{"method":"mtp","num_speculative_tokens":2,'
                                 f'"revision":"{COMMIT}"}}']),
    "enforceEager": (True, ["--enforce-eager"]),
    "languageModelOnly": (True, ["--language-model-only"]),
    "enableExpertParallel": (True, ["--enable-expert-parallel"]),
    "reasoningParser": ("deepseek_r1", ["--reasoning-parser", "deepseek_r1"]),
    # a file of the served repo (with trustRemoteCode), read from the served commit
    "reasoningParserPlugin": ("reasoning_parser.py", [
        "--reasoning-parser-plugin",
        f"/root/.cache/huggingface/hub/models--org--m/snapshots/{COMMIT}/reasoning_parser.py"]),
    "enableAutoToolChoice": (True, ["--enable-auto-tool-choice"]),
    "toolCallParser": ("hermes", ["--tool-call-parser", "hermes"]),
    "chatTemplate": (TEMPLATE, ["--chat-template", CHAT_TEMPLATE]),
    "host": ("192.168.177.11", ["--host", "192.168.177.11"]),  # the head's fabric address
    "port": (8010, ["--port", "8010"]),
    "extraArgs": (["--disable-log-stats"], ["--disable-log-stats"]),
}


def pinned(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` (a stack's top-level keys) with its model pinned to COMMIT."""
    raw["model"] = {**raw["model"], "revision": COMMIT}
    return raw


def sample_vllm(keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The `vllm` object with the samples of `keys` (default: every key)."""
    return {k: v for k, (v, _) in SAMPLES.items() if keys is None or k in keys}


def recipes_with_template(folder: Path, monkeypatch) -> None:
    """config/recipes_data/ as shipped plus the chat template TEMPLATE (none is shipped)."""
    from config import recipe_files

    shipped = Path(str(recipe_files.RECIPES_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    for f in shipped.iterdir():
        if f.is_file() and f.suffix in (".yaml", ".jinja"):
            shutil.copy(f, folder / f.name)
    (folder / TEMPLATE).write_text(TEMPLATE_TEXT)
    monkeypatch.setattr(recipe_files, "RECIPES_DIR", folder)
