"""Every flag the program can emit is accepted by the lab image's real vLLM (0.32.0, CPU build):
the `vllm serve` argv the program builds for the dev, staging and prod stack files is parsed by
vLLM's own parser inside the serving image on a lab node, and a bad flag is rejected with
vLLM's own message. Nothing is served (tests/e2e/vllm_parse_argv.py).

Staging and prod serve with the 122B recipe (config/recipes_data/qwen3.5-122b-a10b-fp8.yaml):
its flags (--max-num-batched-tokens, --language-model-only, --enable-expert-parallel, the
reasoning and tool-call parsers) are in their argv. The recipe names no chat template (none is
shipped), so there is no --chat-template: vLLM serves the model's own. Were a template given,
vLLM's validation would want the file to exist, so it is written where the stack uploads it into
vLLM's container (hostscripts/vllm.CHAT_TEMPLATE) before the parser runs."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from components.vllm_server import serve_argv, serve_chat_template
from config import StackConfig
from config.listen import vllm_host
from config.models import VllmConfig
from hostscripts.vllm import CHAT_TEMPLATE
from lab.deployments import LAB, ROOT

pytestmark = pytest.mark.lab

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHECKER = Path(__file__).with_name("vllm_parse_argv.py")


def _stack_config(name: str) -> StackConfig:
    data = yaml.safe_load((ROOT / f"Pulumi.{name}.yaml").read_text())["config"]
    raw = {k.split(":", 1)[1]: v for k, v in data.items() if not isinstance(v, dict) or
           "secure" not in v}
    for n in raw["nodes"]:  # placeholders or absent: irrelevant to the argv
        n["hostKey"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFlagTest"
    # the model validation alone (prod's placeholders would stop validate_config): it applies
    # the recipe's serve settings, which is all the argv needs
    return StackConfig.model_validate(raw)


def _stack_argv(name: str) -> list[str]:
    """What `vllm serve` gets for Pulumi.<name>.yaml (the words after `vllm serve`)."""
    cfg = _stack_config(name)
    argv = serve_argv(cfg.vllm, cfg.model.repo, COMMIT, cfg.tensor_parallel_size,
                      host=vllm_host(cfg))
    assert argv[:2] == ["vllm", "serve"]
    return argv[2:]


def _parse_in_image(lab_cfg: dict, argvs: list[list[str]], template: str | None) -> list[dict]:
    image = lab_cfg["image"]["ref"]
    script = CHECKER.read_text()
    write = (f"mkdir -p $(dirname {CHAT_TEMPLATE}) && printf '%s' \"$1\" > {CHAT_TEMPLATE} && "
             if template is not None else "")
    inner = write + "exec python3 -c \"$2\""
    cmd = (f"docker pull -q {image} >/dev/null && docker run --rm -i --entrypoint sh "
           f"{image} -c {shlex.quote(inner)} sh {shlex.quote(template or '')} "
           f"{shlex.quote(script)}")
    done = subprocess.run([*LAB, "ssh", "spark-1", "sh", "-c", cmd], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_every_stack_files_argv_is_accepted_and_a_bad_flag_is_refused(lab_cfg):
    argvs = {name: _stack_argv(name) for name in ("dev", "staging", "prod")}
    for name in ("staging", "prod"):  # the 122B recipe's flags are all there
        for flag in ("--max-num-batched-tokens", "--language-model-only",
                     "--enable-expert-parallel", "--reasoning-parser", "--tool-call-parser",
                     "--enable-auto-tool-choice", "--speculative-config",
                     "--kv-cache-dtype", "--load-format"):
            assert flag in argvs[name], (name, flag)
    for name in ("dev", "staging", "prod"):  # no chat template shipped: the model's own
        assert "--chat-template" not in argvs[name], name
        assert serve_chat_template(_stack_config(name).vllm) is None, name
    template = serve_chat_template(_stack_config("prod").vllm)
    bad = [*argvs["dev"], "--bogus-flag"]
    # spellings vLLM's parser reads as the flags the stack owns (underscores, an abbreviation, a
    # dotted key): the config refuses each, and the real parser shows why it must
    sneaky = ["--hos", "10.9.9.9", "--api_key=leaked", "--trust_remote"]
    for arg in ("--hos", "--api_key=leaked", "--trust_remote"):
        with pytest.raises(ValueError, match="is owned by"):
            VllmConfig.model_validate({"extraArgs": [arg]})
    results = _parse_in_image(lab_cfg, [*argvs.values(), bad, [*argvs["dev"], *sneaky]], template)
    assert len(results) == 5, results
    for (name, argv), got in zip(argvs.items(), results, strict=False):
        assert got["ok"] is True, (name, argv, got)
        assert got["values"]["api_key"] is None and got["values"]["trust_remote_code"] is False
    assert results[3]["ok"] is False
    assert results[3]["error"] == "vllm serve: error: unrecognized arguments: --bogus-flag"
    assert results[4]["ok"] is True, results[4]
    assert results[4]["values"]["host"] == "10.9.9.9"  # the last --host wins: the stack's is moot
    assert results[4]["values"]["api_key"] == ["leaked"]
    assert results[4]["values"]["trust_remote_code"] is True
