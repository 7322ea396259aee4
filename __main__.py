"""spark-vllm: a multi-node vLLM serving stack on DGX Spark, as one Pulumi program.

Thin on purpose: validate config, ask the hub which commit and how many bytes the model is,
look at every node before touching any (recon) and refuse on a failed preflight check, then
build the components (components/stack.py) and export what an operator needs. recon, preflight
and the hub lookup are reached through their modules so tests can replace them.
"""

import pulumi

from components import config, model_cache, preflight, stack

cfg = config.load_config()
secrets = config.load_secrets(cfg)
key_path = config.ssh_key_path(cfg)
manifest = model_cache.resolve_model(
    cfg.model.repo, cfg.model.revision, cfg.model.endpoint, config.secret_plaintext("hfToken")
)
facts, plan = preflight.run(cfg, key_path=key_path, model_bytes=manifest.total_bytes)
handles = stack.build_stack(cfg, facts, plan, secrets, manifest=manifest, key_path=key_path)

for key, value in handles.exports().items():
    pulumi.export(key, value)
