"""NcclEnvironment: the NCCL/Gloo/UCX/Ray environment of every node, derived, never typed in.

Pure derivation from config and recon facts: every socket-based library is pinned to the node's
primary fabric interface (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME; NCCL's environment variables:
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html), Ray and vLLM advertise
the node's fabric address,
and with RDMA on NCCL gets exactly the RoCE HCAs whose link is up (a carrier-down twin in
NCCL_IB_HCA makes NCCL fail or hang at init). Policies review the environment (`rdma`, per node
`env` and fabric facts) as props.

Its only resources prove the fabric between the nodes before anything travels on it: on every
node a `fabric-<node>` command pings each other node on each carrier-up twin, unfragmented at
`nccl.minMtu` (hostscripts/fabric.py). The script's text holds the pairs and the MTU, so it runs
again only when the nodes, their fabric config or the carrier-up twins change; a no-op `up`
does not run it. The image copy and the model fan-out (and so Ray and vLLM) wait for it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import pulumi
from pulumi_command import remote

from components.spark_node import Cluster, SparkNode
from config import NcclConfig, NodeConfig
from contract import types
from contract.props import NcclEnvironmentProps, NcclFabricProps, NcclNodeProps
from hostscripts.fabric import FabricPair, fabric_check
from inspection.facts import NodeFacts


@dataclass(frozen=True)
class DockerExtras:
    """Container settings RDMA needs beyond the environment."""

    devices: list[str] = field(default_factory=list)  # host paths, mapped to the same path
    cap_add: list[str] = field(default_factory=list)
    memlock_unlimited: bool = False


def up_hcas(node: NodeConfig, facts: NodeFacts) -> list[str]:
    """RoCE devices NCCL may use on this node: the fabric's HCAs whose port is Up.

    The HCAs named in the node's fabric config are preferred (both twins of the cabled port);
    when none is named, every Up device recon found is used. Order follows the config.
    """
    named = [f.hca for f in node.fabric if f.hca]
    candidates = named or [r.device for r in facts.roce]
    out = []
    for hca in candidates:
        dev = facts.roce_device(hca)
        if dev is not None and dev.up and hca not in out:
            out.append(hca)
    return out


# Values node_env derives per node that vLLM's Ray executor would otherwise copy from the head
# to every worker (it forwards NCCL_*/UCX_* from the driver): a worker whose twin port is down
# needs its own NCCL_IB_HCA. vLLM skips the keys listed in ray_non_carry_over_env_vars.json;
# each worker's container already has its own values from its start-time env.
PER_NODE_KEYS = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES")


def node_env(nccl: NcclConfig, node: NodeConfig, facts: NodeFacts, head_ip: str) -> dict[str, str]:
    """The environment variables of one node's Ray container (and so of vLLM's driver and
    workers); `head_ip` is the head's primary fabric address.

    The launcher environment the community's launchers set (eugr/spark-vllm-docker
    launch-cluster.sh, sparkrun orchestration/infiniband.py) is the stack's, for every model:
    VLLM_HOST_IP, RAY_NODE_IP_ADDRESS and RAY_OVERRIDE_NODE_IP_ADDRESS per node, and
    NCCL_IGNORE_CPU_AFFINITY=1. Ray 2.60 reads neither RAY_*_NODE_IP_ADDRESS variable (its
    wheel has no such string; the node's address is `ray start --node-ip-address`,
    components/ray_cluster.py): they are set for other Ray builds and for scripts that look.
    `nccl.extra_env` comes last: the stack file's entries and, under them, the recipe's `env`
    and `launcherEnv` (config/recipes.with_recipe_env), which may not set the keys derived
    here (config.recipes.STACK_ENV)."""
    iface = node.primary.interface
    ip = node.primary.ip
    env = {
        "NCCL_SOCKET_IFNAME": iface,
        "GLOO_SOCKET_IFNAME": iface,
        "TP_SOCKET_IFNAME": iface,
        "UCX_NET_DEVICES": iface,
        "VLLM_HOST_IP": ip,
        "RAY_NODE_IP_ADDRESS": ip,
        "RAY_OVERRIDE_NODE_IP_ADDRESS": ip,
        "MASTER_ADDR": head_ip,
        # NCCL picks CPUs by the GPU's topology, not the affinity the process inherited
        # (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)
        "NCCL_IGNORE_CPU_AFFINITY": "1",
        # Ray's memory monitor reads unified memory as host RAM and kills vLLM workers; 0 turns
        # it off (https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html).
        "RAY_memory_monitor_refresh_ms": "0",
        "NCCL_DEBUG": nccl.debug,
        # every rank's lines reach the driver's log unfolded (Ray folds lines that differ only
        # in numbers, which hides other nodes' NCCL transport lines)
        "RAY_DEDUP_LOGS": "0",
    }
    if nccl.debug == "INFO":  # init and network lines: what the transport check reads
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    if nccl.rdma:
        hcas = up_hcas(node, facts)
        if not hcas:
            raise ValueError(
                f"node {node.name}: nccl.rdma is true but no RoCE HCA of its fabric is Up "
                f"(recon saw {[(r.device, r.state) for r in facts.roce]}); cable the port or set "
                "spark-vllm:nccl.rdma false"
            )
        env["NCCL_IB_HCA"] = ",".join(hcas)
        env["NCCL_IB_DISABLE"] = "0"
    else:
        env["NCCL_IB_DISABLE"] = "1"
    env.update(nccl.extra_env)
    return env


def docker_extras(nccl: NcclConfig) -> DockerExtras:
    if not nccl.rdma:
        return DockerExtras()
    return DockerExtras(devices=["/dev/infiniband"], cap_add=["IPC_LOCK"], memlock_unlimited=True)


def carrier_up(node: SparkNode) -> list[tuple[str, str]]:
    """(interface, address) of the node's fabric twins whose link recon saw up."""
    return twins_up(node.node, node.facts)


def twins_up(node: NodeConfig, facts: NodeFacts) -> list[tuple[str, str]]:
    """carrier_up from a node's config and recon facts (no SparkNode needed)."""
    out = []
    for f in node.fabric:
        iface = facts.interface(f.interface)
        if iface is not None and iface.carrier:
            out.append((f.interface, f.ip))
    return out


def fabric_pairs(nccl: NcclConfig, cluster: Cluster, node: SparkNode) -> list[FabricPair]:
    """What `node` pings: every other node's address on each carrier-up twin, through our own
    carrier-up interface in the same fabric subnet. Twins down on either end are preflight's
    finding, not a pair."""
    subnets = [ipaddress.IPv4Network(s) for s in nccl.fabric_subnets]

    def subnet(ip: str) -> ipaddress.IPv4Network | None:
        return next((n for n in subnets if ipaddress.IPv4Address(ip) in n), None)

    pairs = []
    for iface, ip in carrier_up(node):
        net = subnet(ip)
        if net is None:
            continue
        for peer in cluster.nodes:
            if peer is node:
                continue
            pairs += [FabricPair(iface, peer.name, peer_ip) for _i, peer_ip in carrier_up(peer)
                      if subnet(peer_ip) == net]
    return pairs


@dataclass
class NcclEnvironmentArgs:
    nccl: NcclConfig
    cluster: Cluster  # each node's config and recon facts
    # the fabric interfaces the stack configures (components/fabric.py), every node's: the
    # check runs after them, and again when one of them ran; with them, the MTU they set
    configured: list[remote.Command] = field(default_factory=list)
    managed_mtu: int | None = None


class NcclEnvironment(pulumi.ComponentResource):
    """Per-node environment dicts and docker extras for the Ray containers."""

    env: dict[str, dict[str, str]]
    extras: DockerExtras
    fabric_checks: dict[str, remote.Command]
    fabric_check: pulumi.Output[dict[str, list[str]]]

    def __init__(
        self, name: str, args: NcclEnvironmentArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        nccl, cluster = args.nccl, args.cluster
        head_ip = cluster.head.fabric_ip
        self.env = {n.name: node_env(nccl, n.node, n.facts, head_ip) for n in cluster.nodes}
        self.extras = docker_extras(nccl)
        props_nodes: list[NcclNodeProps] = []
        for n in cluster.nodes:
            fabric: list[NcclFabricProps] = []
            for f in n.node.fabric:
                iface = n.facts.interface(f.interface)
                hca = n.facts.roce_device(f.hca) if f.hca else None
                fabric.append(
                    {
                        "interface": f.interface,
                        "ip": f.ip,
                        # what the interface will run at: the stack's MTU when it sets it
                        "mtu": args.managed_mtu if args.managed_mtu is not None
                        else (iface.mtu if iface else None),
                        "carrier": iface.carrier if iface else None,
                        "hca": f.hca,
                        "hcaState": hca.state if hca else None,
                    }
                )
            props_nodes.append({"name": n.name, "env": self.env[n.name], "fabric": fabric})
        # what rules 4 and 5 judge; registered again as outputs, which a stack policy reads
        props: NcclEnvironmentProps = {"rdma": nccl.rdma, "minMtu": nccl.min_mtu,
                                       "nodes": props_nodes}
        super().__init__(types.NCCL_ENV, name, props, opts)
        self.pairs = {n.name: fabric_pairs(nccl, cluster, n) for n in cluster.nodes}
        self.fabric_checks = {
            n.name: n.command(
                f"{name}-fabric-{n.name}",
                self,
                create=fabric_check(n.name, self.pairs[n.name], nccl.min_mtu),
                depends_on=args.configured,
                # a configured interface that ran has a new ID (created, repaired) or a new
                # stdout (updated: its address and MTU)
                triggers=[v for c in args.configured for v in (c.id, c.stdout)] or None,
            )
            for n in cluster.nodes
            if self.pairs[n.name]
        }
        # what each node's check proved, one "ok <node> <if> -> <peer> <ip> at MTU <n>" per pair
        self.fabric_check = (
            pulumi.Output.all(**{n: c.stdout for n, c in self.fabric_checks.items()}).apply(
                lambda out: {n: (text or "").splitlines() for n, text in out.items()}
            )
            if self.fabric_checks
            else pulumi.Output.from_input({})
        )
        self.register_outputs({**props, "env": self.env, "fabricCheck": self.fabric_check})
