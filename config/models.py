"""The stack configuration as typed, frozen pydantic models: the single source of truth for the
keys, forms and defaults of `Pulumi.<stack>.yaml` (camelCase in the file, snake_case here;
docs/contract.md mirrors them). Validation of single values lives here; rules that span keys
are in config/validate.py, and the error messages that name key paths in config/errors.py.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from config import recipes
from config.firewall import FirewallConfig
from config.forms import (
    CONTAINER_NAME,
    GIB,
    IMAGE_ID,
    OS_RESERVE_BYTES,
    PLACEHOLDER,
    RUN_DIR,
    STACK_CONTAINERS,
    STATE_DIR,
    credential_in_url,
    is_commit,
    is_digest_ref,
)
from config.gateway import GatewayConfig
from config.guard import GuardConfig
from config.monitoring import MonitoringConfig
from config.recipe_files import RecipeError
from config.serve import MAIN_ONLY_FIELDS, RECIPE_FIELDS, SERVICE_FIELDS, ServeSettings
from config.types import (
    ConfigModel,
    ExtraEnv,
    Fraction,
    IPv4,
    Port,
    RepoId,
    Revision,
    ServedName,
    ipv4,
)

_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# Every pattern is used with fullmatch (config/forms.py): `^...$` with match lets a trailing
# newline through.
_HOSTNAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*")
_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
HOST_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,2}"
)
# pulumi-command 1.2.1 verifies a pinned RSA host key with the SHA-1 `ssh-rsa` algorithm only,
# which OpenSSH 8.8+ servers (Ubuntu 24.04 on the Sparks) no longer accept, so such a pin can
# never connect (tests/engine/test_command_plugin.py). Pin the ed25519 or ECDSA key instead.
PINNABLE = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
_PATH = re.compile(r"/[A-Za-z0-9._/-]*")
_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/-]*)?")
_IMAGE_REF = re.compile(
    r"[a-z0-9]+([._-][a-z0-9]+)*(\.[a-z0-9-]+)*(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    rf"(:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(@{IMAGE_ID.pattern})?"
)
# The model cache (model.cacheDir) is written as root by the model commands on every node and
# mounted into the stack's containers: it may only be a folder of a dedicated root, an
# allow-list (docs/design.md "The model cache folder"), never a class of paths a list of names
# misses. The default HF cache and what is below it, a user's own HF cache, and a folder below
# /data or /srv (where a node's model disks are mounted); not /data or /srv themselves.
CACHE_ROOTS = ("/root/.cache/huggingface",)  # the folder itself or below
CACHE_PARENTS = ("/data", "/srv")  # a folder below, not the folder itself
_HOME_HF_CACHE = re.compile(r"/home/[a-z_][a-z0-9_-]{0,31}/\.cache/huggingface(/.+)?")
CACHE_ALLOWED = ("/root/.cache/huggingface[/...]", "/home/<user>/.cache/huggingface[/...]",
                 "/data/<folder>[/...]", "/srv/<folder>[/...]")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def home_cache_user(path: str) -> str | None:
    """The user whose home holds the cache folder `path` (`/home/<user>/.cache/huggingface...`),
    or None. Such a cache is accepted only when that user is every node's ssh user
    (config/validate.py; payloads/cache_fs.py checks it again on the node, issue 46)."""
    m = _HOME_HF_CACHE.fullmatch(path)
    return path.split("/")[2] if m else None


def cache_dir_problem(path: str) -> str | None:
    """Why a normalised absolute path may not be the model cache, or None.

    The stack's own folders on the nodes (config.forms STATE_DIR and RUN_DIR: every stack's Ray
    token and API key) are refused on their own, with anything in them and every folder above
    them, whatever the allow-list holds."""
    for state in (STATE_DIR, RUN_DIR):
        if _within(path, state) or _within(state, path):
            return (f"expected a folder of a dedicated root ({', '.join(CACHE_ALLOWED)}), never "
                    f"{state}, a folder in it or above it: it holds every stack's secrets")
    if (any(_within(path, r) for r in CACHE_ROOTS)
            or any(path.startswith(p + "/") for p in CACHE_PARENTS)
            or _HOME_HF_CACHE.fullmatch(path)):
        return None
    return (f"expected a folder of a dedicated root ({', '.join(CACHE_ALLOWED)}): the cache is "
            "written as root and mounted into the containers, so it is never a system folder, a "
            "home folder or another program's")

MAX_RAY_BYTES = 64 * GIB  # a Spark has 128 GB of unified memory: Ray must not take half


class FabricInterface(ConfigModel):
    """One ConnectX-7 netdev used for NCCL/Ray/fan-out traffic; the first one is primary."""

    interface: str
    ip: IPv4
    hca: str | None = None  # the RoCE device behind the netdev, e.g. rocep1s0f1

    @field_validator("interface")
    @classmethod
    def _ifname(cls, v: str) -> str:
        if not _IFNAME.fullmatch(v):
            raise ValueError("expected a Linux interface name (1-15 chars), e.g. enp1s0f1np1")
        if v == "lo":
            raise ValueError("expected a fabric interface (ConnectX-7), not the loopback lo")
        return v

    @field_validator("hca")
    @classmethod
    def _hca(cls, v: str | None) -> str | None:
        if v is not None and not _IFNAME.fullmatch(v):
            raise ValueError("expected an RDMA device name, e.g. rocep1s0f1")
        return v


class NodeConfig(ConfigModel):
    """One Spark. The first node in the list is the Ray head.

    `host_key` pins the node's SSH host key. When it is left out, the key is read from the file
    in `ssh.knownHostsFile` (pin_host_keys) before anything else runs, so every component sees
    the node with its key pinned either way.
    """

    name: str
    host: str
    port: Port = 22
    user: str = "root"
    host_key: str | None = None
    fabric: list[FabricInterface] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _DNS_LABEL.fullmatch(v):
            raise ValueError("expected a DNS-safe name: lowercase letters, digits and '-'")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if re.fullmatch(r"[0-9.]+", v):
            return ipv4(v)
        if ":" in v:  # the docker provider's ssh://user@host:port URL cannot carry an IPv6 host
            raise ValueError("expected an IPv4 address or a DNS hostname (IPv6 management "
                             "addresses are not supported: give the node a DNS name)")
        if not _HOSTNAME.fullmatch(v):
            raise ValueError("expected an IPv4 address or a DNS hostname")
        return v

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
        if not HOST_KEY.fullmatch(v):
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


class SshConfig(ConfigModel):
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


class ImageConfig(ConfigModel):
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


class DrafterConfig(ConfigModel):
    """`model.drafter`: the speculative decoding drafter when it is another repository than the
    served one (EAGLE-3 heads, DFlash drafters, `*-assistant` models), which
    `vllm.speculativeConfig.model` names. An artifact like the model: resolved at the hub,
    fetched once at its commit into the same cache (`model.cacheDir`, `model.endpoint`), fanned
    out and verified on every node, counted in the memory fit, promoted pinned, shown by
    `spark-vllm status` (components/model_cache.py)."""

    repo: RepoId
    revision: Revision = "main"

    @property
    def pinned(self) -> bool:
        return is_commit(self.revision)


class ModelConfig(ConfigModel):
    repo: RepoId
    revision: Revision = "main"
    cache_dir: str = "/root/.cache/huggingface"
    endpoint: str | None = None
    drafter: DrafterConfig | None = None

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str) -> str:
        if not v.startswith("/") or not _PATH.fullmatch(v):
            raise ValueError("expected an absolute path of letters, digits and ._-/ on the nodes")
        norm = os.path.normpath(v)
        if norm != (v.rstrip("/") or "/") or "/../" in v + "/":
            raise ValueError(f"expected a normalised path (this one means {norm})")
        problem = cache_dir_problem(norm)
        if problem is not None:
            raise ValueError(problem)
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


class NcclConfig(ConfigModel):
    rdma: bool = True
    fabric_subnets: list[str] = Field(
        default_factory=lambda: ["192.168.177.0/24", "192.168.178.0/24"], min_length=1
    )
    min_mtu: int = Field(default=9000, ge=576, le=9978)
    # INFO (with NCCL_DEBUG_SUBSYS=INIT,NET: init and network lines only) lets the stack read
    # which transport NCCL chose after serving starts; WARN hides it.
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = "INFO"
    extra_env: ExtraEnv = Field(default_factory=dict)

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
    def _not_the_stacks(cls, v: dict[str, str]) -> dict[str, str]:
        """The stack's own variables (config.recipes.STACK_ENV) stay the stack's: extraEnv came
        last and overrode them (issue 46: NCCL_SOCKET_IFNAME could move NCCL off the fabric)."""
        owned = sorted(k for k in v if k in recipes.STACK_ENV)
        if owned:
            raise ValueError(
                f"expected variables the stack does not set itself ({', '.join(owned)}): the "
                "stack derives them per node from the fabric it configures (components/nccl."
                "node_env) or from its own keys (nccl.debug, nccl.rdma), or sets them in the "
                "containers")
        return v

    def networks(self) -> list[ipaddress.IPv4Network]:
        return [ipaddress.IPv4Network(s) for s in self.fabric_subnets]


# NVIDIA's pass marks for all_gather's bus bandwidth between Sparks, from its multi-Spark setup:
# 175 Gb/s for two Sparks (back to back or through a switch), 10 GB/s in a ring of more
NVIDIA_TWO_NODES_GBPS = 21.875
NVIDIA_RING_GBPS = 10.0
MIB = 1024 * 1024


class CollectiveConfig(ConfigModel):
    """The collective bandwidth gate (components/collective.py): after the fabric check and
    before vLLM, the serving image's torch.distributed measures all_gather and all_reduce
    between the nodes (one rank per node, the stack's NCCL environment; Gloo where no GPU).

    `minBusGBps`: the all_gather bus bandwidth (GB/s, nccl-tests' busbw) the gate asks for;
    null: NVIDIA's, 21.875 for two nodes and 10 for more. `enforce`: below it (or unmeasured)
    the up stops before vLLM changes; null: in staging and prod, a warning in dev. The sweep
    runs from `minBytes` to `maxBytes` by factors of 4, each size bounded by the memory the
    nodes have free (recon's MemAvailable / 8). `port`: the ranks' rendezvous on the head's
    fabric address.
    """

    enabled: bool = True
    min_bus_gbps: float | None = Field(default=None, gt=0, le=1000, alias="minBusGBps")
    enforce: bool | None = None
    min_bytes: int = Field(default=1 * MIB, ge=4096, le=GIB)
    max_bytes: int = Field(default=GIB, ge=4096, le=GIB)
    port: Port = 29517
    timeout_seconds: int = Field(default=300, ge=30, le=3600)

    @model_validator(mode="after")
    def _sizes(self) -> CollectiveConfig:
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"minBytes ({self.min_bytes}) is larger than maxBytes "
                             f"({self.max_bytes})")
        return self

    def threshold(self, nodes: int) -> float:
        """The all_gather bus bandwidth the gate asks for (GB/s)."""
        if self.min_bus_gbps is not None:
            return self.min_bus_gbps
        return NVIDIA_TWO_NODES_GBPS if nodes <= 2 else NVIDIA_RING_GBPS

    def enforced(self, environment: str) -> bool:
        """Whether a figure below the threshold (or none at all) stops the up."""
        return self.enforce if self.enforce is not None else environment != "dev"


class FabricConfig(ConfigModel):
    """The ConnectX-7 interfaces' configuration on the nodes (components/fabric.py).

    `manage`: the stack owns each declared fabric interface's IPv4 addresses, MTU and link state
    and a netplan file of its own per interface (the address in nodes[].fabric[].ip with its
    fabricSubnets prefix, `mtu`), and converges them on every `up`. False: today's check-only
    behaviour, for hosts whose network team owns them (preflight then wants them configured).
    `collective`: the collective bandwidth gate (CollectiveConfig).
    """

    manage: bool = True
    mtu: int = Field(default=9000, ge=1280, le=9978)
    collective: CollectiveConfig = Field(default_factory=CollectiveConfig)


class RayConfig(ConfigModel):
    port: Port = 6379
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


class _RecipeApplied(ServeSettings):
    """The serve keys (config/serve.py) with `recipe`: the recipe's serve settings fill in every
    key this section may take from a recipe (`recipe_fills`) that the stack file does not set.
    An explicit stack-file key wins over the recipe, the recipe over the defaults
    (config/recipes.py; the recipe's env is merged likewise in validate.py)."""

    recipe_fills: ClassVar[tuple[str, ...]] = RECIPE_FIELDS

    @model_validator(mode="before")
    @classmethod
    def _apply_recipe(cls, data: Any) -> Any:
        """An unknown or broken recipe is left to the `recipe` key's validator, which names the
        key path."""
        if not isinstance(data, dict) or not isinstance(data.get("recipe"), str):
            return data
        try:
            recipe = recipes.load_recipe(data["recipe"])
        except RecipeError:
            return data
        given = {n for n, f in cls.model_fields.items() if n in data or (f.alias or n) in data}
        fills = {n: v for n, v in recipe.serve_settings().items()
                 if n in cls.recipe_fills and n not in given}
        return {**fills, **data}

    @field_validator("recipe")
    @classmethod
    def _shipped(cls, v: str | None) -> str | None:
        if v is not None:
            recipes.load_recipe(v)  # RecipeError: an unknown name or a broken recipe file
        return v


class VllmConfig(_RecipeApplied):
    """`spark-vllm:vllm`: every serve key of config/serve.py, a recipe's settings filled in."""


# What a service serves, and the flags that make vLLM serve it so (vLLM 0.32's --runner and
# --convert: a pooling model answers /v1/embeddings, a classifier with one label /score and
# /rerank; https://docs.vllm.ai/en/latest/models/pooling_models.html)
ServiceTask = Literal["generate", "embed", "score"]


class ServiceConfig(_RecipeApplied):
    """One entry of `spark-vllm:services`: another model beside the main one, served by its own
    supervised vLLM container (one per listed node, tensor parallel 1: a Spark has one GPU) with
    its own health gate on the endpoint its task uses. Its share of each node's memory is
    `gpuMemoryUtilization`, which it must set: preflight and the policy pack add every share on
    a node (the main model's too) to the OS reserve and refuse an overflow.

    Its serve keys are the ones config/serve.py marks SERVICE (a recipe fills in those only);
    the main model's own (executor, the parallelism, host, ...) are refused as unknown keys."""

    recipe_fills: ClassVar[tuple[str, ...]] = tuple(
        n for n in RECIPE_FIELDS if n in SERVICE_FIELDS)

    name: str = Field(max_length=40)
    repo: RepoId
    revision: Revision = "main"
    task: ServiceTask
    nodes: list[str] | None = None  # None: the head only
    port: Port  # the service's own (its vLLM's --port)
    served_model_name: ServedName = ""  # "": the service's name (_served_as_named fills it in)
    gpu_memory_utilization: Fraction  # its share of each node's memory (required)
    enable_prefix_caching: bool = False  # pooling models do not reuse a prefix

    @classmethod
    def accepted_keys(cls) -> list[str]:
        return [f.alias or n for n, f in cls.model_fields.items() if n not in MAIN_ONLY_FIELDS]

    @model_validator(mode="before")
    @classmethod
    def _served_as_named(cls, data: Any) -> Any:
        """servedModelName defaults to the service's name (a bad name is reported at `name`)."""
        if (isinstance(data, dict) and isinstance(data.get("name"), str)
                and _DNS_LABEL.fullmatch(data["name"])
                and not {"servedModelName", "served_model_name"} & set(data)):
            return {**data, "servedModelName": data["name"]}
        return data

    @field_validator(*MAIN_ONLY_FIELDS, mode="before")
    @classmethod
    def _main_only(cls, v: Any) -> Any:
        raise PydanticCustomError("extra_forbidden", "a key of the main model's only")

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

    @property
    def served_name(self) -> str:
        return self.served_model_name

    @property
    def pinned(self) -> bool:
        return is_commit(self.revision)

class PreflightConfig(ConfigModel):
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


class LivenessConfig(ConfigModel):
    """The liveness watchdog, the main process of the head's vLLM container and of each
    service's (hostscripts/payloads/vllm_liveness.py). Docker restarts a container only when its
    process exits; a vLLM whose engine hangs keeps /health answering 200. Once vLLM has answered,
    a probe every `interval_seconds` (/health; with requests queued one of vLLM's counters must
    have moved, without a 1-token request must answer, each call within
    `probe_timeout_seconds`); `failures` failed probes in a row stop vLLM, and Docker starts the
    container again (for mp every rank: the headless ranks follow the head). An engine that
    hangs while its API server answers (the case measured) is restarted after about
    failures x (interval + probe timeout) seconds; a probe makes at most three calls, so an API
    server that hangs too takes up to failures x (interval + 3 x probe timeout).

    Crash loops: a start of vLLM that follows starts that never answered /health waits first,
    `backoff_seconds` doubling with each such start in a row, at most `backoff_max_seconds`
    (Docker's own backoff resets once a container ran 10 s, which vLLM's start always does).
    More than `crash_loop_restarts` restarts within `crash_loop_window_seconds` is a crash loop:
    `spark-vllm status` shows it and the next `up` warns of it."""

    enabled: bool = True
    interval_seconds: int = Field(default=15, ge=2, le=600)
    probe_timeout_seconds: int = Field(default=30, ge=1, le=600)
    failures: int = Field(default=4, ge=1, le=100)
    backoff_seconds: int = Field(default=10, ge=0, le=3600)
    backoff_max_seconds: int = Field(default=300, ge=0, le=3600)
    crash_loop_restarts: int = Field(default=3, ge=1, le=1000)
    crash_loop_window_seconds: int = Field(default=600, ge=10, le=86400)


class HealthConfig(ConfigModel):
    """The health gates (the main model's, each service's) and the liveness watchdog.

    `on_failure`: what an `up` does when a changed vLLM fails its gate (issue 49, docs/design.md
    "An upgrade that fails"): `restore` puts the last verified deployment back in the same `up`
    (its containers recreated from the record on their nodes) and fails naming the new version's
    failure; `keep` leaves the failing version in place for diagnosis and fails. `restore` in
    every environment by default: dev is where a failing upgrade is seen first, and behaves as
    the stacks it promotes to."""

    timeout_seconds: int = Field(default=900, ge=10, le=7200)
    smoke_prompt: str = "Say hello"
    on_failure: Literal["restore", "keep"] = "restore"
    liveness: LivenessConfig = Field(default_factory=LivenessConfig)


class StackConfig(ConfigModel):
    environment: Literal["dev", "staging", "prod"] = "dev"
    nodes: list[NodeConfig] = Field(min_length=1)
    ssh: SshConfig = Field(default_factory=SshConfig)
    image: ImageConfig
    model: ModelConfig
    nccl: NcclConfig = Field(default_factory=NcclConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    vllm: VllmConfig
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    services: list[ServiceConfig] = Field(default_factory=list)
    gateway: GatewayConfig  # the stack's one endpoint (config/gateway.py)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)  # config/monitoring.py
    firewall: FirewallConfig = Field(default_factory=FirewallConfig)  # config/firewall.py
    guard: GuardConfig = Field(default_factory=GuardConfig)  # config/guard.py

    @model_validator(mode="after")
    def _mp_head_reachable(self) -> StackConfig:
        if (self.vllm.executor == "mp" and len(self.nodes) > 1 and self.vllm.host is not None
                and ipaddress.ip_address(self.vllm.host).is_loopback):
            raise ValueError(
                f"vllm.host: {self.vllm.host} is loopback, but with vllm.executor mp the other "
                "nodes' ranks watch the head's /health to follow its restarts; leave it unset "
                "(the head's fabric address) or set the head's fabric address")
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
        return self.model.model_copy(update={"repo": service.repo, "revision": service.revision,
                                             "drafter": None})

    def drafter_model(self) -> ModelConfig | None:
        """`model.drafter` as a model of its own (the same cache and hub), or None."""
        d = self.model.drafter
        return None if d is None else self.model.model_copy(
            update={"repo": d.repo, "revision": d.revision, "drafter": None})

    def services_on(self, node: str) -> list[ServiceConfig]:
        return [s for s in self.services if node in self.service_nodes(s)]

    def node(self, name: str) -> NodeConfig:
        return next(n for n in self.nodes if n.name == name)
