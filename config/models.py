"""The stack configuration as typed, frozen pydantic models: the single source of truth for the
keys, forms and defaults of `Pulumi.<stack>.yaml` (camelCase in the file, snake_case here;
docs/contract.md mirrors them). Validation of single values lives here; rules that span keys
are in config/validate.py, and the error messages that name key paths in config/errors.py.
"""

from __future__ import annotations

import copy
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator
from pydantic.alias_generators import to_camel

from config.forms import (
    COMMIT,
    CONTAINER_NAME,
    GIB,
    IMAGE_ID,
    NAMESPACE,
    OS_RESERVE_BYTES,
    PLACEHOLDER,
    SECRET_KEYS,
    STACK_CONTAINERS,
    check_port,
    check_ref_name,
    credential_in_url,
    is_commit,
    is_digest_ref,
    secret_env_name,
    secret_value,
)

__all__ = ["NAMESPACE", "PLACEHOLDER", "SECRET_KEYS"]  # config.forms', re-exported

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
HOST_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,2}$"
)
# pulumi-command 1.2.1 verifies a pinned RSA host key with the SHA-1 `ssh-rsa` algorithm only,
# which OpenSSH 8.8+ servers (Ubuntu 24.04 on the Sparks) no longer accept, so such a pin can
# never connect (tests/engine/test_command_plugin.py). Pin the ed25519 or ECDSA key instead.
PINNABLE = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PATH = re.compile(r"/[A-Za-z0-9._/-]*")
_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/-]*)?")
_IMAGE_REF = re.compile(
    r"[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9-]+)*(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    rf"(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(@{IMAGE_ID.pattern})?"
)
# A model cache is bind-mounted read-write into every container: never a system folder.
_SYSTEM_DIRS = {"/", "/root", "/home", "/var", "/var/lib", "/opt", "/srv", "/mnt", "/tmp",
                "/usr/local"}
_SYSTEM_TREES = ("/etc", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/share", "/usr/include",
                 "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot", "/dev", "/proc", "/sys",
                 "/run", "/var/run", "/var/lib/docker", "/var/lib/containerd", "/root/.ssh")
MAX_RAY_BYTES = 64 * GIB  # a Spark has 128 GB of unified memory: Ray must not take half
# Upper bounds of vLLM's sizes: far above any real setting on a Spark, low enough that a typo
# (an extra few digits) is refused here rather than met by vLLM at start-up.
MAX_KV_CACHE_BYTES = 512 * GIB
MAX_TOKENS = 2**24  # --max-model-len, --max-num-batched-tokens (16M tokens)
MAX_NUM_SEQS = 65536
# vLLM flags the stack sets from typed keys: extraArgs may not set them again (it would override
# what the stack validated), so the message names the key to use instead.
OWNED_FLAGS = {
    "--host": "spark-vllm:vllm.host", "--port": "spark-vllm:vllm.port",
    "--api-key": "the secret spark-vllm:vllmApiKey",
    "--trust-remote-code": "the stack: off, it never runs a model's own code",
    "--model": "spark-vllm:model.repo", "--revision": "spark-vllm:model.revision",
    "--served-model-name": "spark-vllm:vllm.servedModelName",
    "--tensor-parallel-size": "spark-vllm:vllm.tensorParallelSize",
    "-tp": "spark-vllm:vllm.tensorParallelSize",
    "--pipeline-parallel-size": "spark-vllm:vllm.pipelineParallelSize",
    "-pp": "spark-vllm:vllm.pipelineParallelSize",
    "--distributed-executor-backend": "spark-vllm:vllm.executor",
    "--nnodes": "the stack (the nodes of spark-vllm:nodes, with vllm.executor mp)",
    "-n": "the stack (the nodes of spark-vllm:nodes, with vllm.executor mp)",
    "--node-rank": "the stack (with vllm.executor mp)",
    "-r": "the stack (with vllm.executor mp)",
    "--master-addr": "the stack (the head's fabric address, with vllm.executor mp)",
    "--master-port": "spark-vllm:vllm.masterPort",
    "--headless": "the stack (every node but the head, with vllm.executor mp)",
    "--gpu-memory-utilization": "spark-vllm:vllm.gpuMemoryUtilization",
    "--kv-cache-memory-bytes": "spark-vllm:vllm.kvCacheMemoryBytes",
    "--max-model-len": "spark-vllm:vllm.maxModelLen",
    "--max-num-seqs": "spark-vllm:vllm.maxNumSeqs",
    "--kv-cache-dtype": "spark-vllm:vllm.kvCacheDtype",
    "--load-format": "spark-vllm:vllm.loadFormat",
    "--speculative-config": "spark-vllm:vllm.speculativeConfig",
    "--enforce-eager": "spark-vllm:vllm.enforceEager",
    "--enable-prefix-caching": "spark-vllm:vllm.enablePrefixCaching",
    "--no-enable-prefix-caching": "spark-vllm:vllm.enablePrefixCaching",
    "--download-dir": "spark-vllm:model.cacheDir",
    "--max-num-batched-tokens": "spark-vllm:vllm.maxNumBatchedTokens",
    "--language-model-only": "spark-vllm:vllm.languageModelOnly",
    "--no-language-model-only": "spark-vllm:vllm.languageModelOnly",
    "--enable-expert-parallel": "spark-vllm:vllm.enableExpertParallel",
    "--no-enable-expert-parallel": "spark-vllm:vllm.enableExpertParallel",
    "-ep": "spark-vllm:vllm.enableExpertParallel",
    "--reasoning-parser": "spark-vllm:vllm.reasoningParser",
    "--tool-call-parser": "spark-vllm:vllm.toolCallParser",
    "--enable-auto-tool-choice": "spark-vllm:vllm.enableAutoToolChoice",
    "--no-enable-auto-tool-choice": "spark-vllm:vllm.enableAutoToolChoice",
    "--chat-template": "spark-vllm:vllm.chatTemplate (a template shipped in config/recipes_data/)",
}



def owned_flag(arg: str) -> str | None:
    """The OWNED_FLAGS entry `arg` would set in vLLM's parser, or None.

    vLLM's parser (vllm/utils/argparse_utils.py FlexibleArgumentParser, an argparse parser with
    its default allow_abbrev) reads `--api_key` as `--api-key`, `--speculative-config.x` as a
    key of `--speculative-config`, and an unambiguous prefix (`--hos`) as the whole flag; each
    of those spellings is matched here too."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name = arg.split("=", 1)[0]
    if name in OWNED_FLAGS:
        return name
    if not name.startswith("--"):
        return None
    name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    if name in OWNED_FLAGS:
        return name
    prefixed = [f for f in OWNED_FLAGS if f.startswith("--") and f.startswith(name)]
    # more than one: vLLM refuses the ambiguous abbreviation itself
    return prefixed[0] if len(name) > 3 and len(prefixed) == 1 else None

class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


def _ipv4(v: str) -> str:
    try:
        return str(ipaddress.IPv4Address(v))
    except (ipaddress.AddressValueError, ValueError):
        raise ValueError("expected an IPv4 address such as 192.168.177.11") from None


class FabricInterface(_Model):
    """One ConnectX-7 netdev used for NCCL/Ray/fan-out traffic; the first one is primary."""

    interface: str
    ip: str
    hca: str | None = None  # the RoCE device behind the netdev, e.g. rocep1s0f1

    @field_validator("interface")
    @classmethod
    def _ifname(cls, v: str) -> str:
        if not _IFNAME.match(v):
            raise ValueError("expected a Linux interface name (1-15 chars), e.g. enp1s0f1np1")
        if v == "lo":
            raise ValueError("expected a fabric interface (ConnectX-7), not the loopback lo")
        return v

    @field_validator("ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        return _ipv4(v)

    @field_validator("hca")
    @classmethod
    def _hca(cls, v: str | None) -> str | None:
        if v is not None and not _IFNAME.match(v):
            raise ValueError("expected an RDMA device name, e.g. rocep1s0f1")
        return v


class NodeConfig(_Model):
    """One Spark. The first node in the list is the Ray head.

    `host_key` pins the node's SSH host key. When it is left out, the key is read from the file
    in `ssh.knownHostsFile` (pin_host_keys) before anything else runs, so every component sees
    the node with its key pinned either way.
    """

    name: str
    host: str
    port: StrictInt = 22
    user: str = "root"
    host_key: str | None = None
    fabric: list[FabricInterface] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _DNS_LABEL.match(v):
            raise ValueError("expected a DNS-safe name: lowercase letters, digits and '-'")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if re.fullmatch(r"[0-9.]+", v):
            return _ipv4(v)
        if ":" in v:  # the docker provider's ssh://user@host:port URL cannot carry an IPv6 host
            raise ValueError("expected an IPv4 address or a DNS hostname (IPv6 management "
                             "addresses are not supported: give the node a DNS name)")
        if not _HOSTNAME.match(v):
            raise ValueError("expected an IPv4 address or a DNS hostname")
        return v

    @field_validator("port")
    @classmethod
    def _port_range(cls, v: int) -> int:
        return check_port(v)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", v):
            raise ValueError("expected a POSIX user name, e.g. root")
        return v

    @field_validator("host_key")
    @classmethod
    def _host_key(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip()
        if not HOST_KEY.match(v):
            raise ValueError(
                "expected '<type> <base64>' with type ssh-ed25519 or "
                "ecdsa-sha2-nistp256/384/521 (the line from ssh-keyscan without the host)"
            )
        if v.split()[0] not in PINNABLE:
            raise ValueError(
                "expected an ssh-ed25519 or ECDSA host key: an ssh-rsa pin cannot be verified "
                "(pulumi-command offers only SHA-1 ssh-rsa, which OpenSSH 8.8+ refuses); "
                "ssh-keyscan -t ed25519 <host>"
            )
        return v

    @property
    def primary(self) -> FabricInterface:
        return self.fabric[0]

    @property
    def host_key_is_placeholder(self) -> bool:
        return self.host_key is not None and PLACEHOLDER in self.host_key

    @property
    def pinned_host_key(self) -> str:
        """The pinned key; pin_host_keys has filled it in from the known_hosts file if needed."""
        if self.host_key is None:
            raise ValueError(f"node {self.name}: no host key pinned (config.pin_host_keys not run)")
        return self.host_key


class SshConfig(_Model):
    private_key_path: str = "~/.ssh/id_ed25519"
    connect_timeout_seconds: int = Field(default=10, ge=1, le=300)
    # An OpenSSH known_hosts file with the nodes' keys, for nodes whose hostKey is not in the
    # stack file (the lab writes one for its generated keys). Hashed entries are understood.
    known_hosts_file: str | None = None

    @field_validator("known_hosts_file")
    @classmethod
    def _known_hosts(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c in v for c in "\n\r\0")):
            raise ValueError("expected the path of an OpenSSH known_hosts file")
        return v

    @property
    def private_key_file(self) -> Path:
        return Path(os.path.expanduser(self.private_key_path))


class ImageConfig(_Model):
    """`ref` by digest, or by tag outside prod: a tag is resolved to its digest at the registry
    on every run (VllmImage), so the nodes pull the digest and a moved tag shows as a diff."""

    ref: str
    source: Literal["registry", "head"] = "registry"
    # The registry of `ref` speaks plain HTTP (a lab or local mirror); the nodes' Docker daemons
    # must list it under insecure-registries too.
    plain_http_registry: bool = False

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        if not _IMAGE_REF.fullmatch(v):
            raise ValueError(
                "expected an image reference such as registry:5000/name@sha256:<64 hex> or "
                "registry:5000/name:tag"
            )
        return v

    @property
    def by_digest(self) -> bool:
        return is_digest_ref(self.ref)


def _check_repo(v: str) -> str:
    if not _REPO_ID.match(v):
        raise ValueError("expected a Hugging Face repo id '<org>/<name>'")
    return v


def _check_revision(v: str) -> str:
    problem = check_ref_name(v)
    if problem:
        raise ValueError(f"expected a branch, tag or 40-hex commit ({problem})")
    return v


def _check_served_name(v: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", v):
        raise ValueError("expected a model name of letters, digits, '.', '_', '-', '/'")
    return v


class ModelConfig(_Model):
    repo: str
    revision: str = "main"
    cache_dir: str = "/root/.cache/huggingface"
    endpoint: str | None = None

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        return _check_repo(v)

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        return _check_revision(v)

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str) -> str:
        if not v.startswith("/") or not _PATH.fullmatch(v):
            raise ValueError("expected an absolute path of letters, digits and ._-/ on the nodes")
        norm = os.path.normpath(v)
        if norm != (v.rstrip("/") or "/") or "/../" in v + "/":
            raise ValueError(f"expected a normalised path (this one means {norm})")
        if norm in _SYSTEM_DIRS or any(norm == d or norm.startswith(d + "/")
                                       for d in _SYSTEM_TREES):
            raise ValueError("expected a folder of its own, not / or a system folder (it is "
                             "mounted read-write into the containers)")
        return norm

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if credential_in_url(v):
            raise ValueError("expected a URL without credentials (user:password@): the HF "
                             "token is the secret spark-vllm:hfToken")
        if not _URL.fullmatch(v):
            raise ValueError("expected an http(s) URL such as http://10.77.0.1:8090, or null")
        return v.rstrip("/")

    @property
    def pinned(self) -> bool:
        return is_commit(self.revision)


class NcclConfig(_Model):
    rdma: bool = True
    fabric_subnets: list[str] = Field(
        default_factory=lambda: ["192.168.177.0/24", "192.168.178.0/24"], min_length=1
    )
    min_mtu: int = Field(default=9000, ge=576, le=9978)
    # INFO (with NCCL_DEBUG_SUBSYS=INIT,NET: init and network lines only) lets the stack read
    # which transport NCCL chose after serving starts; WARN hides it.
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = "INFO"
    extra_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("fabric_subnets")
    @classmethod
    def _subnets(cls, v: list[str]) -> list[str]:
        out = []
        for s in v:
            try:
                net = ipaddress.IPv4Network(s, strict=True)
            except ValueError:
                raise ValueError(f"expected IPv4 networks in CIDR form, got {s!r}") from None
            if net.prefixlen < 16:
                raise ValueError(f"expected the fabric's own subnets (/16 or narrower), got {s!r}: "
                                 "Ray and NCCL would accept peers from all of it")
            out.append(str(net))
        return out

    @field_validator("extra_env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"expected environment variable names, got {bad}")
        secret = sorted(k for k, val in v.items() if secret_env_name(k) or secret_value(val))
        if secret:
            raise ValueError(
                f"expected no secrets in plain environment ({', '.join(secret)}): they would "
                "reach the state, the containers and `docker inspect`; use the secrets "
                "spark-vllm:hfToken / spark-vllm:vllmApiKey"
            )
        control = sorted(k for k, val in v.items() if any(ord(c) < 32 for c in val))
        if control:
            raise ValueError(f"expected values without control characters ({', '.join(control)})")
        return v

    def networks(self) -> list[ipaddress.IPv4Network]:
        return [ipaddress.IPv4Network(s) for s in self.fabric_subnets]


class RayConfig(_Model):
    port: StrictInt = 6379
    # Ray's default object store is ~30% of RAM; on 128 GB unified memory that is GPU memory
    # (eugr/spark-vllm-docker caps it at 1 GiB: https://github.com/eugr/spark-vllm-docker).
    # vLLM moves tensors through NCCL, so 1 GiB is plenty.
    object_store_bytes: int = Field(default=1 * GIB, ge=75 * 1024 * 1024, le=MAX_RAY_BYTES)
    dashboard: bool = False
    # Removed (0.14): the Ray containers run with ipc_mode=host, so they use the host's /dev/shm
    # and Docker ignores --shm-size; the key claimed a size it never set. Refused with the why.
    shm_bytes: int | None = None
    gpus_per_node: int = Field(default=1, ge=1, le=8)  # one GB10 per Spark
    # Open files per container: sharded checkpoints under Ray need many (eugr/spark-vllm-docker
    # runs its containers with --ulimit nofile=1048576). Docker cannot raise it above the
    # daemon's own hard limit, so hosts with a lower limit (the lab's sandbox allows 20000)
    # set this key.
    nofile: int = Field(default=1048576, ge=1024, le=1048576)

    @field_validator("port")
    @classmethod
    def _port_range(cls, v: int) -> int:
        return check_port(v)

    @field_validator("shm_bytes")
    @classmethod
    def _shm_removed(cls, v: int | None) -> None:
        if v is not None:
            raise ValueError(
                "expected no shmBytes: the key was removed, it never took effect (the Ray "
                "containers share the host's IPC namespace and so its /dev/shm, sized by the "
                "host: `df -h /dev/shm`); delete it from the stack file"
            )
        return None


# Environment a recipe may not set: what the stack derives per node (components/nccl.node_env),
# what the Ray and vLLM containers get from the stack (components/ray_cluster.py,
# components/vllm_server.py, hostscripts/vllm.py). A recipe value would override a value the
# stack validated, or be overridden itself without a word.
# tests/unit/components/test_containers.py keeps this in step with what the containers get.
STACK_ENV = frozenset({
    "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
    "VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS", "MASTER_ADDR",
    "RAY_memory_monitor_refresh_ms", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "RAY_DEDUP_LOGS",
    "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_IGNORE_CPU_AFFINITY",
    "HF_HOME", "HF_HUB_OFFLINE", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "VLLM_CACHE_ROOT",
    "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH",
    "VLLM_CONFIG_ROOT", "VLLM_API_KEY", "VLLM_RPC_BASE_PATH", "RAY_ADDRESS",
})
_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")  # a recipe's name (its file name, no .yaml)
_COMMIT_IN_URL = re.compile(rf"/{COMMIT.pattern}(/|$|#)")
_PINNED_HOSTS = ("https://github.com/", "https://huggingface.co/")


def _check_recipe_env(v: dict[str, str]) -> dict[str, str]:
    """A recipe's environment: plain names, no secrets (as nccl.extraEnv), no control
    characters, nothing the stack sets itself."""
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
    owned = sorted(k for k in v if k in STACK_ENV)
    if owned:
        raise ValueError(
            f"expected variables the stack does not set itself ({', '.join(owned)}): the stack "
            "derives them per node (components/nccl.node_env) or sets them in the containers"
        )
    return v


class ServeSettings(_Model):
    """The serve settings a recipe may set (and so VllmConfig's too, with their defaults there).
    `None` in a recipe: the recipe does not set it. One definition and one validation for both."""

    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1024 * 1024, le=MAX_KV_CACHE_BYTES)
    max_model_len: int | None = Field(default=None, ge=16, le=MAX_TOKENS)
    max_num_seqs: int | None = Field(default=None, ge=1, le=MAX_NUM_SEQS)
    # --max-num-batched-tokens: the tokens one engine step schedules (prefill chunks + decodes)
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    load_format: str | None = None
    speculative_config: dict[str, Any] | None = None
    enforce_eager: bool | None = None
    # --language-model-only: a multimodal checkpoint (Qwen3.5) loads without its vision tower
    language_model_only: bool | None = None
    enable_expert_parallel: bool | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool | None = None
    # A chat template shipped in config/recipes_data/ (`<name>.jinja`); vLLM reads it from a
    # fixed path in the head container (hostscripts/vllm.py). None: the model's own template.
    chat_template: str | None = None
    extra_args: list[str] | None = None

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _util(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < 1:
            raise ValueError("expected a fraction strictly between 0 and 1, e.g. 0.80")
        return v

    @field_validator("kv_cache_dtype", "load_format")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9_]+", v):
            raise ValueError("expected a vLLM value of lowercase letters, digits and '_'")
        return v

    @field_validator("reasoning_parser", "tool_call_parser")
    @classmethod
    def _parser(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9][a-z0-9_]{0,63}", v):
            raise ValueError("expected the name of a parser built into vLLM, e.g. qwen3 or "
                             "qwen3_coder (lowercase letters, digits and '_')")
        return v

    @field_validator("chat_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None:
            from config import recipes  # recipes.py reads the package data (and imports us)

            recipes.chat_template_text(v)  # a shipped template, readable: RecipeError otherwise
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str] | None) -> list[str] | None:
        for arg in v or ():
            flag = owned_flag(arg)
            if flag is not None:
                owner = OWNED_FLAGS[flag]
                how = (" (set that key: the stack validates it there)"
                       if owner.startswith(("spark-vllm:", "the secret")) else "")
                spelled = "" if arg.split("=", 1)[0] == flag else f" (as {arg.split('=', 1)[0]!r})"
                raise ValueError(f"expected flags the stack does not set itself; {flag}{spelled} "
                                 f"is owned by {owner}{how}")
            if arg.split("=", 1)[0] == "--config":
                raise ValueError("expected flags the stack does not set itself; --config reads "
                                 "flags from a file the stack cannot check: give them here or "
                                 "in their typed keys")
            if any(ord(c) < 32 for c in arg):
                raise ValueError(f"expected arguments without control characters, got {arg!r}")
        return v


class RecipeSource(_Model):
    """Where a recipe's values come from: a public URL, pinned to a commit on hosts that have
    commits (GitHub, Hugging Face), or a file of this repository."""

    url: str | None = None
    path: str | None = None
    covers: str  # which values this source supports

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not re.fullmatch(r"https://[A-Za-z0-9.-]+/[^\s]*", v):
            raise ValueError("expected an https URL")
        if v.startswith(_PINNED_HOSTS) and not _COMMIT_IN_URL.search(v):
            raise ValueError("expected a URL pinned to a 40-hex commit (.../blob/<commit>/...)")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and (not _PATH.fullmatch("/" + v) or ".." in v.split("/")):
            raise ValueError("expected a relative path in this repository, e.g. lab/tinymodel.py")
        return v

    @model_validator(mode="after")
    def _one(self) -> RecipeSource:
        if (self.url is None) == (self.path is None):
            raise ValueError("expected exactly one of url or path")
        return self


class Recipe(ServeSettings):
    """A recipe: how to serve one model on the Sparks, as a file in config/recipes_data/
    (`<name>.yaml`, camelCase keys). Serve settings as VllmConfig keys; `env`: environment of
    every vLLM process (vLLM's own and its libraries' settings); `launcherEnv`: environment of
    the launcher (Ray, NCCL) for this model. Both reach every node's Ray container, which runs
    the launcher and hosts vLLM's processes (components/nccl.node_env); the per-node launcher
    values (VLLM_HOST_IP, RAY_OVERRIDE_NODE_IP_ADDRESS, ...) are the stack's own."""

    name: str
    description: str
    model: str  # the Hugging Face repo the recipe was written for
    sources: list[RecipeSource] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    launcher_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("expected a name of lowercase letters, digits, '.' and '-'")
        return v

    @field_validator("model")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not _REPO_ID.match(v):
            raise ValueError("expected a Hugging Face repo id '<org>/<name>'")
        return v

    @field_validator("env", "launcher_env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_recipe_env(v)

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        both = sorted(set(self.env) & set(self.launcher_env))
        if both:
            raise ValueError(f"expected each variable in env or launcherEnv, not both ({both})")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("expected toolCallParser with enableAutoToolChoice (vLLM refuses "
                             "--enable-auto-tool-choice without --tool-call-parser)")
        return self

    def serve_settings(self) -> dict[str, Any]:
        """The serve settings this recipe sets, by field name (copies: VllmConfig keeps them)."""
        return {n: copy.deepcopy(getattr(self, n)) for n in ServeSettings.model_fields
                if n in self.model_fields_set}


def _with_recipe(cls: type[BaseModel], data: Any) -> Any:
    """The recipe's serve settings under the keys the stack file sets (VllmConfig and
    ServiceConfig). An unknown or broken recipe is left to the `recipe` field's validator, which
    names the key path."""
    if not isinstance(data, dict) or not isinstance(data.get("recipe"), str):
        return data
    from config import recipes

    try:
        recipe = recipes.load_recipe(data["recipe"])
    except recipes.RecipeError:
        return data
    given = {n for n, f in cls.model_fields.items() if n in data or (f.alias or n) in data}
    return {**{n: v for n, v in recipe.serve_settings().items() if n not in given}, **data}


def _check_recipe(v: str | None) -> str | None:
    if v is not None:
        from config import recipes

        recipes.load_recipe(v)  # RecipeError: an unknown name or a broken recipe file
    return v


class VllmConfig(ServeSettings):
    """`spark-vllm:vllm`. With `recipe`, the recipe's serve settings fill in every key the
    stack file does not set: an explicit stack-file key wins over the recipe, the recipe over
    the defaults here (config/recipes.py; the recipe's env is merged likewise in validate.py)."""

    served_model_name: str = Field(max_length=128)
    # A recipe shipped in config/recipes_data/ (its file name without .yaml)
    recipe: str | None = None
    # How vLLM spreads over the nodes: `ray` (a Ray cluster, vLLM a Ray driver on the head) or
    # `mp` (vLLM's own multi-node executor: a vLLM container per node, the head's serving the
    # API, the others `--headless`, no Ray). vLLM's own docs:
    # https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html
    executor: Literal["ray", "mp"] = "ray"
    # mp: the head's torch.distributed port the other nodes join (--master-port)
    master_port: StrictInt = 29501
    tensor_parallel_size: int | None = Field(default=None, ge=1)  # None: every GPU / pp
    pipeline_parallel_size: int = Field(default=1, ge=1)
    # 0.80 leaves the OS, Ray and CUDA graphs room on 128 GB unified memory (the community's
    # two-Spark recipes use 0.7-0.85; docs/design.md).
    gpu_memory_utilization: float = 0.80
    # The KV cache's size in bytes (vLLM's --kv-cache-memory-bytes): when set, vLLM sizes the
    # cache to exactly this and ignores gpuMemoryUtilization. vLLM's CPU build (the lab) reads
    # gpuMemoryUtilization as a fraction of ALL memory per worker, so the lab sets this instead.
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1024 * 1024, le=MAX_KV_CACHE_BYTES)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    enforce_eager: bool = False
    language_model_only: bool = False
    enable_expert_parallel: bool = False
    enable_auto_tool_choice: bool = False
    host: str = "0.0.0.0"
    port: StrictInt = 8000
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _apply_recipe(cls, data: Any) -> Any:
        return _with_recipe(cls, data)

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, v: str | None) -> str | None:
        return _check_recipe(v)

    @field_validator("port", "master_port")
    @classmethod
    def _port_range(cls, v: int) -> int:
        return check_port(v)

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str) -> str:
        return _check_served_name(v)

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return _ipv4(v)


# What a service serves, and the flags that make vLLM serve it so (vLLM 0.32's --runner and
# --convert: a pooling model answers /v1/embeddings, a classifier with one label /score and
# /rerank; https://docs.vllm.ai/en/latest/models/pooling_models.html)
ServiceTask = Literal["generate", "embed", "score"]


class ServiceConfig(ServeSettings):
    """One entry of `spark-vllm:services`: another model beside the main one, served by its own
    supervised vLLM container (one per listed node, tensor parallel 1: a Spark has one GPU) with
    its own health gate on the endpoint its task uses. Its share of each node's memory is
    `gpuMemoryUtilization`, which it must set: preflight and the policy pack add every share on
    a node (the main model's too) to the OS reserve and refuse an overflow."""

    name: str = Field(max_length=40)
    repo: str
    revision: str = "main"
    task: ServiceTask
    nodes: list[str] | None = None  # None: the head only
    port: StrictInt
    served_model_name: str | None = Field(default=None, max_length=128)  # None: the name
    recipe: str | None = None
    gpu_memory_utilization: float  # its share of each node's memory (required)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = False  # pooling models do not reuse a prefix
    load_format: str = "auto"
    enforce_eager: bool = False
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _apply_recipe(cls, data: Any) -> Any:
        return _with_recipe(cls, data)

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, v: str | None) -> str | None:
        return _check_recipe(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _DNS_LABEL.fullmatch(v):
            raise ValueError("expected a lowercase DNS label such as embed or rerank (it names "
                             "the service's container and resources)")
        if v in STACK_CONTAINERS:
            raise ValueError(f"expected a name other than the stack's own containers' "
                             f"{list(STACK_CONTAINERS)}: the service's container "
                             f"spark-vllm-<stack>-{v} would take the name of the stack's")
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        return _check_repo(v)

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        return _check_revision(v)

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        return check_port(v)

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str | None) -> str | None:
        return v if v is None else _check_served_name(v)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.name

    @property
    def pinned(self) -> bool:
        return is_commit(self.revision)


class PreflightConfig(_Model):
    foreign_containers: Literal["fail", "stop", "ignore"] = "fail"
    allow_containers: list[str] = Field(default_factory=list)

    @field_validator("allow_containers")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not CONTAINER_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"expected exact container names (no patterns), got {bad}")
        return v

    require_gb10: bool = True
    min_docker_version: str = "20.10"
    recon_timeout_seconds: int = Field(default=30, ge=1, le=600)
    os_reserve_bytes: int = Field(default=OS_RESERVE_BYTES, ge=0)

    @field_validator("min_docker_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not re.fullmatch(r"\d+(\.\d+){0,2}", v):
            raise ValueError("expected a version such as 20.10")
        return v


class HealthConfig(_Model):
    timeout_seconds: int = Field(default=900, ge=10, le=7200)
    smoke_prompt: str = "Say hello"


class StackConfig(_Model):
    environment: Literal["dev", "staging", "prod"] = "dev"
    nodes: list[NodeConfig] = Field(min_length=1)
    ssh: SshConfig = Field(default_factory=SshConfig)
    image: ImageConfig
    model: ModelConfig
    nccl: NcclConfig = Field(default_factory=NcclConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    vllm: VllmConfig
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    services: list[ServiceConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _mp_head_reachable(self) -> StackConfig:
        if (self.vllm.executor == "mp" and len(self.nodes) > 1
                and ipaddress.ip_address(self.vllm.host).is_loopback):
            raise ValueError(
                f"vllm.host: {self.vllm.host} is loopback, but with vllm.executor mp the other "
                "nodes' ranks watch the head's /health to follow its restarts; use 0.0.0.0 or "
                "an address they reach")
        return self

    @property
    def head(self) -> NodeConfig:
        return self.nodes[0]

    @property
    def workers(self) -> list[NodeConfig]:
        return self.nodes[1:]

    @property
    def cluster_gpus(self) -> int:
        return len(self.nodes) * self.ray.gpus_per_node

    @property
    def tensor_parallel_size(self) -> int:
        """The configured TP size, or every GPU divided by the pipeline stages."""
        tp = self.vllm.tensor_parallel_size
        if tp is not None:
            return tp
        return max(1, self.cluster_gpus // self.vllm.pipeline_parallel_size)

    def service_nodes(self, service: ServiceConfig) -> list[str]:
        """The nodes a service runs on (the head when it names none)."""
        return list(service.nodes) if service.nodes is not None else [self.head.name]

    def service_model(self, service: ServiceConfig) -> ModelConfig:
        """The service's model, fetched into the same cache from the same hub as the main one."""
        return self.model.model_copy(update={"repo": service.repo, "revision": service.revision})

    def services_on(self, node: str) -> list[ServiceConfig]:
        return [s for s in self.services if node in self.service_nodes(s)]

    def node(self, name: str) -> NodeConfig:
        return next(n for n in self.nodes if n.name == name)
