"""Preflight: decide from the surveyed facts whether the stack may touch the nodes at all.

`check(cfg, facts, model_bytes=...)` returns a `Plan` (what the run will do about the hosts'
current state: containers to stop, warnings, budgets) or raises `PreflightError` listing EVERY
failed check as `node: fact — fix`. Nothing is changed before this passes.

Checks (each a function below, each with a passing and a failing test in tests/unit/inspection):
  reachability  a node that could not be surveyed (unreachable, auth refused, host key mismatch)
  gb10          every GPU is an NVIDIA GB10 (when preflight.requireGb10)
  driver/cuda   the same driver and CUDA version on every node (compared with the first node)
  docker        Docker present, >= preflight.minDockerVersion, with NVIDIA GPU support
  fabric        each configured interface exists, has carrier, MTU >= nccl.minMtu, carries the
                configured IP in a network inside nccl.fabricSubnets
  roce          the configured HCA of each fabric interface is Up (when nccl.rdma)
  foreign       running containers without the label spark-vllm.managed=true, minus
                preflight.allowContainers: fail -> error each; stop -> Plan.stop_containers
                (plus those this stack stopped earlier, found by their markers); ignore ->
                warning each
  memory        see MEMORY BUDGET below
  disk          free bytes at model.cacheDir >= model bytes not yet in that node's HF cache
  other_stack   another stack's container on the node holding a name or a port this stack
                needs, or its Ray where this stack runs Ray (check_other_stacks)
  nccl          which NCCL each node's serving vLLM loads (the image probe's record of the
                image the stack runs there) and the host's, in Plan.nccl; nodes running the
                same image whose records show different NCCL builds are refused (check_nccl)
  guard         with guard.enabled: systemctl, and the OOM killer's program or guard.install
                with apt-get (check_guard); the guard's section unreadable is an error outside
                dev

MEMORY BUDGET (per node; GB10 has one unified memory, so "GPU memory" is MemTotal):
    claim   = vllm.gpuMemoryUtilization x MemTotal     vLLM takes this much up front and refuses
                                                       to start when less is free
    need    = weights per rank (model_bytes / (tp x pp))
              + KV cache (inspection/memory_fit.py: the model's config.json x maxModelLen x
                maxNumSeqs at kvCacheDtype, plus the fixed state of linear-attention layers;
                vllm.kvCacheMemoryBytes instead when set)
              + preflight.osReserveBytes (headroom for vLLM's runtime and the OS)
              (only when model_bytes is known; the same estimate the VllmServer props carry to
              the policy pack's memory-fit rule)
    budget  = max(claim, need)
    usable  = what vLLM will actually get: MemFree
              + what a page-cache drop reclaims (Buffers + Cached - Shmem - Mapped + SReclaimable:
                the clean, unmapped page cache and reclaimable slab that `sync; echo 3 >
                /proc/sys/vm/drop_caches` frees; kernel Documentation/filesystems/proc.rst,
                https://www.kernel.org/doc/html/latest/filesystems/proc.html#meminfo, and
                Documentation/admin-guide/sysctl/vm.rst drop_caches)
              + memory of containers this run stops (foreign, mode stop)
              + memory of the stack's own containers (they are the workload itself)
              On GB10 the page cache counts against what CUDA can allocate (a load next to the
              cache of a 119 GB copy dies part way), so MemAvailable, which counts the cache as
              available, is only the fallback when the survey has no MemFree/Cached breakdown.
    fail when usable < budget; the finding states every term.

Warnings (in Plan.warnings, never fatal): clock more than 2 s off, a fabric link below
200000 Mb/s on a Spark, a /etc/dgx-release that does not say Spark, sections the survey could not
read, the pinned host key absent from /etc/ssh (ssh itself verified it), a crash loop, an OOM
kill on the node in the last 24 h with the memory it had left (check_oom_kills).
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections.abc import Callable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from config import NodeConfig, ServiceConfig, StackConfig
from config.errors import key_path
from config.forms import GIB, MODEL_SEED_PORT, is_image_id
from contract import labels as lbl
from hostscripts.paths import StackNames
from inspection import memory_fit
from inspection.facts import ContainerFacts, ImageNccl, MemoryFacts, NodeFacts, OomKill
from inspection.hub import ModelManifest
from inspection.memory_fit import Estimate, ModelShape
from inspection.recon import UNMATCHED_LABELS, ReconError, Runner, recent_restarts

try:
    from pulumi import RunError as _UserError
except ImportError:  # pragma: no cover
    _UserError = Exception  # type: ignore[misc,assignment]

# per service name: its model's bytes and its config.json's shape (the hub lookups)
ServiceModels = Mapping[str, tuple[int | None, ModelShape | None]]
# per service name: its model at the hub
Manifests = Mapping[str, ModelManifest]

GB10_NAME = "NVIDIA GB10"
SPARK_LINK_MBPS = 200000
CLOCK_WARN_SECONDS = 2.0


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    node: str
    check: str  # reachability, gb10, driver, cuda, docker, fabric, roce, memory, disk, foreign, ...
    fact: str  # what was observed
    fix: str  # what to do about it

    def __str__(self) -> str:
        return f"{self.node}: {self.fact} — {self.fix}"


class Plan(BaseModel):
    """What the run will do about the nodes' present state; shown in preview."""

    model_config = ConfigDict(frozen=True)

    stop_containers: dict[str, list[ContainerFacts]] = Field(default_factory=dict)
    warnings: list[Finding] = Field(default_factory=list)
    memory_budget_bytes: dict[str, int] = Field(default_factory=dict)
    usable_memory_bytes: dict[str, int] = Field(default_factory=dict)  # what vLLM will get
    memory_estimate: Estimate | None = None  # per rank, the same on every node
    model_bytes_missing: dict[str, int] = Field(default_factory=dict)
    hcas_up: dict[str, list[str]] = Field(default_factory=dict)
    # per node: the NCCL its serving vLLM loads (the image probe's record) and the host's
    nccl: dict[str, str] = Field(default_factory=dict)


class PreflightError(_UserError):
    """Every failed check, one per line as `node: fact — fix`. Nothing was changed."""

    def __init__(self, findings: list[Finding], warnings: list[Finding] | None = None) -> None:
        self.findings = findings
        self.warnings = warnings or []
        lines = "\n".join(f"  - {f}" for f in findings)
        super().__init__(f"preflight failed with {len(findings)} problem(s); nothing was changed:"
                         f"\n{lines}")


def gib(n: int | float) -> str:
    """Readable size: '68.2 GiB', '312 MiB' (lab containers hold little), '0 B'."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= 1024**2:
        return f"{n / 1024**2:.0f} MiB"
    return f"{int(n)} B" if n < 1024 else f"{n / 1024:.0f} KiB"


def _tp_pp(cfg: StackConfig) -> tuple[int, int]:
    return cfg.tensor_parallel_size, cfg.vllm.pipeline_parallel_size


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("-")[0])[:3])


# --------------------------------------------------------------------------- the checks

def check_reachability(node: str, result: NodeFacts | ReconError | None) -> list[Finding]:
    if result is None:
        return [Finding(node=node, check="reachability", fact="was not surveyed",
                        fix="run the survey over every configured node")]
    if isinstance(result, ReconError):
        return [Finding(node=node, check=result.kind, fact=result.reason, fix=result.fix)]
    return []


def check_gb10(cfg: StackConfig, f: NodeFacts) -> tuple[list[Finding], list[Finding]]:
    errors: list[Finding] = []
    warnings: list[Finding] = []
    if not cfg.preflight.require_gb10:
        return errors, warnings
    fix = ("use DGX Spark / GB10 nodes, or set spark-vllm:preflight.requireGb10: false for "
           "another platform")
    if not f.gpus:
        why = ("nvidia-smi is not installed" if "nvidia-smi" in f.missing_tools
               else next((f"nvidia-smi: {f.unreadable[s]}" for s in
                          ("nvidia_smi_query", "nvidia_smi") if s in f.unreadable),
                         "nvidia-smi listed no GPU"))
        errors.append(Finding(node=f.node, check="gb10", fact=f"no NVIDIA GPU visible ({why})",
                              fix="install/load the NVIDIA 580 driver so that nvidia-smi lists "
                                  "the GB10, or set spark-vllm:preflight.requireGb10: false for "
                                  "another platform"))
    for gpu in f.gpus:
        if gpu.name != GB10_NAME:
            errors.append(Finding(node=f.node, check="gb10",
                                  fact=f"GPU is {gpu.name!r}, not {GB10_NAME}", fix=fix))
    if f.os.dgx_release and not f.os.is_dgx_spark:
        warnings.append(Finding(
            node=f.node, check="gb10",
            fact=f"/etc/dgx-release names {f.os.dgx_release.get('DGX_NAME', '?')!r}, not DGX Spark",
            fix="fine for other GB10 systems; otherwise check the OS image"))
    return errors, warnings


def check_driver_consistency(cfg: StackConfig, facts: Mapping[str, NodeFacts]) -> list[Finding]:
    surveyed = [facts[n.name] for n in cfg.nodes if isinstance(facts.get(n.name), NodeFacts)
                and facts[n.name].gpus]
    if len(surveyed) < 2:
        return []
    ref = surveyed[0]
    out = []
    for f in surveyed[1:]:
        for field, label in (("driver_version", "driver"), ("cuda_version", "CUDA")):
            mine, theirs = getattr(f.gpus[0], field), getattr(ref.gpus[0], field)
            if mine and theirs and mine != theirs:
                out.append(Finding(
                    node=f.node, check=label.lower(),
                    fact=f"{label} {mine} differs from {ref.node}'s {theirs}",
                    fix=f"install the same NVIDIA driver on every node (tensor parallelism across "
                        f"nodes needs identical drivers); {ref.node} has {label} {theirs}"))
    return out


def check_docker(cfg: StackConfig, f: NodeFacts) -> list[Finding]:
    if f.docker is None:
        if "docker" in f.missing_tools:
            fact, fix = "Docker is not installed", "install Docker Engine (docker-ce) on the node"
        else:
            reason = f.unreadable.get("docker_info", "docker info gave no answer")
            fact = f"Docker did not answer ({reason})"
            fix = "start it (systemctl start docker) and make sure the ssh user may use it"
        return [Finding(node=f.node, check="docker", fact=fact, fix=fix)]
    out = []
    minimum = cfg.preflight.min_docker_version
    if _version(f.docker.version) < _version(minimum):
        out.append(Finding(node=f.node, check="docker",
                           fact=f"Docker {f.docker.version} is older than {minimum}",
                           fix=f"upgrade Docker Engine to {minimum} or newer"))
    if not f.docker.gpu_support:
        out.append(Finding(
            node=f.node, check="docker",
            fact="Docker has no NVIDIA GPU support (runtimes: "
                 f"{', '.join(f.docker.runtimes) or 'none'};"
                 " no nvidia-container-runtime-hook, no CDI spec for nvidia.com/gpu)",
            fix="install nvidia-container-toolkit, then `nvidia-ctk runtime configure "
                "--runtime=docker && systemctl restart docker` (or `nvidia-ctk cdi generate "
                "--output=/etc/cdi/nvidia.yaml`)"))
    return out


MIN_NFT = (1, 0)  # Debian 12's 1.0.6, Ubuntu 22.04's 1.0.2, 24.04's (DGX OS 7) 1.0.9


def check_firewall(cfg: StackConfig, f: NodeFacts) -> list[Finding]:
    """With firewall.enabled (required outside dev): the node's nftables, whose `nft` loads the
    stack's table (hostscripts/firewall.py), a table recon could read (outside dev: what cannot
    be read cannot be judged for drift), and a port block outside the node's ephemeral ports
    (the kernel would hand Ray's pinned ports to outgoing connections)."""
    if not cfg.firewall.enabled:
        return []
    if "nft" in f.missing_tools:
        return [Finding(node=f.node, check="firewall",
                        fact="nftables is not installed (no nft): the stack's firewall cannot "
                             "be loaded, and Ray's and vLLM's ports would answer on every "
                             "address of the node",
                        fix="apt-get install nftables (the stack loads its own table; it does "
                            "not enable nftables.service)")]
    out = []
    if f.nft_version is not None and _version(f.nft_version) < MIN_NFT:
        out.append(Finding(node=f.node, check="firewall",
                           fact=f"nft {f.nft_version} is older than "
                                f"{'.'.join(map(str, MIN_NFT))}",
                           fix="upgrade the node's nftables package"))
    if "firewall" in f.unreadable and cfg.environment != "dev":
        out.append(Finding(node=f.node, check="firewall",
                           fact=f"the stack's firewall could not be read "
                                f"({f.unreadable['firewall']}), so its drift cannot be judged",
                           fix="the ssh user must be root (nft lists tables with CAP_NET_ADMIN); "
                               "see `nft list ruleset` on the node"))
    lo, hi = cfg.firewall.block.span
    if f.ephemeral_ports is not None:
        e0, e1 = f.ephemeral_ports
        if lo <= e1 and e0 <= hi:
            out.append(Finding(
                node=f.node, check="firewall",
                fact=f"the stack's port block {lo}-{hi} (firewall.portBase) overlaps the node's "
                     f"ephemeral ports {e0}-{e1} (net.ipv4.ip_local_port_range): outgoing "
                     "connections would take Ray's and vLLM's pinned ports",
                fix=f"set {key_path(('firewall', 'portBase'))} to a block below {e0} or above "
                    f"{e1}"))
    return out


def check_fabric(cfg: StackConfig, node_cfg: NodeConfig,
                 f: NodeFacts) -> tuple[list[Finding], list[Finding]]:
    errors: list[Finding] = []
    warnings: list[Finding] = []
    nets = [ipaddress.IPv4Network(s) for s in cfg.nccl.fabric_subnets]
    min_mtu = cfg.nccl.min_mtu
    index = cfg.nodes.index(node_cfg) if node_cfg in cfg.nodes else 0
    # the interface carrying the management address (the one ssh uses) is never a fabric one:
    # with fabric.manage the up would reconfigure the connection it arrives on
    mgmt = next((i.name for i in f.interfaces
                 if node_cfg.host in (a.split("/")[0] for a in i.ipv4)), None)
    for j, fab in enumerate(node_cfg.fabric):
        if fab.interface == mgmt:
            errors.append(Finding(
                node=f.node, check="fabric",
                fact=f"{key_path(('nodes', index, 'fabric', j, 'interface'))}: {mgmt} carries "
                     f"the management address {node_cfg.host} (the one ssh uses); a fabric "
                     "interface is never the management one",
                fix="name the ConnectX-7 interfaces there (ibdev2netdev lists them; `spark-vllm "
                    "init` proposes them); nothing was changed"))
    if errors:
        return errors, warnings
    for fab in node_cfg.fabric:
        name = fab.interface
        iface = f.interface(name)
        if iface is None and "ip" in f.missing_tools:
            errors.append(Finding(
                node=f.node, check="fabric",
                fact=f"cannot see fabric interface {name}: `ip` (iproute2) is not installed on "
                     "the node, so recon could not list any interface",
                fix="install iproute2 on the node (apt-get install iproute2), then run again"))
            continue
        if iface is None:
            names = ", ".join(i.name for i in f.interfaces if i.name.startswith(("en", "ib")))
            listed = names or "none"
            if "ip_addr" in f.unreadable:
                listed = f"interface list unreadable: {f.unreadable['ip_addr']}"
            errors.append(Finding(
                node=f.node, check="fabric", fact=f"fabric interface {name} does not exist "
                                                  f"(present: {listed})",
                fix="check spark-vllm:nodes[].fabric[].interface (names are case-sensitive: "
                    "enp1s0f1np1 vs enP2p1s0f1np1) and that the ConnectX-7 driver is loaded"))
            continue
        if not iface.carrier:
            errors.append(Finding(
                node=f.node, check="fabric", fact=f"fabric interface {name} is down (no carrier)",
                fix=f"cable the QSFP port behind {name} to the peer and bring it up "
                    f"(ip link set {name} up); one cable brings up both twins of its port"))
        if cfg.preflight.require_gb10 and iface.speed_mbps and iface.speed_mbps < SPARK_LINK_MBPS:
            warnings.append(Finding(
                node=f.node, check="fabric",
                fact=f"fabric interface {name} links at {iface.speed_mbps} Mb/s, "
                     f"below {SPARK_LINK_MBPS} on a Spark",
                fix="use a 200G QSFP56 cable; behind a switch, force the switch port to 200G"))
        if cfg.fabric.manage:
            # the stack sets the address and MTU itself (components/fabric.py): what the node
            # has now is the starting point of the up, not a finding
            continue
        if iface.mtu and iface.mtu < min_mtu:
            errors.append(Finding(
                node=f.node, check="fabric",
                fact=f"fabric interface {name} has MTU {iface.mtu}, below nccl.minMtu {min_mtu}",
                fix=f"set MTU {min_mtu} on {name} on every node (netplan `mtu: {min_mtu}`, or "
                    f"ip link set {name} mtu {min_mtu})"))
        present = {a.split("/")[0]: a for a in iface.ipv4}
        subnet = next((n for n in nets if ipaddress.IPv4Address(fab.ip) in n), None)
        want = f"{fab.ip}/{subnet.prefixlen}" if subnet else fab.ip
        if fab.ip not in present:
            has = ", ".join(iface.ipv4) or "no IPv4 address"
            errors.append(Finding(
                node=f.node, check="fabric",
                fact=f"fabric interface {name} has {has}, not the configured {fab.ip}",
                fix=f"assign {want} to {name} (netplan, persistent), or correct "
                    f"spark-vllm:nodes[].fabric[].ip"))
        else:
            network = ipaddress.IPv4Interface(present[fab.ip]).network
            if not any(network.subnet_of(n) for n in nets):
                errors.append(Finding(
                    node=f.node, check="fabric",
                    fact=f"fabric interface {name} has {present[fab.ip]}, whose network {network} "
                         f"is outside nccl.fabricSubnets {list(cfg.nccl.fabric_subnets)}",
                    fix=f"use the prefix of the fabric subnet: {want}"))
    return errors, warnings


def check_transport_visible(cfg: StackConfig) -> list[Finding]:
    """With nccl.rdma outside dev the stack must see NCCL's transport after serving (the
    verdict of inspection/nccl_transport fails closed); NCCL states it only at INFO, so a
    quieter nccl.debug is refused here, before anything changes, not after vLLM was replaced."""
    if not cfg.nccl.rdma or cfg.environment == "dev" or cfg.nccl.debug in ("INFO", "TRACE"):
        return []
    return [Finding(
        node=cfg.nodes[0].name, check="nccl",
        fact=f"nccl.rdma is true in {cfg.environment} but nccl.debug is {cfg.nccl.debug}: "
             "NCCL states its transport only at INFO, so RDMA could not be verified after "
             "serving",
        fix="set spark-vllm:nccl.debug INFO (the stack reads only NCCL's init and network "
            "lines: NCCL_DEBUG_SUBSYS=INIT,NET)")]


def serving_image(f: NodeFacts, stack_label: str | None) -> str | None:
    """The image ID the stack's serving containers on this node run (None: none of them). The
    stack creates them by image ID, which is what `docker ps` reports as their image
    (tests/fixtures/status); a tag is looked up in the node's images."""
    for c in f.docker.containers if f.docker else []:
        if (c.labels.get(lbl.STACK) != stack_label
                or c.labels.get(lbl.ROLE) not in lbl.SERVING_ROLES):
            continue
        for ref in (c.image_id, c.image):
            if is_image_id(ref):
                return ref
        found = next((i.id for i in (f.docker.images if f.docker else [])
                      if c.image in (*i.repo_tags, *i.repo_digests)), None)
        if found is not None:
            return found
    return None


def nccl_running(f: NodeFacts, stack_label: str | None) -> tuple[str | None, ImageNccl | None]:
    """(image ID, the NCCL its vLLM loads) on this node, from the image probe's record of the
    image the stack serves there; with no serving container, the node's only record."""
    image = serving_image(f, stack_label)
    if image is None and len(f.image_nccl) == 1:
        image = next(iter(f.image_nccl))
    return image, f.image_nccl.get(image) if image else None


def nccl_line(f: NodeFacts, stack_label: str | None) -> str:
    """Which NCCL runs on the node, and the host's: what preflight says and recon shows."""
    image, found = nccl_running(f, stack_label)
    if found is not None:
        text = found.line()
    elif image is not None:
        text = f"not probed yet in {image[:19]} (the up's image probe reports it)"
    else:
        text = "not probed yet (the up's image probe reports it)"
    if f.nccl_host is None:
        host = "unknown (not surveyed)"
    else:
        host = ", ".join(lib.line() for lib in f.nccl_host) or "none"
    return f"{text}; the host's: {host} (not what the containers load)"


def check_nccl(facts: Mapping[str, NodeFacts], stack_label: str | None
               ) -> tuple[list[Finding], dict[str, str]]:
    """(errors, a line per node): nodes that run the same image ID but whose records show
    different NCCL builds are refused (ranks of different builds: vLLM issues 42354, 41725);
    nodes that run different images are the image check's to compare once the up pulled them."""
    lines = {n: nccl_line(f, stack_label) for n, f in facts.items()}
    seen: dict[str, tuple[str, ImageNccl]] = {}
    for n, f in sorted(facts.items()):
        image, found = nccl_running(f, stack_label)
        if image and found is not None and found.vllm is not None:
            seen[n] = (image, found)
    errors = []
    first = next(iter(seen.items()), None)
    for n, (image, found) in seen.items():
        if first is None or n == first[0] or image != first[1][0]:
            continue
        other = first[1][1]
        assert found.vllm is not None and other.vllm is not None
        if found.vllm.identity != other.vllm.identity:
            errors.append(Finding(
                node=n, check="nccl",
                fact=f"vLLM here loads {found.vllm.line()}, on {first[0]} {other.vllm.line()}, "
                     f"from the same image {image[:19]}",
                fix="every rank must run the same NCCL build: the same VLLM_NCCL_SO_PATH (or "
                    "none) on every node, then `spark-vllm recon` again"))
    return errors, lines


def check_roce(cfg: StackConfig, node_cfg: NodeConfig, f: NodeFacts) -> list[Finding]:
    if not cfg.nccl.rdma:
        return []
    out = []
    for fab in node_cfg.fabric:
        if not fab.hca:
            continue
        dev = f.roce_device(fab.hca)
        if dev is None:
            why = ""
            if "ibdev2netdev" in f.missing_tools and not f.roce:
                why = " (neither ibdev2netdev nor `rdma link` listed any device)"
            present = ", ".join(r.device for r in f.roce) or "none"
            out.append(Finding(
                node=f.node, check="roce",
                fact=f"RoCE device {fab.hca} for {fab.interface} not found{why}; present: "
                     f"{present}",
                fix="check spark-vllm:nodes[].fabric[].hca (case-sensitive: rocep1s0f1 vs "
                    "roceP2p1s0f1), or set spark-vllm:nccl.rdma: false to use TCP"))
        elif not dev.up:
            out.append(Finding(
                node=f.node, check="roce",
                fact=f"RoCE device {fab.hca} ({dev.netdev or fab.interface}) is {dev.state}",
                fix=f"cable and bring up {dev.netdev or fab.interface}; ibdev2netdev must show "
                    f"{fab.hca} (Up) on every node, or set spark-vllm:nccl.rdma: false"))
    return out


def foreign_containers(cfg: StackConfig, f: NodeFacts) -> list[ContainerFacts]:
    allow = set(cfg.preflight.allow_containers)
    return [c for c in f.foreign_containers() if c.name not in allow]


def stopped_by_stack(cfg: StackConfig, f: NodeFacts,
                     stack_label: str | None) -> list[ContainerFacts]:
    """Foreign containers this stack stopped on an earlier run (marker holds its label; any
    label when stack_label is None) that are still stopped: the plan keeps their stops, or the
    engine would delete the stop commands and start the containers again."""
    allow = set(cfg.preflight.allow_containers)
    return [c for c in (f.docker.containers if f.docker else [])
            if not c.managed and c.state != "running" and c.name not in allow
            and c.name in f.stopped_by
            and (stack_label is None or f.stopped_by[c.name] == stack_label)]


def check_foreign(cfg: StackConfig, f: NodeFacts, stack_label: str | None = None
                  ) -> tuple[list[Finding], list[Finding], list[ContainerFacts]]:
    """-> (errors, warnings, containers to stop)."""
    foreign = foreign_containers(cfg, f)
    mode = str(cfg.preflight.foreign_containers)
    # Without a readable container list (or, for `stop`, the stack's own stop markers) the
    # foreign containers cannot be judged: refuse rather than pass with "none seen", or drop
    # earlier stops from the plan (the engine would then start those containers again).
    seen = ("docker_ps", "docker_labels", UNMATCHED_LABELS)
    blind = [s for s in ((*seen, "stopped") if mode == "stop" else seen) if s in f.unreadable]
    if blind and mode != "ignore":
        return [Finding(
            node=f.node, check="foreign",
            fact=f"the running containers cannot be judged: {s} unreadable ({f.unreadable[s]})",
            fix="see the node (docker ps, /var/lib/spark-vllm/stopped) and run again; "
                "preflight.foreignContainers: ignore skips this check") for s in blind], [], []
    if mode == "stop":
        return [], [], foreign + stopped_by_stack(cfg, f, stack_label)
    if not foreign:
        return [], [], []
    findings = [Finding(
        node=f.node, check="foreign",
        fact=f"foreign container {c.name} (image {c.image}) is running and holds "
             f"{gib(c.memory_bytes)}",
        fix=("stop it yourself, or set spark-vllm:preflight.foreignContainers: stop (the stack "
             "stops it and destroy starts it again), or list it in preflight.allowContainers to "
             "keep it")
        if mode == "fail" else "it keeps running (preflight.foreignContainers: ignore)")
        for c in foreign]
    return (findings, [], []) if mode == "fail" else ([], findings, [])


def memory_estimate(cfg: StackConfig, model_bytes: int | None,
                    shape: ModelShape | None) -> Estimate:
    """Weights + KV cache + osReserve per rank (inspection/memory_fit.estimate, the function the
    VllmServer props for the policy pack come from; the headroom term is preflight's own)."""
    tp, pp = _tp_pp(cfg)
    v = cfg.vllm
    return memory_fit.estimate(
        shape, model_bytes=model_bytes, tensor_parallel_size=tp, pipeline_parallel_size=pp,
        max_model_len=v.max_model_len, max_num_seqs=v.max_num_seqs,
        kv_cache_dtype=v.kv_cache_dtype, kv_cache_memory_bytes=v.kv_cache_memory_bytes,
        speculative_config=v.speculative_config, prefix_caching=v.enable_prefix_caching,
        overhead_bytes=int(cfg.preflight.os_reserve_bytes))


def memory_budget(cfg: StackConfig, f: NodeFacts, model_bytes: int | None,
                  shape: ModelShape | None = None) -> int:
    claim = int(cfg.vllm.gpu_memory_utilization * f.memory.total_bytes)
    need = memory_estimate(cfg, model_bytes, shape).total_bytes if model_bytes else None
    return max(claim, need or 0)


def vllm_gets(mem: MemoryFacts) -> tuple[int, list[str]]:
    """What vLLM can allocate on the node before containers are stopped: MemFree + what a
    page-cache drop reclaims; MemAvailable when the survey has no breakdown. -> (bytes, terms)."""
    if not mem.has_breakdown:
        return mem.available_bytes, [f"MemAvailable {gib(mem.available_bytes)} (the survey has "
                                     "no MemFree/Cached breakdown)"]
    free = mem.free_bytes or 0
    reclaim = mem.drop_reclaimable_bytes
    how = [f"Cached {gib(mem.cached_bytes or 0)}"]
    if mem.shmem_bytes:
        how.append(f"- Shmem {gib(mem.shmem_bytes)}")
    if mem.mapped_bytes:
        how.append(f"- Mapped {gib(mem.mapped_bytes)}")
    if mem.buffers_bytes:
        how.append(f"+ Buffers {gib(mem.buffers_bytes)}")
    if mem.sreclaimable_bytes:
        how.append(f"+ SReclaimable {gib(mem.sreclaimable_bytes)}")
    return free + reclaim, [f"MemFree {gib(free)}",
                            f"{gib(reclaim)} a page-cache drop reclaims ({' '.join(how)})"]


def _need_text(cfg: StackConfig, est: Estimate, model_bytes: int) -> str:
    """`model_bytes`: the weights the ranks load (the model's, and model.drafter's with it)."""
    tp, pp = est.tensor_parallel_size, est.pipeline_parallel_size
    what = "model and drafter" if cfg.model.drafter is not None else "model"
    text = (f"weights {gib(est.weights_bytes or 0)} ({what} {gib(model_bytes)}/(tp {tp} x pp "
            f"{pp}))")
    if est.kv_cache_memory_bytes is not None:
        text += f" + KV cache {gib(est.kv_held_bytes)} (vllm.kvCacheMemoryBytes)"
    elif est.kv_known:
        text += (f" + KV cache {gib(est.kv_held_bytes)} ({est.max_num_seqs} x "
                 f"{est.max_model_len} tokens at {est.kv_dtype}: {est.basis})")
    else:
        text += f" + KV cache not counted ({est.basis})"
    return text + f" + osReserve {gib(cfg.preflight.os_reserve_bytes)}"


def check_memory(cfg: StackConfig, f: NodeFacts, stopping: list[ContainerFacts],
                 model_bytes: int | None,
                 shape: ModelShape | None = None, services: ServiceModels | None = None,
                 stack_label: str | None = None) -> tuple[list[Finding], int, int]:
    """-> (errors, budget, usable). The budget is the main model's plus every service's on the
    node; the stack's own running containers count as usable (another stack's do not)."""
    placed = cfg.services_on(f.node)
    budget = memory_budget(cfg, f, model_bytes, shape) + sum(
        service_budget(s, f, services or {}) for s in placed)
    ours = sum(c.memory_bytes for c in (f.docker.containers if f.docker else [])
               if c.managed and c.state == "running"
               and (stack_label is None or c.labels.get(lbl.STACK) == stack_label))
    freed = sum(c.memory_bytes for c in stopping)
    gets, parts = vllm_gets(f.memory)
    usable = gets + freed + ours
    if usable >= budget:
        return [], budget, usable
    util = cfg.vllm.gpu_memory_utilization
    how = f"max({util} x MemTotal {gib(f.memory.total_bytes)}"
    if model_bytes:
        how += ", " + _need_text(cfg, memory_estimate(cfg, model_bytes, shape), model_bytes)
    how += ")"
    if placed:
        how += " + " + " + ".join(f"service {s.name} {gib(service_budget(s, f, services or {}))}"
                                  for s in placed)
    if freed:
        parts.append(f"{gib(freed)} freed by stopping {', '.join(c.name for c in stopping)}")
    if ours:
        parts.append(f"{gib(ours)} held by the stack's own containers")
    holders = [c for c in foreign_containers(cfg, f) if c not in stopping and c.memory_bytes]
    fix = "free memory on the node or lower spark-vllm:vllm.gpuMemoryUtilization"
    if holders:
        fix = (f"foreign containers hold {gib(sum(c.memory_bytes for c in holders))} "
               f"({', '.join(f'{c.name} {gib(c.memory_bytes)}' for c in holders)}): stop "
               "them or set "
               "preflight.foreignContainers: stop; or lower spark-vllm:vllm.gpuMemoryUtilization")
    elif f.memory.has_breakdown and (f.memory.shmem_bytes or 0) + (f.memory.mapped_bytes or 0) \
            >= GIB:
        fix += (f"; Shmem {gib(f.memory.shmem_bytes or 0)} (tmpfs, /dev/shm) and Mapped "
                f"{gib(f.memory.mapped_bytes or 0)} (files mapped by processes) stay after a "
                "page-cache drop")
    return [Finding(node=f.node, check="memory",
                    fact=f"memory: {' + '.join(parts)} = {gib(usable)} usable by vLLM, below the "
                         f"budget {gib(budget)} = {how}", fix=fix)], budget, usable


def service_estimate(svc: ServiceConfig, model_bytes: int | None,
                     shape: ModelShape | None) -> Estimate:
    """Weights + KV cache of a service (tensor parallel 1; memory_fit.estimate, as its props for
    the policy pack). No overhead term: the policy pack adds its runtimeOverheadBytes."""
    return memory_fit.estimate(
        shape, model_bytes=model_bytes, tensor_parallel_size=1,
        max_model_len=svc.max_model_len, max_num_seqs=svc.max_num_seqs,
        kv_cache_dtype=svc.kv_cache_dtype, kv_cache_memory_bytes=svc.kv_cache_memory_bytes,
        speculative_config=svc.speculative_config, prefix_caching=svc.enable_prefix_caching)


def service_budget(svc: ServiceConfig, f: NodeFacts, models: ServiceModels) -> int:
    share = int(svc.gpu_memory_utilization * f.memory.total_bytes)
    model_bytes, shape = models.get(svc.name, (None, None))
    need = service_estimate(svc, model_bytes, shape).total_bytes if model_bytes else None
    return max(share, need or 0)


def check_shares(cfg: StackConfig, f: NodeFacts, models: ServiceModels) -> list[Finding]:
    """A node with services: every share (gpuMemoryUtilization x MemTotal, the main model's
    and each service's) plus osReserve fits in MemTotal, and each service's weights + KV cache
    fit in its own share. Nothing to say on a node without services."""
    services = cfg.services_on(f.node)
    mem = f.memory.total_bytes
    if not services or mem <= 0:
        return []
    out: list[Finding] = []
    shares = [(f"the main model {cfg.vllm.served_model_name}", cfg.vllm.gpu_memory_utilization),
              *((f"service {s.name}", s.gpu_memory_utilization) for s in services)]
    reserve = int(cfg.preflight.os_reserve_bytes)
    total = sum(int(u * mem) for _, u in shares) + reserve
    if total > mem:
        terms = " + ".join(f"{what} {u:.2f} ({gib(u * mem)})" for what, u in shares)
        out.append(Finding(
            node=f.node, check="memory",
            fact=f"memory shares: {terms} + osReserve {gib(reserve)} = {gib(total)}, above "
                 f"MemTotal {gib(mem)} by {gib(total - mem)}",
            fix="lower spark-vllm:vllm.gpuMemoryUtilization or a service's "
                "gpuMemoryUtilization (spark-vllm:services), or place a service on another node"))
    index = {s.name: i for i, s in enumerate(cfg.services)}
    for svc in services:
        model_bytes, shape = models.get(svc.name, (None, None))
        if not model_bytes:
            continue
        est = service_estimate(svc, model_bytes, shape)
        share = int(svc.gpu_memory_utilization * mem)
        need = est.total_bytes or 0
        if need > share:
            kv = (f"KV cache {gib(est.kv_held_bytes)} ({est.basis})" if est.kv_known
                  or est.kv_cache_memory_bytes is not None else f"KV cache not counted "
                  f"({est.basis})")
            out.append(Finding(
                node=f.node, check="memory",
                fact=f"service {svc.name}: weights {gib(est.weights_bytes or 0)} + {kv} = "
                     f"{gib(need)}, above its share {svc.gpu_memory_utilization:.2f} x MemTotal "
                     f"{gib(mem)} = {gib(share)}",
                fix=f"raise spark-vllm:services[{index[svc.name]}].gpuMemoryUtilization, or lower "
                    "its maxModelLen / maxNumSeqs (or set its kvCacheMemoryBytes)"))
    return out


def wanted_containers(cfg: StackConfig, node: str, names: StackNames) -> dict[str, str]:
    """The container names the stack runs on `node`, each with what it is."""
    wanted = {}
    if node == cfg.head.name or cfg.vllm.executor == "mp":  # mp: a vLLM rank on every node
        wanted[names.serve] = "the main vLLM"
    if node == cfg.head.name:
        wanted[names.gateway] = "the gateway"
    if cfg.vllm.executor == "ray":
        wanted[names.ray_head if node == cfg.head.name else names.ray_worker] = "Ray"
    if seeds_on(cfg, node):
        wanted[names.model_seeder] = "the model seeder"
    for svc in cfg.services_on(node):
        wanted[names.service(svc.name)] = f"service {svc.name}"
    return wanted


def seeds_on(cfg: StackConfig, node: str) -> bool:
    """Whether the stack's model seeder runs on `node` during an `up`: the first node of a model
    held on more than one node (the main model's head; a service's first node)."""
    holders = [[n.name for n in cfg.nodes], *(cfg.service_nodes(s) for s in cfg.services)]
    return any(len(h) > 1 and h[0] == node for h in holders)


def wanted_ports(cfg: StackConfig, node: str) -> dict[int, str]:
    """The host ports the stack's containers listen on at `node`, with their config keys."""
    ports: dict[int, str] = {}
    if node == cfg.head.name:
        ports[cfg.vllm.port] = "spark-vllm:vllm.port"
        ports[cfg.gateway.port] = "spark-vllm:gateway.port"  # every address of the head
        if cfg.vllm.executor == "ray":
            ports[cfg.ray.port] = "spark-vllm:ray.port"
        elif len(cfg.nodes) > 1:
            ports[cfg.vllm.master_port] = "spark-vllm:vllm.masterPort"
    if seeds_on(cfg, node):
        ports[MODEL_SEED_PORT] = SEEDER_PORT
    for i, svc in enumerate(cfg.services):
        if node in cfg.service_nodes(svc):
            ports[svc.port] = f"spark-vllm:services[{i}].port"
    return ports


PORT_LABELS = (lbl.PORT, "spark-vllm.master-port")


def declared_ports(c: ContainerFacts) -> list[int]:
    """The host ports a container of a stack declares it listens on (PORT_LABELS: a service's
    or the main vLLM's API, the gateway's, the model seeder's, vLLM's master port with
    vllm.executor mp)."""
    return [int(v) for k in PORT_LABELS if (v := c.labels.get(k, "")).isdigit()]


SEEDER_PORT = "its model seeder, on a fixed port"  # wanted_ports: no config key sets it


def stack_names(stack_label: str | None) -> StackNames | None:
    """The names of the stack whose label (`<project>/<stack>`) is given."""
    return StackNames(stack_label.rsplit("/", 1)[-1]) if stack_label is not None else None


def check_other_stacks(cfg: StackConfig, f: NodeFacts,
                       stack_label: str | None) -> list[Finding]:
    """Another stack's containers on the node (stacks may share nodes): a container name this
    stack needs, a port one of them declares (PORT_LABELS) that this stack listens on, or
    another stack's Ray where this stack runs Ray, is refused before any change, naming the other
    stack.

    One Ray per node: Ray listens on more ports than `ray.port`, pinned into each stack's
    `firewall.portBase` block (config/firewall.PortBlock), and at fixed defaults where nothing
    pins them, the Ray client server on the head (10001) and the dashboard agent on every node
    (52365; https://docs.ray.io/en/latest/ray-core/configure.html#ports-configurations,
    ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT)."""
    mine = stack_names(stack_label)
    if mine is None:
        return []
    unlabelled = next((f.unreadable[k] for k in ("docker_labels", UNMATCHED_LABELS)
                       if k in f.unreadable), None)
    if unlabelled is not None and f.docker and f.docker.containers:
        # whose containers they are is in their labels: unknown, so nothing can be ruled out
        return [Finding(
            node=f.node, check="other_stack",
            fact="the containers' labels are unreadable, so another stack's containers cannot "
                 f"be told apart ({unlabelled})",
            fix="see the node (docker inspect --format '{{json .Config.Labels}}' <container>) "
                "and run again")]
    names = wanted_containers(cfg, f.node, mine)
    ports = wanted_ports(cfg, f.node)
    with_ray = cfg.vllm.executor == "ray"
    out: list[Finding] = []
    for c in f.docker.containers if f.docker else []:
        other = c.labels.get(lbl.STACK)
        if not c.managed or other in (None, stack_label):
            continue
        if c.name in names:
            out.append(Finding(
                node=f.node, check="other_stack",
                fact=f"container {c.name} ({c.state or 'created'}) belongs to the stack {other}; "
                     f"this stack needs that name for {names[c.name]}",
                fix=f"run one of the two stacks on other nodes, or `pulumi destroy` {other} "
                    "first (a stack's containers are named by stack, a service's by stack and "
                    "service: rename one of them)"))
        if with_ray and c.labels.get(lbl.ROLE) in lbl.RAY_ROLES:
            out.append(Finding(
                node=f.node, check="other_stack",
                fact=f"the stack {other} runs Ray here ({c.name}, {c.state or 'created'}); this "
                     "stack wants Ray on the node too, and two Rays cannot share a node (Ray "
                     "listens on many ports besides ray.port: pinned into each stack's "
                     "firewall.portBase block, or at Ray's defaults, the client server 10001 "
                     "and the dashboard agent 52365, for a stack that does not pin them)",
                fix="run one of the two stacks with spark-vllm:vllm.executor: mp (no Ray), or "
                    f"on other nodes, or `pulumi destroy` {other} first"))
        for port in (p for p in declared_ports(c) if p in ports):
            fix = (f"choose another port for {ports[port]}" if ports[port] != SEEDER_PORT
                   else f"the stack {other} is copying a model: run this `up` once it is done")
            out.append(Finding(
                node=f.node, check="other_stack",
                fact=f"port {port} is taken by {c.name} of the stack {other}; this stack "
                     f"listens there ({ports[port]})", fix=fix))
    return out


def check_disk(cfg: StackConfig, f: NodeFacts, model_bytes: int | None,
               repo_id: str | None = None, reserved: int = 0) -> tuple[list[Finding], int]:
    """-> (errors, bytes of the model (or of `repo_id`, the drafter) still to fetch on this
    node); `reserved`: free bytes already spoken for (the model's, when this is the drafter)."""
    if not model_bytes:
        return [], 0
    repo = f.hf_repo(repo_id or cfg.model.repo)
    have = repo.size_bytes if repo else 0
    need = max(0, model_bytes - have)
    if need == 0:
        return [], 0
    if "disk" in f.unreadable:
        return [Finding(node=f.node, check="disk",
                        fact=f"free disk at {cfg.model.cache_dir} unknown ({f.unreadable['disk']})",
                        fix=f"check that `df -B1 --output=avail {cfg.model.cache_dir}` works on "
                            "the node")], need
    if f.disk_free_bytes - reserved < need:
        also = f" ({gib(reserved)} of it for the model)" if reserved else ""
        return [Finding(
            node=f.node, check="disk",
            fact=f"disk: {gib(f.disk_free_bytes)} free at {cfg.model.cache_dir}{also}, "
                 f"{'the model' if repo_id is None else repo_id} needs "
                 f"{gib(need)} more ({gib(model_bytes)} total, {gib(have)} already cached)",
            fix=f"free space on the filesystem holding {cfg.model.cache_dir}, or point "
                "spark-vllm:model.cacheDir at a larger disk")], need
    return [], need


def check_crash_loops(cfg: StackConfig, f: NodeFacts, now: float) -> list[Finding]:
    """Warnings: a container of the stack that restarted more than
    health.liveness.crashLoopRestarts times within the window (the watchdog's record). Not an
    error: the `up` may be the fix (a new flag, a new image)."""
    live = cfg.health.liveness
    out = []
    for container, starts in sorted(f.liveness_starts.items()):
        n = recent_restarts(starts, now, live.crash_loop_window_seconds)
        if n > live.crash_loop_restarts:
            out.append(Finding(
                node=f.node, check="crash_loop",
                fact=f"{container} is crash-looping: {n} restarts in the last "
                     f"{live.crash_loop_window_seconds} s (more than {live.crash_loop_restarts})",
                fix="`spark-vllm logs` shows why it exits, `spark-vllm status` how it stands; "
                    "this up replaces it only if its settings changed"))
    return out


OOM_WARN_SECONDS = 86400  # an OOM kill this recent is a warning of the next preview and up


def check_guard(cfg: StackConfig, f: NodeFacts) -> list[Finding]:
    """With guard.enabled: what the node's guard needs (hostscripts/guard.py): systemd's
    systemctl, and the killer's program, or guard.install and apt-get to install it. The guard's
    state unread is an error outside dev (fail closed: the up could not tell what it changes)."""
    g = cfg.guard
    if not g.enabled:
        return []
    off = "or set spark-vllm:guard.enabled: false (the node then has no OOM guard)"
    if f.guard is None:
        # not surveyed (no stack named): nothing to judge; unreadable: notes() warns of it,
        # and outside dev it stops the change
        if "guard" not in f.unreadable or cfg.environment == "dev":
            return []
        why = f.unreadable["guard"]
        return [Finding(node=f.node, check="guard",
                        fact=f"the node's OOM guard could not be read ({why})",
                        fix=f"see the node: recon runs inspection/snippets/guard.sh there; {off}")]
    out = []
    if not f.guard.has("systemctl"):
        out.append(Finding(
            node=f.node, check="guard", fact="systemctl is not on the node: the guard keeps "
            "sshd, dockerd and its OOM killer through their systemd units",
            fix=f"run the node under systemd (DGX OS does), {off}"))
    if not f.guard.has(g.killer):
        pkg = g.package
        if not g.install:
            out.append(Finding(
                node=f.node, check="guard", fact=f"{pkg} is not installed (guard.killer "
                f"{g.killer}; installing a package is your decision: guard.install is false)",
                fix=f"install it on the node (`apt-get install {pkg}`: Debian's and Ubuntu's "
                f"package; the stack configures it), or set spark-vllm:guard.install: true for "
                f"`up` to install it from the node's package sources, {off}"))
        elif not f.guard.has("apt-get"):
            out.append(Finding(
                node=f.node, check="guard", fact=f"{pkg} is not installed and the node has no "
                "apt-get to install it with (guard.install)",
                fix=f"install {pkg} on the node by hand, {off}"))
    return out


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def oom_text(k: OomKill) -> str:
    """`OOM-killed at <UTC> (node available X of Y)` with who killed what, for a warning or
    `spark-vllm status`."""
    avail = "?" if k.available_bytes is None else gib(k.available_bytes)
    total = "" if k.total_bytes is None else f" of {gib(k.total_bytes)}"
    who = (f"earlyoom killed {k.name}" if k.source == "earlyoom" else
           "the kernel killed a process" + (f" ({k.name})" if k.name else ""))
    return f"OOM-killed at {_when(k.time)} (node available {avail}{total}; {who})"


def check_oom_kills(cfg: StackConfig, f: NodeFacts, now: float) -> list[Finding]:
    """Warnings: the node's OOM kills of the last OOM_WARN_SECONDS, as its guard recorded them
    (earlyoom's) and as the stack's vLLM watchdogs did (the kernel's too), with the node's
    available memory at the time. Not an error: the up may be the fix (a smaller share, a
    shorter maxModelLen)."""
    since = now - OOM_WARN_SECONDS
    kills = [k for k in f.oom_kills if k.time >= since]
    kills += [k for ks in f.liveness_ooms.values() for k in ks
              if k.time >= since and k.source == "kernel"]
    if not kills:
        return []
    last = max(kills, key=lambda k: k.time)
    return [Finding(
        node=f.node, check="oom",
        fact=f"{oom_text(last)}; {len(kills)} OOM kill(s) on this node in the last "
             f"{OOM_WARN_SECONDS // 3600} h (the OS reserve, preflight.osReserveBytes: "
             f"{gib(cfg.preflight.os_reserve_bytes)})",
        fix="the node runs out of memory while it serves: lower vllm.gpuMemoryUtilization (or "
            "kvCacheMemoryBytes), maxModelLen or maxNumSeqs, or a service's share, or move what "
            "else runs there; `spark-vllm status` shows the restarts")]


def notes(cfg: StackConfig, node_cfg: NodeConfig, f: NodeFacts) -> list[Finding]:
    out = []
    if abs(f.clock_offset_seconds) > CLOCK_WARN_SECONDS:
        out.append(Finding(node=f.node, check="clock",
                           fact=f"clock is {f.clock_offset_seconds:+.1f} s off the control machine",
                           fix="enable time sync on every node (timedatectl set-ntp true)"))
    pinned = node_cfg.pinned_host_key
    if f.host_keys and pinned not in f.host_keys:
        out.append(Finding(node=f.node, check="host_key",
                           fact="the pinned hostKey is not among /etc/ssh/ssh_host_*_key.pub "
                                "(ssh verified it, so sshd uses a key from elsewhere)",
                           fix="nothing to do if that is intended"))
    for section, reason in sorted(f.unreadable.items()):
        out.append(Finding(node=f.node, check="survey", fact=f"could not read {section}: {reason}",
                           fix="see the node; the facts from this step are missing"))
    return out


# --------------------------------------------------------------------------- the entry point

def check(cfg: StackConfig, facts: Mapping[str, NodeFacts | ReconError], *,
          model_bytes: int | None = None, stack_label: str | None = None,
          shape: ModelShape | None = None, services: ServiceModels | None = None,
          now: float | None = None, drafter_bytes: int | None = None) -> Plan:
    """Run every check over every node; return the Plan or raise PreflightError (all findings).

    stack_label (`<project>/<stack>`) picks the stopped-container markers that are this stack's.
    shape: the model's config.json read by the hub lookup (None: the KV cache is not counted).
    services: per service name, its model's bytes and shape (the hub lookups of its repo).
    drafter_bytes: model.drafter's bytes at the hub (another repo's speculative drafter): its
    weights are loaded beside the model's on every rank, so the memory fit counts them with the
    model's, and the disk check its files still to fetch.
    """
    weights = model_bytes + (drafter_bytes or 0) if model_bytes else None
    errors: list[Finding] = []
    warnings: list[Finding] = []
    stops: dict[str, list[ContainerFacts]] = {}
    budgets: dict[str, int] = {}
    usable: dict[str, int] = {}
    missing: dict[str, int] = {}
    hcas: dict[str, list[str]] = {}

    surveyed: dict[str, NodeFacts] = {}
    for node_cfg in cfg.nodes:
        result = facts.get(node_cfg.name)
        problems = check_reachability(node_cfg.name, result)
        if problems:
            errors += problems
            continue
        assert isinstance(result, NodeFacts)
        surveyed[node_cfg.name] = result

    errors += check_driver_consistency(cfg, surveyed)
    errors += check_transport_visible(cfg)
    e, nccl = check_nccl(surveyed, stack_label)
    errors += e

    for node_cfg in cfg.nodes:
        f = surveyed.get(node_cfg.name)
        if f is None:
            continue
        e, w = check_gb10(cfg, f)
        errors += e
        warnings += w
        errors += check_docker(cfg, f)
        errors += check_firewall(cfg, f)
        e, w = check_fabric(cfg, node_cfg, f)
        errors += e
        warnings += w
        errors += check_roce(cfg, node_cfg, f)
        hcas[f.node] = [r.device for r in f.roce if r.up]
        e, w, stopping = check_foreign(cfg, f, stack_label)
        errors += e
        warnings += w
        if stopping:
            stops[f.node] = stopping
        e, budgets[f.node], usable[f.node] = check_memory(cfg, f, stopping, weights, shape,
                                                          services, stack_label)
        errors += e
        errors += check_shares(cfg, f, services or {})
        errors += check_other_stacks(cfg, f, stack_label)
        e, missing[f.node] = check_disk(cfg, f, model_bytes)
        errors += e
        if cfg.model.drafter is not None and drafter_bytes:
            e, more = check_disk(cfg, f, drafter_bytes, cfg.model.drafter.repo,
                                 reserved=missing[f.node])
            errors += e
            missing[f.node] += more
        errors += check_guard(cfg, f)
        warnings += notes(cfg, node_cfg, f)
        warnings += check_crash_loops(cfg, f, time.time() if now is None else now)
        warnings += check_oom_kills(cfg, f, time.time() if now is None else now)

    estimate = memory_estimate(cfg, weights, shape) if weights else None
    if (estimate is not None and shape is not None and not shape.known and surveyed
            and estimate.kv_cache_memory_bytes is None):
        warnings.append(Finding(
            node=cfg.nodes[0].name, check="memory",
            fact=f"the memory budget does not count the KV cache: {shape.describe()}",
            fix="nothing to do if the model is fine with the default budget; vLLM itself still "
                "refuses a KV cache smaller than one maxModelLen sequence"))
    if errors:
        raise PreflightError(errors, warnings)
    return Plan(stop_containers=stops, warnings=warnings, memory_budget_bytes=budgets,
                usable_memory_bytes=usable, memory_estimate=estimate,
                model_bytes_missing=missing, hcas_up=hcas, nccl=nccl)


def _stack_label() -> str | None:
    """`<project>/<stack>` of the running program (the label its stop markers hold)."""
    try:
        import pulumi
        return f"{pulumi.get_project()}/{pulumi.get_stack()}"
    except Exception:
        return None


def run(cfg: StackConfig, *, key_path: str | None = None,
        model: ModelManifest | Callable[[], ModelManifest] | None = None,
        runner: Runner | None = None,
        services: Manifests | Callable[[], Manifests] | None = None,
        drafter: ModelManifest | Callable[[], ModelManifest] | None = None,
        ) -> tuple[dict[str, NodeFacts], Plan]:
    """Survey every node and check it: what __main__ calls before registering any resource.

    Unreachable nodes are reported together with every other failed check. `model`: the main
    model at the hub (its bytes and its config.json's shape feed the memory and disk checks);
    `services`: each service's, by name; `drafter`: model.drafter's (its bytes count with the
    model's). Each may be a callable, called once the nodes are
    surveyed (__main__ asks the hub meanwhile, so a preview waits for the slower of the two, not
    for both). None: not known (the checks that need it say so or skip).
    """
    from inspection import recon

    label = _stack_label()
    names = stack_names(label)
    if runner is None:
        results = recon.survey_all(cfg, names=names, key_path=key_path)
    else:
        results = recon.survey_all(cfg, names=names, key_path=key_path, runner=runner)
    if callable(model):
        model = model()
    if callable(services):
        services = services()
    if callable(drafter):
        drafter = drafter()
    plan = check(cfg, results, model_bytes=model.total_bytes if model is not None else None,
                 stack_label=label, shape=model.shape if model is not None else None,
                 services={n: (m.total_bytes, m.shape) for n, m in (services or {}).items()},
                 drafter_bytes=drafter.total_bytes if drafter is not None else None)
    return {k: v for k, v in results.items() if isinstance(v, NodeFacts)}, plan
