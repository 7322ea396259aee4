"""`vllm serve` inside the head Ray container: its argv, its start (idempotent, health-gated by
payloads/vllm_health.py) and its stop."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hostscripts.common import container_ids, payload, q
from hostscripts.paths import VLLM_ARGV, VLLM_CONFIG_ROOT, VLLM_KEY, VLLM_LOG, VLLM_PID

_HEALTH_PY = payload("vllm_health.py")
# The chat template vLLM reads (`--chat-template`), inside the head Ray container: written by
# vllm_start from the script's own text, so it is in the preview's diff.
CHAT_TEMPLATE = "/run/spark-vllm/chat-template.jinja"


def vllm_argv(
    *,
    model: str,
    served_model_name: str,
    revision: str,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    gpu_memory_utilization: float,
    kv_cache_memory_bytes: int | None,
    max_model_len: int | None,
    max_num_seqs: int | None,
    kv_cache_dtype: str,
    enable_prefix_caching: bool,
    load_format: str,
    speculative_config: Mapping[str, Any] | None,
    enforce_eager: bool,
    host: str,
    port: int,
    extra_args: Sequence[str],
    max_num_batched_tokens: int | None = None,
    language_model_only: bool = False,
    enable_expert_parallel: bool = False,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
    enable_auto_tool_choice: bool = False,
    chat_template: bool = False,
) -> list[str]:
    """The `vllm serve` command line. The API key is not here: it comes from VLLM_API_KEY.

    `chat_template`: vLLM reads a chat template from CHAT_TEMPLATE, the file vllm_start writes
    into the head container."""
    argv = [
        "vllm",
        "serve",
        model,
        "--served-model-name",
        served_model_name,
        "--revision",
        revision,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--pipeline-parallel-size",
        str(pipeline_parallel_size),
        "--distributed-executor-backend",
        "ray",
        "--gpu-memory-utilization",
        f"{gpu_memory_utilization:g}",
    ]
    if kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    if max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    argv += ["--kv-cache-dtype", kv_cache_dtype]
    argv += ["--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"]
    argv += ["--load-format", load_format]
    if speculative_config:
        spec = pinned_speculative_config(speculative_config, model, revision)
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    if enforce_eager:
        argv += ["--enforce-eager"]
    if language_model_only:
        argv += ["--language-model-only"]
    if enable_expert_parallel:
        argv += ["--enable-expert-parallel"]
    if reasoning_parser is not None:
        argv += ["--reasoning-parser", reasoning_parser]
    if enable_auto_tool_choice:
        argv += ["--enable-auto-tool-choice"]
    if tool_call_parser is not None:
        argv += ["--tool-call-parser", tool_call_parser]
    if chat_template:
        argv += ["--chat-template", CHAT_TEMPLATE]
    argv += ["--host", host, "--port", str(port)]
    argv += list(extra_args)
    return argv


# Speculative methods that load no drafter weights (vLLM's config/speculative.py)
NO_DRAFTER_WEIGHTS = frozenset({"ngram", "ngram_gpu", "suffix"})


def pinned_speculative_config(
    spec: Mapping[str, Any], model: str, commit: str
) -> dict[str, Any]:
    """The speculative config with the drafter pinned to the served commit.

    vLLM builds the drafter's ModelConfig with the speculative config's own `revision` (default
    None), never the target's `--revision`: with HF_HUB_OFFLINE=1 and a cache that has no
    refs/main (a pinned commit fetched by the stack), a drafter read from the target's repo
    (MTP heads, or `draft_model` with the same repo) finds nothing, or silently follows
    refs/main to another commit. So when the drafter comes from the served repo and the config
    names no revision, it gets the served commit. Config validation refuses a drafter from
    another repo (the stack fetches only model.repo) and a revision of its own.
    """
    out = dict(spec)
    method = out.get("method")
    if method in NO_DRAFTER_WEIGHTS and "model" not in out:
        return out
    if out.get("model", model) == model and "revision" not in out:
        out["revision"] = commit
    return out


def _stop_vllm_in(container: str) -> str:
    inner = (
        f"if [ -f {VLLM_PID} ]; then p=$(cat {VLLM_PID}); kill $p 2>/dev/null || true; "
        "i=0; while kill -0 $p 2>/dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done; "
        f"kill -9 $p 2>/dev/null || true; rm -f {VLLM_PID}; fi"
    )
    return f"docker exec {q(container)} sh -c {q(inner)} || true"


def vllm_start(
    container: str,
    argv: Sequence[str],
    health_url: str,
    served_model_name: str,
    smoke_prompt: str,
    timeout: int,
    ray_ready_stdout_marker: str,
    non_carry_over: Sequence[str] = (),
    chat_template: str | None = None,
) -> str:
    """On the head: make `vllm serve` run `argv` inside the head Ray container, gate on health.

    Idempotent: a vLLM that is alive with the same argv and the same API key is left running and
    only re-checked, so running the command again never costs a restart. It runs again when its
    text changes (new flags, a replaced Ray container: `ray_ready_stdout_marker` holds their IDs)
    or when recon found the cluster under vLLM broken (VllmServer's restart marker).

    stdin carries the API key (possibly empty); it is written to a root-only file inside the
    container and exported as VLLM_API_KEY by the shell that execs vLLM, so it is never on a
    command line.

    `non_carry_over`: env keys vLLM's Ray executor must not copy from the head to the workers
    (per-node values, nccl.PER_NODE_KEYS). vLLM reads them from
    $VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json; the stack keeps its own config root so
    a file the image may carry elsewhere is left alone.

    `chat_template`: the text of the chat template `argv` names (`--chat-template
    CHAT_TEMPLATE`), written into the container on every run (the same bytes change nothing).
    It is in the script, quoted, and its sha256 in a comment and in the configuration hash, so
    a changed template shows in the preview and restarts vLLM.
    """
    ray_ready_stdout_marker = container_ids(ray_ready_stdout_marker)  # exact form, then a comment
    at = [i for i, a in enumerate(argv) if a == "--chat-template"]
    if bool(at) != (chat_template is not None) or any(
        list(argv[i + 1 : i + 2]) != [CHAT_TEMPLATE] for i in at
    ):
        raise ValueError(f"vllm_start: a chat template's text goes with `--chat-template "
                         f"{CHAT_TEMPLATE}` in argv, and only with it")
    serve = " ".join(q(a) for a in argv)
    keep = json.dumps(sorted(non_carry_over))
    config = f"{serve}\n{keep}"
    template_lines = []
    if chat_template is not None:
        digest = hashlib.sha256(chat_template.encode()).hexdigest()
        config += f"\n{digest}"
        write = (f"umask 022; mkdir -p $(dirname {CHAT_TEMPLATE}); "
                 f"printf '%s' \"$1\" > {CHAT_TEMPLATE}.new && "
                 f"mv {CHAT_TEMPLATE}.new {CHAT_TEMPLATE}")
        template_lines = [
            f"# chat template sha256: {digest}",
            f"docker exec {q(container)} sh -c {q(write)} sh {q(chat_template)}",
        ]
    want = hashlib.sha256(config.encode()).hexdigest()[:16]
    launch = (
        f"mkdir -p $(dirname {VLLM_LOG}) {VLLM_CONFIG_ROOT}; echo $$ > {VLLM_PID}; "
        f"printf '%s\\n' {q(keep)} > {VLLM_CONFIG_ROOT}/ray_non_carry_over_env_vars.json; "
        f"VLLM_CONFIG_ROOT={VLLM_CONFIG_ROOT}; export VLLM_CONFIG_ROOT; "
        f"if [ -s {VLLM_KEY} ]; then VLLM_API_KEY=$(cat {VLLM_KEY}); export VLLM_API_KEY; fi; "
        f"echo {q(START_MARKER)} >> {VLLM_LOG}; exec {serve} >> {VLLM_LOG} 2>&1"
    )
    store_key = f"umask 077; mkdir -p $(dirname {VLLM_KEY}); cat > {VLLM_KEY}.new"
    same = (
        f"test -s {VLLM_PID} && kill -0 $(cat {VLLM_PID}) 2>/dev/null && "
        f"[ \"$(cat {VLLM_ARGV} 2>/dev/null)\" = {want} ] && cmp -s {VLLM_KEY}.new {VLLM_KEY}"
    )
    adopt = f"mv {VLLM_KEY}.new {VLLM_KEY} && echo {want} > {VLLM_ARGV}"
    return "\n".join(
        [
            "set -eu",
            f"# ray containers: {ray_ready_stdout_marker}",
            *template_lines,
            f"docker exec -i {q(container)} sh -c {q(store_key)}",
            f"if docker exec {q(container)} sh -c {q(same)}; then",
            f"  docker exec {q(container)} rm -f {VLLM_KEY}.new",
            "  echo 'vllm serve already runs this configuration: not restarted'",
            "else",
            "  " + _stop_vllm_in(container).replace("\n", "\n  "),
            f"  docker exec {q(container)} sh -c {q(adopt)}",
            f"  docker exec -d {q(container)} sh -c {q(launch)}",
            "fi",
            f"if ! docker exec {q(container)} python3 -c {q(_HEALTH_PY)} {q(health_url)} "
            f"{q(served_model_name)} {q(smoke_prompt)} {int(timeout)} {VLLM_KEY} {VLLM_PID}; then",
            f"  echo '--- last 50 lines of {VLLM_LOG} in {container} ---' >&2",
            f"  docker exec {q(container)} tail -n 50 {VLLM_LOG} >&2 || true",
            "  exit 1",
            "fi",
        ]
    )


# The line each start of vLLM writes first into its log: what follows is this run's.
START_MARKER = "=== spark-vllm: vllm serve starts ==="
NCCL_LINES = 2000  # at most this many NCCL transport lines are read back


def vllm_nccl_lines(container: str, serve_marker: str) -> str:
    """On the head, after the health gate: the NCCL lines about the transport (network choice,
    devices, channels, GPU Direct RDMA) that the running vLLM's log holds since it started,
    its own and its Ray workers' (Ray forwards them with an `(Actor pid=.., ip=..)` prefix).

    `serve_marker` (a hash of vllm-serve's script) is in the text so a vLLM started again
    makes this run again."""
    pattern = "NCCL INFO.*(NET/|Using network|via |GPU Direct RDMA|Init COMPLETE)"
    read = (f"grep -aE {q(pattern + '|^' + START_MARKER + '$')} {VLLM_LOG} "
            f"| awk -v m={q(START_MARKER)} '$0 == m {{n = 0; next}} {{b[n++] = $0}} "
            f"END {{for (i = 0; i < n; i++) print b[i]}}' | tail -n {NCCL_LINES}")
    return "\n".join(
        [
            "set -eu",
            f"# vllm-serve: {q(serve_marker)}",
            f"docker exec {q(container)} sh -c {q(read + ' || true')}",
        ]
    )


def vllm_stop(container: str) -> str:
    return "\n".join(["set -eu", _stop_vllm_in(container), "echo vllm serve stopped"])
