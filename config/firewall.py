"""`spark-vllm:firewall`: the node's firewall as code (components/firewall.py; the ruleset:
hostscripts/firewall.py; docs/design.md "The node's firewall").

Ray's servers, torch's store and vLLM's own sockets listen on every address of a node whatever
they are told, so the stack filters its own ports with an nftables table of its own on every
node. For the rules to name exactly the stack's ports, the ports Ray and vLLM would otherwise
pick at random are pinned into a block of `BLOCK_SIZE` ports from `portBase` (`PortBlock`).

Keys (camelCase in the file):

    enabled    the stack's table on every node (default true; only dev may turn it off)
    portBase   the first port of the block Ray's and vLLM's internal ports are pinned to
               (portBase .. portBase+199): it must hold no other port of the stack, no node's
               sshd, and lie outside the nodes' ephemeral port range (preflight reads it).
               Two stacks on the same nodes need blocks of their own

config/ports.py `node_ports(cfg, node)` is the one table of what the stack opens on a node and
who may reach it: the source of the rules, the policy pack's props and the docs' table of ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from pydantic import Field

from config.types import ConfigModel

DEFAULT_PORT_BASE = 20000
BLOCK_SIZE = 200
# Linux's default net.ipv4.ip_local_port_range: the ports the kernel picks for a socket bound
# to port 0 (and for outgoing connections) when a node's own could not be read
DEFAULT_EPHEMERAL = (32768, 60999)


class FirewallConfig(ConfigModel):
    enabled: bool = True
    port_base: int = Field(default=DEFAULT_PORT_BASE, ge=1024, le=65536 - BLOCK_SIZE)

    @property
    def block(self) -> PortBlock:
        return PortBlock(self.port_base)


@dataclass(frozen=True)
class PortBlock:
    """Where Ray's and vLLM's own ports are pinned, from `base` (`firewall.portBase`):

    +0  Ray's node manager (raylet)           +6  Ray's client server (head)
    +1  Ray's object manager                  +7  Ray's dashboard (head, ray.dashboard)
    +2  Ray's runtime-env agent               +8  the launcher's probe (nothing listens there)
    +3  Ray's dashboard agent, gRPC           +9  Ray's autoscaler metrics (head)
    +4  Ray's dashboard agent, HTTP           +10 Ray's dashboard metrics (head)
    +5  Ray's metrics export                  +20..+35  vLLM's own (VLLM_PORT: torch's store
    +100..+199  Ray's workers (one port each)           of the Ray executor's driver, ...)

    Ray's head runs its autoscaler's and its dashboard's metrics servers whatever
    `--include-dashboard` says, on every address at fixed ports unless AUTOSCALER_METRIC_PORT
    and DASHBOARD_METRIC_PORT say otherwise (ray/autoscaler/_private/constants.py,
    ray/dashboard/consts.py: 44217, 44227; measured on the lab with `ss -ltnp`). vLLM takes
    VLLM_PORT and counts up from it past a port in use (vllm/utils/network_utils.py
    `_get_open_port`), so it gets 16; a Ray worker process binds one port of its range, so a
    node runs at most 100 of them (Ray's own and vLLM's ranks)."""

    base: int

    @property
    def node_manager(self) -> int:
        return self.base

    @property
    def object_manager(self) -> int:
        return self.base + 1

    @property
    def runtime_env_agent(self) -> int:
        return self.base + 2

    @property
    def dashboard_agent_grpc(self) -> int:
        return self.base + 3

    @property
    def dashboard_agent_http(self) -> int:
        return self.base + 4

    @property
    def metrics_export(self) -> int:
        return self.base + 5

    @property
    def client_server(self) -> int:
        return self.base + 6

    @property
    def dashboard(self) -> int:
        return self.base + 7

    @property
    def probe(self) -> int:
        return self.base + 8

    @property
    def autoscaler_metrics(self) -> int:
        return self.base + 9

    @property
    def dashboard_metrics(self) -> int:
        return self.base + 10

    @property
    def vllm(self) -> tuple[int, int]:
        return (self.base + 20, self.base + 35)

    @property
    def workers(self) -> tuple[int, int]:
        return (self.base + 100, self.base + BLOCK_SIZE - 1)

    @property
    def span(self) -> tuple[int, int]:
        return (self.base, self.base + BLOCK_SIZE - 1)

    def ray_flags(self, *, head: bool, dashboard: bool) -> list[str]:
        """`ray start` flags that pin every port Ray would otherwise pick at random (Ray 2.60's
        `ray start --help`; GCS is `--port`, ray.port)."""
        flags = [
            "--node-manager-port", str(self.node_manager),
            "--object-manager-port", str(self.object_manager),
            "--runtime-env-agent-port", str(self.runtime_env_agent),
            "--dashboard-agent-grpc-port", str(self.dashboard_agent_grpc),
            "--dashboard-agent-listen-port", str(self.dashboard_agent_http),
            "--metrics-export-port", str(self.metrics_export),
            "--min-worker-port", str(self.workers[0]),
            "--max-worker-port", str(self.workers[1]),
        ]
        if head:
            flags += ["--ray-client-server-port", str(self.client_server)]
            if dashboard:
                flags += ["--dashboard-port", str(self.dashboard)]
        return flags

    def ray_head_env(self) -> dict[str, str]:
        """The Ray head's metrics servers that no `ray start` flag moves."""
        return {"AUTOSCALER_METRIC_PORT": str(self.autoscaler_metrics),
                "DASHBOARD_METRIC_PORT": str(self.dashboard_metrics)}


Sources = Literal["loopback", "stack", "head"]
Ports = tuple[int | tuple[int, int], ...]


class PortRule(NamedTuple):
    """Ports the stack opens on a node and who may reach them besides the node itself (its
    loopback): `loopback` nobody else, `stack` every fabric address of the stack's nodes,
    `head` the head's fabric addresses only. `what` names the rule (and its drop counter)."""

    what: str
    ports: Ports
    sources: Sources
