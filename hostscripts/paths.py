"""Fixed places and ports on the nodes (and inside the stack's containers)."""

HF_MOUNT = "/root/.cache/huggingface"  # HF_HOME inside every container
IMAGE_SEED_PORT = 18471
MODEL_SEED_PORT = 18472
SEED_TIMEOUT_SECONDS = 3600
MODEL_SEEDER = "spark-vllm-model-seeder"
STOPPED_DIR = "/var/lib/spark-vllm/stopped"  # markers of foreign containers the stack stopped
VLLM_LOG = "/var/log/spark-vllm/vllm-serve.log"  # inside the head Ray container
VLLM_PID = "/run/spark-vllm/vllm-serve.pid"
VLLM_KEY = "/run/spark-vllm/api-key"
VLLM_ARGV = "/run/spark-vllm/vllm-serve.argv"  # hash of the argv the running vLLM was given
VLLM_CONFIG_ROOT = "/run/spark-vllm/vllm-config"  # the stack's own VLLM_CONFIG_ROOT
