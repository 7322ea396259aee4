"""Shared by every rule: the reviewed resource types, the pack config defaults, tolerant access to
props (unknowns, secrets, proxies), pack/stack config and the stack environment.

Props arrive wrapped in pulumi_policy's `unknown_checking_proxy`: reading a value that is unknown
during preview raises `UnknownValueError`. `get` and `elements` turn that into `UNKNOWN`, so every
check can skip what it cannot know (policies/README.md "What the rules can and cannot see").
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final, Protocol, final

from pulumi_policy import ReportViolation, Secret, StackValidationArgs
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

Json = Any
"""A value as the engine hands it to the pack: untyped JSON (dict, list, str, float, bool, None),
possibly behind pulumi_policy's unknown-checking proxies. The helpers below make it safe to read."""

Props = Mapping[str, Any]
"""A resource's props, or any JSON object inside them."""

Report = ReportViolation
"""The `report_violation(message, urn)` callback a validate function receives."""

Finding = tuple[str, str | None]
"""A violation of a stack policy: (message, urn of the resource or None for the stack)."""


class ConfigSource(Protocol):
    """What carries the pack config: `ResourceValidationArgs` or `StackValidationArgs`."""

    def get_config(self) -> Mapping[str, Any]: ...


GIB: Final = 1024 ** 3

# Resource types reviewed (docs/contract.md "What policies see").
VLLM_SERVER: Final = "spark-vllm:vllm_server:VllmServer"
VLLM_SERVICE: Final = "spark-vllm:vllm_service:VllmService"
NCCL_ENV: Final = "spark-vllm:nccl:NcclEnvironment"
VLLM_IMAGE: Final = "spark-vllm:vllm_image:VllmImage"
SPARK_NODE: Final = "spark-vllm:spark_node:SparkNode"
MODEL_CACHE: Final = "spark-vllm:model_cache:ModelCache"
COLLECTIVE_GATE: Final = "spark-vllm:collective:CollectiveGate"
CONTAINER: Final = "docker:index/container:Container"
COMMAND_TYPES: Final = ("command:remote:Command", "command:local:Command")

# Defaults of the pack config (also the `default`s in each config_schema).
DEFAULTS: dict[str, Json] = {
    "osReserveBytes": 8 * GIB,
    "runtimeOverheadBytes": 6 * GIB,
    "kvMinBytes": 4 * GIB,
    # a service (spark-vllm:services) is a small model: its CUDA context, activations and graphs
    # are a fraction of the 122B's, and its KV cache is sized for it
    "serviceOverheadBytes": 2 * GIB,
    "serviceKvMinBytes": 256 * 1024 * 1024,
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
@final
class _Unknown:
    """Marker for a value that is unknown during preview."""

    _instance: ClassVar[_Unknown | None] = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"

    def __bool__(self) -> bool:  # an unknown is never "truthy enough" to trigger a check
        return False


UNKNOWN: Final = _Unknown()

_SENTINELS = frozenset({UNKNOWN_BOOLEAN_VALUE, UNKNOWN_NUMBER_VALUE, UNKNOWN_STRING_VALUE,
                        UNKNOWN_ARRAY_VALUE, UNKNOWN_ASSET_VALUE, UNKNOWN_ARCHIVE_VALUE,
                        UNKNOWN_OBJECT_VALUE})

_MISSING: Final = object()  # `_child` found no such item


def unwrap(value: Json) -> Json:
    """Unwrap a pulumi_policy Secret (only the remediation path keeps it) and map sentinels."""
    while isinstance(value, Secret):
        value = value.value
    if isinstance(value, str) and value in _SENTINELS:
        return UNKNOWN
    return value


def is_unknown(value: Json) -> bool:
    return value is UNKNOWN


def _child(cur: Json, key: str | int) -> Json:
    """`cur[key]`, or `_MISSING` when `cur` has no such item (an unknown item still raises)."""
    if isinstance(key, int):
        if isinstance(cur, (str, bytes)) or not isinstance(cur, Sequence) or key >= len(cur):
            return _MISSING
        return cur[key]
    if not isinstance(cur, Mapping):
        return _MISSING
    try:
        return cur[key]
    except KeyError:
        return _MISSING


def get(obj: Json, *path: str | int, default: Json = None) -> Json:
    """`obj[p0][p1]...`; `default` when absent or None, `UNKNOWN` when unknown during preview."""
    cur = obj
    try:
        for key in path:
            cur = unwrap(cur)
            if cur is UNKNOWN:
                return UNKNOWN
            if cur is None:
                return default
            cur = _child(cur, key)
            if cur is _MISSING:
                return default
        cur = unwrap(cur)
    except UnknownValueError:
        return UNKNOWN
    return default if cur is None else cur


def elements(value: Json) -> list[Json]:
    """The items of a list prop (unknown items become UNKNOWN); [] for anything else."""
    value = unwrap(value)
    if value is UNKNOWN or value is None or isinstance(value, (str, bytes)) \
            or not isinstance(value, Sequence):
        return []
    out: list[Json] = []
    for i in range(len(value)):
        try:
            out.append(unwrap(value[i]))
        except UnknownValueError:
            out.append(UNKNOWN)
    return out


def mapping_items(value: Json) -> list[tuple[str, Json]]:
    """The (key, value) pairs of a map prop (unknown values become UNKNOWN)."""
    value = unwrap(value)
    if not isinstance(value, Mapping):
        return []
    return [(key, get(value, key)) for key in list(value)]


def num(value: Json) -> float | None:
    """A known number (protobuf sends numbers as floats), else None."""
    value = unwrap(value)
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


def text(value: Json) -> str | None:
    value = unwrap(value)
    return value if isinstance(value, str) else None


def flag(value: Json) -> bool | None:
    """A known boolean (also 'true'/'false' strings), else None."""
    value = unwrap(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# --------------------------------------------------------------------------------------------
# Pack config, stack config, environment
# --------------------------------------------------------------------------------------------
def conf(args: ConfigSource, key: str) -> Json:
    """Pack config for this policy with the pack's default (the analyzer applies schema defaults;
    unit tests and older engines may not)."""
    try:
        cfg = args.get_config() or {}
    except Exception:  # config must never crash a rule
        cfg = {}
    value = cfg.get(key) if isinstance(cfg, Mapping) else None
    return DEFAULTS.get(key) if value is None else value


def stack_config(key: str) -> Json:
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


def environment_of(props: Props | None, args: ConfigSource) -> str | None:
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


def stack_environment(args: StackValidationArgs) -> str | None:
    """`environment_of` for a stack policy: the first VllmServer that carries one decides."""
    for r in args.resources:
        if r.resource_type != VLLM_SERVER:
            continue
        env = text(get(r.props, "environment"))
        if env:
            return env
    return environment_of(None, args)
