"""Fixed places and ports on the nodes (and inside the stack's containers)."""

from config.forms import IMAGE_SEED_PORT, MODEL_SEED_PORT

__all__ = [
           "COMPILE_CACHE_DIR",
           "COMPILE_CACHE_MOUNT",
           "HF_MOUNT",
           "IMAGE_SEED_PORT",
           "MODEL_SEEDER",
           "MODEL_SEED_PORT",
           "RAY_SESSION_DIR",
           "RAY_SESSION_MOUNT",
           "RAY_TOKEN_FILE",
           "RAY_TOKEN_MOUNT",
           "SEED_TIMEOUT_SECONDS",
           "STACK_DIR",
           "STOPPED_DIR",
           "VLLM_CONFIG_ROOT",
           "VLLM_KEY",
           "VLLM_KEY_FILE",
]

HF_MOUNT = "/root/.cache/huggingface"  # HF_HOME inside every container
SEED_TIMEOUT_SECONDS = 3600
MODEL_SEEDER = "spark-vllm-model-seeder"
# Files of one stack only, in a folder per stack (<STACK_DIR>/<stack>/): what several stacks
# sharing a node must not share. The services' API key files live there.
STACK_DIR = "/var/lib/spark-vllm/stacks"
STOPPED_DIR = "/var/lib/spark-vllm/stopped"  # markers of foreign containers the stack stopped
VLLM_KEY_FILE = "/var/lib/spark-vllm/vllm/api-key"  # on the head, root only (0600)
VLLM_KEY = "/run/spark-vllm/api-key"  # where the vLLM container reads it
VLLM_CONFIG_ROOT = "/etc/spark-vllm/vllm-config"  # the stack's own VLLM_CONFIG_ROOT (container)
# Ray's session folder (sockets, logs), shared by the Ray head container and the vLLM container
# on the head: a Ray driver connects to its node's raylet through the files in it. Under /run so
# a reboot starts it empty; Docker creates it (a `volumes` bind) when it is missing.
RAY_SESSION_DIR = "/run/spark-vllm/ray-session"  # on the head
RAY_SESSION_MOUNT = "/tmp/ray"  # Ray's default --temp-dir, in both containers
RAY_TOKEN_FILE = "/var/lib/spark-vllm/ray/auth-token"  # on each node, root only (0600)
RAY_TOKEN_MOUNT = "/run/spark-vllm/ray-auth-token"  # where the Ray containers read it
# Compile and JIT caches, per node, kept across container replacements and `destroy`
COMPILE_CACHE_DIR = "/var/lib/spark-vllm/compile-cache"  # on each node
COMPILE_CACHE_MOUNT = "/var/cache/spark-vllm"  # inside the Ray containers
