"""The labels the stack puts on its containers (docs/contract.md "Labels"): the program writes
them, recon and the CLI read them back, the pack reviews containers by their role."""
from __future__ import annotations

from typing import Final

MANAGED: Final = "spark-vllm.managed"  # "true" on every container the stack makes
STACK: Final = "spark-vllm.stack"  # <project>/<stack>
ROLE: Final = "spark-vllm.role"  # one of the roles below
NODE: Final = "spark-vllm.node"  # the node a long-running container serves
PORT: Final = "spark-vllm.port"  # the port it listens on
SERVICE: Final = "spark-vllm.service"  # a service's name (spark-vllm:services)

# the roles (the value of ROLE)
RAY_HEAD: Final = "ray-head"
RAY_WORKER: Final = "ray-worker"
VLLM_SERVE: Final = "vllm-serve"
VLLM_SERVICE: Final = "vllm-service"
SERVE_CHECK: Final = "serve-check"
COLLECTIVE_GATE: Final = "collective-gate"
IMAGE_PROBE: Final = "image-probe"
MODEL_FETCH: Final = "model-fetch"
MODEL_SEEDER: Final = "model-seeder"
GATEWAY: Final = "gateway"
GATEWAY_CHECK: Final = "gateway-check"
PROMETHEUS: Final = "prometheus"
PROMETHEUS_CHECK: Final = "prometheus-check"
NODE_EXPORTER: Final = "node-exporter"
ALERTMANAGER: Final = "alertmanager"
ALERTMANAGER_CHECK: Final = "alertmanager-check"

RAY_ROLES: Final = (RAY_HEAD, RAY_WORKER)
# the containers that serve the main model (its ranks)
SERVING_ROLES: Final = (RAY_HEAD, RAY_WORKER, VLLM_SERVE)
# the containers that answer the OpenAI API (the gateway fronts them)
API_ROLES: Final = (VLLM_SERVE, VLLM_SERVICE)
