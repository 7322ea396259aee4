"""The spark-vllm CrossGuard rules: every rule and all logic, importable without side effects.

`__main__.py` only builds the PolicyPack (whose constructor starts the analyzer gRPC server and
blocks), so tests import this module instead. Importing it starts nothing.

What the rules review (docs/contract.md "What policies see"): the components' props
(`spark-vllm:<module>:<Class>`), docker containers (camelCase provider props), remote commands.

Two facts about pulumi_policy 1.21.0 shape every rule (see policies/README.md):
* Unknown values: props arrive wrapped in `unknown_checking_proxy`; reading an unknown value raises
  `UnknownValueError`. The helpers below (`get`, `elements`) turn that into `UNKNOWN`, and every
  check skips what it cannot know, so a preview never crashes a rule and never fails on a guess.
* Secrets: `Analyze`/`AnalyzeStack` deserialize with `proxy_secrets=False`, so a secret arrives as
  its plain value, indistinguishable from a plaintext one. A rule cannot ask "is this a secret?";
  the secret rules therefore check where a value sits (command lines, labels, inline shell are never
  safe), whether the stack file holds the key as `secure:`, and optionally that the resource carries
  `additionalSecretOutputs` for the property.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Secret,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import (
    UNKNOWN_ARCHIVE_VALUE,
    UNKNOWN_ARRAY_VALUE,
    UNKNOWN_ASSET_VALUE,
    UNKNOWN_BOOLEAN_VALUE,
    UNKNOWN_NUMBER_VALUE,
    UNKNOWN_OBJECT_VALUE,
    UNKNOWN_STRING_VALUE,
    UnknownValueError,
)

GIB = 1024 ** 3

# Resource types reviewed (docs/contract.md).
VLLM_SERVER = "spark-vllm:vllm_server:VllmServer"
NCCL_ENV = "spark-vllm:nccl:NcclEnvironment"
VLLM_IMAGE = "spark-vllm:vllm_image:VllmImage"
SPARK_NODE = "spark-vllm:spark_node:SparkNode"
MODEL_CACHE = "spark-vllm:model_cache:ModelCache"
CONTAINER = "docker:index/container:Container"
COMMAND_TYPES = ("command:remote:Command", "command:local:Command")

# Defaults of the pack config (also the `default`s in each config_schema).
DEFAULTS: dict[str, Any] = {
    "osReserveBytes": 8 * GIB,
    "runtimeOverheadBytes": 6 * GIB,
    "kvMinBytes": 4 * GIB,
    "kvBytesPerToken": 0,
    "minMtu": 9000,
    "includeCarrierDown": False,
    "allowedCapabilities": ["IPC_LOCK"],
    "rayPorts": [6379, 8265, 10001],
    "fabricSubnets": [],
    "nonDevEnvironments": ["staging", "prod"],
    "prodEnvironments": ["prod"],
    "requireSecretOutputs": False,
    "utilizationThreshold": 0.85,
}


# --------------------------------------------------------------------------------------------
# Tolerant access to props (unknowns, secrets, proxies)
# --------------------------------------------------------------------------------------------
class _Unknown:
    """Marker for a value that is unknown during preview."""

    _instance: Optional["_Unknown"] = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"

    def __bool__(self) -> bool:  # an unknown is never "truthy enough" to trigger a check
        return False


UNKNOWN = _Unknown()

_SENTINELS = frozenset({UNKNOWN_BOOLEAN_VALUE, UNKNOWN_NUMBER_VALUE, UNKNOWN_STRING_VALUE,
                        UNKNOWN_ARRAY_VALUE, UNKNOWN_ASSET_VALUE, UNKNOWN_ARCHIVE_VALUE,
                        UNKNOWN_OBJECT_VALUE})


def _norm(value: Any) -> Any:
    """Unwrap a pulumi_policy Secret (only the remediation path keeps it) and map sentinels."""
    while isinstance(value, Secret):
        value = value.value
    if isinstance(value, str) and value in _SENTINELS:
        return UNKNOWN
    return value


def is_unknown(value: Any) -> bool:
    return value is UNKNOWN


def get(obj: Any, *path: Any, default: Any = None) -> Any:
    """`obj[p0][p1]...`; `default` when absent or None, `UNKNOWN` when unknown during preview."""
    cur = obj
    try:
        for key in path:
            cur = _norm(cur)
            if cur is UNKNOWN:
                return UNKNOWN
            if cur is None:
                return default
            if isinstance(key, int):
                if isinstance(cur, (str, bytes)) or not isinstance(cur, Sequence) or key >= len(cur):
                    return default
                cur = cur[key]
            else:
                if not isinstance(cur, Mapping):
                    return default
                try:
                    cur = cur[key]
                except KeyError:
                    return default
        cur = _norm(cur)
    except UnknownValueError:
        return UNKNOWN
    return default if cur is None else cur


def elements(value: Any) -> list[Any]:
    """The items of a list prop (unknown items become UNKNOWN); [] for anything else."""
    value = _norm(value)
    if value is UNKNOWN or value is None or isinstance(value, (str, bytes)) \
            or not isinstance(value, Sequence):
        return []
    out = []
    for i in range(len(value)):
        try:
            out.append(_norm(value[i]))
        except UnknownValueError:
            out.append(UNKNOWN)
    return out


def mapping_items(value: Any) -> list[tuple[str, Any]]:
    """The (key, value) pairs of a map prop (unknown values become UNKNOWN)."""
    value = _norm(value)
    if not isinstance(value, Mapping):
        return []
    out = []
    for key in list(value):
        out.append((key, get(value, key)))
    return out


def num(value: Any) -> Optional[float]:
    """A known number (protobuf sends numbers as floats), else None."""
    value = _norm(value)
    if isinstance(value, bool) or value is UNKNOWN or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def text(value: Any) -> Optional[str]:
    value = _norm(value)
    return value if isinstance(value, str) else None


def flag(value: Any) -> Optional[bool]:
    """A known boolean (also 'true'/'false' strings), else None."""
    value = _norm(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def conf(args: Any, key: str) -> Any:
    """Pack config for this policy with the pack's default (the analyzer applies schema defaults;
    unit tests and older engines may not)."""
    try:
        cfg = args.get_config() or {}
    except Exception:  # noqa: BLE001 - config must never crash a rule
        cfg = {}
    value = cfg.get(key) if isinstance(cfg, Mapping) else None
    return DEFAULTS.get(key) if value is None else value


def stack_config(key: str) -> Any:
    """A stack config value (`spark-vllm:<key>`) as the engine hands it to the pack (PULUMI_CONFIG,
    JSON; object values are JSON strings). None when not running under the engine."""
    try:
        config = json.loads(os.environ.get("PULUMI_CONFIG") or "{}")
    except ValueError:
        return None
    value = config.get(f"spark-vllm:{key}")
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def environment_of(props: Any, args: Any) -> Optional[str]:
    """The stack environment: VllmServer `environment` prop, else pack config `environment`,
    else the stack config `spark-vllm:environment`."""
    env = text(get(props, "environment")) if props is not None else None
    if env:
        return env
    env = conf(args, "environment")
    if isinstance(env, str) and env:
        return env
    env = stack_config("environment")
    return env if isinstance(env, str) and env else None


def stack_environment(args: StackValidationArgs) -> Optional[str]:
    for r in args.resources:
        if r.resource_type == VLLM_SERVER:
            env = text(get(r.props, "environment"))
            if env:
                return env
    return environment_of(None, args)


# --------------------------------------------------------------------------------------------
# Docker container / command helpers
# --------------------------------------------------------------------------------------------
def command_tokens(props: Any, key: str = "command") -> list[str]:
    """A container's command as argv tokens; shell strings (`bash -lc "..."`) are split too."""
    tokens: list[str] = []
    for item in elements(get(props, key)):
        if not isinstance(item, str):
            continue
        if any(ch.isspace() for ch in item):
            try:
                tokens.extend(shlex.split(item))
            except ValueError:
                tokens.extend(item.split())
        else:
            tokens.append(item)
    return tokens


def shell_tokens(script: Optional[str], depth: int = 0) -> list[str]:
    """Words of a shell script, descending into quoted `sh -c '...'` bodies (one level per
    quoting) so an inline `VAR=literal` in a nested script is seen too."""
    if not script:
        return []
    try:
        words = shlex.split(script, comments=True)
    except ValueError:
        words = script.split()
    out: list[str] = []
    for word in words:
        out.append(word)
        if depth < 3 and any(ch.isspace() for ch in word):
            out.extend(shell_tokens(word, depth + 1))
    return out


def flag_value(tokens: Sequence[str], name: str) -> Optional[str]:
    """The value of `--name=v` or `--name v` (the last occurrence wins, like argparse)."""
    found = None
    for i, tok in enumerate(tokens):
        if tok == name and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            found = tokens[i + 1]
        elif tok.startswith(name + "="):
            found = tok[len(name) + 1:]
    return found


def has_flag(tokens: Sequence[str], name: str) -> bool:
    return any(t == name or t.startswith(name + "=") for t in tokens)


def labels_of(props: Any) -> dict[str, Any]:
    out = {}
    for item in elements(get(props, "labels")):
        label = text(get(item, "label"))
        if label:
            out[label] = get(item, "value")
    return out


def envs_of(props: Any) -> dict[str, Any]:
    """Container `envs` (list of K=V) as a dict; an unknown entry is skipped."""
    out = {}
    for item in elements(get(props, "envs")):
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out[k] = v
    return out


def is_ray_container(props: Any) -> bool:
    role = text(labels_of(props).get("spark-vllm.role")) or ""
    if role.startswith("ray"):
        return True
    tokens = command_tokens(props)
    return any(t.endswith("ray") and i + 1 < len(tokens) and tokens[i + 1] == "start"
               for i, t in enumerate(tokens))


def is_literal(value: Optional[str]) -> bool:
    """A literal value, as opposed to a shell/env reference (`$VAR`, `${VAR}`) or empty."""
    if not value:
        return False
    return not value.startswith("$") and value not in ('""', "''")


def parse_ip(value: Optional[str]):
    if not value:
        return None
    try:
        return ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        return None


def provider_host(resource: Any) -> Optional[str]:
    """The management address behind a docker provider (`host: ssh://user@10.77.0.11:22`)."""
    provider = getattr(resource, "provider", None)
    if provider is None:
        return None
    host = text(get(provider.props, "host"))
    if not host:
        return None
    m = re.match(r"^[a-z]+://(?:[^@/]*@)?(\[[^\]]+\]|[^:/]+)", host)
    return m.group(1).strip("[]") if m else None


# --------------------------------------------------------------------------------------------
# 1. memory-fit
# --------------------------------------------------------------------------------------------
def memory_fit_findings(props: Any, os_reserve: float, overhead: float, kv_min: float,
                        kv_per_token: float = 0) -> list[str]:
    """Per node: weights/(tp*pp) + overhead + KV minimum <= util * memTotal, and on unified memory
    util * memTotal <= memTotal - osReserve. Each half runs when its own inputs are known (during a
    first preview modelBytes may be unknown; the reserve check still runs)."""
    util = num(get(props, "gpuMemoryUtilization"))
    if util is None:
        return []  # unknown during preview or not given: nothing to judge
    out: list[str] = []
    if not 0 < util <= 1:
        return [f"gpuMemoryUtilization {util:g} must be in (0, 1]"]
    tp, pp = num(get(props, "tensorParallelSize")), num(get(props, "pipelineParallelSize", default=1))
    model_bytes = num(get(props, "modelBytes"))
    weights = kv = None
    if None not in (tp, pp, model_bytes):
        if tp < 1 or pp < 1:
            return [f"tensorParallelSize {tp:g} x pipelineParallelSize {pp:g} must be at least 1"]
        shards = tp * pp
        weights = model_bytes / shards
        max_len = num(get(props, "maxModelLen"))
        kv = kv_min
        if kv_per_token and max_len:
            kv = max(kv_min, kv_per_token * max_len / shards)
    for node in elements(get(props, "nodes")):
        name = text(get(node, "name")) or "?"
        mem = num(get(node, "memTotalBytes"))
        if mem is None or mem <= 0:
            continue
        budget = util * mem
        if weights is not None:
            need = weights + overhead + kv
            if need > budget:
                out.append(
                    f"node {name}: weights per GPU {gib(weights)} (modelBytes {gib(model_bytes)} / "
                    f"(tp {tp:g} x pp {pp:g})) + runtime overhead {gib(overhead)} + minimum KV "
                    f"cache {gib(kv)} = {gib(need)} exceeds the vLLM budget {gib(budget)} "
                    f"(gpuMemoryUtilization {util:.2f} x memTotal {gib(mem)}); short by "
                    f"{gib(need - budget)}")
        if flag(get(node, "unifiedMemory")) and budget > mem - os_reserve:
            out.append(
                f"node {name}: vLLM budget {gib(budget)} (gpuMemoryUtilization {util:.2f} x memTotal "
                f"{gib(mem)}) leaves {gib(mem - budget)} for the OS on unified memory, less than "
                f"the OS reserve {gib(os_reserve)}; highest safe utilization "
                f"{max(0.0, (mem - os_reserve) / mem):.2f}")
    return out


def validate_memory_fit(args: ResourceValidationArgs, report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    for msg in memory_fit_findings(args.props, float(conf(args, "osReserveBytes")),
                                   float(conf(args, "runtimeOverheadBytes")),
                                   float(conf(args, "kvMinBytes")),
                                   float(conf(args, "kvBytesPerToken"))):
        report(msg)


# --------------------------------------------------------------------------------------------
# 2. same-image-everywhere
# --------------------------------------------------------------------------------------------
def _short(image_id: str) -> str:
    return image_id[:19] if image_id.startswith("sha256:") else image_id


def validate_same_image(args: StackValidationArgs, report) -> None:
    for r in args.resources:
        if r.resource_type == VLLM_IMAGE:
            ids = {node: text(v) for node, v in mapping_items(get(r.props, "imageIds"))}
            known = {node: v for node, v in ids.items() if v}
            if len(set(known.values())) > 1:
                listing = ", ".join(f"{n}={_short(v)}" for n, v in sorted(known.items()))
                report(f"image {text(get(r.props, 'ref')) or '?'} has different image IDs per node: "
                       f"{listing}", r.urn)
    images: dict[str, str] = {}
    for r in args.resources:
        if r.resource_type == CONTAINER and is_ray_container(r.props):
            image = text(get(r.props, "image"))
            if image:
                images[r.name] = image
    if len(set(images.values())) > 1:
        listing = ", ".join(f"{n}={_short(v)}" for n, v in sorted(images.items()))
        report(f"Ray containers run different images: {listing}")


# --------------------------------------------------------------------------------------------
# 3. parallelism-matches-gpus
# --------------------------------------------------------------------------------------------
def validate_parallelism(args: ResourceValidationArgs, report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    tp = num(get(args.props, "tensorParallelSize"))
    pp = num(get(args.props, "pipelineParallelSize", default=1))
    gpus = num(get(args.props, "clusterGpus"))
    if None in (tp, pp, gpus):
        return
    if tp * pp != gpus:
        report(f"tensorParallelSize {tp:g} x pipelineParallelSize {pp:g} = {tp * pp:g} but the Ray "
               f"cluster has {gpus:g} GPUs; vLLM would wait for missing GPUs or leave GPUs idle")


# --------------------------------------------------------------------------------------------
# 4. nccl-rdma-interfaces / 5. fabric-mtu
# --------------------------------------------------------------------------------------------
def _name_list(value: str) -> tuple[list[str], bool, bool]:
    """NCCL interface/HCA list syntax: `=` exact, `^` exclude, `name:port`."""
    exact = value.startswith("=")
    value = value.lstrip("=")
    exclude = value.startswith("^")
    value = value.lstrip("^")
    names = [n.strip().split(":")[0] for n in value.split(",") if n.strip()]
    return names, exact, exclude


def _covers(names: list[str], exact: bool, target: str) -> bool:
    return any(target == n if exact else target.startswith(n) for n in names)


def _hca_active(state: str) -> bool:
    """ibdev2netdev says Up/Down; sysfs says '4: ACTIVE' / 'PORT_ACTIVE' / DOWN."""
    state = state.strip().upper()
    return state == "UP" or ("ACTIVE" in state and "INACTIVE" not in state)


def nccl_findings(props: Any) -> list[str]:
    if flag(get(props, "rdma")) is not True:
        return []  # RDMA off (the lab) or unknown
    out: list[str] = []
    for node in elements(get(props, "nodes")):
        name = text(get(node, "name")) or "?"
        env = get(node, "env", default={})
        fabric = elements(get(node, "fabric"))
        if is_unknown(env) or any(is_unknown(f) for f in fabric):
            continue
        up = [f for f in fabric if flag(get(f, "carrier")) is True]
        if not fabric:
            continue
        if not up:
            out.append(f"node {name}: RDMA is on but no fabric interface has carrier")
            continue
        up_ifaces = [text(get(f, "interface")) for f in up if text(get(f, "interface"))]
        up_hcas = [text(get(f, "hca")) for f in up if text(get(f, "hca"))]
        hca_value = get(env, "NCCL_IB_HCA")
        if not is_unknown(hca_value):
            hca_value = text(hca_value)
            if not hca_value:
                out.append(f"node {name}: NCCL_IB_HCA is not set; it must list the carrier-up HCAs "
                           f"{', '.join(up_hcas)}")
            else:
                names, exact, exclude = _name_list(hca_value)
                if exclude:
                    out.append(f"node {name}: NCCL_IB_HCA={hca_value} is an exclusion list; list the "
                               f"carrier-up HCAs {', '.join(up_hcas)} explicitly")
                else:
                    missing = [h for h in up_hcas if not _covers(names, exact, h)]
                    if missing:
                        out.append(f"node {name}: NCCL_IB_HCA={hca_value} does not cover carrier-up "
                                   f"HCA(s) {', '.join(missing)}")
        for f in up:
            state = text(get(f, "hcaState"))
            if state and not _hca_active(state):
                out.append(f"node {name}: HCA {text(get(f, 'hca'))} of carrier-up interface "
                           f"{text(get(f, 'interface'))} is {state}, not ACTIVE")
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            value = get(env, var)
            if is_unknown(value):
                continue
            value = text(value)
            if not value:
                out.append(f"node {name}: {var} is not set; it must name a fabric interface "
                           f"({', '.join(up_ifaces)}), or the bootstrap picks the management network")
                continue
            names, exact, exclude = _name_list(value)
            if exclude:
                out.append(f"node {name}: {var}={value} is an exclusion list; name the fabric "
                           f"interface ({', '.join(up_ifaces)})")
                continue
            bad = [n for n in names if not any(i == n or (not exact and i.startswith(n))
                                               for i in up_ifaces)]
            if bad:
                out.append(f"node {name}: {var}={value} names {', '.join(bad)}, not a carrier-up "
                           f"fabric interface ({', '.join(up_ifaces)})")
    return out


def validate_nccl(args: ResourceValidationArgs, report) -> None:
    if args.resource_type == NCCL_ENV:
        for msg in nccl_findings(args.props):
            report(msg)


def validate_mtu(args: ResourceValidationArgs, report) -> None:
    if args.resource_type != NCCL_ENV:
        return
    min_mtu = num(conf(args, "minMtu")) or 9000
    include_down = bool(conf(args, "includeCarrierDown"))
    for node in elements(get(args.props, "nodes")):
        name = text(get(node, "name")) or "?"
        for f in elements(get(node, "fabric")):
            carrier = flag(get(f, "carrier"))
            if carrier is not True and not (include_down and carrier is False):
                continue
            mtu = num(get(f, "mtu"))
            if mtu is not None and mtu < min_mtu:
                report(f"node {name}: fabric interface {text(get(f, 'interface')) or '?'} has MTU "
                       f"{mtu:g}, below the required {min_mtu:g}")


# --------------------------------------------------------------------------------------------
# 6. no-privileged-containers
# --------------------------------------------------------------------------------------------
def _cap(name: str) -> str:
    name = name.strip().upper()
    return name[4:] if name.startswith("CAP_") else name


def validate_no_privileged(args: ResourceValidationArgs, report) -> None:
    if args.resource_type != CONTAINER:
        return
    if flag(get(args.props, "privileged")) is True:
        report(f"container {args.name} runs privileged; use the nvidia runtime/CDI for GPUs, "
               f"`devices` for /dev/infiniband and capability IPC_LOCK for RDMA")
    allowed = {_cap(c) for c in (conf(args, "allowedCapabilities") or []) if isinstance(c, str)}
    adds = [a for a in elements(get(args.props, "capabilities", "adds")) if isinstance(a, str)]
    extra = sorted({_cap(a) for a in adds} - allowed)
    if extra:
        report(f"container {args.name} adds capabilities {', '.join(extra)} beyond the allowed "
               f"{', '.join(sorted(allowed)) or 'none'}")


# --------------------------------------------------------------------------------------------
# 7. ray-not-exposed
# --------------------------------------------------------------------------------------------
def _fabric_subnets(args: Any) -> list:
    subnets = conf(args, "fabricSubnets") or []
    if not subnets:
        nccl = stack_config("nccl")
        if isinstance(nccl, Mapping):
            subnets = nccl.get("fabricSubnets") or []
    out = []
    for s in subnets:
        try:
            out.append(ipaddress.ip_network(s, strict=False))
        except (TypeError, ValueError):
            continue
    return out


def _listen_ok(ip, management: set[str], subnets: list, node_ip,
               fabric_ips: Optional[set[str]] = None) -> bool:
    """A listen address that stays off the management and public networks."""
    if ip.is_loopback:
        return True
    if ip.is_unspecified or str(ip) in management:
        return False
    if fabric_ips and str(ip) in fabric_ips:
        return True
    if subnets:
        return any(ip in n for n in subnets if n.version == ip.version)
    return ip == node_ip and ip.is_private


def ray_exposure_findings(name: str, props: Any, management: set[str], subnets: list,
                          ray_ports: set[int], fabric_ips: Optional[set[str]] = None) -> list[str]:
    tokens = command_tokens(props)
    out: list[str] = []
    in_fabric = (lambda ip: any(ip in n for n in subnets if n.version == ip.version))
    node_ip_raw = flag_value(tokens, "--node-ip-address")
    node_ip = parse_ip(node_ip_raw)
    if node_ip_raw is None:
        if tokens:
            out.append(f"container {name}: `ray start` has no --node-ip-address; Ray then binds and "
                       f"advertises the default-route (management) address")
    elif node_ip is not None:  # a shell variable cannot be judged here
        if node_ip.is_unspecified:
            out.append(f"container {name}: --node-ip-address {node_ip_raw} binds Ray's GCS/object "
                       f"manager on every interface; use the node's fabric address")
        elif str(node_ip) in management:
            out.append(f"container {name}: --node-ip-address {node_ip_raw} is the management "
                       f"address; use the node's fabric address")
        elif fabric_ips and str(node_ip) not in fabric_ips:
            out.append(f"container {name}: --node-ip-address {node_ip_raw} is not a fabric address "
                       f"of the stack ({', '.join(sorted(fabric_ips))})")
        elif subnets and not in_fabric(node_ip):
            out.append(f"container {name}: --node-ip-address {node_ip_raw} is outside the fabric "
                       f"subnets {', '.join(map(str, subnets))}")
        elif not node_ip.is_private:
            out.append(f"container {name}: --node-ip-address {node_ip_raw} is a public address")
    if "--head" in tokens:
        include = (flag_value(tokens, "--include-dashboard") or "").lower()
        if include not in ("false", "0", "no"):
            host_raw = flag_value(tokens, "--dashboard-host") or "127.0.0.1"  # Ray's default
            host = parse_ip("127.0.0.1" if host_raw == "localhost" else host_raw)
            if host is not None and not _listen_ok(host, management, subnets, node_ip, fabric_ips):
                out.append(f"container {name}: the Ray dashboard listens on --dashboard-host "
                           f"{host_raw}; disable it (--include-dashboard=false) or bind 127.0.0.1 "
                           f"or the fabric address")
    if text(get(props, "networkMode")) != "host":
        ports = set(ray_ports)
        for f in ("--port", "--dashboard-port", "--ray-client-server-port"):
            v = flag_value(tokens, f)
            if v and v.isdigit():
                ports.add(int(v))
        for p in elements(get(props, "ports")):
            internal = num(get(p, "internal"))
            if internal is None or int(internal) not in ports:
                continue
            ip_raw = text(get(p, "ip")) or "0.0.0.0"
            ip = parse_ip(ip_raw)
            if ip is not None and _listen_ok(ip, management, subnets, node_ip, fabric_ips):
                continue
            out.append(f"container {name}: publishes Ray port {int(internal)} on {ip_raw}"
                       f"{':' + str(int(num(get(p, 'external')))) if num(get(p, 'external')) else ''}")
    return out


def validate_ray_not_exposed(args: StackValidationArgs, report) -> None:
    management: set[str] = set()
    for r in args.resources:
        if r.resource_type == SPARK_NODE:
            host = text(get(r.props, "host"))
            if host:
                management.add(host)
    fabric_ips: set[str] = set()
    for r in args.resources:
        if r.resource_type == NCCL_ENV:
            for node in elements(get(r.props, "nodes")):
                for f in elements(get(node, "fabric")):
                    ip = text(get(f, "ip"))
                    if ip:
                        fabric_ips.add(ip)
    subnets = _fabric_subnets(args)
    ray_ports = {int(p) for p in (conf(args, "rayPorts") or []) if num(p) is not None}
    for r in args.resources:
        if r.resource_type != CONTAINER or not is_ray_container(r.props):
            continue
        mgmt = set(management)
        ph = provider_host(r)
        if ph:
            mgmt.add(ph)
        for msg in ray_exposure_findings(r.name, r.props, mgmt, subnets, ray_ports, fabric_ips):
            report(msg, r.urn)


# --------------------------------------------------------------------------------------------
# Secrets (8, 9): shared scanning
# --------------------------------------------------------------------------------------------
HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
HF_ENV_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")
API_ENV_NAMES = ("VLLM_API_KEY",)


def _project_dir(args: Any) -> Path:
    configured = conf(args, "projectDir")
    if isinstance(configured, str) and configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent


def read_stack_config_text(args: Any) -> Optional[str]:
    """The Pulumi.<stack>.yaml text, or None outside the engine / when it is not on disk
    (e.g. config from an ESC environment). Tests replace this function."""
    stack = os.environ.get("PULUMI_STACK")
    if not stack:
        return None
    path = _project_dir(args) / f"Pulumi.{stack.split('/')[-1]}.yaml"
    try:
        return path.read_text()
    except OSError:
        return None


def plaintext_config_keys(stack_yaml: Optional[str], keys: Iterable[str]) -> list[str]:
    """The given config keys that the stack file holds in plaintext instead of `secure:`."""
    if not stack_yaml:
        return []
    try:
        import yaml  # PyYAML ships with the pulumi SDK
        doc = yaml.safe_load(stack_yaml) or {}
    except Exception:  # noqa: BLE001 - an unparsable file is the program's problem, not ours
        return []
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        return []
    out = []
    for key in keys:
        if key in config:
            value = config[key]
            if not (isinstance(value, dict) and "secure" in value) and value not in (None, ""):
                out.append(key)
    return out


def secret_findings(args: StackValidationArgs, env_names: Sequence[str], cli_flags: Sequence[str],
                    value_re: Optional[re.Pattern], what: str) -> list[tuple[str, Optional[str]]]:
    """Plaintext placements of a secret in containers and commands: (message, urn)."""
    out: list[tuple[str, Optional[str]]] = []
    require_aso = bool(conf(args, "requireSecretOutputs"))
    for r in args.resources:
        if r.resource_type == CONTAINER:
            tokens = command_tokens(r.props) + command_tokens(r.props, "entrypoints")
            for f in cli_flags:
                v = flag_value(tokens, f)
                if v is not None and is_literal(v):
                    out.append((f"container {r.name}: {what} passed on the command line ({f} ...), "
                                f"readable in `ps` and `docker inspect`", r.urn))
            for tok in tokens:
                for env_name in env_names:
                    if tok.startswith(env_name + "=") and is_literal(tok.split("=", 1)[1]):
                        out.append((f"container {r.name}: {what} inline in the command "
                                    f"({env_name}=...)", r.urn))
                if value_re and value_re.search(tok):
                    out.append((f"container {r.name}: a literal {what} appears in the command",
                                r.urn))
            for label, value in labels_of(r.props).items():
                v = text(value) or ""
                if (value_re and value_re.search(v)) or label.upper() in env_names:
                    out.append((f"container {r.name}: {what} in label {label}; labels are never "
                                f"secret", r.urn))
            envs = envs_of(r.props)
            if require_aso and any(k in envs for k in env_names):
                aso = list(getattr(r.opts, "additional_secret_outputs", None) or [])
                if "envs" not in aso:
                    out.append((f"container {r.name}: carries {what} in envs without "
                                f"additionalSecretOutputs=['envs']", r.urn))
        elif r.resource_type in COMMAND_TYPES:
            for key in ("create", "update", "delete"):
                script = text(get(r.props, key))
                if not script:
                    continue
                toks = shell_tokens(script)
                for tok in toks:
                    for env_name in env_names:
                        if tok.startswith(env_name + "=") and is_literal(tok.split("=", 1)[1]):
                            out.append((f"command {r.name}: {what} inline in its {key} script "
                                        f"({env_name}=...); pass it in `environment` from a secret",
                                        r.urn))
                for f in cli_flags:
                    v = flag_value(toks, f)
                    if v is not None and is_literal(v):
                        out.append((f"command {r.name}: {what} on the command line of its {key} "
                                    f"script ({f} ...)", r.urn))
                if value_re and value_re.search(script):
                    out.append((f"command {r.name}: a literal {what} appears in its {key} script",
                                r.urn))
            environment = get(r.props, "environment")
            if require_aso and any(k in env_names for k, _ in mapping_items(environment)):
                aso = list(getattr(r.opts, "additional_secret_outputs", None) or [])
                if "environment" not in aso:
                    out.append((f"command {r.name}: carries {what} in environment without "
                                f"additionalSecretOutputs=['environment']", r.urn))
    # de-duplicate, keep order
    seen, unique = set(), []
    for item in out:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique


# --------------------------------------------------------------------------------------------
# 8. vllm-api-key
# --------------------------------------------------------------------------------------------
def validate_vllm_api_key(args: StackValidationArgs, report) -> None:
    non_dev = set(conf(args, "nonDevEnvironments") or [])
    for r in args.resources:
        if r.resource_type != VLLM_SERVER:
            continue
        env = environment_of(r.props, args)
        if env not in non_dev:
            continue
        key = get(r.props, "apiKey")
        if is_unknown(key):
            continue
        if not (isinstance(key, str) and key.strip()):
            report(f"environment '{env}': vLLM serves without an API key; set one with "
                   f"`pulumi config set --secret spark-vllm:vllmApiKey <key>`", r.urn)
    for msg, urn in secret_findings(args, API_ENV_NAMES, ("--api-key",), None, "the vLLM API key"):
        report(msg, urn)
    for key in plaintext_config_keys(read_stack_config_text(args), ["spark-vllm:vllmApiKey"]):
        report(f"stack config {key} is stored in plaintext; re-set it with `pulumi config set "
               f"--secret {key}`")


# --------------------------------------------------------------------------------------------
# 9. hf-token-secret
# --------------------------------------------------------------------------------------------
def validate_hf_token(args: StackValidationArgs, report) -> None:
    for msg, urn in secret_findings(args, HF_ENV_NAMES, ("--token", "--hf-token"), HF_TOKEN_RE,
                                    "the HF token"):
        report(msg, urn)
    # Component props that are not a secret's channel must not carry a token-looking literal.
    for r in args.resources:
        if not r.resource_type.startswith("spark-vllm:"):
            continue
        for path, value in _string_leaves(r.props):
            if re.search(r"token|key|secret|password", path, re.I):
                continue  # the declared secret channels (apiKey, hfToken, hostKey ...)
            if HF_TOKEN_RE.search(value):
                report(f"{r.resource_type.split(':')[-1]} {r.name}: a literal HF token in prop "
                       f"{path}", r.urn)
    for key in plaintext_config_keys(read_stack_config_text(args), ["spark-vllm:hfToken"]):
        report(f"stack config {key} is stored in plaintext; re-set it with `pulumi config set "
               f"--secret {key}`")


def _string_leaves(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    value = _norm(value)
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in mapping_items(value):
            yield from _string_leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        for i, v in enumerate(elements(value)):
            yield from _string_leaves(v, f"{path}[{i}]")


# --------------------------------------------------------------------------------------------
# 10. prod-pinned
# --------------------------------------------------------------------------------------------
DIGEST_REF_RE = re.compile(r"@sha256:[0-9a-f]{64}$")
IMAGE_ID_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
HOST_KEY_RE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|"
                         r"sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com)"
                         r" [A-Za-z0-9+/]+={0,3}( .*)?$")


def validate_prod_pinned(args: StackValidationArgs, report) -> None:
    env = stack_environment(args)
    if env not in set(conf(args, "prodEnvironments") or []):
        return
    for r in args.resources:
        p = r.props
        if r.resource_type == VLLM_IMAGE:
            ref = get(p, "ref")
            if not is_unknown(ref) and not (isinstance(ref, str) and DIGEST_REF_RE.search(ref)):
                report(f"{env}: image ref {ref!r} is not pinned by digest (<repo>@sha256:<64 hex>)",
                       r.urn)
        elif r.resource_type == CONTAINER:
            image = get(p, "image")
            if isinstance(image, str) and not (DIGEST_REF_RE.search(image) or IMAGE_ID_RE.match(image)):
                report(f"{env}: container {r.name} image {image!r} is neither a digest ref nor an "
                       f"image ID", r.urn)
        elif r.resource_type == MODEL_CACHE:
            revision = get(p, "revision")
            if is_unknown(revision):
                continue
            if revision is None:
                revision = get(p, "commit")
            if not is_unknown(revision) and not (isinstance(revision, str) and COMMIT_RE.match(revision)):
                report(f"{env}: model {text(get(p, 'repo')) or '?'} revision {revision!r} is not a "
                       f"40-hex commit", r.urn)
        elif r.resource_type == SPARK_NODE:
            key = get(p, "hostKey")
            if is_unknown(key):
                continue
            if not (isinstance(key, str) and HOST_KEY_RE.match(key.strip())):
                report(f"{env}: node {text(get(p, 'name')) or r.name} has no pinned host key "
                       f"(got {key!r}; expected '<type> <base64>')", r.urn)


# --------------------------------------------------------------------------------------------
# 11. gpu-memory-utilization-advisory / 12. enforce-eager-advisory
# --------------------------------------------------------------------------------------------
def validate_utilization_advisory(args: ResourceValidationArgs, report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    util = num(get(args.props, "gpuMemoryUtilization"))
    threshold = num(conf(args, "utilizationThreshold")) or 0.85
    if util is None or util <= threshold:
        return
    unified = [text(get(n, "name")) or "?" for n in elements(get(args.props, "nodes"))
               if flag(get(n, "unifiedMemory")) is True]
    if unified:
        report(f"gpuMemoryUtilization {util:.2f} is above {threshold:.2f} on unified-memory nodes "
               f"{', '.join(unified)}: CPU, page cache and the container share that memory")


def validate_enforce_eager_advisory(args: ResourceValidationArgs, report) -> None:
    if args.resource_type != VLLM_SERVER:
        return
    if flag(get(args.props, "enforceEager")) is not True:
        return
    env = environment_of(args.props, args)
    if env in set(conf(args, "prodEnvironments") or []):
        report(f"environment '{env}': enforceEager disables CUDA graphs and costs decode "
               f"throughput; use it to debug, not in production")


# --------------------------------------------------------------------------------------------
# The policies
# --------------------------------------------------------------------------------------------
def _schema(**props: dict) -> PolicyConfigSchema:
    return PolicyConfigSchema(properties=props)


_ENV_PROP = {"type": "string", "description": "fallback stack environment when no VllmServer "
             "carries one (dev | staging | prod)"}


def _ENVS_PROP(default: list, what: str) -> dict:
    return {"type": "array", "items": {"type": "string"}, "default": default, "description": what}

memory_fit = ResourceValidationPolicy(
    name="memory-fit",
    description="On every node, weights per GPU + minimum KV cache + runtime overhead fit in the "
                "vLLM budget (gpuMemoryUtilization x memTotal), and the budget keeps the OS reserve "
                "on unified-memory nodes.",
    validate=validate_memory_fit,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Raise tensorParallelSize/pipelineParallelSize (more nodes), choose a smaller "
                      "or more quantized model, or adjust vllm.gpuMemoryUtilization so that "
                      "utilization x memTotal covers weights + overhead + KV and stays below "
                      "memTotal - osReserveBytes.",
    config_schema=_schema(
        osReserveBytes={"type": "number", "minimum": 0, "default": DEFAULTS["osReserveBytes"],
                        "description": "memory kept for the OS on unified-memory nodes"},
        runtimeOverheadBytes={"type": "number", "minimum": 0,
                              "default": DEFAULTS["runtimeOverheadBytes"],
                              "description": "CUDA context, activations, CUDA graphs, NCCL buffers"},
        kvMinBytes={"type": "number", "minimum": 0, "default": DEFAULTS["kvMinBytes"],
                    "description": "smallest useful KV cache per GPU"},
        kvBytesPerToken={"type": "number", "minimum": 0, "default": 0,
                         "description": "if > 0, the KV minimum is at least one maxModelLen sequence"},
    ),
)

same_image_everywhere = StackValidationPolicy(
    name="same-image-everywhere",
    description="Every node runs the same vLLM image ID, and all Ray containers the same image.",
    validate=validate_same_image,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Pin image.ref by digest and let VllmImage distribute that one image to every "
                      "node (source: head copies it over the fabric); remove stale tags on nodes.",
)

parallelism_matches_gpus = ResourceValidationPolicy(
    name="parallelism-matches-gpus",
    description="tensorParallelSize x pipelineParallelSize equals the GPUs in the Ray cluster.",
    validate=validate_parallelism,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set vllm.tensorParallelSize x vllm.pipelineParallelSize to the number of "
                      "nodes (one GB10 GPU each), or add/remove nodes.",
)

nccl_rdma_interfaces = ResourceValidationPolicy(
    name="nccl-rdma-interfaces",
    description="With RDMA on, NCCL_IB_HCA covers the carrier-up ConnectX-7 twins (HCAs ACTIVE) and "
                "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME name fabric interfaces.",
    validate=validate_nccl,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="List every carrier-up fabric HCA in NCCL_IB_HCA (e.g. "
                      "=rocep1s0f1,roceP2p1s0f1), set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to "
                      "the fabric interface, cable the port or fix the RoCE link state.",
)

fabric_mtu = ResourceValidationPolicy(
    name="fabric-mtu",
    description="Fabric interfaces (carrier up) run at least the configured MTU (9000).",
    validate=validate_mtu,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set MTU 9000 on the fabric interfaces (netplan/nmcli, persistently) on every "
                      "node and on the switch if there is one.",
    config_schema=_schema(
        minMtu={"type": "integer", "minimum": 576, "default": 9000},
        includeCarrierDown={"type": "boolean", "default": False,
                            "description": "also check fabric interfaces without carrier"},
    ),
)

no_privileged_containers = ResourceValidationPolicy(
    name="no-privileged-containers",
    description="No privileged containers and no added capabilities beyond IPC_LOCK (RDMA).",
    validate=validate_no_privileged,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Drop privileged; expose GPUs via the nvidia runtime/CDI, RDMA devices via "
                      "`devices` (/dev/infiniband), and add only IPC_LOCK.",
    config_schema=_schema(
        allowedCapabilities={"type": "array", "items": {"type": "string"},
                             "default": DEFAULTS["allowedCapabilities"]},
    ),
)

ray_not_exposed = StackValidationPolicy(
    name="ray-not-exposed",
    description="Ray's GCS, client and dashboard ports are not bound to management or public "
                "addresses: --node-ip-address is a fabric address, the dashboard is off or on "
                "127.0.0.1/fabric, no published Ray ports.",
    validate=validate_ray_not_exposed,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Start Ray with --node-ip-address=<fabric IP>, --include-dashboard=false (or "
                      "--dashboard-host=127.0.0.1), host networking and no `ports` for 6379/8265/"
                      "10001; reach the dashboard through an SSH tunnel.",
    config_schema=_schema(
        fabricSubnets={"type": "array", "items": {"type": "string"}, "default": [],
                       "description": "CIDRs of the fabric; default: stack config nccl.fabricSubnets"},
        rayPorts={"type": "array", "items": {"type": "integer"}, "default": DEFAULTS["rayPorts"]},
    ),
)

vllm_api_key = StackValidationPolicy(
    name="vllm-api-key",
    description="Outside dev, vLLM requires an API key, held as a secret (never on a command line "
                "or inline in a script; stack config `secure:`).",
    validate=validate_vllm_api_key,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="`pulumi config set --secret spark-vllm:vllmApiKey <key>`; the program passes "
                      "it to the container as VLLM_API_KEY in envs (a secret Output), never as "
                      "--api-key.",
    config_schema=_schema(
        environment=_ENV_PROP,
        nonDevEnvironments=_ENVS_PROP(DEFAULTS["nonDevEnvironments"],
                                      "environments that require the API key"),
        requireSecretOutputs={"type": "boolean", "default": False,
                              "description": "require additionalSecretOutputs on resources that "
                                             "carry the key"},
        projectDir={"type": "string", "description": "where Pulumi.<stack>.yaml lives "
                                                     "(default: the pack's parent directory)"},
    ),
)

hf_token_secret = StackValidationPolicy(
    name="hf-token-secret",
    description="The Hugging Face token exists only as a secret: never in command lines, labels, "
                "inline scripts or component props; stack config `secure:`.",
    validate=validate_hf_token,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="`pulumi config set --secret spark-vllm:hfToken <token>`; pass it as HF_TOKEN "
                      "in container envs or a Command's `environment`, from the secret Output.",
    config_schema=_schema(
        requireSecretOutputs={"type": "boolean", "default": False},
        projectDir={"type": "string"},
    ),
)

prod_pinned = StackValidationPolicy(
    name="prod-pinned",
    description="In prod: images by digest, the model revision a 40-hex commit, a pinned host key "
                "for every node.",
    validate=validate_prod_pinned,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set image.ref to <repo>@sha256:<digest>, model.revision to the commit hash, "
                      "and hostKey for every node (`ssh-keyscan -t ed25519 <host>`).",
    config_schema=_schema(
        environment=_ENV_PROP,
        prodEnvironments=_ENVS_PROP(DEFAULTS["prodEnvironments"], "environments that must pin"),
    ),
)

gpu_memory_utilization_advisory = ResourceValidationPolicy(
    name="gpu-memory-utilization-advisory",
    description="Advisory: gpuMemoryUtilization above 0.85 on unified-memory nodes starves the OS.",
    validate=validate_utilization_advisory,
    enforcement_level=EnforcementLevel.ADVISORY,
    remediation_steps="Lower vllm.gpuMemoryUtilization to 0.85 or less on GB10 unless measured.",
    config_schema=_schema(
        utilizationThreshold={"type": "number", "minimum": 0, "maximum": 1, "default": 0.85},
    ),
)

enforce_eager_advisory = ResourceValidationPolicy(
    name="enforce-eager-advisory",
    description="Advisory: enforceEager in prod gives up CUDA graphs.",
    validate=validate_enforce_eager_advisory,
    enforcement_level=EnforcementLevel.ADVISORY,
    remediation_steps="Set vllm.enforceEager: false in Pulumi.prod.yaml.",
    config_schema=_schema(
        environment=_ENV_PROP,
        prodEnvironments=_ENVS_PROP(DEFAULTS["prodEnvironments"], "environments counted as prod"),
    ),
)

POLICIES = [
    memory_fit,
    same_image_everywhere,
    parallelism_matches_gpus,
    nccl_rdma_interfaces,
    fabric_mtu,
    no_privileged_containers,
    ray_not_exposed,
    vllm_api_key,
    hf_token_secret,
    prod_pinned,
    gpu_memory_utilization_advisory,
    enforce_eager_advisory,
]

BY_NAME: dict[str, Any] = {p.name: p for p in POLICIES}

Report = Callable[..., None]
