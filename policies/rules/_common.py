"""Shared by every rule: the reviewed resource types, the pack config defaults, tolerant access to
props (unknowns, secrets, proxies), pack/stack config and the stack environment.

Props arrive wrapped in pulumi_policy's `unknown_checking_proxy`: reading a value that is unknown
during preview raises `UnknownValueError`. `get` and `elements` turn that into `UNKNOWN`, so every
check can skip what it cannot know (policies/README.md "What the rules can and cannot see").
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import (
    Any,
    ClassVar,
    Final,
    Protocol,
    TypeVar,
    Union,
    cast,
    final,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

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

from contract.props import PROPS, VllmServerProps, VllmServiceProps

# Sizes and the resource types reviewed: the contract the program registers its components by
# (contract/, installed into the pack's virtualenv; docs/contract.md "What policies see").
# Re-exported (`X as X`): the rules import them from here.
from contract.sizes import GIB as GIB
from contract.sizes import MIB, OS_RESERVE_BYTES, RUNTIME_OVERHEAD_BYTES
from contract.types import COLLECTIVE_GATE as COLLECTIVE_GATE
from contract.types import COMMAND_TYPES as COMMAND_TYPES
from contract.types import CONTAINER as CONTAINER
from contract.types import MODEL_CACHE as MODEL_CACHE
from contract.types import NCCL_ENV as NCCL_ENV
from contract.types import SPARK_NODE as SPARK_NODE
from contract.types import VLLM_IMAGE as VLLM_IMAGE
from contract.types import VLLM_SERVER as VLLM_SERVER
from contract.types import VLLM_SERVICE as VLLM_SERVICE

Json = Any
"""A value as the engine hands it to the pack: untyped JSON (dict, list, str, float, bool, None),
possibly behind pulumi_policy's unknown-checking proxies. The helpers below make it safe to read."""

Props = Mapping[str, Any]
"""A resource's props, or any JSON object inside them."""

Report = ReportViolation
"""The `report_violation(message, urn)` callback a validate function receives."""

Finding = tuple[str, str | None]
"""A violation of a stack policy: (message, urn of the resource or None for the stack)."""


class Typed(Protocol):
    """A reviewed resource: `ResourceValidationArgs` or a stack's `PolicyResource`."""

    @property
    def resource_type(self) -> str: ...

    @property
    def props(self) -> Mapping[str, Any]: ...


class ConfigSource(Protocol):
    """What carries the pack config: `ResourceValidationArgs` or `StackValidationArgs`."""

    def get_config(self) -> Mapping[str, Any]: ...


# Defaults of the pack config (also the `default`s in each config_schema).
DEFAULTS: dict[str, Json] = {
    "osReserveBytes": OS_RESERVE_BYTES,  # preflight's default (the program's) too
    "runtimeOverheadBytes": RUNTIME_OVERHEAD_BYTES,  # inspection/memory_fit.py's overhead term
    "kvMinBytes": 4 * GIB,
    # a service (spark-vllm:services) is a small model: its CUDA context, activations and graphs
    # are a fraction of the 122B's, and its KV cache is sized for it
    "serviceOverheadBytes": 2 * GIB,
    "serviceKvMinBytes": 256 * MIB,
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

    # reading into an unknown (an unknown item of `each`) is unknown, as `get` has it
    def __getitem__(self, key: object) -> _Unknown:
        return self

    def get(self, key: object, default: object = None) -> _Unknown:
        return self


UNKNOWN: Final = _Unknown()

_SENTINELS = frozenset({UNKNOWN_BOOLEAN_VALUE, UNKNOWN_NUMBER_VALUE, UNKNOWN_STRING_VALUE,
                        UNKNOWN_ARRAY_VALUE, UNKNOWN_ASSET_VALUE, UNKNOWN_ARCHIVE_VALUE,
                        UNKNOWN_OBJECT_VALUE})

T = TypeVar("T")

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


def each(value: Sequence[T] | None) -> list[T]:
    """`elements` of a list prop the contract types (`each(p["nodes"])`): its items keep their
    type, so mypy checks the keys read from them."""
    return elements(value)


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


# --------------------------------------------------------------------------------------------
# Props read through the contract (contract/props.py): one TypedDict per component resource type
# --------------------------------------------------------------------------------------------
P = TypeVar("P")  # a TypedDict of contract/props.py

ModelProps = VllmServerProps | VllmServiceProps
"""The props of a vLLM, the main model's or a service's (memory-fit and the API rules read the
keys both declare)."""


class UndeclaredProp(LookupError):
    """A rule read a key its resource type's TypedDict does not declare: a defect of the rule
    (mypy rejects it statically; tests/policies/test_props_contract.py runs every rule over the
    goldens' props to prove none does). Not a KeyError, so `Mapping.get` does not hide it."""


def _declared(contract: type) -> dict[str, Any]:
    """The keys a TypedDict declares and their types (NotRequired stripped)."""
    return get_type_hints(contract)


def _nested(hint: Any) -> type | None:
    """The TypedDict a prop's type names (itself, in `X | None`), else None."""
    if is_typeddict(hint):
        return cast(type, hint)
    if get_origin(hint) is Union or type(hint).__name__ == "UnionType":
        return next((a for a in get_args(hint) if is_typeddict(a)), None)
    return None


def _typed(value: Json, hint: Any) -> Json:
    """A prop's value as `get` returns it, an object of a declared TypedDict (or each item of a
    list of them) viewed through that type too. A view reads a value that is not an object as
    `get` does (None for every key), so `x["key"]` is as tolerant as `get(x, "key")`; None and
    UNKNOWN stay themselves (an unknown reads UNKNOWN for every key)."""
    if value is None or value is UNKNOWN:
        return value
    if (inner := _nested(hint)) is not None:
        return _Props(value, inner)
    args = get_args(hint)
    if get_origin(hint) is list and args and (inner := _nested(args[0])) is not None \
            and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [v if v is UNKNOWN else _Props(v, inner) for v in elements(value)]
    return value


@final
class _Props(Mapping[str, Any]):
    """A resource's props (or a JSON object inside them) read through the contract's TypedDict
    for it: `p["key"]` and `p.get("key", default)` are `get(props, "key", default=...)` (absent
    or None -> default, unknown -> UNKNOWN, secrets unwrapped), and raise `UndeclaredProp` for a
    key the type does not declare."""

    __slots__ = ("_hints", "_name", "_raw")
    _raw: Json
    _name: str
    _hints: dict[str, Any]

    def __init__(self, raw: Json, contract: type, keys: frozenset[str] | None = None) -> None:
        self._raw = raw._raw if isinstance(raw, _Props) else raw
        self._name = contract.__name__
        hints = _declared(contract)
        self._hints = {k: v for k, v in hints.items() if keys is None or k in keys}

    def _hint(self, key: str) -> Any:
        try:
            return self._hints[key]
        except KeyError:
            raise UndeclaredProp(f"{self._name} declares no prop {key!r} "
                                 "(contract/props.py)") from None

    def __getitem__(self, key: str) -> Json:
        return self.get(key)

    def get(self, key: str, default: Json = None) -> Json:
        hint = self._hint(key)
        return _typed(get(self._raw, key, default=default), hint)

    def __contains__(self, key: object) -> bool:
        """Whether the props carry a declared key (a NotRequired one may be absent)."""
        raw = unwrap(self._raw)
        return isinstance(key, str) and self._hint(key) is not None and isinstance(raw, Mapping) \
            and key in raw

    def __iter__(self) -> Iterator[str]:
        raw = unwrap(self._raw)
        return iter([k for k in raw if k in self._hints] if isinstance(raw, Mapping) else [])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __repr__(self) -> str:
        return f"<{self._name} {self._raw!r}>"


def props_as(props: Json, contract: type[P]) -> P:
    """`props` read as `contract` (a TypedDict of contract/props.py): mypy checks every key a rule
    reads against it, and at run time each read is as tolerant as `get`."""
    return cast(P, _Props(props, contract))


def props_of(resource: Typed, contract: type[P]) -> P:
    """A reviewed resource's props (`args` of a resource policy, or one of a stack's resources)
    read as the contract's type for its resource type (`PROPS[resource_type]`)."""
    if PROPS.get(resource.resource_type) is not contract:
        raise TypeError(f"{resource.resource_type} does not carry {contract.__name__} "
                        "(contract/props.py PROPS)")
    return props_as(resource.props, contract)


_MODEL_KEYS: Final = frozenset(_declared(VllmServerProps)) & frozenset(_declared(VllmServiceProps))


def model_props(props: Json) -> ModelProps:
    """A vLLM's props, the main model's or a service's, read through the keys both types
    declare (at run time too)."""
    return cast(ModelProps, _Props(props, VllmServerProps, _MODEL_KEYS))


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
        env = text(props_of(r, VllmServerProps)["environment"])
        if env:
            return env
    return environment_of(None, args)
