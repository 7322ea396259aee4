"""The stack configuration: typed, validated once, before anything touches a host.

Every value the program acts on comes from `Pulumi.<stack>.yaml` under the `spark-vllm`
namespace. The pydantic models below are the single source of truth for keys, defaults and
forms (docs/contract.md mirrors them). A bad value stops the program with a `ConfigError` that
names the key path (`spark-vllm:nodes[1].fabric[0].ip`), the value and the expected form; the
error subclasses `pulumi.RunError`, so the CLI prints the message and no traceback.

Secrets (`hfToken`, `vllmApiKey`, `sshPrivateKey`) never enter these models: `load_secrets`
returns them as secret Outputs that components pass straight to resources.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

NAMESPACE = "spark-vllm"
GIB = 1024**3

SECRET_KEYS = ("hfToken", "vllmApiKey", "sshPrivateKey")

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_HOST_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+={0,2}$"
)
# pulumi-command 1.2.1 verifies a pinned RSA host key with the SHA-1 `ssh-rsa` algorithm only,
# which OpenSSH 8.8+ servers (Ubuntu 24.04 on the Sparks) no longer accept, so such a pin can
# never connect (tests/engine/test_command_plugin.py). Pin the ed25519 or ECDSA key instead.
_PINNABLE = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PLACEHOLDER = "PLACEHOLDER"


class ConfigError(pulumi.RunError):
    """Invalid stack config. The message is complete: key path, value, expected form."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid stack config ({len(problems)} problem(s)):\n{lines}")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


def _check_port(v: int) -> int:
    if not 1 <= v <= 65535:
        raise ValueError("expected a TCP port between 1 and 65535")
    return v


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
    port: int = 22
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
        try:
            return str(ipaddress.IPv6Address(v))
        except ValueError:
            pass
        if not _HOSTNAME.match(v):
            raise ValueError("expected an IPv4/IPv6 address or a DNS hostname")
        return v

    @field_validator("port")
    @classmethod
    def _port_range(cls, v: int) -> int:
        return _check_port(v)

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
        if not _HOST_KEY.match(v):
            raise ValueError(
                "expected '<type> <base64>' with type ssh-ed25519 or "
                "ecdsa-sha2-nistp256/384/521 (the line from ssh-keyscan without the host)"
            )
        if v.split()[0] not in _PINNABLE:
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
        if not v or any(c.isspace() for c in v):
            raise ValueError(
                "expected an image reference such as registry:5000/name@sha256:<64 hex>"
            )
        return v

    @property
    def by_digest(self) -> bool:
        return bool(_DIGEST.search(self.ref))


class ModelConfig(_Model):
    repo: str
    revision: str = "main"
    cache_dir: str = "/root/.cache/huggingface"
    endpoint: str | None = None

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not _REPO_ID.match(v):
            raise ValueError("expected a Hugging Face repo id '<org>/<name>'")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not v or any(c.isspace() for c in v):
            raise ValueError("expected a branch, tag or 40-hex commit")
        return v

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() for c in v):
            raise ValueError("expected an absolute path without spaces on the nodes")
        return v.rstrip("/") or "/"

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("expected an http(s) URL such as http://10.77.0.1:8090, or null")
        return v.rstrip("/") if v else v

    @property
    def pinned(self) -> bool:
        return bool(_COMMIT.match(self.revision))


class NcclConfig(_Model):
    rdma: bool = True
    fabric_subnets: list[str] = Field(
        default_factory=lambda: ["192.168.177.0/24", "192.168.178.0/24"], min_length=1
    )
    min_mtu: int = Field(default=9000, ge=576, le=9978)
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = "WARN"
    extra_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("fabric_subnets")
    @classmethod
    def _subnets(cls, v: list[str]) -> list[str]:
        out = []
        for s in v:
            try:
                out.append(str(ipaddress.IPv4Network(s, strict=True)))
            except ValueError:
                raise ValueError(f"expected IPv4 networks in CIDR form, got {s!r}") from None
        return out

    @field_validator("extra_env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"expected environment variable names, got {bad}")
        return v

    def networks(self) -> list[ipaddress.IPv4Network]:
        return [ipaddress.IPv4Network(s) for s in self.fabric_subnets]


class RayConfig(_Model):
    port: int = 6379
    # Ray's default object store is ~30% of RAM; on 128 GB unified memory that is GPU memory
    # (field notes 2.7). vLLM moves tensors through NCCL, so 1 GiB is plenty.
    object_store_bytes: int = Field(default=1 * GIB, ge=75 * 1024 * 1024)
    dashboard: bool = False
    shm_bytes: int = Field(default=16 * GIB, ge=64 * 1024 * 1024)
    gpus_per_node: int = Field(default=1, ge=1, le=8)  # one GB10 per Spark
    # Open files per container: sharded checkpoints under Ray need many (field notes, problem
    # 16). Docker cannot raise it above the daemon's own hard limit, so hosts with a lower
    # limit (the lab's sandbox allows 20000) set this key.
    nofile: int = Field(default=1048576, ge=1024, le=1048576)

    @field_validator("port")
    @classmethod
    def _port_range(cls, v: int) -> int:
        return _check_port(v)


class VllmConfig(_Model):
    served_model_name: str
    tensor_parallel_size: int | None = Field(default=None, ge=1)  # None: every GPU / pp
    pipeline_parallel_size: int = Field(default=1, ge=1)
    # 0.80 leaves the OS, Ray and CUDA graphs room on 128 GB unified memory (field notes 2.8).
    gpu_memory_utilization: float = 0.80
    max_model_len: int | None = Field(default=None, ge=16)
    max_num_seqs: int | None = Field(default=None, ge=1)
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    speculative_config: dict[str, Any] | None = None
    enforce_eager: bool = False
    host: str = "0.0.0.0"
    port: int = 8000
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("port")
    @classmethod
    def _port_range(cls, v: int) -> int:
        return _check_port(v)

    @field_validator("served_model_name")
    @classmethod
    def _served(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", v):
            raise ValueError("expected a model name of letters, digits, '.', '_', '-', '/'")
        return v

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _util(cls, v: float) -> float:
        if not 0 < v < 1:
            raise ValueError("expected a fraction strictly between 0 and 1, e.g. 0.80")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return _ipv4(v)

    @field_validator("kv_cache_dtype", "load_format")
    @classmethod
    def _word(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9_]+", v):
            raise ValueError("expected a vLLM value of lowercase letters, digits and '_'")
        return v


class PreflightConfig(_Model):
    foreign_containers: Literal["fail", "stop", "ignore"] = "fail"
    allow_containers: list[str] = Field(default_factory=list)
    require_gb10: bool = True
    min_docker_version: str = "20.10"
    recon_timeout_seconds: int = Field(default=30, ge=1, le=600)
    os_reserve_bytes: int = Field(default=8 * GIB, ge=0)

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

    def node(self, name: str) -> NodeConfig:
        return next(n for n in self.nodes if n.name == name)


# ---------------------------------------------------------------------------------------------
# Error reporting


def _key(loc: tuple[Any, ...]) -> str:
    out = f"{NAMESPACE}:"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if i else "") + str(part)
    return out


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the last key of `loc` (for listing the allowed keys)."""
    model: Any = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = next(
            (f for n, f in model.model_fields.items() if (f.alias or n) == part or n == part), None
        )
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next(
            (a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
        if model is None:
            return None
    return model


_EXPECTED = {
    "missing": "a value (this key is required)",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _describe(err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    typ = err["type"]
    value = err.get("input")
    if typ == "extra_forbidden":
        owner = _model_at(loc)
        allowed = (
            ", ".join(f.alias or n for n, f in owner.model_fields.items()) if owner else "see docs"
        )
        return f"{_key(loc)}: unknown key; expected one of: {allowed} (camelCase)"
    if typ == "value_error":
        expected = str(err["msg"]).removeprefix("Value error, ")
    elif typ in _EXPECTED:
        expected = f"expected {_EXPECTED[typ]}"
    elif typ == "literal_error":
        expected = f"expected one of {err.get('ctx', {}).get('expected', '')}"
    elif typ == "too_short":
        expected = f"expected at least {err.get('ctx', {}).get('min_length', 1)} item(s)"
    else:
        msg = str(err["msg"])
        expected = "expected a value that " + (msg[0].lower() + msg[1:]).replace(
            "input should", "should"
        )
    if typ == "missing":
        return f"{_key(loc)}: missing; {expected}"
    return f"{_key(loc)}: got {value!r}; {expected}"


def _cross_checks(cfg: StackConfig) -> list[str]:
    """Rules that span keys: uniqueness, subnets, parallelism, what prod demands."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for i, node in enumerate(cfg.nodes):
        if node.name in seen:
            problems.append(
                f"{_key(('nodes', i, 'name'))}: got {node.name!r}; expected a unique node name "
                f"(also used by nodes[{seen[node.name]}])"
            )
        seen.setdefault(node.name, i)

    nets = cfg.nccl.networks()
    fabric_ips: dict[str, str] = {}
    for i, node in enumerate(cfg.nodes):
        for j, fab in enumerate(node.fabric):
            ip = ipaddress.IPv4Address(fab.ip)
            if not any(ip in n for n in nets):
                problems.append(
                    f"{_key(('nodes', i, 'fabric', j, 'ip'))}: got {fab.ip!r}; expected an address "
                    f"inside spark-vllm:nccl.fabricSubnets {cfg.nccl.fabric_subnets}"
                )
            if fab.ip in fabric_ips:
                problems.append(
                    f"{_key(('nodes', i, 'fabric', j, 'ip'))}: got {fab.ip!r}; expected a fabric "
                    f"address not already used by {fabric_ips[fab.ip]}"
                )
            fabric_ips.setdefault(fab.ip, node.name)

    pp = cfg.vllm.pipeline_parallel_size
    tp = cfg.tensor_parallel_size
    if tp * pp != cfg.cluster_gpus:
        problems.append(
            f"{_key(('vllm', 'tensorParallelSize'))}: got tensorParallelSize={tp} x "
            f"pipelineParallelSize={pp} = {tp * pp}; expected the product to equal the GPUs in the "
            f"cluster: {len(cfg.nodes)} node(s) x ray.gpusPerNode {cfg.ray.gpus_per_node} = "
            f"{cfg.cluster_gpus}"
        )
    if cfg.vllm.port == cfg.ray.port:
        problems.append(
            f"{_key(('vllm', 'port'))}: got {cfg.vllm.port}; expected a port other than "
            "spark-vllm:ray.port (both bind on the head's host network)"
        )

    if cfg.environment == "prod":
        if not cfg.image.by_digest:
            problems.append(
                f"{_key(('image', 'ref'))}: got {cfg.image.ref!r}; expected an image pinned by "
                "digest (<name>@sha256:<64 hex>) in prod"
            )
        if not cfg.model.pinned:
            problems.append(
                f"{_key(('model', 'revision'))}: got {cfg.model.revision!r}; expected a 40-hex "
                "commit in prod (promote the commit resolved in staging)"
            )
        for i, node in enumerate(cfg.nodes):
            if node.host_key_is_placeholder:
                problems.append(
                    f"{_key(('nodes', i, 'hostKey'))}: got {node.host_key!r}; expected the real "
                    "host key (ssh-keyscan -t ed25519 <host>) in prod, not a placeholder"
                )
        if not cfg.nccl.rdma:
            problems.append(
                f"{_key(('nccl', 'rdma'))}: got False; expected true in prod (NCCL over RoCE; "
                "TCP sockets cost most of the interconnect bandwidth)"
            )
    return problems


_KEY_PREFERENCE = ("ssh-ed25519", "ecdsa-sha2-nistp521", "ecdsa-sha2-nistp384",
                   "ecdsa-sha2-nistp256")


def known_host_keys(text: str, host: str, port: int) -> list[str]:
    """The keys an OpenSSH known_hosts text holds for host:port, as '<type> <base64>'.

    Plain (`host`, `[host]:port`, comma lists) and hashed (`|1|salt|hmac`) host fields;
    @revoked lines and @cert-authority lines are never taken as a pin.
    """
    import base64
    import hashlib
    import hmac

    names = {host} if port == 22 else set()
    names.add(f"[{host}]:{port}")
    keys = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[0].startswith("#") or parts[0].startswith("@"):
            continue
        hosts, kind, blob = parts[0], parts[1], parts[2]
        matched = False
        if hosts.startswith("|1|"):
            try:
                _, _, salt, digest = hosts.split("|", 3)
                key = base64.b64decode(salt)
                for name in names:
                    mac = hmac.new(key, name.encode(), hashlib.sha1).digest()
                    if hmac.compare_digest(base64.b64encode(mac).decode(), digest):
                        matched = True
            except ValueError:
                continue
        else:
            matched = bool(names & set(hosts.split(",")))
        candidate = f"{kind} {blob}"
        if matched and kind in _PINNABLE and _HOST_KEY.match(candidate) and candidate not in keys:
            keys.append(candidate)
    keys.sort(key=lambda k: _KEY_PREFERENCE.index(k.split()[0]))
    return keys


def pin_host_keys(cfg: StackConfig) -> StackConfig:
    """Every node with its host key: from the stack file, else from `ssh.knownHostsFile`.

    Raises ConfigError naming the node when neither pins a key (an unpinned node is never
    contacted). When the file holds several keys for a host, the strongest type is pinned.
    """
    if all(n.host_key is not None for n in cfg.nodes):
        return cfg
    path = cfg.ssh.known_hosts_file
    text = None
    if path is not None:
        try:
            text = Path(os.path.expanduser(path)).read_text()
        except OSError as exc:
            raise ConfigError([
                f"{_key(('ssh', 'knownHostsFile'))}: got {path!r}; expected a readable known_hosts "
                f"file ({exc.strerror})"
            ]) from None
    problems, nodes = [], []
    for i, node in enumerate(cfg.nodes):
        if node.host_key is not None:
            nodes.append(node)
            continue
        found = known_host_keys(text, node.host, node.port) if text is not None else []
        if not found:
            where = (f"no entry for {node.host} port {node.port} in {path}" if path
                     else "and spark-vllm:ssh.knownHostsFile is not set")
            problems.append(
                f"{_key(('nodes', i, 'hostKey'))}: missing ({where}); expected the node's SSH host "
                "key ('ssh-keyscan -t ed25519 <host>' without the host name) or a known_hosts file "
                "that lists it"
            )
            continue
        nodes.append(node.model_copy(update={"host_key": found[0]}))
    if problems:
        raise ConfigError(problems)
    return cfg.model_copy(update={"nodes": nodes})


def validate_config(raw: dict[str, Any]) -> StackConfig:
    """Validate a raw mapping of top-level keys; raise ConfigError listing every problem."""
    try:
        cfg = StackConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError([_describe(e) for e in exc.errors()]) from None
    problems = _cross_checks(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def _present_keys() -> set[str]:
    """Every key set under the namespace, read from the SDK's config store (for unknown keys)."""
    from pulumi.runtime import config as rc

    keys = set(rc.CONFIG.get()) | set(rc.get_config_env())
    prefix = f"{NAMESPACE}:"
    return {k[len(prefix) :] for k in keys if k.startswith(prefix)}


def load_config(pulumi_config: pulumi.Config | None = None) -> StackConfig:
    """Read every top-level key of the `spark-vllm` namespace and validate the whole config."""
    conf = pulumi_config or pulumi.Config(NAMESPACE)
    raw: dict[str, Any] = {}
    problems: list[str] = []
    for name, field in StackConfig.model_fields.items():
        key = field.alias or name
        try:
            value = conf.get(key) if key == "environment" else conf.get_object(key)
        except Exception:  # ConfigTypeError: not JSON where a mapping/list is expected
            problems.append(f"{_key((key,))}: got {conf.get(key)!r}; expected a YAML mapping/list")
            continue
        if value is not None:
            raw[key] = value
    known = {f.alias or n for n, f in StackConfig.model_fields.items()} | set(SECRET_KEYS)
    for extra in sorted(_present_keys() - known):
        problems.append(
            f"{_key((extra,))}: unknown key; expected one of: {', '.join(sorted(known))}"
        )
    if problems:
        raise ConfigError(problems)
    return pin_host_keys(validate_config(raw))


# ---------------------------------------------------------------------------------------------
# Secrets


@dataclass(frozen=True)
class Secrets:
    """Secret Outputs. Never plaintext in Python: they flow only into resource inputs."""

    ssh_private_key: pulumi.Output[str]
    hf_token: pulumi.Output[str] | None = None
    vllm_api_key: pulumi.Output[str] | None = None


def load_secrets(cfg: StackConfig, pulumi_config: pulumi.Config | None = None) -> Secrets:
    """Read the secret keys. Outside dev an API key for vLLM is required.

    `sshPrivateKey` falls back to the file at `ssh.privateKeyPath` (the docker provider's ssh
    transport needs that file anyway), read once and wrapped as a secret.
    """
    from pulumi.runtime import config as rc

    conf = pulumi_config or pulumi.Config(NAMESPACE)
    problems = [
        f"{_key((k,))}: set in plaintext; expected a secret (pulumi config set --secret {k} ...)"
        for k in SECRET_KEYS
        if k in _present_keys() and not rc.is_config_secret(f"{NAMESPACE}:{k}")
    ]
    api_key = conf.get_secret("vllmApiKey")
    if api_key is None and cfg.environment != "dev":
        problems.append(
            f"{_key(('vllmApiKey',))}: missing; expected a secret API key for vLLM outside dev "
            "(pulumi config set --secret vllmApiKey ...)"
        )
    ssh_key = conf.get_secret("sshPrivateKey")
    if ssh_key is None:
        path = cfg.ssh.private_key_file
        if path.is_file():
            ssh_key = pulumi.Output.secret(path.read_text())
        else:
            problems.append(
                f"{_key(('sshPrivateKey',))}: missing and {_key(('ssh', 'privateKeyPath'))} "
                f"{str(path)!r} is not a file; expected a secret private key or a readable key file"
            )
    if problems:
        raise ConfigError(problems)
    return Secrets(
        ssh_private_key=ssh_key, hf_token=conf.get_secret("hfToken"), vllm_api_key=api_key
    )


def secret_plaintext(key: str) -> str | None:
    """The decrypted value of a secret key, for the few in-process uses that cannot wait for an
    Output: the hub lookup (HF token) and the SSH key file. Never log or export what it returns.
    """
    from pulumi.runtime import config as rc

    value = rc.get_config(f"{NAMESPACE}:{key}")
    return value or None


def ssh_key_path(cfg: StackConfig) -> str:
    """The private key file recon and the docker provider's ssh transport use.

    The ssh binary needs a file: when the stack holds the key in the secret `sshPrivateKey`, it
    is written (mode 0600, only when changed) to a path that depends only on the project and
    stack, so the docker providers' ssh options do not change from run to run.
    """
    key = secret_plaintext("sshPrivateKey")
    if key is None:
        return str(cfg.ssh.private_key_file)
    folder = Path.home() / ".cache" / "spark-vllm" / "keys"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    path = folder / f"{pulumi.get_project()}.{pulumi.get_stack()}"
    text = key if key.endswith("\n") else key + "\n"
    if not path.exists() or path.read_text() != text:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    return str(path)
