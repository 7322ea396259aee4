"""spark-vllm: a multi-node vLLM serving stack on DGX Spark, as one Pulumi program.

Thin on purpose, and in the order the design reads: the config (validated, host keys pinned),
the model resolved at the hub (its commit and size) while recon looks at every node before
touching any (recon + preflight, which stops here on a failed check), then the components, then
the outputs.
recon, preflight and the hub lookup are reached through their modules so tests can replace them.
"""

from concurrent.futures import ThreadPoolExecutor

import pulumi

import config
from components import stack
from inspection import hub, preflight

cfg = config.load_config()
secrets = config.load_secrets(cfg)
key_path = config.ssh_key_path(cfg)
# the hub is asked while recon surveys the nodes: a preview waits for the slower, not for both
token = config.secret_plaintext("hfToken")
drafter = cfg.model.drafter  # the speculative drafter of another repo: an artifact too
with ThreadPoolExecutor(max_workers=2 + len(cfg.services), thread_name_prefix="hub") as pool:
    lookup = pool.submit(hub.resolve_model, cfg.model.repo, cfg.model.revision,
                         cfg.model.endpoint, token)
    draft = (pool.submit(hub.resolve_model, drafter.repo, drafter.revision, cfg.model.endpoint,
                         token) if drafter is not None else None)
    services = {s.name: pool.submit(hub.resolve_model, s.repo, s.revision, cfg.model.endpoint,
                                    token) for s in cfg.services}
    facts, plan = preflight.run(
        cfg, key_path=key_path, model=lookup.result,
        services=lambda: {n: f.result() for n, f in services.items()},
        drafter=draft.result if draft is not None else None)
for warning in plan.warnings:  # never fatal: shown by every preview and up (a crash loop, ...)
    pulumi.log.warn(f"preflight: {warning}")
manifest = lookup.result()
handles = stack.build_stack(cfg, facts, plan, secrets, manifest=manifest,
                            service_manifests={n: f.result() for n, f in services.items()},
                            drafter_manifest=draft.result() if draft is not None else None,
                            key_path=key_path)

for key, value in handles.exports().items():
    pulumi.export(key, value)
