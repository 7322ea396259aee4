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
import re
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


# ----------------------------------------------------------- issue 46, item 2 and issue 44
def _in_image(lab_cfg: dict, script: str, stdin: str, timeout: float = 600
              ) -> subprocess.CompletedProcess[str]:
    """`python3 -c <script>` in the lab's serving image on spark-1 (network none), stdin given."""
    image = lab_cfg["image"]["ref"]
    cmd = (f"docker pull -q {image} >/dev/null && docker run --rm -i --network none "
           f"--entrypoint python3 {image} -c {shlex.quote(script)}")
    return subprocess.run([*LAB, "ssh", "spark-1", "sh", "-c", cmd], input=stdin,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_extra_args_are_judged_by_the_destination_vllms_own_parser_gives_them(lab_cfg):
    """The serve check (hostscripts/payloads/image_probe.py) in the real image: every token of
    extraArgs resolved by vLLM 0.32.0's own parser to its argparse destination, so attached
    short options (`-n2` is --nnodes 2, `-r1` --node-rank 1), abbreviations and underscores
    cannot get around the owned and forbidden flags; flags that open a listener or load code are
    refused by name; allowed flags with several values pass. A VLLM_* variable the stack file or
    recipe declares that this vLLM does not know fails the check in dev too."""
    from components.vllm_server import extra_args_request
    from hostscripts.common import payload

    sneaky = ["-n2", "-r1", "--kv_transfer_config={\"kv_connector\":\"X\"}", "-dp", "2",
              "--data-parallel-addr=10.0.0.1", "--otlp-traces-endpoint", "http://10.9.9.9:4317",
              "--allowed-local-media-path", "/", "--hos", "10.9.9.9", "--trust_remote",
              "--cudagraph-capture-sizes", "1", "2", "4", "8"]
    request = {"argv": ["spark-lab/tiny-moe", "--host", "127.0.0.1", *sneaky], "strict": False,
               "timeout": 300, "env": {"VLLM_USE_B12X_MOE": "1",
                                       "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
               "declaredEnv": ["VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_USE_B12X_MOE"],
               **extra_args_request(sneaky)}
    probe = payload("image_probe.py")
    runner = ("import json, sys\nsys.argv = ['probe', sys.stdin.read()]\n"
              f"exec(compile({probe!r}, 'image_probe.py', 'exec'))\n")
    done = _in_image(lab_cfg, runner, json.dumps(request))
    assert done.returncode != 0 and done.stdout.strip(), (done.stdout[-2000:],
                                                         done.stderr[-2000:])
    serve = json.loads(done.stdout.strip().splitlines()[-1])["serve"]
    assert serve["parser"] == "vllm.entrypoints.launchers.cli_args", serve
    failed = [ln.removeprefix("serve check failed: ") for ln in done.stderr.splitlines()
              if ln.startswith("serve check failed: ")]
    refused = [ln.removeprefix("extraArgs, as the image's vLLM parses them: ")
               for ln in failed if ln.startswith("extraArgs")]
    heads = [r.split(":", 1)[0].split(", owned by")[0] for r in refused]
    assert refused, (serve, failed)
    print(f"REPORT the image's own check said: {failed}", flush=True)
    assert heads == [
        "--nnodes (as -n) sets nnodes", "--node-rank (as -r) sets node_rank",
        "--kv-transfer-config sets kv_transfer_config",
        "--data-parallel-size (as -dp) sets data_parallel_size",
        "--data-parallel-address sets data_parallel_address",
        "--otlp-traces-endpoint sets otlp_traces_endpoint",
        "--allowed-local-media-path sets allowed_local_media_path",
        "--host sets host", "--trust-remote-code sets trust_remote_code"], refused
    # every option token's destination, the allowed one's too
    assert [d for d, _ in serve["extraDests"]] == [
        "nnodes", "node_rank", "kv_transfer_config", "data_parallel_size",
        "data_parallel_address", "otlp_traces_endpoint", "allowed_local_media_path", "host",
        "trust_remote_code", "cudagraph_capture_sizes"], serve
    assert ("VLLM_USE_B12X_MOE is not a variable the image's vLLM knows (it would be ignored)"
            in failed)
    assert not any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in ln for ln in failed)
    print(f"REPORT the image's parser resolved {len(serve['extraDests'])} extraArgs tokens and "
          f"refused {len(refused)} by destination", flush=True)


def test_imported_real_recipes_lines_through_vllms_own_parser(lab_cfg):
    """Every recipe `spark-vllm recipes import` makes of the real corpus
    (tests/fixtures/community_recipes/real), as a stack renders it (the reference stack:
    tools/recipe_import.reference_stack), parsed and validated by vLLM 0.32.0's own `vllm serve`
    parser in the lab image. Those recipes were written for newer vLLM builds on GPUs: a flag or
    value this vLLM does not have is rejected with vLLM's own message (the serve check in the
    image stops such an `up` before vLLM is replaced); the rest are accepted, the recipe served
    by tests/e2e/test_recipe_serve.py among them."""
    from config import validate_config
    from config.recipes import trial
    from tests.unit.tools.test_recipe_corpus import all_results
    from tools.recipe_import import reference_stack

    argvs: dict[str, list[str]] = {}
    for file, r in all_results().items():
        if r.recipe is None:
            continue
        with trial(r.recipe):
            cfg = validate_config(reference_stack(r.recipe))
        argvs[file] = serve_argv(cfg.vllm, cfg.model.repo, COMMIT, cfg.tensor_parallel_size,
                                 host="127.0.0.1")[2:]
    results = _parse_in_image(lab_cfg, list(argvs.values()), None)
    assert len(results) == len(argvs) == 67
    accepted = [f for f, got in zip(argvs, results, strict=True) if got["ok"]]
    rejected = {f: got["error"] for f, got in zip(argvs, results, strict=True) if not got["ok"]}
    for file, error in rejected.items():  # vLLM's own words, never a crash of the check
        assert re.match(r"(vllm serve: error: |[A-Za-z.]*(Error|Exception): )", error), (
            file, error)
    assert "scitrera-oss-spark-run/recipes/qwen3/qwen3-1.7b-vllm.yaml" in accepted
    print(f"REPORT vLLM 0.32.0's parser accepts {len(accepted)} of the {len(argvs)} imported "
          f"real recipes; rejects {len(rejected)}:", flush=True)
    for file, error in sorted(rejected.items()):
        print(f"REPORT   {file}: {error[:200]}", flush=True)
