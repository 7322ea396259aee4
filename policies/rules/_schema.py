"""Builders for the policies' `config_schema` (JSON Schema fragments, see policies/README.md
"Per-stack policy config")."""
from __future__ import annotations

from typing import Any

from pulumi_policy import PolicyConfigSchema

SchemaProp = dict[str, Any]
"""The JSON Schema of one config key (`{"type": "number", "default": ...}`)."""


def schema(**props: SchemaProp) -> PolicyConfigSchema:
    return PolicyConfigSchema(properties=props)


ENV_PROP: SchemaProp = {"type": "string", "description": "fallback stack environment when no "
                        "VllmServer carries one (dev | staging | prod)"}


FABRIC_SUBNETS_PROP: SchemaProp = {
    "type": "array", "items": {"type": "string"}, "default": [],
    "description": "CIDRs of the fabric; default: stack config nccl.fabricSubnets"}
"""`fabricSubnets` of the rules that tell the fabric's addresses from the others."""


def env_list_prop(default: list[str], what: str) -> SchemaProp:
    """A list of environment names (`nonDevEnvironments`, `prodEnvironments`)."""
    return {"type": "array", "items": {"type": "string"}, "default": default, "description": what}
