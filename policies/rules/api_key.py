"""8. vllm-api-key: vLLM requires an API key whenever it listens beyond loopback (in every
environment, dev included; outside dev always), held as a secret (never on a command
line, inline in a script or in any environment value; stack config `secure:`). Also reports any
other API key (`sk-...`, *API_KEY*) or secret (*SECRET*, *PASSWORD* ...) in an environment value
(see _secrets.py)."""
from __future__ import annotations

import ipaddress

from pulumi_policy import EnforcementLevel, StackValidationArgs, StackValidationPolicy

from contract.props import VllmServerProps

from ._common import DEFAULTS, VLLM_SERVER, Report, conf, environment_of, is_unknown, props_of
from ._schema import ENV_PROP, env_list_prop, schema
from ._secrets import API, API_ENV_NAMES, API_KEY_RE, report_plaintext_config, secret_findings


def loopback_only(host: object) -> bool:
    """vLLM's --host binds only the loopback interface (127.0.0.0/8, ::1, localhost)."""
    if not isinstance(host, str):
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate_vllm_api_key(args: StackValidationArgs, report: Report) -> None:
    non_dev = set(conf(args, "nonDevEnvironments") or [])
    for r in args.resources:
        if r.resource_type != VLLM_SERVER:
            continue
        env = environment_of(r.props, args)
        props = props_of(r, VllmServerProps)
        host = props["host"]
        if env not in non_dev and (is_unknown(host) or loopback_only(host)):
            continue
        key = props["apiKey"]
        if is_unknown(key):
            continue
        if not (isinstance(key, str) and key.strip()):
            where = (f"environment '{env}'" if env in non_dev
                     else f"environment '{env}', vLLM listening on {host}")
            report(f"{where}: vLLM serves without an API key (anyone who reaches the port can "
                   "use the model); set one with `pulumi config set --secret "
                   "spark-vllm:vllmApiKey <key>`, or let the stack generate it (the default)",
                   r.urn)
    for msg, urn in secret_findings(args, API_ENV_NAMES, ("--api-key",), API_KEY_RE,
                                    "the vLLM API key", rule=API):
        report(msg, urn)
    report_plaintext_config(args, "spark-vllm:vllmApiKey", report)


vllm_api_key = StackValidationPolicy(
    name="vllm-api-key",
    description="vLLM requires an API key whenever it listens beyond loopback (always outside "
                "dev), held as a secret (never on a command line, "
                "inline in a script or in an environment value; stack config `secure:`); no API "
                "key or other secret in any environment value.",
    validate=validate_vllm_api_key,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="`pulumi config set --secret spark-vllm:vllmApiKey <key>`; the program "
                      "passes it on stdin into a mode-600 file the serving shell exports as "
                      "VLLM_API_KEY, never in envs, `environment` or as --api-key. Other secrets: "
                      "pass them on stdin or in a mounted file, never in an environment value.",
    config_schema=schema(
        environment=ENV_PROP,
        nonDevEnvironments=env_list_prop(DEFAULTS["nonDevEnvironments"],
                                         "environments that require the API key"),
        requireSecretOutputs={"type": "boolean", "default": False,
                              "description": "require additionalSecretOutputs on resources that "
                                             "carry the key"},
        projectDir={"type": "string", "description": "where Pulumi.<stack>.yaml lives "
                                                     "(default: the pack's parent directory)"},
    ),
)
