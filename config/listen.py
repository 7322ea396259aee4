"""Where each vLLM of the stack listens: only where the gateway on the head reaches it
(config/gateway.py), never the management network.

* The main model's API: `vllm.host` when set (validated: 127.0.0.1 or a fabric address of the
  head), else 127.0.0.1, or the head's fabric address with `vllm.executor: mp` on more than
  one node (the other nodes' ranks watch its /health: payloads/vllm_rank_watch.py).
* A service: 127.0.0.1 on the head, the node's primary fabric address on any other node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from config.models import StackConfig

LOOPBACK = "127.0.0.1"


def vllm_host(cfg: StackConfig) -> str:
    """The address the main model's API listens on."""
    if cfg.vllm.host is not None:
        return cfg.vllm.host
    if cfg.vllm.executor == "mp" and len(cfg.nodes) > 1:
        return cfg.head.primary.ip
    return LOOPBACK


def service_host(cfg: StackConfig, node: str) -> str:
    """The address a service's vLLM listens on at `node`."""
    return LOOPBACK if node == cfg.head.name else cfg.node(node).primary.ip


def served_names(cfg: StackConfig) -> list[str]:
    """Every model name the stack serves: the main model's, then each service's."""
    return [cfg.vllm.served_model_name, *(s.served_name for s in cfg.services)]
