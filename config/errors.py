"""ConfigError and the messages that name the key path, the value and the expected form.

A bad value stops the program with a `ConfigError` that names the key path
(`spark-vllm:nodes[1].fabric[0].ip`), the value and the expected form; it subclasses
`pulumi.RunError`, so the CLI prints the message and no traceback.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pydantic import BaseModel

from config.forms import NAMESPACE, clip, secret_env_name, secret_flag, secret_value
from config.types import ConfigModel


class ConfigError(pulumi.RunError):
    """Invalid stack config. The message is complete: key path, value, expected form."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid stack config ({len(problems)} problem(s)):\n{lines}")


def key_path(loc: tuple[Any, ...]) -> str:
    out = f"{NAMESPACE}:"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if i else "") + str(part)
    return out


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class under `root` that owns the last key of `loc` (to list its keys)."""
    model: Any = root
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
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


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


def allowed_keys(model: type[BaseModel]) -> list[str]:
    """The keys a section takes, as the file spells them."""
    if issubclass(model, ConfigModel):
        return model.accepted_keys()
    return [f.alias or n for n, f in model.model_fields.items()]


def describe(err: dict[str, Any], root: type[BaseModel] | None = None) -> str:
    """One problem of a pydantic ValidationError as `<key path>: got <value>; expected <form>`.
    `root`: the model validated (StackConfig), whose sections list their keys for an unknown
    one."""
    loc = tuple(err["loc"])
    typ = err["type"]
    value = err.get("input")
    if typ == "extra_forbidden":
        owner = _model_at(root, loc) if root is not None else None
        allowed = ", ".join(allowed_keys(owner)) if owner else "see docs"
        return f"{key_path(loc)}: unknown key; expected one of: {allowed} (camelCase)"
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
        return f"{key_path(loc)}: missing; {expected}"
    return f"{key_path(loc)}: got {clip(redacted(value))}; {expected}"


SECRET_SHOWN = "<secret, not shown>"


def redacted(value: Any) -> Any:
    """`value` with every secret in it replaced by SECRET_SHOWN, for an error message: a string
    shaped like a token, a mapping's value under a secret-named key (HF_TOKEN), the value after
    or in a secret-named flag (`--hf-token X`, `--hf-token=X`)."""
    if isinstance(value, str):
        if secret_value(value):
            return SECRET_SHOWN
        if secret_flag(value) and "=" in value:
            return value.split("=", 1)[0] + "=" + SECRET_SHOWN
        return value
    if isinstance(value, dict):
        return {k: SECRET_SHOWN if isinstance(k, str) and secret_env_name(k) else redacted(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        out: list[Any] = []
        for item in value:
            after_flag = bool(out) and isinstance(out[-1], str) and secret_flag(out[-1]) \
                and "=" not in out[-1]
            out.append(SECRET_SHOWN if after_flag else redacted(item))
        return out
    return value
