"""The recipe's flags in `vllm serve`'s argv, and the chat template vllm_start writes into the
head container: byte for byte whatever it holds, and a changed template restarts vLLM. The
templates are the tests' own (none is shipped in config/recipes_data/)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hostscripts import paths, vllm

ID_A = "a1" * 32
NASTY = "{{- x }}'\"$(id)`id`\\n\\\\ %s %n\n\tlast line, no newline: ${HOME} '\\''"
ARGV = ["vllm", "serve", "org/m", "--chat-template", vllm.CHAT_TEMPLATE, "--port", "8000"]


def _start(template: str | None, argv: list[str] = ARGV) -> str:
    return vllm.vllm_start("head", argv, "http://127.0.0.1:8000", "m", "hi", 60, ID_A,
                           chat_template=template)


def _want(text: str) -> str:
    found = re.search(r"echo ([0-9a-f]{16}) > " + re.escape(paths.VLLM_ARGV), text)
    assert found
    return found.group(1)


def _argv(**kw) -> list[str]:
    base = dict(model="org/m", served_model_name="m", revision="c" * 40, tensor_parallel_size=2,
                pipeline_parallel_size=1, gpu_memory_utilization=0.7, kv_cache_memory_bytes=None,
                max_model_len=None, max_num_seqs=None, kv_cache_dtype="auto",
                enable_prefix_caching=True, load_format="auto", speculative_config=None,
                enforce_eager=False, host="0.0.0.0", port=8000, extra_args=["--x"])
    return vllm.vllm_argv(**{**base, **kw})


def test_recipe_flags_in_the_argv_only_when_set():
    plain = _argv()
    for flag in ("--max-num-batched-tokens", "--language-model-only", "--enable-expert-parallel",
                 "--reasoning-parser", "--tool-call-parser", "--enable-auto-tool-choice",
                 "--chat-template"):
        assert flag not in plain
    full = _argv(max_num_batched_tokens=8192, language_model_only=True,
                 enable_expert_parallel=True, reasoning_parser="qwen3",
                 tool_call_parser="qwen3_coder", enable_auto_tool_choice=True, chat_template=True)
    assert full[full.index("--max-num-batched-tokens") + 1] == "8192"
    assert full[-9:] == ["--tool-call-parser", "qwen3_coder", "--chat-template",
                         "/run/spark-vllm/chat-template.jinja", "--host", "0.0.0.0", "--port",
                         "8000", "--x"]
    assert {"--language-model-only", "--enable-expert-parallel",
            "--enable-auto-tool-choice"} <= set(full)


def test_the_template_is_written_byte_for_byte_whatever_it_holds(tmp_path):
    """Run the script's template lines with a `docker` that runs `exec <container> ...`
    locally, with the container's /run/spark-vllm mapped into tmp_path."""
    root = tmp_path / "container-run"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "assert sys.argv[1:3] == ['exec', 'head'], sys.argv\n"
        f"args = [a.replace('/run/spark-vllm', {str(root)!r}) for a in sys.argv[3:]]\n"
        "os.execvp(args[0], args)\n"
    )
    fake.chmod(0o755)
    text = _start(NASTY)
    at = text.index(f"# chat template sha256: {hashlib.sha256(NASTY.encode()).hexdigest()}\n")
    lines = text[at: text.index("\ndocker exec -i ", at)]
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", "set -eu\n" + lines], env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert (root / "chat-template.jinja").read_bytes() == NASTY.encode()
    assert not (root / "chat-template.jinja.new").exists()
    again = subprocess.run(["sh", "-c", "set -eu\n" + lines], env=env, capture_output=True,
                           text=True, timeout=30, check=False)  # idempotent
    assert again.returncode == 0 and (root / "chat-template.jinja").read_text() == NASTY


def test_a_changed_template_is_a_new_configuration():
    a, b = _start("{{ a }}"), _start("{{ b }}")
    assert _want(a) != _want(b) and _want(a) == _want(_start("{{ a }}"))
    no_template = vllm.vllm_start("head", ["vllm", "serve", "org/m", "--port", "8000"],
                                  "http://127.0.0.1:8000", "m", "hi", 60, ID_A)
    assert "chat template" not in no_template and "chat-template" not in no_template
    assert f"# chat template sha256: {hashlib.sha256(b'{{ a }}').hexdigest()}\n" in a


@pytest.mark.parametrize("argv, template", [
    (ARGV, None),  # the flag without the text
    (["vllm", "serve", "org/m"], "{{ a }}"),  # the text without the flag
    (["vllm", "serve", "org/m", "--chat-template", "/tmp/t.jinja"], "{{ a }}"),  # elsewhere
    (["vllm", "serve", "org/m", "--chat-template"], "{{ a }}"),
])
def test_template_text_and_flag_go_together(argv, template):
    with pytest.raises(ValueError, match=re.escape("a chat template's text goes with "
                                                   "`--chat-template /run/spark-vllm/")):
        _start(template, argv)


def test_the_template_path_is_under_the_stacks_run_folder():
    assert Path(vllm.CHAT_TEMPLATE).parent == Path(paths.VLLM_PID).parent
