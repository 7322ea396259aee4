"""The stack configuration: typed, validated once, before anything touches a host.

    forms.py        the exact forms of commits, digests, IDs, sizes, ports; the namespace
    recipe_files.py the files shipped in recipes_data/: recipe names, chat templates
    types.py        the base model and the value types the models share (Annotated)
    serve.py        the serve keys (`vllm.*`), one declaration each: the source of the argv,
                    the flags extraArgs may not set, what promotion carries, a recipe's keys
    errors.py       ConfigError and key-path messages
    recipes.py      recipes (vllm.recipe): the Recipe model, loading, the env they add
    guard.py        spark-vllm:guard: what each node does when its memory runs out
    firewall.py     spark-vllm:firewall: the node's firewall as code
    gateway.py      spark-vllm:gateway: the stack's one endpoint for clients (HAProxy on the head)
    monitoring.py   spark-vllm:monitoring: Prometheus, the node exporters, Alertmanager's receivers
    ports.py        what the stack opens on each node and who may reach it (node_ports)
    listen.py       where each vLLM of the stack listens
    ssh.py          how the stack's own SSH clients reach a node (the pinned key only)
    models.py       the pydantic models (keys, forms, defaults)
    validate.py     validate_config: single values + rules that span keys
    known_hosts.py  host keys pinned through an OpenSSH known_hosts file
    load.py         reading the config and the secrets from the Pulumi runtime
    paths.py        local folders on the machine that runs Pulumi
    recipes_data/   the recipes shipped with the program, and their chat templates

(tests/unit/test_package_indexes.py holds this list to the package's modules.)
"""
from config.errors import ConfigError, key_path
from config.forms import NAMESPACE, PLACEHOLDER, SECRET_KEYS
from config.guard import GuardConfig
from config.known_hosts import known_host_keys, pin_host_keys
from config.load import (
    Secrets,
    load_config,
    load_secrets,
    plain_value,
    secret_plaintext,
    ssh_key_path,
)
from config.models import (
    CollectiveConfig,
    FabricConfig,
    FabricInterface,
    HealthConfig,
    ImageConfig,
    ModelConfig,
    NcclConfig,
    NodeConfig,
    PreflightConfig,
    RayConfig,
    ServiceConfig,
    SshConfig,
    StackConfig,
    VllmConfig,
)
from config.recipe_files import RecipeError, chat_template_text
from config.recipes import Recipe, load_recipe
from config.serve import ServeSettings
from config.validate import validate_config

__all__ = [
    "NAMESPACE", "PLACEHOLDER", "SECRET_KEYS", "CollectiveConfig", "ConfigError", "FabricConfig",
    "FabricInterface", "GuardConfig", "HealthConfig", "ImageConfig", "ModelConfig", "NcclConfig",
    "NodeConfig", "PreflightConfig", "RayConfig",
    "Recipe", "RecipeError", "Secrets", "ServeSettings", "ServiceConfig", "SshConfig",
    "StackConfig", "VllmConfig",
    "chat_template_text", "key_path", "known_host_keys", "load_config", "load_recipe",
    "load_secrets", "pin_host_keys", "plain_value", "secret_plaintext", "ssh_key_path",
    "validate_config",
]
