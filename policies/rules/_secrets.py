"""Shared by the secret rules (vllm-api-key, hf-token-secret): where a secret must never sit.

`Analyze`/`AnalyzeStack` deserialize with `proxy_secrets=False`, so a secret arrives as its plain
value, indistinguishable from a plaintext one: a rule cannot ask "is this a secret?". These helpers
therefore check where a value sits (command lines, labels and inline shell are never safe), whether
the stack file holds the key as `secure:`, and optionally that the resource carries
`additionalSecretOutputs` for the property (policies/README.md "Secrets").
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pulumi_policy import PolicyResource, StackValidationArgs

from ._common import (
    COMMAND_TYPES,
    CONTAINER,
    ConfigSource,
    Finding,
    Report,
    conf,
    get,
    mapping_items,
    text,
)
from ._containers import command_tokens, envs_of, flag_value, is_literal, labels_of, shell_tokens

HF_TOKEN_RE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
HF_ENV_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN")
API_ENV_NAMES = ("VLLM_API_KEY",)


# --------------------------------------------------------------------------------------------
# The stack file
# --------------------------------------------------------------------------------------------
def _project_dir(args: ConfigSource) -> Path:
    """Pack config `projectDir`, else the pack's parent directory (the Pulumi project)."""
    configured = conf(args, "projectDir")
    if isinstance(configured, str) and configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2]  # policies/rules/_secrets.py -> the project


def read_stack_config_text(args: ConfigSource) -> str | None:
    """The Pulumi.<stack>.yaml text, or None outside the engine / when it is not on disk
    (e.g. config from an ESC environment). Tests replace this function (`rules.` attribute)."""
    stack = os.environ.get("PULUMI_STACK")
    if not stack:
        return None
    path = _project_dir(args) / f"Pulumi.{stack.split('/')[-1]}.yaml"
    try:
        return path.read_text()
    except OSError:
        return None


def plaintext_config_keys(stack_yaml: str | None, keys: Iterable[str]) -> list[str]:
    """The given config keys that the stack file holds in plaintext instead of `secure:`."""
    if not stack_yaml:
        return []
    try:
        import yaml  # PyYAML ships with the pulumi SDK
        doc = yaml.safe_load(stack_yaml) or {}
    except Exception:  # an unparsable file is the program's problem, not ours
        return []
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        return []
    return [key for key in keys if key in config and _is_plaintext(config[key])]


def _is_plaintext(value: object) -> bool:
    return not (isinstance(value, dict) and "secure" in value) and value not in (None, "")


def report_plaintext_config(args: StackValidationArgs, key: str, report: Report) -> None:
    """Report `key` if the stack file holds it in plaintext.

    The file is read through the registry's `rules.read_stack_config_text`, looked up at call
    time, so that a test replacing that attribute is honoured (as with the single-module pack)."""
    from . import read_stack_config_text as read  # late, see the docstring

    for k in plaintext_config_keys(read(args), [key]):
        report(f"stack config {k} is stored in plaintext; re-set it with `pulumi config set "
               f"--secret {k}`", None)


# --------------------------------------------------------------------------------------------
# Plaintext placements in containers and commands
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _SecretSpec:
    """What to look for: the env names that carry the secret, the CLI flags that would take it,
    what a literal value looks like (None: unrecognizable) and how messages name it."""

    env_names: Sequence[str]
    cli_flags: Sequence[str]
    value_re: re.Pattern[str] | None
    what: str
    require_aso: bool

    def literal_flags(self, tokens: Sequence[str]) -> list[str]:
        """The CLI flags given a literal value in `tokens`."""
        found = []
        for f in self.cli_flags:
            v = flag_value(tokens, f)
            if v is not None and is_literal(v):
                found.append(f)
        return found

    def inline_assignments(self, token: str) -> list[str]:
        """The env names `token` assigns a literal to (`HF_TOKEN=hf_...`)."""
        return [name for name in self.env_names
                if token.startswith(name + "=") and is_literal(token.split("=", 1)[1])]

    def looks_like_value(self, s: str) -> bool:
        return bool(self.value_re and self.value_re.search(s))


def _secret_outputs(r: PolicyResource) -> list[str]:
    return list(getattr(r.opts, "additional_secret_outputs", None) or [])


def _container_findings(r: PolicyResource, s: _SecretSpec) -> list[Finding]:
    tokens = command_tokens(r.props) + command_tokens(r.props, "entrypoints")
    out: list[Finding] = []
    for f in s.literal_flags(tokens):
        out.append((f"container {r.name}: {s.what} passed on the command line ({f} ...), "
                    f"readable in `ps` and `docker inspect`", r.urn))
    for tok in tokens:
        for env_name in s.inline_assignments(tok):
            out.append((f"container {r.name}: {s.what} inline in the command ({env_name}=...)",
                        r.urn))
        if s.looks_like_value(tok):
            out.append((f"container {r.name}: a literal {s.what} appears in the command", r.urn))
    for label, value in labels_of(r.props).items():
        if s.looks_like_value(text(value) or "") or label.upper() in s.env_names:
            out.append((f"container {r.name}: {s.what} in label {label}; labels are never secret",
                        r.urn))
    envs = envs_of(r.props)
    if s.require_aso and any(k in envs for k in s.env_names) and "envs" not in _secret_outputs(r):
        out.append((f"container {r.name}: carries {s.what} in envs without "
                    f"additionalSecretOutputs=['envs']", r.urn))
    return out


def _script_findings(r: PolicyResource, key: str, script: str, s: _SecretSpec) -> list[Finding]:
    """One `create`/`update`/`delete` script of a command."""
    toks = shell_tokens(script)
    out: list[Finding] = []
    for tok in toks:
        for env_name in s.inline_assignments(tok):
            out.append((f"command {r.name}: {s.what} inline in its {key} script "
                        f"({env_name}=...); pass it in `environment` from a secret", r.urn))
    for f in s.literal_flags(toks):
        out.append((f"command {r.name}: {s.what} on the command line of its {key} script "
                    f"({f} ...)", r.urn))
    if s.looks_like_value(script):
        out.append((f"command {r.name}: a literal {s.what} appears in its {key} script", r.urn))
    return out


def _command_findings(r: PolicyResource, s: _SecretSpec) -> list[Finding]:
    out: list[Finding] = []
    for key in ("create", "update", "delete"):
        script = text(get(r.props, key))
        if script:
            out.extend(_script_findings(r, key, script, s))
    environment = get(r.props, "environment")
    if s.require_aso and any(k in s.env_names for k, _ in mapping_items(environment)) \
            and "environment" not in _secret_outputs(r):
        out.append((f"command {r.name}: carries {s.what} in environment without "
                    f"additionalSecretOutputs=['environment']", r.urn))
    return out


def secret_findings(args: StackValidationArgs, env_names: Sequence[str], cli_flags: Sequence[str],
                    value_re: re.Pattern[str] | None, what: str) -> list[Finding]:
    """Plaintext placements of a secret in containers and commands: (message, urn)."""
    s = _SecretSpec(env_names, cli_flags, value_re, what, bool(conf(args, "requireSecretOutputs")))
    out: list[Finding] = []
    for r in args.resources:
        if r.resource_type == CONTAINER:
            out.extend(_container_findings(r, s))
        elif r.resource_type in COMMAND_TYPES:
            out.extend(_command_findings(r, s))
    return list(dict.fromkeys(out))  # de-duplicate, keep order
