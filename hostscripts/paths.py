"""Fixed places and ports on the nodes (and inside the stack's containers)."""

from config.forms import IMAGE_SEED_PORT, MODEL_SEED_PORT

__all__ = ["COMPILE_CACHE_DIR", "COMPILE_CACHE_MOUNT",
           "HF_MOUNT",
           "IMAGE_SEED_PORT",
           "MODEL_SEEDER",
           "MODEL_SEED_PORT",
           "RAY_TOKEN_FILE",
           "RAY_TOKEN_MOUNT",
           "SEED_TIMEOUT_SECONDS",
           "STOPPED_DIR",
           "VLLM_ARGV",
           "VLLM_CONFIG_ROOT",
           "VLLM_KEY",
           "VLLM_LOG",
           "VLLM_PID",
]

HF_MOUNT = "/root/.cache/huggingface"  # HF_HOME inside every container
SEED_TIMEOUT_SECONDS = 3600
MODEL_SEEDER = "spark-vllm-model-seeder"
STOPPED_DIR = "/var/lib/spark-vllm/stopped"  # markers of foreign containers the stack stopped
VLLM_LOG = "/var/log/spark-vllm/vllm-serve.log"  # inside the head Ray container
VLLM_PID = "/run/spark-vllm/vllm-serve.pid"
VLLM_KEY = "/run/spark-vllm/api-key"
VLLM_ARGV = "/run/spark-vllm/vllm-serve.argv"  # hash of the argv the running vLLM was given
VLLM_CONFIG_ROOT = "/run/spark-vllm/vllm-config"  # the stack's own VLLM_CONFIG_ROOT
RAY_TOKEN_FILE = "/var/lib/spark-vllm/ray/auth-token"  # on each node, root only (0600)
RAY_TOKEN_MOUNT = "/run/spark-vllm/ray-auth-token"  # where the Ray containers read it
# Compile and JIT caches, per node, kept across container replacements and `destroy`
COMPILE_CACHE_DIR = "/var/lib/spark-vllm/compile-cache"  # on each node
COMPILE_CACHE_MOUNT = "/var/cache/spark-vllm"  # inside the Ray containers
