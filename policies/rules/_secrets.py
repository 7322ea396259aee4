"""Shared by the secret rules (vllm-api-key, hf-token-secret): where a secret must never sit.

`Analyze`/`AnalyzeStack` deserialize with `proxy_secrets=False`, so a secret arrives as its plain
value, indistinguishable from a plaintext one: a rule cannot ask "is this a secret?". These helpers
therefore check where a value sits (command lines, labels and inline shell are never safe), whether
the stack file holds the key as `secure:`, and optionally that the resource carries
`additionalSecretOutputs` for the property (policies/README.md "Secrets").

Environment values are never a safe place either, secret Output or not: a container's `envs` are
readable in `docker inspect` (and by every process in the container), a command's `environment`
and inline `KEY=value` reach the node's process table. The program passes its secrets on stdin
or in files. So every environment value is scanned, wherever it is: container `envs` and
`command` tokens, command `environment` and `KEY=value` words of create/update/delete scripts, and
the NcclEnvironment's `nodes[].env` (where `nccl.extraEnv` lands). A value is a secret when it
looks like a token (`hf_` + 20 or more alphanumerics, OpenAI-style `sk-` keys, a PEM private
key: contract/forms.py, the program's shapes too) or when its name
says so (*TOKEN*, *SECRET*, *PASSWORD*, *API_KEY* ...) and it holds a literal (not a `$VAR`
reference, not a flag such as 0/1/true/false, not a *_PATH/*_FILE name pointing at a file).
`classify_env` decides, and which rule reports it: the HF token and other tokens go to
hf-token-secret, API keys and other secrets to vllm-api-key. Findings name the resource and the
key and show the value only masked (`mask`).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pulumi_policy import PolicyResource, StackValidationArgs

from contract import forms
from contract.props import NcclEnvironmentProps

from ._common import (
    COMMAND_TYPES,
    CONTAINER,
    NCCL_ENV,
    ConfigSource,
    Finding,
    Report,
    conf,
    each,
    elements,
    get,
    mapping_items,
    props_of,
    text,
)
from ._containers import command_tokens, envs_of, flag_value, is_literal, labels_of, shell_tokens

# The secret shapes, one definition with the program's (contract/forms.py: the program refuses
# them in plain config, the pack flags them where secrets must never sit)
HF_TOKEN_RE = forms.HF_TOKEN
API_KEY_RE = forms.API_KEY  # OpenAI-style keys
PEM_KEY_RE = forms.PEM_KEY
HF_ENV_NAMES = forms.HF_TOKEN_ENV_NAMES
API_ENV_NAMES = forms.API_KEY_ENV_NAMES
# Names that say they hold a secret
SECRET_NAME_RE = forms.SECRET_NAME
API_NAME_RE = forms.API_KEY_NAME
# ... unless they name a file holding it (RAY_AUTH_TOKEN_PATH, HF_TOKEN_PATH)
FILE_REF_RE = re.compile(r"_(?:PATH|FILE|DIR|FILENAME)$", re.IGNORECASE)
FLAG_VALUES = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off"})
# `KEY=value` words of scripts: environment-style (upper case) names only, so a Python or shell
# local such as `token=token` is not taken for an environment variable
SCRIPT_ASSIGNMENT_RE = re.compile(r"([A-Z_][A-Z0-9_]*)=(.*)", re.DOTALL)

HF, API = "hf-token-secret", "vllm-api-key"  # which rule reports a finding


def mask(value: str) -> str:
    """What a message may show of a secret: its public prefix (hf_, sk-) and its length."""
    prefix = next((p for p in ("hf_", "sk-") if value.startswith(p)), "")
    return f"{prefix}*** {len(value)} chars"


def classify_env(name: str, value: str) -> tuple[str, str] | None:
    """(rule, what) when the environment value `name=value` holds a secret, else None."""
    if HF_TOKEN_RE.search(value):
        return HF, "the HF token"
    if API_KEY_RE.search(value):
        return API, "an API key"
    if PEM_KEY_RE.search(value):
        return API, "a private key"
    if not is_literal(value) or value.strip().lower() in FLAG_VALUES or FILE_REF_RE.search(name):
        return None
    upper = name.upper()
    if upper in HF_ENV_NAMES:
        return HF, "the HF token"
    if upper in API_ENV_NAMES or API_NAME_RE.search(upper):
        return API, "an API key"
    found = SECRET_NAME_RE.search(upper)
    if found is None:
        return None
    return (HF, "a token") if found.group(0).upper() == "TOKEN" else (API, "a secret")


def _assignments(tokens: Sequence[str]) -> list[tuple[str, str]]:
    """The `KEY=value` words among shell/argv tokens."""
    out = []
    for tok in tokens:
        m = SCRIPT_ASSIGNMENT_RE.fullmatch(tok)
        if m:
            out.append((m.group(1), m.group(2)))
    return out


def env_findings(args: StackValidationArgs, rule: str) -> list[Finding]:
    """Every environment value holding a secret that `rule` reports: (message, urn)."""
    out: list[Finding] = []

    def add(where: str, name: str, value: str, urn: str, fix: str) -> None:
        found = classify_env(name, value)
        if found is not None and found[0] == rule:
            link = "to" if where.endswith(" sets") else "carries"
            out.append((f"{where} {name} {link} {found[1]} ({mask(value)}); {fix}", urn))

    inspect = ("environment values are readable in `docker inspect` and the state; pass it on "
               "stdin or in a mounted file from a secret")
    for r in args.resources:
        if r.resource_type == CONTAINER:
            for item in elements(get(r.props, "envs")):
                if isinstance(item, str) and "=" in item:
                    name, value = item.split("=", 1)
                    add(f"container {r.name}: env", name, value, r.urn, inspect)
            tokens = command_tokens(r.props) + command_tokens(r.props, "entrypoints")
            for name, value in _assignments(tokens):
                add(f"container {r.name}: its command sets", name, value, r.urn,
                    "a command line is readable in `ps` and `docker inspect`")
        elif r.resource_type in COMMAND_TYPES:
            for name, value in mapping_items(get(r.props, "environment")):
                if isinstance(value, str):
                    add(f"command {r.name}: environment", name, value, r.urn,
                        "the remote process's environment is readable on the node; pass it on "
                        "stdin from a secret")
            for key in ("create", "update", "delete"):
                for name, value in _assignments(shell_tokens(text(get(r.props, key)))):
                    add(f"command {r.name}: its {key} script sets", name, value, r.urn,
                        "pass it on stdin from a secret, never inline")
        elif r.resource_type == NCCL_ENV:
            for node in each(props_of(r, NcclEnvironmentProps)["nodes"]):
                node_name = text(node["name"]) or "?"
                for name, value in mapping_items(node["env"]):
                    if isinstance(value, str):
                        add(f"NcclEnvironment {r.name}: node {node_name} env", name, value, r.urn,
                            "nccl.extraEnv reaches every Ray container's env (`docker inspect`); "
                            "use the secrets spark-vllm:hfToken / spark-vllm:vllmApiKey")
    return out


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

    def looks_like_value(self, s: str) -> bool:
        return bool(self.value_re and self.value_re.search(s))

    def loose_values(self, s: str, tokens: Sequence[str]) -> list[str]:
        """Token-looking literals in `s` that no `KEY=value` word of `tokens` holds (those are
        reported by `env_findings`)."""
        if self.value_re is None:
            return []
        assigned = " ".join(value for _, value in _assignments(tokens))
        return [m.group(0) for m in self.value_re.finditer(s) if m.group(0) not in assigned]


def _secret_outputs(r: PolicyResource) -> list[str]:
    return list(getattr(r.opts, "additional_secret_outputs", None) or [])


def _container_findings(r: PolicyResource, s: _SecretSpec) -> list[Finding]:
    tokens = command_tokens(r.props) + command_tokens(r.props, "entrypoints")
    out: list[Finding] = []
    for f in s.literal_flags(tokens):
        out.append((f"container {r.name}: {s.what} passed on the command line ({f} ...), "
                    f"readable in `ps` and `docker inspect`", r.urn))
    for value in s.loose_values(" ".join(tokens), tokens):
        if not any(flag_value(tokens, f) == value for f in s.cli_flags):
            out.append((f"container {r.name}: {s.what} appears literally in the command "
                        f"({mask(value)})", r.urn))
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
    flagged = []
    for f in s.literal_flags(toks):
        flagged.append(flag_value(toks, f))
        out.append((f"command {r.name}: {s.what} on the command line of its {key} script "
                    f"({f} ...)", r.urn))
    for value in s.loose_values(script, toks):
        if value not in flagged:
            out.append((f"command {r.name}: {s.what} appears literally in its {key} script "
                        f"({mask(value)})", r.urn))
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
                    value_re: re.Pattern[str] | None, what: str, *,
                    rule: str = "") -> list[Finding]:
    """Plaintext placements of a secret in containers and commands, and (with `rule`) every
    environment value holding a secret that rule reports (`env_findings`): (message, urn)."""
    s = _SecretSpec(env_names, cli_flags, value_re, what, bool(conf(args, "requireSecretOutputs")))
    out: list[Finding] = env_findings(args, rule) if rule else []
    for r in args.resources:
        if r.resource_type == CONTAINER:
            out.extend(_container_findings(r, s))
        elif r.resource_type in COMMAND_TYPES:
            out.extend(_command_findings(r, s))
    return list(dict.fromkeys(out))  # de-duplicate, keep order
