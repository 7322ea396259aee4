#!/usr/bin/env python3
"""The names the pulumi_command Python SDK sends and reads, derived from the SDK's own source,
checked against a provider schema (the JSON of GetSchema / `pulumi package get-schema`).

    sdk_contract.py [--sdk DIR] --schema schema.json   -> exit 0, or 1 and one problem a line
    sdk_contract.py [--sdk DIR] --dump                 -> the contract the SDK implies, as JSON

Nothing is hard-coded about the provider: resource tokens come from @pulumi.type_token,
wire names from @pulumi.getter(name=...) (or the method name), inputs from the *Args classes,
required-ness from their __init__ signatures, defaults from `if x is None: x = <const>`,
enum values from the Enum classes, secret outputs from additional_secret_outputs and
replace-on-changes from replace_on_changes. Nested objects are followed through the schema's
$ref so their tokens need not be guessed.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import sys
from pathlib import Path

RESOURCES_WANTED = {"command:local:Command", "command:remote:Command"}


def find_sdk() -> Path:
    env = os.environ.get("PULUMI_COMMAND_SDK")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        hits = sorted(glob.glob(str(parent / "venv/lib/python3*/site-packages/pulumi_command")))
        if hits:
            return Path(hits[-1])
    try:
        import pulumi_command  # noqa: PLC0415

        return Path(pulumi_command.__file__).parent
    except ImportError:
        sys.exit("cannot find the pulumi_command SDK: set PULUMI_COMMAND_SDK")


def _decorator_name(d: ast.expr) -> str:
    target = d.func if isinstance(d, ast.Call) else d
    return ast.unparse(target)


def _type_token(cls: ast.ClassDef) -> str | None:
    for d in cls.decorator_list:
        if isinstance(d, ast.Call) and _decorator_name(d) == "pulumi.type_token":
            return d.args[0].value
    return None


def _kind(annotation: str) -> dict:
    """A small description of a Python SDK annotation: the schema kind it implies."""
    a = annotation.replace(" ", "")
    for wrapper in ("Optional[", "pulumi.Input[", "pulumi.Output["):
        while a.startswith(wrapper) and a.endswith("]"):
            a = a[len(wrapper):-1]
    prims = {"_builtins.str": "string", "_builtins.float": "number", "_builtins.int": "integer",
             "_builtins.bool": "boolean"}
    if a in prims:
        return {"type": prims[a]}
    if a.startswith(("Sequence[", "pulumi.InputType[")) and a.endswith("]"):
        inner = a[a.index("[") + 1:-1]
        return {"type": "array", "items": _kind(inner)}
    if a.startswith("Mapping[") and a.endswith("]"):
        inner = a[len("Mapping["):-1].split(",", 1)[1]
        return {"type": "map", "items": _kind(inner)}
    if a.startswith("'") and a.endswith("'"):
        return {"type": "ref", "name": a.strip("'")}
    if a == "Any":
        return {"type": "any"}
    return {"type": "other", "annotation": annotation}


def _getters(cls: ast.ClassDef) -> dict[str, dict]:
    """wire name -> {python, kind} for every @pulumi.getter property of a class."""
    out = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for d in fn.decorator_list:
            if _decorator_name(d) != "pulumi.getter":
                continue
            wire = fn.name
            if isinstance(d, ast.Call):
                for kw in d.keywords:
                    if kw.arg == "name":
                        wire = kw.value.value
            out[wire] = {"python": fn.name,
                         "kind": _kind(ast.unparse(fn.returns)) if fn.returns else {"type": "any"}}
    return out


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
            return fn
    return None


def _required_and_defaults(cls: ast.ClassDef) -> tuple[set[str], dict[str, object]]:
    fn = _init(cls)
    if fn is None:
        return set(), {}
    required = {a.arg for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is None}
    defaults = {}
    for node in ast.walk(fn):
        # if x is None: x = <constant>
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and isinstance(node.test.ops[0], ast.Is)
                and isinstance(node.test.comparators[0], ast.Constant)
                and node.test.comparators[0].value is None
                and len(node.body) == 1 and isinstance(node.body[0], ast.Assign)
                and isinstance(node.body[0].value, ast.Constant)):
            defaults[node.test.left.id] = node.body[0].value.value
    return required, defaults


def _object(cls: ast.ClassDef) -> dict:
    getters = _getters(cls)
    required, defaults = _required_and_defaults(cls)
    py2wire = {g["python"]: w for w, g in getters.items()}
    return {
        "properties": {w: g["kind"] for w, g in getters.items()},
        "required": sorted(py2wire[r] for r in required if r in py2wire),
        "defaults": {py2wire[k]: v for k, v in defaults.items() if k in py2wire},
    }


def _resource_opts(cls: ast.ClassDef) -> tuple[list[str], list[str]]:
    secret, replace = [], []
    for node in ast.walk(cls):
        if isinstance(node, ast.keyword) and isinstance(node.value, ast.List):
            vals = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            if node.arg == "additional_secret_outputs":
                secret += vals
            elif node.arg == "replace_on_changes":
                replace += vals
    return secret, replace


def sdk_contract(sdk: Path) -> dict:
    resources, objects, enums = {}, {}, {}
    for path in sorted(sdk.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
        for name, cls in classes.items():
            token = _type_token(cls)
            bases = [ast.unparse(b) for b in cls.bases]
            decos = [_decorator_name(d) for d in cls.decorator_list]
            if token and "pulumi.CustomResource" in bases:
                args = classes.get(name + "Args")
                secret, replace = _resource_opts(cls)
                resources[token] = {
                    "inputs": _object(args) if args else {"properties": {}, "required": [], "defaults": {}},
                    "outputs": _object(cls),
                    "secretOutputs": secret,
                    "replaceOnChanges": replace,
                    "file": str(path.relative_to(sdk)),
                }
            elif token and any(b.endswith("Enum") for b in bases):
                enums[token] = [s.value.value for s in cls.body
                                if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)]
            elif "pulumi.input_type" in decos or "pulumi.output_type" in decos:
                key = f"{path.parent.name}.{name}"
                objects[key] = _object(cls)
    return {"resources": resources, "objects": objects, "enums": enums}


def _resolve(kind: dict, module: str, objects: dict) -> dict:
    if kind.get("type") == "ref":
        key = f"{module}.{kind['name'].removeprefix('outputs.')}"
        if key in objects:
            return {"type": "object", "name": key}
        return {"type": "enum", "name": kind["name"]}
    return kind


def compare(contract: dict, schema: dict) -> list[str]:
    problems: list[str] = []
    types = schema.get("types", {})
    res_schema = schema.get("resources", {})
    if schema.get("name") != "command":
        problems.append(f"schema package name is {schema.get('name')!r}, the SDK asks for 'command'")

    def check_kind(where: str, kind: dict, spec: dict, module: str, seen: set):
        kind = _resolve(kind, module, contract["objects"])
        t = kind["type"]
        ref = spec.get("$ref", "")
        if t in ("string", "number", "integer", "boolean"):
            if spec.get("type") != t:
                problems.append(f"{where}: the SDK sends {t}, the schema has {spec}")
        elif t == "array":
            if spec.get("type") != "array":
                problems.append(f"{where}: the SDK sends a list, the schema has {spec}")
            else:
                check_kind(where + "[]", kind["items"], spec.get("items", {}), module, seen)
        elif t == "map":
            if spec.get("type") != "object" or "additionalProperties" not in spec:
                problems.append(f"{where}: the SDK sends a map, the schema has {spec}")
            else:
                check_kind(where + "{}", kind["items"], spec["additionalProperties"], module, seen)
        elif t == "enum":
            token = ref.removeprefix("#/types/")
            if token not in types or "enum" not in types[token]:
                problems.append(f"{where}: the SDK sends enum {kind['name']}, the schema has {spec}")
            else:
                want = next((v for k, v in contract["enums"].items() if k == token), None)
                got = [e["value"] for e in types[token]["enum"]]
                if want is None:
                    problems.append(f"{where}: schema enum {token} is not an SDK enum token")
                elif sorted(want) != sorted(got):
                    problems.append(f"{where}: enum {token} values {got} != SDK {want}")
        elif t == "object":
            token = ref.removeprefix("#/types/")
            if token not in types:
                problems.append(f"{where}: the SDK sends object {kind['name']}, the schema has {spec}")
            elif (kind["name"], token) not in seen:
                seen.add((kind["name"], token))
                check_object(where, contract["objects"][kind["name"]], types[token], module, seen)

    def check_object(where: str, sdk_obj: dict, spec: dict, module: str, seen: set, props_key="properties"):
        props = spec.get(props_key) or {}
        for name, kind in sdk_obj["properties"].items():
            if name not in props:
                problems.append(f"{where}.{name}: used by the SDK, missing from the schema")
                continue
            check_kind(f"{where}.{name}", kind, props[name], module, seen)
            if name in sdk_obj["defaults"]:
                want = sdk_obj["defaults"][name]
                got = props[name].get("default")
                if got != want:
                    problems.append(f"{where}.{name}: SDK default {want!r}, schema default {got!r}")
        req_key = "requiredInputs" if props_key == "inputProperties" else "required"
        schema_required = set(spec.get(req_key) or [])
        for name in sdk_obj["required"]:
            if name not in schema_required:
                problems.append(f"{where}.{name}: required by the SDK, optional in the schema")
        for name in schema_required - set(sdk_obj["required"]):
            if props_key != "properties" or name not in sdk_obj["properties"]:
                problems.append(f"{where}.{name}: required by the schema, optional in the SDK")

    for token, sdk_res in sorted(contract["resources"].items()):
        if token not in RESOURCES_WANTED:
            continue
        module = Path(sdk_res["file"]).parent.name
        spec = res_schema.get(token)
        if spec is None:
            problems.append(f"{token}: missing from the schema")
            continue
        check_object(f"{token} input", sdk_res["inputs"], spec, module, set(), "inputProperties")
        outs = {"properties": sdk_res["outputs"]["properties"], "required": [], "defaults": {}}
        check_object(f"{token} output", outs, spec, module, set())
        for name in sdk_res["secretOutputs"]:
            if not (spec.get("properties", {}).get(name, {}).get("secret")):
                problems.append(f"{token}.{name}: the SDK keeps it secret, the schema does not mark it secret")
        for path in sdk_res["replaceOnChanges"]:
            root = path.split("[")[0].split(".")[0]
            if not spec.get("inputProperties", {}).get(root, {}).get("replaceOnChanges"):
                problems.append(f"{token}.{root}: the SDK replaces on changes ({path}), the schema does not")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdk", type=Path)
    ap.add_argument("--schema", type=Path)
    ap.add_argument("--dump", action="store_true")
    ns = ap.parse_args()
    contract = sdk_contract(ns.sdk or find_sdk())
    if ns.dump or not ns.schema:
        json.dump(contract, sys.stdout, indent=1, sort_keys=True)
        return 0
    missing = RESOURCES_WANTED - set(contract["resources"])
    if missing:
        print(f"the SDK itself has no {sorted(missing)}: wrong SDK?")
        return 1
    problems = compare(contract, json.loads(ns.schema.read_text()))
    for p in problems:
        print(p)
    n_in = sum(len(contract["resources"][t]["inputs"]["properties"]) for t in RESOURCES_WANTED)
    n_out = sum(len(contract["resources"][t]["outputs"]["properties"]) for t in RESOURCES_WANTED)
    print(f"checked {len(RESOURCES_WANTED)} resources, {n_in} input and {n_out} output names "
          f"(nested objects and enums followed): {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
