"""The resource type tokens: the program registers its components under these
(`pulumi.ComponentResource.__init__`), the pack reviews resources by them."""
from __future__ import annotations

from typing import Final

# the program's components, `spark-vllm:<module>:<class>`
VLLM_SERVER: Final = "spark-vllm:vllm_server:VllmServer"
VLLM_SERVICE: Final = "spark-vllm:vllm_service:VllmService"
NCCL_ENV: Final = "spark-vllm:nccl:NcclEnvironment"
VLLM_IMAGE: Final = "spark-vllm:vllm_image:VllmImage"
SPARK_NODE: Final = "spark-vllm:spark_node:SparkNode"
MODEL_CACHE: Final = "spark-vllm:model_cache:ModelCache"
COLLECTIVE_GATE: Final = "spark-vllm:collective:CollectiveGate"
NODE_FABRIC: Final = "spark-vllm:fabric:NodeFabric"
NODE_FIREWALL: Final = "spark-vllm:firewall:NodeFirewall"
NODE_GUARD: Final = "spark-vllm:guard:NodeGuard"
GATEWAY: Final = "spark-vllm:gateway:Gateway"
MONITORING: Final = "spark-vllm:monitoring:Monitoring"
RAY_CLUSTER: Final = "spark-vllm:ray_cluster:RayCluster"
STACK_SECRETS: Final = "spark-vllm:stack_secrets:StackSecrets"

# the providers' resources the pack reviews too
CONTAINER: Final = "docker:index/container:Container"
COMMAND_TYPES: Final = ("command:remote:Command", "command:local:Command")
