"""The props each component hands the policy pack: one TypedDict per component resource type.

A component builds its props as its type here (`props: VllmServerProps = {...}`) and mypy checks
the keys and values; the rules read the same keys (`PROPS[type]` lists them). A prop typed
`Any` may be a Pulumi Output on the program's side (a secret, or a value known only during the
update): the pack sees its plain value, or an unknown during preview. docs/contract.md's "What
policies see" is generated from this module (scripts/contract_doc.py; a test compares them).

The docstring's first line of each class is the table's note for its type.
"""
from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from contract import types


# --------------------------------------------------------------------------- the model servers
class MemoryFitProps(TypedDict):
    """inspection/memory_fit.estimate's numbers per rank, on the shape of the commit's
    config.json (what memory-fit judges)."""

    weightsBytesPerRank: int | None
    kvBytesPerTokenPerRank: int | None
    kvCacheBytesPerRank: int | None
    stateBytesPerRank: int | None
    oneSequenceBytesPerRank: int | None
    maxModelLen: int | None
    maxNumSeqs: int | None
    kvCacheDtype: str
    basis: str


class RemoteCodeProps(TypedDict):
    repo: str
    commit: Any  # the resolved commit (an Output on the VllmServer)


class ServerNodeProps(TypedDict):
    name: str
    memTotalBytes: int | None
    unifiedMemory: bool | None
    services: NotRequired[dict[str, float]]  # {service: gpuMemoryUtilization} on this node


class VllmServerProps(TypedDict):
    """the main model's vLLM (memory-fit, parallelism-matches-gpus, vllm-api-key,
    mp-rendezvous-fabric-only with the head's NodeFirewall, remote-code-reviewed); the
    effective values, a recipe's included"""

    environment: str
    executor: str
    tensorParallelSize: int
    pipelineParallelSize: int
    clusterGpus: int
    gpuMemoryUtilization: float
    maxModelLen: int | None
    kvCacheDtype: str
    enforceEager: bool
    modelBytes: Any
    servedModelName: str
    host: str
    port: int
    nodes: list[ServerNodeProps]
    masterAddr: NotRequired[str]  # executor mp on more than one node: where the ranks meet
    masterPort: NotRequired[int]
    kvCacheMemoryBytes: NotRequired[int]
    maxNumSeqs: int | None
    memoryFit: Any  # MemoryFitProps, known once the commit is
    apiKey: Any  # a secret Output
    trustRemoteCode: NotRequired[bool]  # with vllm.trustRemoteCode: the model's and drafter's
    remoteCode: NotRequired[list[RemoteCodeProps]]


class ServiceNodeProps(TypedDict):
    name: str
    memTotalBytes: int | None
    unifiedMemory: bool | None


class VllmServiceProps(TypedDict):
    """a small model beside the main one (memory-fit with serviceOverheadBytes and
    serviceKvMinBytes, vllm-api-key, remote-code-reviewed)"""

    environment: str
    service: str
    task: str
    repo: str
    revision: str
    commit: str
    servedModelName: str
    port: int
    hosts: dict[str, str]  # {node: the address it listens on}
    tensorParallelSize: int
    pipelineParallelSize: int
    gpuMemoryUtilization: float
    maxModelLen: int | None
    maxNumSeqs: int | None
    kvCacheDtype: str
    modelBytes: int | None
    memoryFit: MemoryFitProps
    nodes: list[ServiceNodeProps]
    apiKey: Any  # a secret Output
    kvCacheMemoryBytes: NotRequired[int]
    trustRemoteCode: NotRequired[bool]
    remoteCode: NotRequired[list[RemoteCodeProps]]


# --------------------------------------------------------------------------- the fabric
class NcclFabricProps(TypedDict):
    interface: str
    ip: str
    mtu: int | None  # fabric.mtu when the stack configures the fabric, else what recon saw
    carrier: bool | None
    hca: str | None
    hcaState: str | None


class NcclNodeProps(TypedDict):
    name: str
    env: dict[str, str]
    fabric: list[NcclFabricProps]


class NcclEnvironmentProps(TypedDict):
    """the NCCL environment per node (fabric-mtu, rdma-requires-hca; hf-token-secret reads
    nodes[].env)"""

    rdma: bool
    minMtu: int
    nodes: list[NcclNodeProps]


class FabricInterfaceProps(TypedDict):
    interface: str
    address: str
    file: str


class NodeFabricProps(TypedDict):
    """one per node with fabric.manage (fabric-config, fabric-addresses-unique)"""

    node: str
    host: str
    managementInterface: str | None
    mtu: int
    interfaces: list[FabricInterfaceProps]


class FirewallRuleProps(TypedDict):
    what: str
    ports: list[list[int]]  # [[first, last]]
    sources: list[str]


class DataPlaneProps(TypedDict):
    ports: list[int]  # [first, last]
    sources: list[str]


class NodeFirewallProps(TypedDict):
    """one per node with firewall.enabled (ray-not-exposed, mp-rendezvous-fabric-only,
    vllm-behind-gateway, stack-ports-firewalled)"""

    environment: str
    node: str
    host: str
    managementInterface: str | None
    table: str
    unit: str
    sshPort: int
    public: list[int]
    rules: list[FirewallRuleProps]
    dataPlane: DataPlaneProps | None


class CollectiveGateProps(TypedDict):
    """the fabric's collective gate (nccl-build-advisory: ncclBuilds{node: {vllm: library or
    null, host: [library]}}, payloads/nccl_library.py's form)"""

    enabled: bool
    environment: str
    nodes: list[str]
    thresholdGBps: float | None
    enforce: bool
    sizes: list[int]
    rdma: bool
    ncclBuilds: Any


# --------------------------------------------------------------------------- nodes and images
class VllmImageProps(TypedDict):
    """the serving image (its imageIds{node: id} and imageId are registered OUTPUTS only: a
    component's props are sent before its children exist, so a prop cannot depend on a child)"""

    ref: str
    source: str
    nodes: list[str]


class SparkNodeProps(TypedDict):
    """one per node (prod-pinned reads hostKey)"""

    name: str
    host: str
    hostKey: str | None
    role: str


class ModelCacheProps(TypedDict):
    """the model in the HF cache of every node (prod-pinned reads the revision)"""

    repo: str
    revision: str
    commit: str
    modelBytes: int | None
    cacheDir: str


class RayClusterProps(TypedDict):
    """the Ray cluster (executor ray)"""

    nodes: list[str]
    port: int
    dashboard: bool
    objectStoreBytes: int
    gpusPerNode: int


class NodeGuardProps(TypedDict):
    """one per node with guard.enabled (earlyoom's thresholds and regular expressions null with
    systemd-oomd)"""

    node: str
    host: str
    killer: str
    install: bool
    reserveBytes: int
    termBelowBytes: int | None
    killBelowBytes: int | None
    protected: dict[str, int]  # {unit: oom_score_adj}
    vllmScoreAdj: int
    prefer: str | None
    avoid: str | None
    files: list[str]


# --------------------------------------------------------------------------- gateway, monitoring
class GatewayServerProps(TypedDict):
    node: str
    address: str
    port: int


class GatewayRouteProps(TypedDict):
    name: str
    task: str
    servers: list[GatewayServerProps]


class GatewayProps(TypedDict):
    """HAProxy on the head in front of the models (vllm-behind-gateway, gateway-tls)"""

    environment: str
    node: str
    host: str
    port: int
    listen: str
    tls: bool
    image: str
    livenessPath: str
    maxBodyBytes: int
    routes: list[GatewayRouteProps]


class MonitoringImagesProps(TypedDict):
    prometheus: str | None
    nodeExporter: str | None
    alertmanager: str | None


class AlertmanagerProps(TypedDict):
    listen: str
    clusterListen: str  # "" when off


class ReceiverProps(TypedDict):
    name: str
    kind: str
    sendResolved: bool


class ExporterProps(TypedDict):
    node: str
    host: str
    listen: str


class TargetsProps(TypedDict):
    models: list[str]
    replicas: dict[str, list[str]]  # {model: [node]}
    nodes: list[str]


class MonitoringProps(TypedDict):
    """Prometheus, node exporters and Alertmanager with monitoring.enabled
    (monitoring-not-exposed)"""

    environment: str
    node: str
    host: str
    listen: str  # "addr:port"
    authentication: bool
    fabricAddresses: list[str]
    images: MonitoringImagesProps
    alertmanager: AlertmanagerProps
    receivers: list[ReceiverProps]
    exporters: list[ExporterProps]
    targets: TargetsProps
    scrapeIntervalSeconds: int
    retentionDays: int
    keepDataOnDestroy: bool


# the component resource types the pack reviews, and the props each carries
PROPS: dict[str, type] = {
    types.VLLM_SERVER: VllmServerProps,
    types.VLLM_SERVICE: VllmServiceProps,
    types.NCCL_ENV: NcclEnvironmentProps,
    types.NODE_FABRIC: NodeFabricProps,
    types.NODE_FIREWALL: NodeFirewallProps,
    types.VLLM_IMAGE: VllmImageProps,
    types.GATEWAY: GatewayProps,
    types.NODE_GUARD: NodeGuardProps,
    types.MONITORING: MonitoringProps,
    types.MODEL_CACHE: ModelCacheProps,
    types.COLLECTIVE_GATE: CollectiveGateProps,
    types.RAY_CLUSTER: RayClusterProps,
    types.SPARK_NODE: SparkNodeProps,
}
