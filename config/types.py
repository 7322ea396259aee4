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
from config.forms import IMAGE_ID, check_port, check_ref_name, secret_env_name, secret_value


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
# container of every node. Only the communication libraries' own families, without the variables
# that make them load a library or plugin or read or write a file, and a short list of exact
# names, each with its reason. Anything else (VLLM_SERVER_DEV_MODE's routes outside the API key
# check, PYTHONPATH or LD_PRELOAD into the model cache, VLLM_PLUGINS, ...) is refused.
EXTRA_ENV_FAMILIES = ("NCCL_", "UCX_", "GLOO_")
_LOADS_OR_NAMES_A_FILE = re.compile(r"PLUGIN|MODULE|_(FILE|PATH|DIR|LIB|SO)(_|$)")
EXTRA_ENV_NAMES: dict[str, str] = {
    "PYTORCH_ALLOC_CONF": "PyTorch's allocator settings (expandable segments on unified memory; "
                          "the 122B recipe sets it)",
    "PYTORCH_CUDA_ALLOC_CONF": "the same settings under the name older PyTorch reads",
    "VLLM_LOGGING_LEVEL": "how much vLLM logs (the lab's recipe sets it)",
    "VLLM_FLASHINFER_MOE_BACKEND": "FlashInfer's MoE kernel choice, for images whose vLLM reads it "
                                   "(config/recipes_data/qwen3.5-122b-a10b-fp8.yaml says why "
                                   "the recipe leaves it out)",
    "VLLM_USE_DEEP_GEMM": "a kernel choice (DeepGEMM for FP8 matmuls)",
    "VLLM_MARLIN_USE_ATOMIC_ADD": "a kernel choice (Marlin's reduction)",
    "VLLM_USE_FLASHINFER_SAMPLER": "a kernel choice (FlashInfer's sampler)",
}


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
    if name in EXTRA_ENV_NAMES:
        return None
    if name in EXTRA_ENV_REFUSED:
        return EXTRA_ENV_REFUSED[name]
    if name.startswith(EXTRA_ENV_FAMILIES):
        if _LOADS_OR_NAMES_A_FILE.search(name):
            return "names a library, plugin or file the library would load, read or write"
        return None
    return "not in the allowed families or names"


def _allowed_env(v: dict[str, str]) -> dict[str, str]:
    bad = sorted(k for k in v if extra_env_problem(k) is not None)
    if bad:
        why = "".join(f"; {k}: {EXTRA_ENV_REFUSED[k]}" for k in bad if k in EXTRA_ENV_REFUSED)
        raise ValueError(
            f"expected only NCCL_*, UCX_*, GLOO_* variables (none that names a library, plugin or "
            f"file, runs a command or chooses a listener) and {', '.join(EXTRA_ENV_NAMES)} "
            f"({', '.join(bad)}): the values reach every container of the stack, where others "
            "could open vLLM's development routes or load code from the model cache "
            f"(docs/design.md \"What extraEnv may set\"){why}"
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
ChatTemplateName = Annotated[str, AfterValidator(_chat_template)]
"""A chat template shipped in config/recipes_data/ (`<name>.jinja`), readable as a template."""
PlainEnv = Annotated[dict[str, str], AfterValidator(_plain_env)]
"""Environment variables in plain text: names, no secrets, no control characters."""
AllowedEnv = AfterValidator(_allowed_env)
"""The check of nccl.extraEnv and a recipe's env: only EXTRA_ENV_FAMILIES and EXTRA_ENV_NAMES."""
ExtraEnv = Annotated[PlainEnv, AllowedEnv]
"""nccl.extraEnv: plain environment of the allowed families and names only."""
ImageRef = Annotated[str, AfterValidator(_image_ref)]
"""An image reference, `[registry[:port]/]path[:tag][@sha256:<64 hex>]`."""
PemCertificates = Annotated[str, Field(max_length=65536), AfterValidator(_pem_certificates)]
"""PEM certificates (a server's, then its chain), without any private key."""
