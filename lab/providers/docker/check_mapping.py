#!/usr/bin/env python3
"""Prove the lab docker plugin speaks the pulumi_docker SDK's names.

Walks the installed pulumi_docker SDK (the same type metadata the Python runtime uses to turn
snake_case into wire names) and checks that every property the SDK sends or reads, at every
nesting level, exists in the Pulumi schema the plugin was built with, with the same shape
(scalar / array / map / object). Names the schema has but the SDK lacks are only listed: they
are newer upstream fields the 5.1.0 SDK cannot send.

    python check_mapping.py <schema.json>        # exit 1 on any mismatch

Uses the SDK's runtime metadata via pulumi._types (private, but it is what serialises inputs).
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import json
import re
import sys
import typing
from typing import Any

import pulumi
from pulumi import _types

# token -> (module, args class or None for invokes, resource/result class, kind)
TARGETS: dict[str, tuple[str, str | None, str, str]] = {
    "pulumi:providers:docker": ("pulumi_docker.provider", "ProviderArgs", "Provider", "provider"),
    "docker:index/container:Container": ("pulumi_docker.container", "ContainerArgs", "Container", "resource"),
    "docker:index/remoteImage:RemoteImage": ("pulumi_docker.remote_image", "RemoteImageArgs", "RemoteImage", "resource"),
    "docker:index/network:Network": ("pulumi_docker.network", "NetworkArgs", "Network", "resource"),
    "docker:index/volume:Volume": ("pulumi_docker.volume", "VolumeArgs", "Volume", "resource"),
    "docker:index/getRegistryImage:getRegistryImage": (
        "pulumi_docker.get_registry_image", None, "GetRegistryImageResult", "function"),
    # Mapped as well (tfgen wants every TF resource mapped); same check, not exercised on a daemon.
    "docker:index/serviceConfig:ServiceConfig": ("pulumi_docker.service_config", "ServiceConfigArgs", "ServiceConfig", "resource"),
    "docker:index/secret:Secret": ("pulumi_docker.secret", "SecretArgs", "Secret", "resource"),
    "docker:index/service:Service": ("pulumi_docker.service", "ServiceArgs", "Service", "resource"),
    "docker:index/plugin:Plugin": ("pulumi_docker.plugin", "PluginArgs", "Plugin", "resource"),
    "docker:index/registryImage:RegistryImage": ("pulumi_docker.registry_image", "RegistryImageArgs", "RegistryImage", "resource"),
    "docker:index/tag:Tag": ("pulumi_docker.tag", "TagArgs", "Tag", "resource"),
    "docker:index/buildxBuilder:BuildxBuilder": ("pulumi_docker.buildx_builder", "BuildxBuilderArgs", "BuildxBuilder", "resource"),
    "docker:index/getRegistryImageManifests:getRegistryImageManifests": (
        "pulumi_docker.get_registry_image_manifests", None, "GetRegistryImageManifestsResult", "function"),
    "docker:index/getNetwork:getNetwork": ("pulumi_docker.get_network", None, "GetNetworkResult", "function"),
    "docker:index/getPlugin:getPlugin": ("pulumi_docker.get_plugin", None, "GetPluginResult", "function"),
    "docker:index/getRemoteImage:getRemoteImage": ("pulumi_docker.get_remote_image", None, "GetRemoteImageResult", "function"),
    "docker:index/getLogs:getLogs": ("pulumi_docker.get_logs", None, "GetLogsResult", "function"),
}

SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", typing.Any: "any"}


def sdk_shape(tp: Any) -> Any:
    """('array', inner) | ('map', inner) | ('object', cls) | scalar name."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or (hasattr(__import__("types"), "UnionType") and isinstance(tp, __import__("types").UnionType)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        # Input[T] = Union[T, Awaitable[T], Output[T]]; InputType[T] = Union[T, Mapping[str, Any]]
        for a in args:
            o = typing.get_origin(a)
            if o in (collections.abc.Awaitable, typing.Awaitable) or o is pulumi.Output:
                continue
            if o in (dict, collections.abc.Mapping) and any(
                _types.is_input_type(b) for b in args if isinstance(b, type)):
                continue
            return sdk_shape(a)
        return "any"
    if origin is pulumi.Output:
        return sdk_shape(typing.get_args(tp)[0])
    if origin in (list, collections.abc.Sequence):
        return ("array", sdk_shape(typing.get_args(tp)[0]))
    if origin in (dict, collections.abc.Mapping):
        return ("map", sdk_shape(typing.get_args(tp)[1]))
    if isinstance(tp, type) and (_types.is_input_type(tp) or _types.is_output_type(tp)):
        return ("object", tp)
    if isinstance(tp, type) and issubclass(tp, str) and tp is not str:  # enums
        return "string"
    return SCALARS.get(tp, "any")


def props_of(cls: type) -> dict[str, Any]:
    """Wire name -> annotated type, exactly as the runtime derives it."""
    return dict(_types._raw_return_hints(cls))


def schema_shape(spec: dict, schema: dict) -> Any:
    if "$ref" in spec:
        ref = spec["$ref"].split("#/types/", 1)[-1]
        t = schema["types"][ref]
        return "string" if "enum" in t else ("object", t)
    kind = spec.get("type")
    if kind == "array":
        return ("array", schema_shape(spec["items"], schema))
    if kind == "object" and "additionalProperties" in spec:
        return ("map", schema_shape(spec["additionalProperties"], schema))
    if kind == "object":
        return "any"
    return kind or "any"


def compare(path: str, sdk: Any, sch: Any, schema: dict, errors: list, extras: list, seen: set) -> None:
    if isinstance(sdk, tuple) and isinstance(sch, tuple) and sdk[0] == sch[0]:
        if sdk[0] in ("array", "map"):
            compare(path + ("[]" if sdk[0] == "array" else "{}"), sdk[1], sch[1], schema, errors, extras, seen)
            return
        key = (sdk[1], id(sch[1]))
        if key in seen:
            return
        seen.add(key)
        if " inputs" in path:
            compare_required(path, sdk[1], sch[1].get("required", []), errors)
        compare_props(path, props_of(sdk[1]), sch[1].get("properties", {}), schema, errors, extras, seen)
        return
    simple = lambda s: s if isinstance(s, str) else s[0]
    if "any" in (simple(sdk), simple(sch)):
        return
    if {simple(sdk), simple(sch)} <= {"integer", "number"}:
        return
    if simple(sdk) != simple(sch):
        errors.append(f"{path}: SDK shape {simple(sdk)!r} but schema shape {simple(sch)!r}")


def compare_required(path: str, cls: type, schema_required: list, errors: list) -> None:
    """An input the SDK insists on must be required by the schema, and the other way round
    (catches e.g. a property the bridge auto-names, so optional, that the SDK treats as required)."""
    sdk_required = set(_types._required_property_names(cls))
    if sdk_required != set(schema_required):
        errors.append(f"{path}: required inputs differ: SDK {sorted(sdk_required)} vs schema {sorted(schema_required)}")


CHECKED = [0]  # every SDK name compared, at any depth


def compare_props(path: str, sdk_props: dict, sch_props: dict, schema: dict, errors: list, extras: list, seen: set) -> int:
    n = 0
    for name, tp in sorted(sdk_props.items()):
        n += 1
        CHECKED[0] += 1
        where = f"{path}.{name}"
        if name not in sch_props:
            errors.append(f"{where}: sent/read by the SDK, missing from the schema")
            continue
        compare(where, sdk_shape(tp), schema_shape(sch_props[name], schema), schema, errors, extras, seen)
    for name in sorted(set(sch_props) - set(sdk_props)):
        extras.append(f"{path}.{name}")
    return n


def invoke_args(module) -> list[str]:
    src = inspect.getsource(module)
    return sorted(set(re.findall(r"__args__\['([A-Za-z0-9_]+)'\]", src)))


def check(schema: dict) -> tuple[list[str], list[str], int]:
    errors: list[str] = []
    extras: list[str] = []
    count = 0
    for token, (modname, args_name, cls_name, kind) in TARGETS.items():
        mod = importlib.import_module(modname)
        seen: set = set()
        if kind == "provider":
            spec = schema.get("provider")
            if not spec:
                errors.append(f"{token}: no provider in schema")
                continue
            count += compare_props(f"{token} inputs", props_of(getattr(mod, args_name)),
                                   spec.get("inputProperties", {}), schema, errors, extras, seen)
            # Stack config keys docker:<name> are the provider inputs too.
            cfg = schema.get("config", {}).get("variables", {})
            for name in props_of(getattr(mod, args_name)):
                if name not in cfg:
                    errors.append(f"config docker:{name}: missing from schema config")
            continue
        if kind == "function":
            spec = schema.get("functions", {}).get(token)
            if not spec:
                errors.append(f"{token}: function missing from schema")
                continue
            in_props = spec.get("inputs", {}).get("properties", {})
            for name in invoke_args(mod):
                count += 1
                CHECKED[0] += 1
                if name not in in_props:
                    errors.append(f"{token} args.{name}: missing from the schema")
            out_props = spec.get("outputs", {}).get("properties", {})
            count += compare_props(f"{token} result", props_of(getattr(mod, cls_name)), out_props,
                                   schema, errors, extras, seen)
            continue
        spec = schema.get("resources", {}).get(token)
        if not spec:
            errors.append(f"{token}: resource missing from schema")
            continue
        count += compare_props(f"{token} inputs", props_of(getattr(mod, args_name)),
                               spec.get("inputProperties", {}), schema, errors, extras, seen)
        seen = set()
        count += compare_props(f"{token} outputs", props_of(getattr(mod, cls_name)),
                               spec.get("properties", {}), schema, errors, extras, seen)
        compare_required(f"{token} inputs", getattr(mod, args_name), spec.get("requiredInputs", []), errors)
    return errors, extras, count


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    schema = json.loads(open(argv[1]).read())
    errors, extras, _top_level = check(schema)
    count = CHECKED[0]
    for e in extras:
        print(f"  info: schema-only, the 5.1.0 SDK never uses it (newer upstream field): {e}")
    for e in errors:
        print(f"  MISMATCH: {e}")
    print(f"checked {count} SDK property names across {len(TARGETS)} tokens: "
          f"{len(errors)} mismatches, {len(extras)} schema-only")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
