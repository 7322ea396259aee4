"""The base of every config model, and the value types the models share: each type carries its
form and its message, so a field declares what it holds in one annotation and no model repeats a
validator (after alan-turing-institute/data-safe-haven's types/annotated_types.py).

Every message reads as the `expected ...` half of a config error: config/errors.py puts the key
path and the value before it.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt
from pydantic.alias_generators import to_camel

from config import recipe_files
from config.forms import (
    IMAGE_ID,
    check_port,
    check_ref_name,
    check_repo_path,
    secret_env_name,
    secret_value,
)


class ConfigModel(BaseModel):
    """A section of the stack config (or a recipe): frozen, unknown keys refused, camelCase in
    the file and snake_case here."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )

    @classmethod
    def accepted_keys(cls) -> list[str]:
        """The keys this section takes, as the file spells them (an unknown key's message)."""
        return [f.alias or n for n, f in cls.model_fields.items()]


def ipv4(v: str) -> str:
    try:
        return str(ipaddress.IPv4Address(v))
    except (ipaddress.AddressValueError, ValueError):
        raise ValueError("expected an IPv4 address such as 192.168.177.11") from None


_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def _repo(v: str) -> str:
    if not _REPO_ID.fullmatch(v):
        raise ValueError("expected a Hugging Face repo id '<org>/<name>'")
    return v


def _revision(v: str) -> str:
    problem = check_ref_name(v)
    if problem:
        raise ValueError(f"expected a branch, tag or 40-hex commit ({problem})")
    return v


def _served_name(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", v):
        raise ValueError("expected a model name of letters, digits, '.', '_', '-', '/'")
    return v


def _fraction(v: float) -> float:
    if not 0 < v < 1:
        raise ValueError("expected a fraction strictly between 0 and 1, e.g. 0.80")
    return v


def _vllm_word(v: str) -> str:
    if not re.fullmatch(r"[a-z0-9_]+", v):
        raise ValueError("expected a vLLM value of lowercase letters, digits and '_'")
    return v


def _parser(v: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_]{0,63}", v):
        raise ValueError("expected the name of a parser built into vLLM, e.g. qwen3 or "
                         "qwen3_coder (lowercase letters, digits and '_')")
    return v


_PLUGIN_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*\.py")


def _plugin_file(v: str) -> str:
    if check_repo_path(v) is not None or not _PLUGIN_FILE.fullmatch(v) or len(v) > 255:
        raise ValueError("expected the path of a Python file inside the model repository, e.g. "
                         "nano_v3_reasoning_parser.py (relative, letters, digits, '_', '.', "
                         "'-', ending .py)")
    return v


def _chat_template(v: str) -> str:
    recipe_files.chat_template_text(v)  # a shipped template, readable: RecipeError otherwise
    return v


# An image reference as Docker reads it: [registry[:port]/]path[:tag][@sha256:<64 hex>]
IMAGE_REF = re.compile(
    r"[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9-]+)*(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    rf"(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(@{IMAGE_ID.pattern})?"
)


def _image_ref(v: str) -> str:
    if not IMAGE_REF.fullmatch(v):
        raise ValueError(
            "expected an image reference such as registry:5000/name@sha256:<64 hex> or "
            "registry:5000/name:tag"
        )
    return v


_PEM_CERT = re.compile(
    r"-----BEGIN CERTIFICATE-----\n([A-Za-z0-9+/=\n]+)-----END CERTIFICATE-----\n?")


def _pem_certificates(v: str) -> str:
    """One or more PEM certificates (the server's first, then its chain), nothing else."""
    text = v.replace("\r\n", "\n").strip() + "\n"
    if "PRIVATE KEY" in text:
        raise ValueError("expected certificates only: the private key is the secret "
                         "spark-vllm:gatewayTlsKey (pulumi config set --secret "
                         "gatewayTlsKey < key.pem), never the stack file")
    pos, blocks = 0, 0
    while pos < len(text):
        m = _PEM_CERT.match(text, pos)
        if m is None:
            raise ValueError("expected PEM certificates (-----BEGIN CERTIFICATE----- ... "
                             "-----END CERTIFICATE-----, the server's first, then its chain)")
        try:
            base64.b64decode("".join(m.group(1).split()), validate=True)
        except ValueError:
            raise ValueError("expected PEM certificates: a block is not base64") from None
        blocks += 1
        pos = m.end()
        while pos < len(text) and text[pos] == "\n":
            pos += 1
    if not blocks:
        raise ValueError("expected at least one PEM certificate")
    return text


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _plain_env(v: dict[str, str]) -> dict[str, str]:
    bad = [k for k in v if not _ENV_NAME.fullmatch(k)]
    if bad:
        raise ValueError(f"expected environment variable names, got {bad}")
    secret = sorted(k for k, val in v.items() if secret_env_name(k) or secret_value(val))
    if secret:
        raise ValueError(
            f"expected no secrets in plain environment ({', '.join(secret)}): they would reach "
            "the state, the containers and `docker inspect`; use the secrets "
            "spark-vllm:hfToken / spark-vllm:vllmApiKey"
        )
    control = sorted(k for k, val in v.items() if any(ord(c) < 32 for c in val))
    if control:
        raise ValueError(f"expected values without control characters ({', '.join(control)})")
    return v


# nccl.extraEnv (and a recipe's env/launcherEnv, merged into it) reaches every Ray and vLLM
# container of every node. What it may hold (docs/design.md "What extraEnv may set"): the
# families of the libraries the stack runs (vLLM's own, torch's, OpenMP's, CUDA's and the
# communication libraries'), less the names that make a library load code, read or write a file
# or folder, or reach or open an address, and less a short list of names, each with its reason
# (EXTRA_ENV_DENIED). Whether a VLLM_* name is one the serving image's vLLM reads is the image's
# to say: the serve check in the image (hostscripts/payloads/image_probe.py) refuses a declared
# variable its vLLM does not know, naming it. Anything outside the families (PYTHONPATH,
# LD_PRELOAD, a launcher's own variables) is refused.
# Environment nccl.extraEnv and a recipe may not set: what the stack derives per node
# (components/nccl.node_env), what the Ray and vLLM containers get from the stack
# (components/ray_cluster.py, components/vllm_server.py, hostscripts/vllm.py). A recipe value
# would override a value the stack validated, or be overridden itself without a word.
# tests/unit/components/test_containers.py keeps this in step with what the containers get.
STACK_ENV = frozenset({
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
    "VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS", "MASTER_ADDR",
    "RAY_memory_monitor_refresh_ms", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "RAY_DEDUP_LOGS",
    "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_IGNORE_CPU_AFFINITY",
    "HF_HOME", "HF_HUB_OFFLINE", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "VLLM_CACHE_ROOT",
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH",
    "VLLM_CONFIG_ROOT", "VLLM_API_KEY", "VLLM_RPC_BASE_PATH", "RAY_ADDRESS", "VLLM_PORT",
    "SPARK_VLLM_FIREWALL_PROBE", "AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT",
})
EXTRA_ENV_FAMILIES = ("VLLM_", "TORCH_", "PYTORCH_", "OMP_", "CUDA_", "NCCL_", "UCX_", "GLOO_")
# A name that says the variable loads code (a plugin, module or library; a preload), names a
# file, folder or home to read or write, reaches or opens an address (a host, IP, port, URL,
# endpoint, server, a remote or Redis cache), or runs a command.
_LOADS_CODE_OR_OPENS_A_DOOR = re.compile(
    r"PLUGIN|MODULE|LIBRAR|PRELOAD|REMOTE|REDIS"
    r"|_(FILE|PATH|DIR|DIRECTORY|LIB|SO|HOME|ROOT|FOLDER)S?(_|$)"
    r"|_(HOST|HOSTNAME|IP|ADDR|ADDRESS|PORT|URL|URI|ENDPOINT|SERVER)S?(_|$)|_SOCKETS?$"
    r"|_(COMMAND|CMD|EXEC|SCRIPT)(_|$)")
EXTRA_ENV_DENIED: dict[str, str] = {
    "VLLM_SERVER_DEV_MODE": "opens vLLM's development routes (/reset_prefix_cache, /sleep, "
                            "/collective_rpc...) beside the API",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "lets vLLM's processes unpickle what they receive "
                                         "(pickle runs code)",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "opens routes that load LoRA adapters from any path or "
                                        "repository at request time",
    "VLLM_LORA_RESOLVER_HF_REPO_LIST": "loads LoRA adapters from hub repositories at request "
                                       "time, beside what the stack fetched and verified",
    "VLLM_USE_MODELSCOPE": "fetches models from ModelScope instead of the cache the stack "
                           "filled and verified",
    "VLLM_TRACE_FUNCTION": "traces every call into files on the node",
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": "writes every response's content into the log, "
                                          "which `spark-vllm logs` and anyone reading it see",
    "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": "copies the driver's variables to every Ray worker, over "
                                       "the per-node ones the stack sets",
    "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "copies the driver's variables to every Ray "
                                               "worker, over the per-node ones the stack sets",
    "VLLM_ASSETS_CACHE": "a folder vLLM downloads assets into and reads them from",
    "VLLM_MEDIA_CACHE": "a folder vLLM writes fetched media into and reads them from",
    "VLLM_MEDIA_CONNECTOR": "chooses the class that fetches media (a connector of its own "
                            "registry)",
    "VLLM_ENABLE_RESPONSES_API_STORE": "keeps every response in the API server's memory, "
                                       "retrievable by ID",
    "CUDA_VISIBLE_DEVICES": "Ray and vLLM give each rank its GPU; another list hides it",
    "NCCL_COMM_ID": "makes NCCL's bootstrap listen on the address it names",
}
# VLLM_DP_*: data parallelism's rank, size and master address: replicas that open a coordination
# listener of their own (the stack runs one replica; the parallelism is its own keys')
_DENIED_PREFIXES = {"VLLM_DP_": "data parallelism's ranks and master address: replicas that "
                                "open a coordination listener of their own"}


# Names of the allowed families that run a command, write a file or choose a listener, each with
# what it does (issue 46, item 10; read in UCX's src/ucs/config/global_opts.c and
# src/ucs/debug/debug.c, and NCCL's src/ras/client_support.cc and src/bootstrap.cc, at
# https://github.com/openucx/ucx and https://github.com/NVIDIA/nccl). The stack's own
# variables (config.recipes.STACK_ENV: NCCL_SOCKET_IFNAME, NCCL_IB_HCA, UCX_NET_DEVICES, ...)
# are refused in nccl.extraEnv on their own (config.models.NcclConfig).
EXTRA_ENV_REFUSED: dict[str, str] = {
    "UCX_GDB_COMMAND": "a command UCX runs (execvp, with the process's pid) when it handles an "
                       "error in debug mode",
    "UCX_HANDLE_ERRORS": "'debug' runs UCX_GDB_COMMAND (default `gdb -quiet`) on an error, "
                         "'freeze' stops the rank until a debugger attaches",
    "UCX_ERROR_MAIL_TO": "UCX pipes an error report to /usr/lib/sendmail for this address",
    "UCX_ERROR_MAIL_FOOTER": "text UCX adds to the error report it mails",
    "UCX_STATS_DEST": "file:<path> writes a file, udp:<host>:<port> sends to any host",
    "UCX_MEMTRACK_DEST": "file:<path> writes a file",
    "NCCL_RAS_ADDR": "the address NCCL's RAS listens on for clients (loopback by default): "
                     "any other opens an unauthenticated listener beyond the node",
    "NCCL_COMM_ID": "the address NCCL's bootstrap root listens on and every rank connects "
                    "to, outside the stack's rendezvous",
    "NCCL_OOB_NET_IFNAME": "the interface NCCL's bootstrap listens on with its out-of-band "
                           "network: the stack's NCCL_SOCKET_IFNAME (the fabric) decides that",
}


def extra_env_problem(name: str) -> str | None:
    """Why `name` may not be set through nccl.extraEnv or a recipe's env, or None."""
    if name in STACK_ENV:
        return "the stack sets it itself"
    if name in EXTRA_ENV_REFUSED:
        return EXTRA_ENV_REFUSED[name]
    if name in EXTRA_ENV_DENIED:
        return EXTRA_ENV_DENIED[name]
    for prefix, why in _DENIED_PREFIXES.items():
        if name.startswith(prefix):
            return why
    if not name.startswith(EXTRA_ENV_FAMILIES):
        families = ", ".join(f + "*" for f in EXTRA_ENV_FAMILIES)
        return f"not in the families the stack passes ({families})"
    if _LOADS_CODE_OR_OPENS_A_DOOR.search(name):
        return ("names code to load, a file or folder, an address, a port or a command "
                "(PLUGIN, MODULE, _PATH, _DIR, _HOST, _PORT, _URL, ...)")
    return None


def _allowed_env(v: dict[str, str]) -> dict[str, str]:
    owned = sorted(k for k in v if k in STACK_ENV)
    if owned:
        raise ValueError(
            f"expected variables the stack does not set itself ({', '.join(owned)}): the "
            "stack derives them per node from the fabric it configures (components/nccl."
            "node_env) or from its own keys (nccl.debug, nccl.rdma), or sets them in the "
            "containers")
    bad = sorted(k for k in v if extra_env_problem(k) is not None)
    if bad:
        raise ValueError(
            "expected only " + ", ".join(f + "*" for f in EXTRA_ENV_FAMILIES) + " variables, "
            "none that loads code, names a file, folder, address or command, and none of "
            "config.types.EXTRA_ENV_DENIED (" + "; ".join(
                f"{k}: {extra_env_problem(k)}" for k in bad) + "): the values reach every "
            "container of the stack (docs/design.md \"What extraEnv may set\")"
        )
    return v


IPv4 = Annotated[str, AfterValidator(ipv4)]
"""An IPv4 address, normalised (192.168.177.11)."""
Port = Annotated[StrictInt, AfterValidator(check_port)]
"""A TCP port, 1..65535 (an integer, never a string or a bool)."""
RepoId = Annotated[str, AfterValidator(_repo)]
"""A Hugging Face repo id, `<org>/<name>`."""
Revision = Annotated[str, AfterValidator(_revision)]
"""A branch, tag or 40-hex commit (git's ref-name rules: it names a folder in the HF cache)."""
ServedName = Annotated[str, Field(max_length=128), AfterValidator(_served_name)]
"""The name a model is served under (vLLM's --served-model-name)."""
Fraction = Annotated[float, AfterValidator(_fraction)]
"""A share strictly between 0 and 1 (vLLM's --gpu-memory-utilization)."""
VllmWord = Annotated[str, AfterValidator(_vllm_word)]
"""A vLLM enum value such as fp8 or fastsafetensors (--kv-cache-dtype, --load-format)."""
ParserName = Annotated[str, AfterValidator(_parser)]
"""The name of a parser built into vLLM (--reasoning-parser, --tool-call-parser)."""
ModelPluginFile = Annotated[str, AfterValidator(_plugin_file)]
"""A Python file of the model repository (a reasoning parser plugin), loaded from the served
commit's snapshot."""
ChatTemplateName = Annotated[str, AfterValidator(_chat_template)]
"""A chat template shipped in config/recipes_data/ (`<name>.jinja`), readable as a template."""
PlainEnv = Annotated[dict[str, str], AfterValidator(_plain_env)]
"""Environment variables in plain text: names, no secrets, no control characters."""
AllowedEnv = AfterValidator(_allowed_env)
"""The check of nccl.extraEnv and a recipe's env: EXTRA_ENV_FAMILIES less what loads code or
opens a door (extra_env_problem)."""
ExtraEnv = Annotated[PlainEnv, AllowedEnv]
"""nccl.extraEnv: plain environment of the allowed families and names only."""
ImageRef = Annotated[str, AfterValidator(_image_ref)]
"""An image reference, `[registry[:port]/]path[:tag][@sha256:<64 hex>]`."""
PemCertificates = Annotated[str, Field(max_length=65536), AfterValidator(_pem_certificates)]
"""PEM certificates (a server's, then its chain), without any private key."""
