"""spark-vllm: a multi-node vLLM serving stack on DGX Spark, as one Pulumi program.

Thin on purpose, and in the order the design reads: the config (validated, host keys pinned),
the model resolved at the hub (its commit and size), a look at every node before touching any
(recon + preflight, which stops here on a failed check), then the components, then the outputs.
recon, preflight and the hub lookup are reached through their modules so tests can replace them.
"""

import pulumi

import config
from components import stack
from inspection import hub, preflight

cfg = config.load_config()
secrets = config.load_secrets(cfg)
key_path = config.ssh_key_path(cfg)
manifest = hub.resolve_model(
    cfg.model.repo, cfg.model.revision, cfg.model.endpoint, config.secret_plaintext("hfToken")
)
facts, plan = preflight.run(cfg, key_path=key_path, model_bytes=manifest.total_bytes)
handles = stack.build_stack(cfg, facts, plan, secrets, manifest=manifest, key_path=key_path)

for key, value in handles.exports().items():
    pulumi.export(key, value)
