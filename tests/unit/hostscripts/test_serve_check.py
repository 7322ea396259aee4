"""Issue 32, items 5 and 6: the image probe's serve check (hostscripts/payloads/image_probe.py
with a request), run by this machine's python against a small stand-in `vllm` package written
here with the module layout and entry points the payload uses (vLLM 0.32.0's
`vllm.entrypoints.launchers.cli_args`, `vllm.utils.argparse_utils`, `vllm.envs`,
`vllm.engine.arg_utils`; tests/e2e/vllm_parse_argv.py uses the same ones in the lab image).
The real vLLM's verdict on the real argv is the lab's to show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostscripts.common import payload
from inspection.image_probe import parse_serve_check

FAKE = {
    "vllm/__init__.py": "",
    "vllm/envs.py": '''
import os
def _choice(name, default, choices):
    def get():
        value = os.getenv(name, default)
        if value not in choices:
            raise ValueError(f"invalid value {value!r} for {name}; valid: {choices}")
        return value
    return get
environment_variables = {
    "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
    "VLLM_CACHE_ROOT": lambda: os.getenv("VLLM_CACHE_ROOT", ""),
    "VLLM_ATTENTION_BACKEND": _choice("VLLM_ATTENTION_BACKEND", "FLASH_ATTN",
                                      ["FLASH_ATTN", "FLASHINFER"]),
}
if os.getenv("FAKE_VLLM_HANG"):
    import time
    time.sleep(60)
if os.getenv("FAKE_VLLM_CRASH"):
    os.abort()
''',
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": '''
import argparse
class FlexibleArgumentParser(argparse.ArgumentParser):
    pass
''',
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/launchers/__init__.py": "",
    "vllm/entrypoints/launchers/cli_args.py": '''
import argparse, json
def _config(text):  # as vLLM's config types: pydantic's message spans lines
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "1 validation error for KVTransferConfig\\n  Value error, not JSON [input_value="
            + repr(text) + "]\\n    For further information visit https://errors.pydantic.dev")
def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--model", default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--nnodes", "-n", type=int, default=1)
    parser.add_argument("--node-rank", "-r", type=int, default=0)
    parser.add_argument("--host", default=None)
    parser.add_argument("--kv-transfer-config", default=None, type=_config)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    parser.add_argument("--data-parallel-address", "-dpa", default=None)
    parser.add_argument("--cudagraph-capture-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    parser.add_argument("--middleware", action="append", default=[])
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser", default=None)
    parser.add_argument("--chat-template", default=None)
    return parser
def validate_parsed_serve_args(args):
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if args.chat_template is not None:
        open(args.chat_template).close()
''',
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": '''
class AsyncEngineArgs:
    @classmethod
    def from_cli_args(cls, args):
        if args.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be >= 1")
        return cls()
''',
}


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for rel, text in FAKE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run(site: Path | None, request: dict, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    environ["PYTHONPATH"] = str(site) if site else ""
    environ.update(env)
    return subprocess.run([sys.executable, "-c", payload("image_probe.py"), json.dumps(request)],
                          capture_output=True, text=True, timeout=120, env=environ)


def req(argv: list[str], env: dict[str, str] | None = None, strict: bool = True,
        **more: object) -> dict:
    return {"argv": argv, "env": env or {}, "strict": strict, "timeout": 60, **more}


def test_an_accepted_argv_and_known_variables_pass(fake_vllm):
    out = run(fake_vllm, req(["org/model", "--tensor-parallel-size", "2"],
                             {"VLLM_HOST_IP": "192.168.177.11"}))
    assert out.returncode == 0, out.stderr
    check = parse_serve_check("spark-1", out.stdout)
    assert (check.checked, check.ok, check.parser) == (
        True, True, "vllm.entrypoints.launchers.cli_args")
    assert check.unknown_env == [] and check.bad_env == {}
    assert check.line() == "serve command accepted by vllm.entrypoints.launchers.cli_args"
    # the probe's other answers are still there for the image check
    assert {"python", "vllm", "ray", "libibverbs"} <= set(json.loads(out.stdout))


def test_a_rejected_flag_fails_everywhere_with_vllms_own_message(fake_vllm):
    for strict in (True, False):
        out = run(fake_vllm, req(["org/model", "--max-num-seqz", "4"], strict=strict))
        assert out.returncode == 1
        assert ("serve check failed: the image's vLLM rejects the serve command: vllm serve: "
                "error: unrecognized arguments: --max-num-seqz 4") in out.stderr
        assert parse_serve_check("n", out.stdout).line().startswith("serve command REJECTED")


def test_serve_validation_and_engine_arguments_are_run(fake_vllm):
    out = run(fake_vllm, req(["org/model", "--enable-auto-tool-choice"]))
    assert out.returncode == 1
    assert "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser" in out.stderr
    out = run(fake_vllm, req(["org/model", "--tensor-parallel-size", "0"]))
    assert out.returncode == 1 and "ValueError: tensor_parallel_size must be >= 1" in out.stderr


def test_an_unknown_vllm_variable_fails_outside_dev_and_is_reported_in_dev(fake_vllm):
    """The prod recipe's VLLM_FLASHINFER_MOE_BACKEND in an image whose vLLM does not know it
    (vLLM 0.32.0: "Unknown vLLM environment variable detected")."""
    env = {"VLLM_FLASHINFER_MOE_BACKEND": "latency", "VLLM_HOST_IP": "192.168.177.11"}
    prod = run(fake_vllm, req(["org/model"], env))
    assert prod.returncode == 1
    assert ("serve check failed: VLLM_FLASHINFER_MOE_BACKEND is not a variable the image's vLLM "
            "knows (it would be ignored)") in prod.stderr
    dev = run(fake_vllm, req(["org/model"], env, strict=False))
    assert dev.returncode == 0
    check = parse_serve_check("n", dev.stdout)
    assert check.unknown_env == ["VLLM_FLASHINFER_MOE_BACKEND"] and check.ok
    # a variable the image itself sets is the container's too
    image_set = run(fake_vllm, req(["org/model"]), VLLM_FROM_THE_IMAGE="1")
    assert image_set.returncode == 1 and "VLLM_FROM_THE_IMAGE is not a variable" in (
        image_set.stderr)


def test_a_refused_value_fails_everywhere(fake_vllm):
    out = run(fake_vllm, req(["org/model"], {"VLLM_ATTENTION_BACKEND": "FAST"}, strict=False))
    assert out.returncode == 1
    assert ("the image's vLLM refuses the value of VLLM_ATTENTION_BACKEND: ValueError: invalid "
            "value 'FAST'") in out.stderr


def test_the_chat_template_is_where_the_stack_uploads_it(fake_vllm, tmp_path):
    path = tmp_path / "etc" / "chat-template.jinja"
    out = run(fake_vllm, req(["org/model", "--chat-template", str(path)],
                             chatTemplate={"path": str(path), "text": "{{ messages }}"}))
    assert out.returncode == 0, out.stderr
    assert path.read_text() == "{{ messages }}"


@pytest.mark.parametrize(("env", "reason"), [
    ({}, "vllm.envs cannot be imported: ModuleNotFoundError"),
    ({"FAKE_VLLM_HANG": "1"}, "vLLM's check did not answer within 2 s"),
    ({"FAKE_VLLM_CRASH": "1"}, "vLLM's check exited -6 without an answer"),
])
def test_a_check_that_cannot_run_fails_closed_outside_dev(fake_vllm, env, reason):
    site = None if not env else fake_vllm
    for strict in (True, False):
        out = run(site, req(["org/model"], strict=strict, timeout=2), **env)
        check = parse_serve_check("n", out.stdout)  # the answer is printed either way
        assert not check.checked and check.reason and check.reason.startswith(reason), check
        if strict:
            assert out.returncode == 1 and "the serve command could not be checked" in out.stderr
        else:
            assert out.returncode == 0


def test_without_a_request_the_probe_answers_as_before():
    out = subprocess.run([sys.executable, "-c", payload("image_probe.py")], capture_output=True,
                         text=True, timeout=60, check=True)
    assert "serve" not in json.loads(out.stdout)


# ------------------------------------------------------------ issue 46, item 2: extraArgs
OWNED = {"--nnodes": "the stack (mp)", "-n": "the stack (mp)", "--node-rank": "the stack (mp)",
         "-r": "the stack (mp)", "--host": "spark-vllm:vllm.host",
         "--tensor-parallel-size": "spark-vllm:vllm.tensorParallelSize"}
FORBIDDEN = {"--kv-transfer-config": "imports a connector module", "-dp": "data parallel",
             "--data-parallel-size": "data parallel", "--data-parallel-address": "a listener",
             "--middleware": "imports ASGI middleware (code)", "--not-in-this-vllm": "x"}


def extra_req(extra: list[str], strict: bool = False) -> dict:
    return req(["org/model", "--host", "127.0.0.1", *extra], strict=strict, extraArgs=extra,
               owned=OWNED, forbidden=FORBIDDEN)


@pytest.mark.parametrize(("extra", "refused"), [
    (["-n2"], "--nnodes (as -n) sets nnodes, owned by the stack (mp)"),
    (["-r1"], "--node-rank (as -r) sets node_rank, owned by the stack (mp)"),
    (["--node-r", "1"], "--node-rank sets node_rank, owned by the stack (mp)"),
    (["--ho=0.0.0.0"], "--host sets host, owned by spark-vllm:vllm.host"),
    (["--kv-transfer", "{}"], "--kv-transfer-config sets kv_transfer_config: imports a "
                              "connector module"),
    (["-dp", "2"], "--data-parallel-size (as -dp) sets data_parallel_size: data parallel"),
    (["-dpa", "10.0.0.1"], "--data-parallel-address (as -dpa) sets data_parallel_address: a "
                           "listener"),
    (["--middleware", "x.y"], "--middleware sets middleware: imports ASGI middleware (code)"),
])
def test_extra_args_are_judged_by_the_destination_the_images_parser_gives_them(
        fake_vllm, extra, refused):
    """Whatever the spelling (attached short options, abbreviations, `=`), each token of
    extraArgs is resolved by the image's own parser to its argparse destination; an owned or
    forbidden one fails the `up` in every environment, named with how it was spelled."""
    out = run(fake_vllm, extra_req(extra))
    assert out.returncode == 1, out.stdout
    check = parse_serve_check("n", out.stdout)
    assert check.ok and check.extra_refused, check
    (line,) = [ln for ln in out.stderr.splitlines() if "extraArgs" in ln]
    assert line == f"serve check failed: extraArgs, as the image's vLLM parses them: {refused}"


def test_extra_args_the_stack_allows_pass_with_every_destination_recorded(fake_vllm):
    extra = ["--cudagraph-capture-sizes", "1", "2", "4", "8", "--no-enable-chunked-prefill",
             "--cudagraph-capture-sizes=16"]
    out = run(fake_vllm, extra_req(extra, strict=True))
    assert out.returncode == 0, out.stderr
    check = parse_serve_check("n", out.stdout)
    assert check.ok and check.extra_refused == []
    assert check.extra_dests == [["cudagraph_capture_sizes", "--cudagraph-capture-sizes"],
                                 ["enable_chunked_prefill", "--no-enable-chunked-prefill"],
                                 ["cudagraph_capture_sizes", "--cudagraph-capture-sizes"]]


def test_extra_args_vllm_cannot_parse_are_a_rejection(fake_vllm):
    out = run(fake_vllm, extra_req(["--nnodes", "two"]))
    assert out.returncode == 1
    assert ("the image's vLLM rejects the serve command: extraArgs alone: vllm serve: error: "
            "argument --nnodes/-n: invalid int value: 'two'") in out.stderr


def test_a_declared_variable_the_images_vllm_does_not_know_fails_in_dev_too(fake_vllm):
    """A VLLM_* variable of the stack file or recipe (config accepts the family, issue 44 item
    2) is the image's to know: unknown, it would be ignored in silence, so it fails the `up`
    everywhere, named; one the image itself sets stays a finding of strict checks only."""
    env = {"VLLM_USE_B12X_MOE": "1", "VLLM_HOST_IP": "192.168.177.11"}
    dev = run(fake_vllm, req(["org/model"], env, strict=False, declaredEnv=["VLLM_USE_B12X_MOE"]))
    assert dev.returncode == 1
    assert ("serve check failed: VLLM_USE_B12X_MOE is not a variable the image's vLLM knows "
            "(it would be ignored)") in dev.stderr
    image_set = run(fake_vllm, req(["org/model"], strict=False, declaredEnv=[]),
                    VLLM_FROM_THE_IMAGE="1")
    assert image_set.returncode == 0, image_set.stderr


def test_a_forbidden_flag_whose_value_the_image_refuses_is_still_refused_by_destination(
        fake_vllm):
    """The destination is noted when argparse resolves the token, before its value is
    converted: a value this vLLM rejects (the real one validates JSON configs while it parses)
    does not hide where the token goes."""
    out = run(fake_vllm, extra_req(["-dp", "two"]))
    assert out.returncode == 1
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("serve check failed: ")]
    assert lines == [
        "serve check failed: the image's vLLM rejects the serve command: extraArgs alone: vllm "
        "serve: error: argument --data-parallel-size/-dp: invalid int value: 'two'",
        "serve check failed: extraArgs, as the image's vLLM parses them: --data-parallel-size "
        "(as -dp) sets data_parallel_size: data parallel"]


def test_a_message_of_several_lines_is_said_whole_on_one_line(fake_vllm):
    out = run(fake_vllm, extra_req(["--kv-transfer-config", "{bad"]))
    check = parse_serve_check("n", out.stdout)
    assert check.error == (
        "extraArgs alone: vllm serve: error: argument --kv-transfer-config: 1 validation error "
        "for KVTransferConfig Value error, not JSON [input_value='{bad'] For further "
        "information visit https://errors.pydantic.dev")
    assert check.extra_refused == ["--kv-transfer-config sets kv_transfer_config: imports a "
                                   "connector module"]
