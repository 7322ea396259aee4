"""The stack configuration: typed, validated once, before anything touches a host.

    models.py       the pydantic models (keys, forms, defaults)
    forms.py        the exact forms of commits, digests, IDs, sizes, ports
    errors.py       ConfigError and key-path messages
    validate.py     validate_config: single values + rules that span keys
    recipes.py      recipes shipped in recipes_data/ (vllm.recipe): loading, chat templates, env
    known_hosts.py  host keys pinned through an OpenSSH known_hosts file
    load.py         reading the config and the secrets from the Pulumi runtime
    paths.py        local folders on the machine that runs Pulumi
"""

from config.errors import ConfigError, key_path
from config.known_hosts import known_host_keys, pin_host_keys
from config.load import Secrets, load_config, load_secrets, secret_plaintext, ssh_key_path
from config.models import (
    NAMESPACE,
    PLACEHOLDER,
    SECRET_KEYS,
    FabricInterface,
    HealthConfig,
    ImageConfig,
    ModelConfig,
    NcclConfig,
    NodeConfig,
    PreflightConfig,
    RayConfig,
    Recipe,
    ServiceConfig,
    SshConfig,
    StackConfig,
    VllmConfig,
)
from config.recipes import RecipeError, chat_template_text, load_recipe
from config.validate import validate_config

__all__ = [
    "NAMESPACE", "PLACEHOLDER", "SECRET_KEYS", "ConfigError", "FabricInterface", "HealthConfig",
    "ImageConfig", "ModelConfig", "NcclConfig", "NodeConfig", "PreflightConfig", "RayConfig",
    "Recipe", "RecipeError", "Secrets", "ServiceConfig", "SshConfig", "StackConfig", "VllmConfig",
    "chat_template_text", "key_path", "known_host_keys", "load_config", "load_recipe",
    "load_secrets", "pin_host_keys", "secret_plaintext", "ssh_key_path", "validate_config",
]
