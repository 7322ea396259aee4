"""Reading the stack config and its secrets from the Pulumi runtime.

Every value the program acts on comes from `Pulumi.<stack>.yaml` under the `spark-vllm`
namespace. Secrets (`hfToken`, `vllmApiKey`, `sshPrivateKey`, `gatewayTlsKey`,
`alertingSecrets`) never enter the config models:
`load_secrets` returns them as secret Outputs that components pass straight to resources.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from config.errors import ConfigError, key_path
from config.forms import NAMESPACE, SECRET_KEYS
from config.known_hosts import pin_host_keys
from config.models import StackConfig
from config.paths import local_state_dir
from config.ssh import write_private
from config.validate import validate_config


def _present_keys() -> set[str]:
    """Every key set under the namespace, read from the SDK's config store (for unknown keys)."""
    from pulumi.runtime import config as rc

    keys = set(rc.CONFIG.get()) | set(rc.get_config_env())
    prefix = f"{NAMESPACE}:"
    return {k[len(prefix) :] for k in keys if k.startswith(prefix)}


def plain_value(value: Any, key: str = "") -> Any:
    """A plain `spark-vllm:<key>` value from a stack file or a ConfigMap as load_config reads it,
    for the CLI's readers of stack files (one rule, not one per reader): `environment` as text
    (Config.get), any other text that is JSON as the value it encodes (Config.get_object:
    `pulumi config set` of a list and the Automation API store objects as JSON text), other text
    as it is (validation judges it); a value that is not text as it is."""
    if key == "environment" or not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def load_config(pulumi_config: pulumi.Config | None = None) -> StackConfig:
    """Read every top-level key of the `spark-vllm` namespace and validate the whole config."""
    conf = pulumi_config or pulumi.Config(NAMESPACE)
    raw: dict[str, Any] = {}
    problems: list[str] = []
    for name, field in StackConfig.model_fields.items():
        key = field.alias or name
        try:
            value = conf.get(key) if key == "environment" else conf.get_object(key)
        except Exception:  # ConfigTypeError: not JSON where a mapping/list is expected
            problems.append(
                f"{key_path((key,))}: got {conf.get(key)!r}; expected a YAML mapping/list"
            )
            continue
        if value is not None:
            raw[key] = value
    known = {f.alias or n for n, f in StackConfig.model_fields.items()} | set(SECRET_KEYS)
    for extra in sorted(_present_keys() - known):
        problems.append(
            f"{key_path((extra,))}: unknown key; expected one of: {', '.join(sorted(known))}"
        )
    if problems:
        raise ConfigError(problems)
    return pin_host_keys(validate_config(raw))



@dataclass(frozen=True)
class Secrets:
    """Secret Outputs. Never plaintext in Python: they flow only into resource inputs."""

    ssh_private_key: pulumi.Output[str]
    hf_token: pulumi.Output[str] | None = None
    vllm_api_key: pulumi.Output[str] | None = None
    gateway_tls_key: pulumi.Output[str] | None = None  # with gateway.certificate
    # the values monitoring.alerting's receivers name (webhook URLs, SMTP passwords), by name
    alerting: pulumi.Output[Mapping[str, str]] | None = None


# The repository this program runs from, and the passphrase it commits for the lab's dev stack
# (Pulumi.dev.yaml says why: every value it protects is made by and for the lab).
REPOSITORY = Path(__file__).resolve().parents[1]
COMMITTED_PASSPHRASE = REPOSITORY / "lab" / "dev.passphrase"


def _committed_passphrase() -> str | None:
    """Where the passphrase in use is committed (a path relative to the repository), or None.

    The one Pulumi reads (PULUMI_CONFIG_PASSPHRASE, else the file of
    PULUMI_CONFIG_PASSPHRASE_FILE) is committed when it is lab/dev.passphrase's text or its
    file lies inside the repository."""
    given = os.environ.get("PULUMI_CONFIG_PASSPHRASE")
    where = os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if not given and where:
        path = Path(os.path.expanduser(where)).resolve()
        if path.is_relative_to(REPOSITORY):
            return str(path.relative_to(REPOSITORY))
        try:
            given = path.read_text()
        except OSError:
            return None
    try:
        committed = COMMITTED_PASSPHRASE.read_text()
    except OSError:
        return None
    if given is not None and given.strip() and given.strip() == committed.strip():
        return str(COMMITTED_PASSPHRASE.relative_to(REPOSITORY))
    return None


def committed_passphrase_warnings(present: set[str], stack: str) -> list[str]:
    """A warning for each secret key set on a stack whose passphrase is committed: whoever has
    the repository decrypts it from Pulumi.<stack>.yaml (issue 31)."""
    keys = sorted(k for k in present if k in SECRET_KEYS)
    where = _committed_passphrase() if keys else None
    if where is None:
        return []
    return [f"{key_path((k,))} is set on stack {stack}, whose passphrase is committed in this "
            f"repository ({where}): anyone with the repository can decrypt it from "
            f"Pulumi.{stack}.yaml and the state. Set only throw-away values there, or give the "
            "stack a passphrase of its own (pulumi stack change-secrets-provider passphrase)"
            for k in keys]


def load_secrets(cfg: StackConfig, pulumi_config: pulumi.Config | None = None) -> Secrets:
    """Read the secret keys. Outside dev an API key for vLLM is required (in dev the stack makes
    one: StackSecrets), and an HF token is only sent to an https endpoint.

    `sshPrivateKey` falls back to the file at `ssh.privateKeyPath` (the docker provider's ssh
    transport needs that file anyway), read once and wrapped as a secret.
    """
    from pulumi.runtime import config as rc

    conf = pulumi_config or pulumi.Config(NAMESPACE)
    problems = [
        f"{key_path((k,))}: set in plaintext; expected a secret (pulumi config set --secret "
        f"{k} ...)"
        for k in SECRET_KEYS
        if k in _present_keys() and not rc.is_config_secret(f"{NAMESPACE}:{k}")
    ]
    api_key = conf.get_secret("vllmApiKey")
    if api_key is None and cfg.environment != "dev":
        problems.append(
            f"{key_path(('vllmApiKey',))}: missing; expected a secret API key for vLLM outside dev "
            "(pulumi config set --secret vllmApiKey ...)"
        )
    hf_token = conf.get_secret("hfToken")
    endpoint = cfg.model.endpoint
    if hf_token is not None and endpoint and endpoint.startswith("http://") \
            and cfg.environment != "dev":
        problems.append(
            f"{key_path(('model', 'endpoint'))}: got {endpoint!r}; expected an https URL when "
            "the secret spark-vllm:hfToken is set outside dev (the token would cross the "
            "network in clear)"
        )
    tls_key = conf.get_secret("gatewayTlsKey")
    if cfg.gateway.tls and tls_key is None:
        problems.append(
            f"{key_path(('gatewayTlsKey',))}: missing; expected the secret private key of "
            f"{key_path(('gateway', 'certificate'))} (pulumi config set --secret gatewayTlsKey "
            "< key.pem)")
    if tls_key is not None and not cfg.gateway.tls:
        problems.append(
            f"{key_path(('gatewayTlsKey',))}: set, but {key_path(('gateway', 'certificate'))} "
            "is not; expected both (TLS on the gateway) or neither")
    ssh_key = conf.get_secret("sshPrivateKey")
    if ssh_key is None:
        path = cfg.ssh.private_key_file
        if path.is_file():
            ssh_key = pulumi.Output.secret(path.read_text())
        else:
            problems.append(
                f"{key_path(('sshPrivateKey',))}: missing and "
                f"{key_path(('ssh', 'privateKeyPath'))} "
                f"{str(path)!r} is not a file; expected a secret private key or a readable key file"
            )
    alerting, alerting_problems = _alerting_secrets(cfg)
    problems += alerting_problems
    if problems or ssh_key is None:
        raise ConfigError(problems)
    for warning in committed_passphrase_warnings(_present_keys(), pulumi.get_stack()):
        pulumi.log.warn(warning)
    return Secrets(
        ssh_private_key=ssh_key, hf_token=hf_token, vllm_api_key=api_key,
        gateway_tls_key=tls_key, alerting=alerting,
    )


_URL = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[!-~]*)?")


def alerting_secret_problem(kind: str, value: object) -> str | None:
    """Why a value of spark-vllm:alertingSecrets cannot be what its receiver takes it as (a
    webhook's URL, an SMTP password), or None. The message never holds the value."""
    if not isinstance(value, str) or not value:
        return "expected a non-empty string"
    if kind == "url":
        if len(value) > 2048 or not _URL.fullmatch(value) or "\\" in value:
            return ("expected an http(s) URL of printable characters without spaces, at most "
                    "2048 (the value is not shown)")
        return None
    if len(value) > 1024 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "expected at most 1024 characters without control characters (not shown)"
    return None


def _alerting_secrets(cfg: StackConfig) -> tuple[pulumi.Output[Mapping[str, str]] | None,
                                                 list[str]]:
    """The values monitoring.alerting's receivers name, read from the secret
    spark-vllm:alertingSecrets (a JSON object: `pulumi config set --secret --path
    spark-vllm:alertingSecrets.<name>`, the value from stdin), each checked for what it is
    taken as; problems name the key, never a value."""
    m = cfg.monitoring
    wanted: dict[str, str] = {}
    for r in m.alerting.receivers:
        if r.webhook is not None:
            wanted[r.webhook.url_secret] = "url"
        elif r.email is not None and r.email.password_secret:
            wanted[r.email.password_secret] = "password"
    if not m.enabled or not wanted:
        return None, []
    where = key_path(("alertingSecrets",))
    text = secret_plaintext("alertingSecrets")
    if text is None:
        return None, [f"{where}: missing; expected a secret object holding "
                      f"{', '.join(sorted(wanted))} (pulumi config set --secret --path "
                      f"'spark-vllm:alertingSecrets.<name>' < value)"]
    try:
        values = json.loads(text)
    except ValueError:
        values = None
    if not isinstance(values, dict):
        return None, [f"{where}: expected a secret object {{name: value}} (the value is not "
                      "shown)"]
    problems = []
    for name, kind in sorted(wanted.items()):
        if name not in values:
            problems.append(f"{where}.{name}: missing; expected the "
                            f"{'webhook URL' if kind == 'url' else 'SMTP password'} a receiver "
                            "of spark-vllm:monitoring.alerting names")
            continue
        why = alerting_secret_problem(kind, values[name])
        if why:
            problems.append(f"{where}.{name}: {why}")
    if problems:
        return None, problems
    return pulumi.Output.secret({k: values[k] for k in sorted(wanted)}), []


def secret_plaintext(key: str) -> str | None:
    """The decrypted value of a secret key, for the few in-process uses that cannot wait for an
    Output: the hub lookup (HF token) and the SSH key file. Never log or export what it returns.
    """
    from pulumi.runtime import config as rc

    value = rc.get_config(f"{NAMESPACE}:{key}")
    return value or None


def ssh_key_path(cfg: StackConfig) -> str:
    """The private key file recon and the docker provider's ssh transport use.

    The ssh binary needs a file: when the stack holds the key in the secret `sshPrivateKey`, it
    is written (mode 0600, only when changed) to a path that depends only on the project and
    stack, so the docker providers' ssh options do not change from run to run.
    """
    key = secret_plaintext("sshPrivateKey")
    if key is None:
        return str(cfg.ssh.private_key_file)
    folder = local_state_dir() / "keys"
    path = folder / f"{pulumi.get_project()}.{pulumi.get_stack()}"
    text = key if key.endswith("\n") else key + "\n"
    current = None
    if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o077 == 0:
        current = path.read_text()
    if current != text:
        write_private(path, text)
    os.chmod(folder, 0o700)
    return str(path)
