"""The spark-vllm CrossGuard rules: the policy pack's registry, importable without side effects.

`__main__.py` only builds the PolicyPack (whose constructor starts the analyzer gRPC server and
blocks) from `POLICIES`, so tests import this package instead. Importing it starts nothing.

Layout (policies/README.md): one module per rule or closely related pair, each holding its validate
function(s), its findings helper(s) and its policy object; shared helpers in `_common` (props,
config, environment), `_containers` (argv/shell tokens, labels, envs), `_schema` (config schemas)
and `_secrets` (secret placements, the stack file). This module lists the policies in the pack's
order and re-exports the helpers and constants that tests and tools use as `rules.<name>`.

What the rules review (docs/contract.md "What policies see"): the components' props
(`spark-vllm:<module>:<Class>`), docker containers (camelCase provider props), remote commands.

Two facts about pulumi_policy 1.21.0 shape every rule (see policies/README.md):
* Unknown values: props arrive wrapped in `unknown_checking_proxy`; reading an unknown value raises
  `UnknownValueError`. The helpers (`get`, `elements`, and `props_of`, which reads a component's
  props through its TypedDict of contract/props.py) turn that into `UNKNOWN`, and every check
  skips what it cannot know, so a preview never crashes a rule and never fails on a guess.
* Secrets: `Analyze`/`AnalyzeStack` deserialize with `proxy_secrets=False`, so a secret arrives as
  its plain value, indistinguishable from a plaintext one. A rule cannot ask "is this a secret?";
  the secret rules therefore check where a value sits (command lines, labels, inline shell are never
  safe), whether the stack file holds the key as `secure:`, and optionally that the resource carries
  `additionalSecretOutputs` for the property.
"""
from __future__ import annotations

from pulumi_policy import Policy

from ._common import (
    COLLECTIVE_GATE,
    COMMAND_TYPES,
    CONTAINER,
    DEFAULTS,
    GIB,
    MODEL_CACHE,
    NCCL_ENV,
    SPARK_NODE,
    UNKNOWN,
    VLLM_IMAGE,
    VLLM_SERVER,
    VLLM_SERVICE,
    Report,
    conf,
    elements,
    environment_of,
    flag,
    get,
    gib,
    is_unknown,
    mapping_items,
    num,
    stack_config,
    stack_environment,
    text,
)
from ._containers import (
    command_tokens,
    env_pairs,
    envs_of,
    flag_value,
    has_flag,
    is_literal,
    is_ray_container,
    labels_of,
    provider_host,
    shell_tokens,
)
from ._firewall import FIREWALL
from ._secrets import (
    API_ENV_NAMES,
    API_KEY_RE,
    HF_ENV_NAMES,
    HF_TOKEN_RE,
    classify_env,
    env_findings,
    mask,
    plaintext_config_keys,
    read_stack_config_text,
    secret_findings,
)
from .advisories import (
    KNOWN_BAD_NCCL,
    enforce_eager_advisory,
    gpu_memory_utilization_advisory,
    nccl_build_advisory,
    nccl_build_findings,
    validate_enforce_eager_advisory,
    validate_nccl_build_advisory,
    validate_utilization_advisory,
)
from .api_key import validate_vllm_api_key, vllm_api_key
from .fabric import fabric_mtu, nccl_findings, nccl_rdma_interfaces, validate_mtu, validate_nccl
from .fabric_config import (
    NODE_FABRIC,
    fabric_address_findings,
    fabric_addresses_unique,
    fabric_config,
    fabric_config_findings,
    parse_cidr,
    validate_fabric_addresses_unique,
    validate_fabric_config,
)
from .firewall import firewall_findings, stack_ports_firewalled, validate_stack_ports_firewalled
from .gateway import (
    GATEWAY,
    behind_gateway_findings,
    validate_vllm_behind_gateway,
    vllm_behind_gateway,
)
from .hf_token import hf_token_secret, validate_hf_token
from .images import same_image_everywhere, validate_same_image
from .memory import memory_fit, memory_fit_findings, validate_memory_fit
from .monitoring import (
    MONITORING,
    monitoring_findings,
    monitoring_not_exposed,
    parse_listen,
    validate_monitoring_not_exposed,
)
from .parallelism import parallelism_matches_gpus, validate_parallelism
from .pinning import (
    COMMIT_RE,
    DIGEST_REF_RE,
    HOST_KEY_RE,
    IMAGE_ID_RE,
    prod_pinned,
    validate_prod_pinned,
)
from .privileges import no_privileged_containers, validate_no_privileged
from .ray_exposure import (
    auth_findings,
    parse_ip,
    ray_exposure_findings,
    ray_not_exposed,
    validate_ray_not_exposed,
)
from .remote_code import remote_code_findings, remote_code_reviewed, validate_remote_code
from .rendezvous import mp_rendezvous_fabric_only, validate_mp_rendezvous

POLICIES: list[Policy] = [
    memory_fit,
    same_image_everywhere,
    parallelism_matches_gpus,
    nccl_rdma_interfaces,
    fabric_mtu,
    no_privileged_containers,
    ray_not_exposed,
    vllm_api_key,
    hf_token_secret,
    prod_pinned,
    gpu_memory_utilization_advisory,
    enforce_eager_advisory,
    mp_rendezvous_fabric_only,
    vllm_behind_gateway,
    fabric_config,
    fabric_addresses_unique,
    monitoring_not_exposed,
    nccl_build_advisory,
    stack_ports_firewalled,
    remote_code_reviewed,
]

BY_NAME: dict[str, Policy] = {p.name: p for p in POLICIES}

__all__ = [
    "API_ENV_NAMES",
    "API_KEY_RE",
    "BY_NAME",
    "COLLECTIVE_GATE",
    "COMMAND_TYPES",
    "COMMIT_RE",
    "CONTAINER",
    "DEFAULTS",
    "DIGEST_REF_RE",
    "FIREWALL",
    "GATEWAY",
    "GIB",
    "HF_ENV_NAMES",
    "HF_TOKEN_RE",
    "HOST_KEY_RE",
    "IMAGE_ID_RE",
    "KNOWN_BAD_NCCL",
    "MODEL_CACHE",
    "MONITORING",
    "NCCL_ENV",
    "NODE_FABRIC",
    "POLICIES",
    "SPARK_NODE",
    "UNKNOWN",
    "VLLM_IMAGE",
    "VLLM_SERVER",
    "VLLM_SERVICE",
    "Report",
    "auth_findings",
    "behind_gateway_findings",
    "classify_env",
    "command_tokens",
    "conf",
    "elements",
    "enforce_eager_advisory",
    "env_findings",
    "env_pairs",
    "environment_of",
    "envs_of",
    "fabric_address_findings",
    "fabric_addresses_unique",
    "fabric_config",
    "fabric_config_findings",
    "fabric_mtu",
    "firewall_findings",
    "flag",
    "flag_value",
    "get",
    "gib",
    "gpu_memory_utilization_advisory",
    "has_flag",
    "hf_token_secret",
    "is_literal",
    "is_ray_container",
    "is_unknown",
    "labels_of",
    "mapping_items",
    "mask",
    "memory_fit",
    "memory_fit_findings",
    "monitoring_findings",
    "monitoring_not_exposed",
    "mp_rendezvous_fabric_only",
    "nccl_build_advisory",
    "nccl_build_findings",
    "nccl_findings",
    "nccl_rdma_interfaces",
    "no_privileged_containers",
    "num",
    "parallelism_matches_gpus",
    "parse_cidr",
    "parse_ip",
    "parse_listen",
    "plaintext_config_keys",
    "prod_pinned",
    "provider_host",
    "ray_exposure_findings",
    "ray_not_exposed",
    "read_stack_config_text",
    "remote_code_findings",
    "remote_code_reviewed",
    "same_image_everywhere",
    "secret_findings",
    "shell_tokens",
    "stack_config",
    "stack_environment",
    "stack_ports_firewalled",
    "text",
    "validate_enforce_eager_advisory",
    "validate_fabric_addresses_unique",
    "validate_fabric_config",
    "validate_hf_token",
    "validate_memory_fit",
    "validate_monitoring_not_exposed",
    "validate_mp_rendezvous",
    "validate_mtu",
    "validate_nccl",
    "validate_nccl_build_advisory",
    "validate_no_privileged",
    "validate_parallelism",
    "validate_prod_pinned",
    "validate_ray_not_exposed",
    "validate_remote_code",
    "validate_same_image",
    "validate_stack_ports_firewalled",
    "validate_utilization_advisory",
    "validate_vllm_api_key",
    "validate_vllm_behind_gateway",
    "vllm_api_key",
    "vllm_behind_gateway",
]
