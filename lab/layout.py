"""Where the lab lives: state and cache paths, addresses, interface and node names.

Only constants and pure naming functions; every other lab module imports from here.
"""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))  # lab/: stand-ins, identity files, the plugin
LAB = "/var/lib/spark-vllm-lab"  # lab state: removed by `down`
CACHE = "/root/.cache/spark-vllm/lab"  # caches + lab key + stack.json: kept by `down`
CG_ROOT = "svl-lab"  # cgroup (v1) sub-tree that holds every lab process
# Each node's own memory (lab/memory.py): its memory cgroup's limit, what its /proc/meminfo says
NODE_MEMORY_BYTES = 8 * 1024**3
LXCFS_DIR = os.path.join(LAB, "lxcfs")  # the lab's lxcfs (its /proc/meminfo bound into nodes)
# One user of the lab at a time, for a whole session (a test run, `make demo`, `make lab-up`):
# an exclusive flock on this file. The holder names itself in SESSION_ENV (its pid), so the
# lab.py runs it starts (its children) do not wait for their own parent.
SESSION_LOCK = "/run/spark-vllm-lab.lock"
SESSION_ENV = "SPARK_VLLM_LAB_SESSION"

MGMT_BR, MGMT_NET, MGMT_IP = "svl-mgmt", "10.77.0", "10.77.0.1"
BUILD_IP = "10.77.0.2"
# (host bridge, node interface name, /24 prefix, RoCE HCA name shown by ibdev2netdev)
FABRIC = [("svl-fab1", "enp1s0f1np1", "192.168.177", "rocep1s0f1"),
          ("svl-fab2", "enP2p1s0f1np1", "192.168.178", "roceP2p1s0f1")]
MGMT_IF = "enP7s7"  # the Spark's 10GbE management NIC name
# A host on the fabric that is not a node (no stack address): a network namespace with a leg on
# each fabric bridge, the outsider the nodes' firewalls keep out (issue 45)
OUTSIDER_NS = "svl-outsider"
OUTSIDER_IFS = ("svo-fab1", "svo-fab2")  # its host ends; inside they are fab1, fab2
OUTSIDER_HOST = 250  # .250 on each fabric /24
FAB_MTU = 9000
REGISTRY = f"{MGMT_IP}:5000"
IMAGE_REPO = "spark-lab/vllm-spark"  # the serving image (base + top), what the dev stack runs
BASE_REPO = "spark-lab/vllm-base"  # its large base layer, pushed once per content key
GATEWAY_REPO = "spark-lab/haproxy"  # the gateway's image: Debian's haproxy (lab/image.py)
STACK_TAG = "lab"  # the tag Pulumi.dev.yaml names; the program resolves it to the digest
HF_PORT, OLAH_PORT = 8090, 8091
HF_ENDPOINT = f"http://{MGMT_IP}:{HF_PORT}"
HF_REPO = "spark-lab/tiny-moe"  # the chat/completions model (Qwen3-MoE)
HF_EMBED_REPO = "spark-lab/tiny-embed"  # the embedding model (Qwen3, sentence-transformers)
# a speculative drafter of tiny-moe from another repo (dense Qwen3, tiny-moe's tokenizer)
HF_DRAFTER_REPO = "spark-lab/tiny-drafter"
HF_REPOS = (HF_REPO, HF_EMBED_REPO, HF_DRAFTER_REPO)
LAB_KEY = os.path.join(CACHE, "id_ed25519")
STACK_JSON = os.path.join(CACHE, "stack.json")
KNOWN_HOSTS = os.path.join(CACHE, "known_hosts")
FIXTURES = os.path.join(HERE, "identity")
MAX_NODES = 9  # lab.py up --nodes 1..9
BUILD = "build"  # the throw-away host (no fabric, no sshd) whose dockerd builds and pushes images


def node_name(i: int) -> str:
    return f"spark-{i}"


def node_dir(name: str) -> str:
    return os.path.join(LAB, name)


def netns(name: str) -> str:
    return f"svl-{name}"


def mgmt_ip(i: int) -> str:
    return f"{MGMT_NET}.1{i}" if i < 10 else f"{MGMT_NET}.{10 + i}"


def fab_ip(prefix: str, i: int) -> str:
    return f"{prefix}.1{i}" if i < 10 else f"{prefix}.{10 + i}"


def outsider_ip(prefix: str) -> str:
    return f"{prefix}.{OUTSIDER_HOST}"


def node_cache(name: str) -> str:
    """What a node keeps across `down`: its Docker data-root (the pulled image layers)."""
    return os.path.join(CACHE, "nodes", name)


def host_key_path(name: str) -> str:
    """A node's sshd host key: generated once per machine and node, kept by `down`."""
    return os.path.join(CACHE, "hostkeys", name, "ssh_host_ed25519_key")
