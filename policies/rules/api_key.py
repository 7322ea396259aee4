"""8. vllm-api-key: outside dev, vLLM requires an API key, held as a secret (never on a command
line or inline in a script; stack config `secure:`)."""
from __future__ import annotations

from pulumi_policy import EnforcementLevel, StackValidationArgs, StackValidationPolicy

from ._common import DEFAULTS, VLLM_SERVER, Report, conf, environment_of, get, is_unknown
from ._schema import ENV_PROP, env_list_prop, schema
from ._secrets import API_ENV_NAMES, report_plaintext_config, secret_findings


def validate_vllm_api_key(args: StackValidationArgs, report: Report) -> None:
    non_dev = set(conf(args, "nonDevEnvironments") or [])
    for r in args.resources:
        if r.resource_type != VLLM_SERVER:
            continue
        env = environment_of(r.props, args)
        if env not in non_dev:
            continue
        key = get(r.props, "apiKey")
        if is_unknown(key):
            continue
        if not (isinstance(key, str) and key.strip()):
            report(f"environment '{env}': vLLM serves without an API key; set one with "
                   f"`pulumi config set --secret spark-vllm:vllmApiKey <key>`", r.urn)
    for msg, urn in secret_findings(args, API_ENV_NAMES, ("--api-key",), None, "the vLLM API key"):
        report(msg, urn)
    report_plaintext_config(args, "spark-vllm:vllmApiKey", report)


vllm_api_key = StackValidationPolicy(
    name="vllm-api-key",
    description="Outside dev, vLLM requires an API key, held as a secret (never on a command line "
                "or inline in a script; stack config `secure:`).",
    validate=validate_vllm_api_key,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="`pulumi config set --secret spark-vllm:vllmApiKey <key>`; the program "
                      "passes it to the container as VLLM_API_KEY in envs (a secret Output), never "
                      "as --api-key.",
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
