"""The vLLM container's pieces: its `vllm serve` argv, the launcher that hands it the API key,
the API key's file on the head, the health gate after it starts (and the step that records or
puts back a deployment after it) and the NCCL lines of its log."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from config.models import LivenessConfig
from config.serve import SERVE_KEYS, Argv, Place, ServeKey, ServeSettings
from hostscripts.common import (
    container_ids,
    container_name,
    legacy_file_remove,
    payload,
    plain,
    q,
    repo_dir,
    secret_file_write,
    stack_path_remove,
)
from hostscripts.deployment import (
    PAYLOAD_DEFINE,
    GateRestore,
    GateVerdict,
    NodeDeployment,
    run_payload,
)
from hostscripts.firewall import probe_launcher
from hostscripts.guard import PREFER
from hostscripts.paths import (
    GUARD_KILLS_MOUNT,
    HF_MOUNT,
    LEGACY_VLLM_KEY_FILE,
    LIVENESS_STARTS,
    VLLM_KEY,
    StackNames,
)

_HEALTH_PY = payload("vllm_health.py")
_RANK_WATCH_PY = payload("vllm_rank_watch.py")
_LIVENESS_PY = payload("vllm_liveness.py")
# A headless rank stops when the head's /health missed this many checks this far apart (after it
# had answered): about 15-30 s, well inside a head's restart (its API comes back only after
# every rank joined), and more than a busy head's slow answer.
RANK_WATCH_INTERVAL_S = 5
RANK_WATCH_MISSES = 3
# The launcher shell's $0 (its name in `ps`), in every vLLM container of every stack: not a
# container name (those are StackNames'), and fixed so that it changes no container.
LAUNCHER_NAME = "spark-vllm-serve"
# The chat template vLLM reads (`--chat-template`): uploaded into the vLLM container when it is
# created (components/vllm_server.py), so its text is in the preview's diff.
CHAT_TEMPLATE = "/etc/spark-vllm/chat-template.jinja"
# The line each start of vLLM writes first into the container's log: what follows is this run's.
START_MARKER = "=== spark-vllm: vllm serve starts ==="


def vllm_argv(settings: ServeSettings, *, model: str, commit: str, backend: str | None = None,
              node_flags: Sequence[str] = (), drafter: Drafter | None = None) -> list[str]:
    """The `vllm serve` command line of `settings`, one serve key after the other as
    config/serve.py declares them (their Argv and Place). The API key is not here: it comes from
    VLLM_API_KEY.

    `model` at `commit` is what vLLM serves (--revision); `drafter`: the speculative drafter of
    another repo (config model.drafter) and its commit, which its speculative config is pinned
    to; `backend`: vLLM's
    --distributed-executor-backend when not `settings.executor` (a service runs `uni`);
    `node_flags`: this node's place in a multi-node mp run (mp_node_flags), before where it
    listens. `settings.tensor_parallel_size` and `settings.host` must be resolved
    (StackConfig.tensor_parallel_size, config/listen.py).

    A chat template is read by vLLM from CHAT_TEMPLATE, uploaded into the vLLM container
    (components/vllm_server.py)."""
    if settings.tensor_parallel_size is None:
        raise ValueError("vllm_argv: tensor_parallel_size is not resolved "
                         "(StackConfig.tensor_parallel_size)")
    if settings.host is None:  # without --host vLLM listens on every address
        raise ValueError("vllm_argv: host is not resolved (config/listen.py)")
    places: dict[Place, list[str]] = {place: [] for place in Place}
    for key in SERVE_KEYS:
        value = getattr(settings, key.name)
        if key.name == "executor" and backend is not None:
            value = backend
        places[key.flag.place] += _rendered(key, value, model, commit, drafter)
    return ["vllm", "serve", model, *places[Place.MODEL], "--revision", commit,
            *places[Place.FLAGS], *node_flags, *places[Place.LISTEN], *places[Place.LAST]]


def key_flags(name: str, value: Any, *, model: str, commit: str | None) -> list[str]:
    """The `vllm serve` arguments the serve key `name` (a field of config/serve.py) with `value`
    becomes. `commit` None: a speculative config as a recipe holds it, its drafter not pinned
    to the served commit yet (`spark-vllm recipes show`)."""
    return _rendered(next(k for k in SERVE_KEYS if k.name == name), value, model, commit)


def _rendered(key: ServeKey, value: Any, model: str, commit: str | None,
              drafter: Drafter | None = None) -> list[str]:
    """One serve key on the command line (config/serve.Argv says how)."""
    flag, how = key.flag.flag, key.flag.argv
    if how is Argv.ARGS:
        return list(value)
    if how in (Argv.NONE, Argv.NODE) or flag is None:
        return []
    if how is Argv.TOGGLE:
        return [flag if value else "--no-" + flag.removeprefix("--")]
    if how is Argv.SWITCH:
        return [flag] if value else []
    if value is None:
        return []
    if how is Argv.NUMBER:
        return [flag, f"{value:g}"]
    if how is Argv.JSON:
        if not value:
            return []
        spec = (dict(value) if commit is None
                else pinned_speculative_config(value, model, commit, drafter))
        return [flag, json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    if how is Argv.TEMPLATE:
        return [flag, CHAT_TEMPLATE]
    if how is Argv.MODEL_FILE:
        return [flag, str(value) if commit is None else model_file(model, commit, str(value))]
    return [flag, str(value)]


def model_file(repo: str, commit: str, path: str) -> str:
    """Where a file of `repo` at `commit` is inside the stack's containers (the HF cache at
    HF_MOUNT, read-only; the model commands put every file of the commit there)."""
    return f"{HF_MOUNT}/hub/{repo_dir(repo)}/snapshots/{commit}/{path}"


def mp_node_flags(nnodes: int, rank: int, master_addr: str, master_port: int) -> list[str]:
    """vLLM's own multi-node executor: every node runs `vllm serve` with the same flags and its
    rank; the head (rank 0) serves the API, the others run `--headless` (no API server)."""
    flags = ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", master_addr,
             "--master-port", str(master_port)]
    return [*flags, "--headless"] if rank else flags


# Speculative methods that load no drafter weights (vLLM's config/speculative.py)
NO_DRAFTER_WEIGHTS = frozenset({"ngram", "ngram_gpu", "suffix"})


@dataclass(frozen=True)
class Drafter:
    """A speculative drafter of another repo (config model.drafter) at the commit the stack
    fetched and verified on every node."""

    repo: str
    commit: str


def pinned_speculative_config(
    spec: Mapping[str, Any], model: str, commit: str, drafter: Drafter | None = None
) -> dict[str, Any]:
    """The speculative config with the drafter pinned to its commit: the served commit for a
    drafter of the served repo, `drafter.commit` for the declared drafter of another repo.

    vLLM builds the drafter's ModelConfig with the speculative config's own `revision` (default
    None), never the target's `--revision`: with HF_HUB_OFFLINE=1 and a cache that has no
    refs/main (a pinned commit fetched by the stack), a drafter read from the target's repo
    (MTP heads, or `draft_model` with the same repo) finds nothing, or silently follows
    refs/main to another commit. So when the drafter comes from the served repo and the config
    names no revision, it gets the served commit; the declared drafter of another repo gets its
    own. Config validation refuses any other drafter repo (the stack fetches only what it
    declares) and a revision of the config's own.
    """
    out = dict(spec)
    method = out.get("method")
    if method in NO_DRAFTER_WEIGHTS and "model" not in out:
        return out
    if "revision" in out:
        return out
    if out.get("model", model) == model:
        out["revision"] = commit
    elif drafter is not None and out["model"] == drafter.repo:
        out["revision"] = drafter.commit
    return out


@dataclass(frozen=True)
class OomWatch:
    """What a vLLM container does for the node's guard (config/guard.py): vLLM raises its own
    oom_score_adj to `score_adj` (raising needs no privilege; its processes inherit it), so any
    OOM killer takes it first; the watchdog (payloads/vllm_liveness.py) reads the node's kill
    records at `kills` (the guard's folder, mounted read-only) and waits `backoff_seconds`
    before a start that follows an OOM kill."""

    score_adj: int
    backoff_seconds: int
    kills: str = GUARD_KILLS_MOUNT

    def __post_init__(self) -> None:
        if not 0 <= int(self.score_adj) <= 1000 or int(self.backoff_seconds) < 0:
            raise ValueError(f"not an oom_score_adj of 0..1000 and a wait: {self}")


def launcher(score_adj: int | None = None) -> str:
    """The container's entrypoint: `sh -c <launcher> LAUNCHER_NAME <argv...>`. With the stack's
    firewall, vLLM starts only when the node's table answers the launcher's probe
    (hostscripts/firewall.py). The API key is read from its root-only file and exported for vLLM
    (VLLM_API_KEY) by this shell only, so it is in no command line, no `docker inspect` and no
    container environment. `score_adj`: the shell raises its own oom_score_adj first, which vLLM
    (exec'd) and its processes keep."""
    raise_adj = [] if score_adj is None else [
        f"echo {int(score_adj)} > /proc/self/oom_score_adj || "
        "echo 'spark-vllm: could not raise the oom_score_adj of vLLM' >&2"]
    return "; ".join(
        [
            f"echo {q(START_MARKER)}",
            probe_launcher(),
            *raise_adj,
            f"if [ -s {VLLM_KEY} ]; then VLLM_API_KEY=$(cat {VLLM_KEY}); export VLLM_API_KEY; fi",
            'exec "$@"',
        ]
    )


LAUNCHER = launcher()  # without the guard


def serve_entrypoint(head_health_url: str | None = None,
                     guard: OomWatch | None = None) -> list[str]:
    """What precedes the argv in the vLLM container (Docker runs entrypoint + command).

    `head_health_url`: in a `--headless` container (vllm.executor mp), the head's /health; the
    container's main process is then payloads/vllm_rank_watch.py, which ends the container when
    the head's vLLM went away, so Docker starts this rank again to meet the head's next start.
    `guard`: vLLM's oom_score_adj (OomWatch)."""
    shell = ["/bin/sh", "-c", launcher(guard.score_adj if guard else None), LAUNCHER_NAME]
    if head_health_url is None:
        return shell
    return ["python3", "-c", _RANK_WATCH_PY, head_health_url, str(RANK_WATCH_INTERVAL_S),
            str(RANK_WATCH_MISSES), *shell]


def watched_entrypoint(url: str, served_name: str, task: str, liveness: LivenessConfig,
                       guard: OomWatch | None = None) -> list[str]:
    """The entrypoint of a vLLM container that serves the API (the head's, a service's): with
    `liveness.enabled`, payloads/vllm_liveness.py runs the launcher and restarts vLLM when it is
    alive but no longer serves (probing `url`, the container's own vLLM, for `served_name` with
    `task`'s request; the key from the mounted VLLM_KEY file), and records an OOM kill that
    ended it (`guard`: the node's kill records; without, the kernel's kills only); else the
    launcher alone. The watchdog itself keeps the container's oom_score_adj: only vLLM raises
    its own."""
    shell = serve_entrypoint(guard=guard)
    if not liveness.enabled:
        return shell
    kills, backoff = ((guard.kills, guard.backoff_seconds) if guard is not None
                      else ("-", liveness.backoff_seconds))
    return ["python3", "-c", _LIVENESS_PY, url, served_name, task,
            str(liveness.interval_seconds), str(liveness.probe_timeout_seconds),
            str(liveness.failures), VLLM_KEY, LIVENESS_STARTS, str(liveness.backoff_seconds),
            str(liveness.backoff_max_seconds), str(liveness.crash_loop_restarts),
            str(liveness.crash_loop_window_seconds), kills, PREFER, str(backoff), *shell]


def api_key_write(path: str) -> str:
    """On the head (StackNames.vllm_key_file; a service's node for its service_key_file): the
    API key (stdin) into its root-only file, mounted read-only into the vLLM container; prints
    the file's sha256 (a label on the container: a new key restarts it)."""
    return secret_file_write(path, "api key")


def main_key_write(names: StackNames) -> str:
    """On the head: the main vLLM's API key (api_key_write) into the stack's folder, then the
    copy an older version kept at the fixed LEGACY_VLLM_KEY_FILE removed: an upgrade leaves no
    second copy of the secret behind."""
    return "\n".join([api_key_write(names.vllm_key_file),
                      legacy_file_remove(LEGACY_VLLM_KEY_FILE)])


def main_key_remove(names: StackNames) -> str:
    """The main vLLM's key file and the stack's folders, as far as they are empty."""
    return stack_path_remove(names, names.vllm_key_file)


# What makes vLLM serve a service's task (config.ServiceTask): the pooling runner for embed and
# score. Its `--convert auto` picks what the checkpoint needs (vLLM 0.32, vllm/config/model.py
# `_get_default_convert_type`): nothing for a native embedding or classification model, `embed`
# for a *ForCausalLM (Qwen3-Embedding), `classify` for a *ForSequenceClassification (a reranker,
# or a causal LM given that architecture with `--hf-overrides` in extraArgs).
TASK_FLAGS: dict[str, tuple[str, ...]] = {
    "generate": (),
    "embed": ("--runner", "pooling"),
    "score": ("--runner", "pooling"),
}


def service_key_remove(names: StackNames, service: str) -> str:
    """The service's key file and its folders, as far as they are empty (the stack's folder
    stays while another service or the main vLLM keeps a file there)."""
    return stack_path_remove(names, names.service_key_file(service))


def non_carry_over_json(keys: Sequence[str]) -> str:
    """$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json: env keys vLLM's Ray executor must not
    copy from the head to the workers (per-node values, nccl.PER_NODE_KEYS)."""
    return json.dumps(sorted(keys)) + "\n"


def _probe(probe_container: str, health_url: str, served_model_name: str, smoke_prompt: str,
           timeout: int, task: str, dimension: int, key_file: str) -> str:
    """payloads/vllm_health.py run in `probe_container`, the key on stdin from its file."""
    return (f"docker exec -i {q(probe_container)} python3 -c {q(_HEALTH_PY)} {q(health_url)} "
            f"{q(served_model_name)} {q(smoke_prompt)} {int(timeout)}"
            + ("" if task == "generate" else f" {q(task)} {int(dimension)}")
            + f" < {q(key_file)}")


def _watched(container: str, probe: str) -> list[str]:
    """Lines that run `probe` in the background while watching `container`: `$out` holds the
    probe's output; `$fail` says why when vLLM exited or restarted meanwhile (the probe is then
    stopped); `$outcome` is ok or failed."""
    c = q(container)
    state = f"docker inspect -f '{{{{.State.Status}}}} {{{{.RestartCount}}}}' {c}"
    return [
        f"n0=$(docker inspect -f '{{{{.RestartCount}}}}' {c})",
        f"{probe} > \"$out\" 2>&1 &",
        "probe=$!",
        "fail=",
        "while kill -0 $probe 2>/dev/null; do",
        f"  s=$({state} 2>&1 || echo gone)",
        "  case $s in",
        "    \"running $n0\") ;;",
        "    *) fail=\"vllm serve exited while the gate waited (now: $s)\"; "
        "kill $probe 2>/dev/null || true; break ;;",
        "  esac",
        "  sleep 1",
        "done",
        "if [ -z \"$fail\" ] && wait $probe; then outcome=ok; else outcome=failed; fi",
    ]


def vllm_health_gate(
    container: str,
    probe_container: str,
    ids_marker: str,
    health_url: str,
    served_model_name: str,
    smoke_prompt: str,
    timeout: int,
    *,
    task: str = "generate",
    dimension: int = 0,
    key_file: str,
    deployment: GateRestore,
) -> str:
    """On the head, after the vLLM container is created: wait for `/health`, `/v1/models`
    listing the served name and one smoke completion (payloads/vllm_health.py, run in
    `probe_container`, the Ray head container, which shares the host network and outlives
    vLLM's restarts).

    A container stopped behind the stack (recon's restart reason) is started first. Docker
    restarts the container whenever vLLM exits (its restart policy); the gate watches the
    container while it waits and stops as soon as vLLM exits or restarts, so a setting vLLM dies
    of is known in seconds, not after the timeout. The API key reaches the probe on stdin
    from its root-only file.

    The gate does not fail the `up` itself (issue 49): payloads/deployment.py `gate` keeps its
    verdict on the node (with vLLM's log tail when it failed) and prints it as one JSON line;
    on a failure with `deployment` restorable it first puts this node's containers of the last
    verified deployment back. The model's `-deployment-<node>` steps follow it
    (`vllm_deployment_final` fails the `up`).

    `ids_marker`: the vLLM and Ray container IDs, so a replaced container re-runs the gate.
    `task`/`dimension`: a service's smoke request (an embedding of `dimension` values when that
    is known, two scores) instead of a completion; `key_file`: where its node keeps the key.
    """
    ids_marker = container_ids(ids_marker)
    c = q(container)
    probe = _probe(probe_container, health_url, served_model_name, smoke_prompt, timeout, task,
                   dimension, key_file)
    return "\n".join(
        [
            "set -eu",
            f"# containers: {ids_marker}",
            f"if [ \"$(docker inspect -f '{{{{.State.Running}}}}' {c})\" != true ]; then",
            f"  docker start {c} >/dev/null",
            "fi",
            "out=$(mktemp)",
            "logs=$(mktemp)",
            "trap 'rm -f \"$out\" \"$logs\"' EXIT",
            *_watched(container, probe),
            "if [ $outcome = failed ]; then",
            "  [ -n \"$fail\" ] || fail=$(tail -n 20 \"$out\")",
            f"  docker logs --tail 2000 {c} > \"$logs\" 2>&1 || true",
            "fi",
            PAYLOAD_DEFINE,
            run_payload("gate", deployment.args(), "\"$outcome\"", "\"$out\"", "\"$fail\"",
                        "\"$logs\""),
        ]
    )


def vllm_deployment_final(
    node: NodeDeployment,
    verdict: GateVerdict,
    others: Mapping[str, str],
    *,
    api_container: str,
    probe_container: str,
    health_url: str,
    served_model_name: str,
    smoke_prompt: str,
    timeout: int,
    task: str = "generate",
    dimension: int = 0,
    key_file: str,
    facts: Mapping[str, Any],
) -> str:
    """On the node of a model's API, after the gate and the model's other nodes' steps
    (hostscripts/deployment.node_step; `others`: what each did): a pass records this node's
    containers and the deployment's summary (verified.json), printed as JSON (the stack output
    `deployment`). A failure fails the `up` with the new version's failure (why and log tail,
    kept by the gate) and, when the last verified deployment was put back everywhere, waits until
    it answers the gate's probe again and says "serving the last verified deployment again".
    Its text changes with every run of the gate (the ids), so it runs exactly then."""
    if verdict.ok:
        return "\n".join(["set -eu", PAYLOAD_DEFINE, run_payload("final", node.args(
            mode="ok", deployment=verdict.deployment, container=container_name(api_container),
            facts=dict(facts)))])
    fail_args = node.args(mode="failed", container=container_name(api_container),
                          nodes=dict(others), restore=verdict.restore)
    probe = _probe(probe_container, health_url, served_model_name, smoke_prompt, timeout, task,
                   dimension, key_file)
    return "\n".join(
        [
            "set -eu",
            PAYLOAD_DEFINE,
            "rc=0",
            run_payload("final", fail_args) + " || rc=$?",
            "[ $rc -eq 2 ] || exit 1",
            "out=$(mktemp)",
            "trap 'rm -f \"$out\"' EXIT",
            *_watched(api_container, probe),
            "if [ $outcome = ok ]; then",
            "  " + run_payload("restored", fail_args) + " || true",
            "else",
            "  echo \"the last verified deployment did not answer again either: "
            "${fail:-$(tail -n 5 \"$out\")}\" >&2",
            "fi",
            "exit 1",
        ]
    )


def vllm_ranks_restart(container: str) -> str:
    """On the head (vllm.executor mp), when recon found one of the stack's vLLM ranks stopped:
    restart the head's vLLM, so that every rank starts again together. A head that kept running
    holds the dead rank (its next request would fail), and a rank started again alone waits on
    that head; the headless ranks follow the head's restart (payloads/vllm_rank_watch.py). The
    reason arrives on stdin and is printed; the health gate runs after this."""
    c = q(container)
    return "\n".join(
        [
            "set -eu",
            "why=$(cat)",
            f"echo \"restarting vllm serve in {plain(container)}: $why\"",
            f"docker restart -t 60 {c} >/dev/null",
        ]
    )


NCCL_LINES = 2000  # at most this many NCCL transport lines are read back


def vllm_nccl_lines(container: str, serve_marker: str) -> str:
    """On the head, after the health gate: the NCCL lines about the transport (network choice,
    devices, channels, GPU Direct RDMA) that the vLLM container's log holds since vLLM last
    started, its own and its Ray workers' (Ray forwards them with an `(Actor pid=.., ip=..)`
    prefix).

    `serve_marker` (the vLLM container's ID and the gate's run) is in the text so a vLLM started
    again makes this run again."""
    pattern = ("NCCL INFO.*(NET/|Using network|via |GPU Direct RDMA|Init COMPLETE|P2P plugin"
               "|NET plugin)")
    return "\n".join(
        [
            "set -eu",
            f"# vllm-serve: {q(serve_marker)}",
            f"{{ docker logs {q(container)} 2>&1 || true; }} "
            f"| grep -aE {q(pattern + '|^' + START_MARKER + '$')} "
            f"| awk -v m={q(START_MARKER)} '$0 == m {{n = 0; next}} {{b[n++] = $0}} "
            f"END {{for (i = 0; i < n; i++) print b[i]}}' | tail -n {NCCL_LINES}",
        ]
    )
