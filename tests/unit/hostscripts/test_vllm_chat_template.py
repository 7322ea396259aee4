"""The recipe's flags in `vllm serve`'s argv. The chat template's text is uploaded into the vLLM
container by the docker provider (tests/unit/components/test_vllm_server.py checks the upload
byte for byte and that a changed template replaces only that container)."""

from __future__ import annotations

from pathlib import Path

from config import ServeSettings
from hostscripts import paths, vllm


def _argv(**kw) -> list[str]:
    settings = ServeSettings.model_construct(**{
        **ServeSettings(served_model_name="m").model_dump(), "tensor_parallel_size": 2,
        "host": "127.0.0.1",
        "gpu_memory_utilization": 0.7, "extra_args": ["--x"], **kw})
    return vllm.vllm_argv(settings, model="org/m", commit="c" * 40)


def test_recipe_flags_in_the_argv_only_when_set():
    plain = _argv()
    for flag in ("--max-num-batched-tokens", "--language-model-only", "--enable-expert-parallel",
                 "--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice",
                 "--chat-template"):
        assert flag not in plain
    full = _argv(max_num_batched_tokens=8192, language_model_only=True,
                 enable_expert_parallel=True, reasoning_parser="qwen3",
                 tool_call_parser="qwen3_coder", enable_auto_tool_choice=True,
                 chat_template="any.jinja")
    assert full[full.index("--max-num-batched-tokens") + 1] == "8192"
    assert full[-9:] == ["--tool-call-parser", "qwen3_coder", "--chat-template",
                         vllm.CHAT_TEMPLATE, "--host", "127.0.0.1", "--port",
                         "8000", "--x"]
    assert {"--language-model-only", "--enable-expert-parallel",
            "--enable-auto-tool-choice"} <= set(full)


def test_the_template_lives_beside_the_stacks_vllm_config_in_the_container():
    assert Path(vllm.CHAT_TEMPLATE).parent == Path(paths.VLLM_CONFIG_ROOT).parent
