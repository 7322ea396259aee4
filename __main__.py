"""spark-vllm: a multi-node vLLM serving stack on DGX Spark, as one Pulumi program.

Thin on purpose: validate config, look at every node before touching any (recon), refuse on a
failed preflight check, then build the components (components/stack.py) and export what an
operator needs. recon and preflight are reached through their modules so tests can replace them.
"""

import pulumi

from components import config, preflight, recon, stack

cfg = config.load_config()
secrets = config.load_secrets(cfg)
facts = recon.survey(cfg)
plan = preflight.check(cfg, facts)
handles = stack.build_stack(cfg, facts, plan, secrets)

for key, value in handles.exports().items():
    pulumi.export(key, value)
