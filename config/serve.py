"""The serve flags: one declaration per `spark-vllm:vllm.*` key, the single source of what the
key is and where it goes.

Each field of ServeSettings is one key: its name (camelCase in the file), its type with its
bounds (config/types.py), its default (the main model's), and in its `Flag` the vLLM flag it
sets and who may set it:

    environment  the target environment's own (where vLLM listens, the parallelism that must
                 match the nodes): promotion never carries it; every other key is promoted
    recipe       a recipe (config/recipes_data/) may set it
    service      a service (spark-vllm:services) may set it; the others are the main model's

Generated from it, so none can fall out of step: the `vllm serve` argv (hostscripts/vllm.py
vllm_argv, which takes a ServeSettings), the flags `extraArgs` may not set (OWNED_FLAGS), the
keys promotion carries (PROMOTED_KEYS, tools/promote.py), a recipe's keys (config/recipes.py
Recipe), the keys a service refuses (config/models.py ServiceConfig), and the serve-keys table
of the README (markdown_table; tests/unit/config/test_serve.py holds the README to it).

Adding a flag is one field here (its docstring is the README's words for it) plus its sample
in tests/serve_samples.py, from which the tests of every generated part take it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field

from config.forms import GIB, NAMESPACE, secret_flag, secret_value
from config.types import (
    ChatTemplateName,
    ConfigModel,
    Fraction,
    IPv4,
    ModelPluginFile,
    ParserName,
    Port,
    ServedName,
    VllmWord,
)

# Upper bounds of vLLM's sizes: far above any real setting on a Spark, low enough that a typo
# (an extra few digits) is refused here rather than met by vLLM at start-up.
MAX_KV_CACHE_BYTES = 512 * GIB
MAX_TOKENS = 2**24  # --max-model-len, --max-num-batched-tokens (16M tokens)
MAX_NUM_SEQS = 65536


class Argv(enum.Enum):
    """How a key's value lands on `vllm serve` (hostscripts/vllm.py renders each)."""

    VALUE = "flag value, left out when null"
    NUMBER = "flag value, as the shortest decimal"
    TOGGLE = "flag when true, --no-flag when false"
    SWITCH = "flag when true"
    JSON = "flag JSON, the drafter pinned to its commit"
    TEMPLATE = "flag and the uploaded template's path, when set"
    MODEL_FILE = "flag and the file's path in the served commit's snapshot, when set"
    NODE = "with the node's place (vllm.executor mp), not by itself"
    NONE = "nothing: not a flag of vLLM's"
    ARGS = "as given, last"


class Place(enum.IntEnum):
    """Where on the command line, in this order (within a place: the declaration order)."""

    MODEL = 0  # right after the model, before its --revision
    FLAGS = 1
    LISTEN = 2  # after a node's place (vllm.executor mp): where the API listens
    LAST = 3


class Who(enum.Flag):
    """Who, besides the main model's stack file, has a say in a key."""

    NOBODY = 0
    ENVIRONMENT = enum.auto()  # the target environment's own: never promoted
    RECIPE = enum.auto()  # a recipe may set it
    SERVICE = enum.auto()  # a service may set it


ENVIRONMENT, RECIPE, SERVICE = Who.ENVIRONMENT, Who.RECIPE, Who.SERVICE


@dataclass(frozen=True)
class Flag:
    """What a serve key is to vLLM and who may set it (see the module docstring)."""

    flag: str | None  # None: not a flag of vLLM's
    who: Who = Who.NOBODY
    spellings: tuple[str, ...] = ()  # more spellings vLLM reads as this flag
    argv: Argv = Argv.VALUE
    place: Place = Place.FLAGS
    note: str = ""  # said after the key where extraArgs sets its flag

    @property
    def environment(self) -> bool:
        return Who.ENVIRONMENT in self.who

    @property
    def recipe(self) -> bool:
        return Who.RECIPE in self.who

    @property
    def service(self) -> bool:
        return Who.SERVICE in self.who


def _extra_args(v: list[str]) -> list[str]:
    for arg in v:
        flag = owned_flag(arg)
        spelled = _flag_part(arg)
        as_given = "" if spelled == flag else f" (as {spelled!r})"
        if flag is not None and flag in FORBIDDEN_FLAGS:
            raise ValueError(f"expected flags the stack allows; {flag}{as_given} "
                             f"{FORBIDDEN_FLAGS[flag]} (docs/design.md \"What extraArgs may "
                             "set\")")
        if flag is not None:
            owner = OWNED_FLAGS[flag]
            how = (" (set that key: the stack validates it there)"
                   if owner.startswith(("spark-vllm:", "the secret")) else "")
            raise ValueError(f"expected flags the stack does not set itself; {flag}{as_given} "
                             f"is owned by {owner}{how}")
        if secret_flag(arg) or secret_value(arg):
            # never the value in the message: it would reach the logs and the state
            what = arg.split("=", 1)[0] if secret_flag(arg) else "a value shaped like a token"
            raise ValueError(f"expected no secret on vLLM's command line ({what}): the stack "
                             "passes its own as files (spark-vllm:hfToken, spark-vllm:vllmApiKey)"
                             ", and a command line is seen by every process on the node")
        if any(ord(c) < 32 for c in arg):
            raise ValueError(f"expected arguments without control characters, got {arg!r}")
    return v


ExtraArgs = Annotated[list[str], AfterValidator(_extra_args)]
AtLeastOne = Annotated[int, Field(ge=1)]
KvCacheBytes = Annotated[int, Field(ge=1024 * 1024, le=MAX_KV_CACHE_BYTES)]
ModelLen = Annotated[int, Field(ge=16, le=MAX_TOKENS)]
BatchedTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
NumSeqs = Annotated[int, Field(ge=1, le=MAX_NUM_SEQS)]


class ServeSettings(ConfigModel):
    """`spark-vllm:vllm`'s keys, one each, in the order of `vllm serve`'s command line. With
    the main model's defaults; VllmConfig is this plus a recipe, ServiceConfig the keys a service
    may set. It is also what hostscripts/vllm.vllm_argv turns into the command line."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    served_model_name: Annotated[ServedName, Flag(
        "--served-model-name", SERVICE, place=Place.MODEL)]
    """the name the API serves the model under (a service's default: its name)"""
    recipe: Annotated[str | None, Flag(None, SERVICE, argv=Argv.NONE)] = None
    """a recipe shipped in config/recipes_data/: its serve settings fill in the keys the stack
    file does not set (in a service: those it may set), its env and launcherEnv go under
    nccl.extraEnv"""
    tensor_parallel_size: Annotated[AtLeastOne | None, Flag(
        "--tensor-parallel-size", ENVIRONMENT, ("-tp",))] = None
    """GPUs a layer is split over; null: every GPU / pipelineParallelSize"""
    pipeline_parallel_size: Annotated[AtLeastOne, Flag(
        "--pipeline-parallel-size", ENVIRONMENT, ("-pp",))] = 1
    """pipeline stages (tensorParallelSize x this = nodes x ray.gpusPerNode)"""
    executor: Annotated[Literal["ray", "mp"], Flag("--distributed-executor-backend")] = "ray"
    """`ray`: a Ray cluster, vLLM a Ray driver on the head; `mp`: vLLM's own multi-node
    executor, a vLLM container per node, the others `--headless`, no Ray"""
    master_port: Annotated[Port, Flag("--master-port", ENVIRONMENT, argv=Argv.NODE)] = 29501
    """mp: the head's port the other nodes join"""
    gpu_memory_utilization: Annotated[Fraction, Flag(
        "--gpu-memory-utilization", RECIPE | SERVICE, argv=Argv.NUMBER)] = 0.80
    """the share of each node's memory vLLM takes; 0.80 leaves the OS room on 128 GB unified
    memory (required in a service)"""
    kv_cache_memory_bytes: Annotated[KvCacheBytes | None, Flag(
        "--kv-cache-memory-bytes", RECIPE | SERVICE)] = None
    """the KV cache's exact size; vLLM then ignores gpuMemoryUtilization for it"""
    max_model_len: Annotated[ModelLen | None, Flag("--max-model-len", RECIPE | SERVICE)] = None
    """the longest sequence; null: the model's"""
    max_num_seqs: Annotated[NumSeqs | None, Flag("--max-num-seqs", RECIPE | SERVICE)] = None
    """sequences served at once; null: vLLM's default"""
    max_num_batched_tokens: Annotated[BatchedTokens | None, Flag(
        "--max-num-batched-tokens", RECIPE | SERVICE)] = None
    """the tokens one engine step schedules (prefill chunks + decodes)"""
    kv_cache_dtype: Annotated[VllmWord, Flag("--kv-cache-dtype", RECIPE | SERVICE)] = "auto"
    """e.g. fp8"""
    enable_prefix_caching: Annotated[bool, Flag(
        "--enable-prefix-caching", RECIPE | SERVICE, ("--no-enable-prefix-caching",),
        argv=Argv.TOGGLE)] = True
    """reuse the KV cache of a shared prefix (a service's default: false)"""
    load_format: Annotated[VllmWord, Flag("--load-format", RECIPE | SERVICE)] = "auto"
    """e.g. fastsafetensors"""
    trust_remote_code: Annotated[bool, Flag(
        "--trust-remote-code", RECIPE | SERVICE, argv=Argv.SWITCH)] = False
    """run the model repository's own Python code (its config and modeling files), as many
    current models need; only with the model (a service's, the drafter) pinned to a 40-hex
    commit, so the code that runs is the code that was reviewed (the policy pack's
    remote-code-reviewed)"""
    speculative_config: Annotated[dict[str, Any] | None, Flag(
        "--speculative-config", RECIPE | SERVICE, argv=Argv.JSON)] = None
    """e.g. {method: mtp, num_speculative_tokens: 1}; the drafter is the served repo's at the
    served commit, or spark-vllm:model.drafter's (another repo: EAGLE-3 heads, DFlash) at its
    commit"""
    enforce_eager: Annotated[bool, Flag(
        "--enforce-eager", RECIPE | SERVICE, argv=Argv.SWITCH)] = False
    """no CUDA graphs"""
    language_model_only: Annotated[bool, Flag(
        "--language-model-only", RECIPE, ("--no-language-model-only",), argv=Argv.SWITCH)] = False
    """a multimodal checkpoint (Qwen3.5) loads without its vision tower"""
    enable_expert_parallel: Annotated[bool, Flag(
        "--enable-expert-parallel", RECIPE, ("--no-enable-expert-parallel", "-ep"),
        argv=Argv.SWITCH)] = False
    """MoE experts spread over the GPUs instead of split"""
    reasoning_parser: Annotated[ParserName | None, Flag(
        "--reasoning-parser", RECIPE | SERVICE)] = None
    """a parser built into vLLM, e.g. qwen3"""
    reasoning_parser_plugin: Annotated[ModelPluginFile | None, Flag(
        "--reasoning-parser-plugin", RECIPE | SERVICE, argv=Argv.MODEL_FILE,
        note=" (a file of the model repository, with trustRemoteCode)")] = None
    """a reasoning parser the model repository ships as a Python file (e.g.
    nano_v3_reasoning_parser.py), loaded from the served commit; only with trustRemoteCode (it
    is the repository's code)"""
    enable_auto_tool_choice: Annotated[bool, Flag(
        "--enable-auto-tool-choice", RECIPE | SERVICE, ("--no-enable-auto-tool-choice",),
        argv=Argv.SWITCH)] = False
    """the model may call tools by itself (needs toolCallParser)"""
    tool_call_parser: Annotated[ParserName | None, Flag(
        "--tool-call-parser", RECIPE | SERVICE)] = None
    """a parser built into vLLM, e.g. qwen3_coder"""
    chat_template: Annotated[ChatTemplateName | None, Flag(
        "--chat-template", RECIPE | SERVICE, argv=Argv.TEMPLATE,
        note=" (a template shipped in config/recipes_data/)")] = None
    """a `.jinja` shipped in config/recipes_data/, uploaded into the vLLM container; null: the
    model's own"""
    host: Annotated[IPv4 | None, Flag("--host", ENVIRONMENT, place=Place.LISTEN)] = None
    """where the API listens, only where the gateway reaches it: null, the stack's choice
    (127.0.0.1; the head's fabric address with executor mp on more than one node, whose other
    ranks watch its /health); else 127.0.0.1 or a fabric address of the head"""
    port: Annotated[Port, Flag("--port", ENVIRONMENT | SERVICE, place=Place.LISTEN)] = 8000
    """the API's port (required in a service)"""
    extra_args: Annotated[ExtraArgs, Flag(
        None, RECIPE | SERVICE, argv=Argv.ARGS, place=Place.LAST)] = Field(default_factory=list)
    """more `vllm serve` flags; a flag one of these keys owns is refused"""


@dataclass(frozen=True)
class ServeKey:
    """One row of the declaration, as the generators read it."""

    name: str  # the field (snake_case)
    key: str  # as the stack file spells it (camelCase)
    flag: Flag
    default: Any  # the main model's; REQUIRED when the key must be given
    doc: str


REQUIRED = object()


def _keys() -> Iterator[ServeKey]:
    for name, field in ServeSettings.model_fields.items():
        (flag,) = (m for m in field.metadata if isinstance(m, Flag))
        default = (field.default_factory() if field.default_factory is not None  # type: ignore[call-arg]
                   else REQUIRED if field.is_required() else field.default)
        yield ServeKey(name, field.alias or name, flag, default, " ".join(
            (field.description or "").split()))


SERVE_KEYS: tuple[ServeKey, ...] = tuple(_keys())
ENVIRONMENT_KEYS = tuple(k.key for k in SERVE_KEYS if k.flag.environment)
PROMOTED_KEYS = tuple(k.key for k in SERVE_KEYS if not k.flag.environment)
RECIPE_FIELDS = tuple(k.name for k in SERVE_KEYS if k.flag.recipe)
SERVICE_FIELDS = tuple(k.name for k in SERVE_KEYS if k.flag.service)
MAIN_ONLY_FIELDS = tuple(k.name for k in SERVE_KEYS if not k.flag.service)


def _owned() -> dict[str, str]:
    mp = "the stack (with vllm.executor mp)"
    tls = "the gateway (TLS ends there: spark-vllm:gateway.certificate)"
    owned = {
        "--api-key": "the secret spark-vllm:vllmApiKey",
        "--model": "spark-vllm:model.repo", "--revision": "spark-vllm:model.revision",
        "--code-revision": "spark-vllm:model.revision (the code that runs is the served "
                           "commit's)",
        "--download-dir": "spark-vllm:model.cacheDir",
        "--spec-model": f"{NAMESPACE}:vllm.speculativeConfig (its model; another repo is "
                        "spark-vllm:model.drafter)",
        "--spec-method": f"{NAMESPACE}:vllm.speculativeConfig (its method)",
        "--nnodes": "the stack (the nodes of spark-vllm:nodes, with vllm.executor mp)",
        "-n": "the stack (the nodes of spark-vllm:nodes, with vllm.executor mp)",
        "--node-rank": mp, "-r": mp,
        "--master-addr": "the stack (the head's fabric address, with vllm.executor mp)",
        "--headless": "the stack (every node but the head, with vllm.executor mp)",
        **{f: tls for f in ("--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs",
                            "--enable-ssl-refresh", "--ssl-cert-reqs", "--ssl-ciphers")},
    }
    for k in SERVE_KEYS:
        for flag in (k.flag.flag, *k.flag.spellings) if k.flag.flag else ():
            owned[flag] = f"{NAMESPACE}:vllm.{k.key}{k.flag.note}"
    return owned


# vLLM flags the stack sets: extraArgs may not set them again (it would override what the stack
# validated), so the message names the key to use instead.
OWNED_FLAGS: dict[str, str] = _owned()

_DATA_PARALLEL = ("starts data-parallel replicas that coordinate through a listener of their "
                  "own (an address and RPC port beside the API, outside the stack's fabric "
                  "rules); the stack serves one replica")
# vLLM flags no stack sets, because they load code or open a door the security design keeps
# shut (docs/design.md "What extraArgs may set"): refused by name in extraArgs and by the
# importer, and by their argparse destination in the image (the serve check resolves every
# token of extraArgs with vLLM's own parser, so no spelling gets around the list).
FORBIDDEN_FLAGS: dict[str, str] = {
    "--config": "reads flags from a file the stack cannot check: give them here or in their "
                "typed keys",
    "--kv-transfer-config": "imports the KV connector module its JSON names "
                            "(kv_connector_module_path) and opens the connector's side channel",
    "--ec-transfer-config": "imports the encoder-cache connector its JSON names and opens its "
                            "side channel",
    "--kv-events-config": "publishes KV cache events on a ZMQ endpoint it opens",
    "--otlp-traces-endpoint": "sends every request's traces to an outside endpoint",
    "--allowed-local-media-path": "lets a request read files of the node",
    "--grpc": "serves a gRPC API instead of the HTTP one the gateway guards",
    "--grpc-port": "opens a second API listener (gRPC) the gateway does not guard",
    "--uds": "opens the API on a unix socket the gateway does not guard",
    "--tool-server": "lets the model call tool servers (MCP) at the addresses it names",
    "--middleware": "imports and runs ASGI middleware by its import path (code)",
    "--logits-processors": "imports logits processors by their qualified names (code)",
    "--worker-cls": "imports the worker class it names (code)",
    "--worker-extension-cls": "imports the worker extension class it names (code)",
    "--tool-parser-plugin": "loads a Python file as a tool parser (code the image does not "
                            "carry)",
    "--io-processor-plugin": "loads an IO processor plugin (code)",
    "--logging-config": "can load a Python logging configuration, which builds any class it "
                        "names (code); set VLLM_LOGGING_LEVEL instead",
    "--log-config-file": "loads a Python logging configuration, which builds any class it "
                         "names (code); set VLLM_LOGGING_LEVEL instead",
    "--profiler-config": "opens the profiler's start and stop routes and writes traces on the "
                         "node",
    **{f: _DATA_PARALLEL for f in (
        "--data-parallel-size", "-dp", "--data-parallel-rank", "-dpn",
        "--data-parallel-start-rank", "-dpr", "--data-parallel-size-local", "-dpl",
        "--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp",
        "--data-parallel-backend", "-dpb", "--data-parallel-hybrid-lb", "-dph",
        "--data-parallel-external-lb", "-dpe", "--data-parallel-multi-port-external-lb",
        "--data-parallel-supervisor-port")},
}

# Every spelling extraArgs is judged against here (the image judges their destinations)
_KNOWN: tuple[str, ...] = (*OWNED_FLAGS, *FORBIDDEN_FLAGS)
# Single-dash options argparse reads with the value attached (`-n2` is `-n 2`): two characters
_SHORT = tuple(f for f in _KNOWN if len(f) == 2 and f[0] == "-" and f[1] != "-")


def _flag_part(arg: str) -> str:
    return arg.split("=", 1)[0]


def owned_flag(arg: str) -> str | None:
    """The OWNED_FLAGS or FORBIDDEN_FLAGS entry `arg` would set in vLLM's parser, or None.

    vLLM's parser (vllm/utils/argparse_utils.py FlexibleArgumentParser, an argparse parser with
    its default allow_abbrev) reads `--api_key` as `--api-key`, `--speculative-config.x` as a
    key of `--speculative-config`, an unambiguous prefix (`--hos`) as the whole flag, and a
    two-character option with its value attached (`-n2`, `-r1`) as that option; each of those
    spellings is matched here too. The serve check in the image has the last word: it resolves
    every token of extraArgs to its argparse destination (hostscripts/payloads/image_probe.py)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = _flag_part(arg)
    if name in _KNOWN:
        return name
    if not name.startswith("--"):
        base = name.split(".", 1)[0]  # -cc.mode: a key of -cc
        if base in _KNOWN:
            return base
        attached = [f for f in _SHORT if name.startswith(f)]
        return attached[0] if attached else None
    name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    if name in _KNOWN:
        return name
    prefixed = [f for f in _KNOWN if f.startswith("--") and f.startswith(name)]
    # more than one: vLLM refuses the ambiguous abbreviation itself
    return prefixed[0] if len(name) > 3 and len(prefixed) == 1 else None


def markdown_table() -> str:
    """The README's table of the serve keys (between its `serve-keys` markers)."""

    def default(k: ServeKey) -> str:
        if k.default is REQUIRED:
            return "required"
        if k.default is None:
            return "null"
        return f"`{str(k.default).lower() if isinstance(k.default, bool) else k.default}`"

    def yes(v: bool) -> str:
        return "yes" if v else "-"

    rows = ["| `vllm.` key | vLLM flag | default | promoted | recipe | service | meaning |",
            "|---|---|---|---|---|---|---|"]
    for k in SERVE_KEYS:
        flags = ", ".join(f"`{f}`" for f in (k.flag.flag, *k.flag.spellings) if f) or "-"
        promoted = "no (environment)" if k.flag.environment else "yes"
        rows.append(f"| `{k.key}` | {flags} | {default(k)} | {promoted} | {yes(k.flag.recipe)} "
                    f"| {yes(k.flag.service)} | {k.doc} |")
    return "\n".join(rows) + "\n"
