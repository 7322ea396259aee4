"""9. hf-token-secret: the Hugging Face token exists only as a secret: never in command lines,
labels, inline scripts, environment values or component props; stack config `secure:`. Also
reports any other token (`hf_...`, *TOKEN*) in an environment value (see _secrets.py)."""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence

from pulumi_policy import EnforcementLevel, StackValidationArgs, StackValidationPolicy

from ._common import NCCL_ENV, Json, Props, Report, elements, mapping_items, unwrap
from ._schema import schema
from ._secrets import HF, HF_ENV_NAMES, HF_TOKEN_RE, report_plaintext_config, secret_findings

# Prop paths that are a secret's declared channel (apiKey, hfToken, hostKey ...).
SECRET_CHANNEL_RE = re.compile(r"token|key|secret|password", re.I)
ENV_PROP_RE = re.compile(r"nodes\[\d+\]\.env\.")


def _string_leaves(value: Json, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, string) for every string inside a prop value (`nodes[0].name`)."""
    value = unwrap(value)
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in mapping_items(value):
            yield from _string_leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        for i, v in enumerate(elements(value)):
            yield from _string_leaves(v, f"{path}[{i}]")


def _literal_token_paths(props: Props) -> list[str]:
    """Component props that are not a secret's channel but carry a token-looking literal."""
    return [path for path, value in _string_leaves(props)
            if not SECRET_CHANNEL_RE.search(path) and HF_TOKEN_RE.search(value)]


def validate_hf_token(args: StackValidationArgs, report: Report) -> None:
    for msg, urn in secret_findings(args, HF_ENV_NAMES, ("--token", "--hf-token"), HF_TOKEN_RE,
                                    "the HF token", rule=HF):
        report(msg, urn)
    for r in args.resources:
        if not r.resource_type.startswith("spark-vllm:"):
            continue
        for path in _literal_token_paths(r.props):
            if r.resource_type == NCCL_ENV and ENV_PROP_RE.match(path):
                continue  # nodes[].env: reported with its key by secret_findings
            report(f"{r.resource_type.split(':')[-1]} {r.name}: a literal HF token in prop "
                   f"{path}", r.urn)
    report_plaintext_config(args, "spark-vllm:hfToken", report)


hf_token_secret = StackValidationPolicy(
    name="hf-token-secret",
    description="The Hugging Face token exists only as a secret: never in command lines, labels, "
                "inline scripts, environment values or component props; stack config `secure:`; "
                "no token in any environment value.",
    validate=validate_hf_token,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="`pulumi config set --secret spark-vllm:hfToken <token>`; the program "
                      "passes it on the fetch command's stdin (a secret Output), never in envs, "
                      "`environment`, nccl.extraEnv or a script.",
    config_schema=schema(
        requireSecretOutputs={"type": "boolean", "default": False},
        projectDir={"type": "string"},
    ),
)
