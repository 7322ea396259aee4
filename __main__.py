"""spark-vllm: a multi-node vLLM serving stack on DGX Spark, as one Pulumi program.

Thin on purpose, and in the order the design reads: the config (validated, host keys pinned),
the model resolved at the hub (its commit and size) while recon looks at every node before
touching any (recon + preflight, which stops here on a failed check), then the components, then
the outputs.
recon, preflight and the hub lookup are reached through their modules so tests can replace them.
The components' modules are imported while recon surveys the nodes (about half a second of
imports no preview waits for on top of the survey's SSH round trips).
"""

import contextvars
from concurrent.futures import ThreadPoolExecutor

import pulumi

import config
from inspection import hub, preflight

cfg = config.load_config()
secrets = config.load_secrets(cfg)
key_path = config.ssh_key_path(cfg)
# the hub is asked while recon surveys the nodes, and the components' modules load meanwhile:
# a preview waits for the slowest of the three, not for all of them in turn
token = config.secret_plaintext("hfToken")
with ThreadPoolExecutor(max_workers=2 + len(cfg.services), thread_name_prefix="look") as pool:
    lookup = pool.submit(hub.resolve_model, cfg.model.repo, cfg.model.revision,
                         cfg.model.endpoint, token)
    services = {s.name: pool.submit(hub.resolve_model, s.repo, s.revision, cfg.model.endpoint,
                                    token) for s in cfg.services}
    # in the program's context: preflight reads the stack's name (its label, the stack's own
    # containers and markers) from Pulumi's settings, which are context variables a pool's
    # thread does not inherit (without it every container of the stack read as another stack's)
    survey = pool.submit(contextvars.copy_context().run, preflight.run, cfg,
                         key_path=key_path, model=lookup.result,
                         services=lambda: {n: f.result() for n, f in services.items()})
    from components import stack  # while the nodes are surveyed

    facts, plan = survey.result()
for warning in plan.warnings:  # never fatal: shown by every preview and up (a crash loop, ...)
    pulumi.log.warn(f"preflight: {warning}")
manifest = lookup.result()
handles = stack.build_stack(cfg, facts, plan, secrets, manifest=manifest,
                            service_manifests={n: f.result() for n, f in services.items()},
                            key_path=key_path)

for key, value in handles.exports().items():
    pulumi.export(key, value)
