"""Day zero (`spark-vllm init`): a stack config proposed from one survey of each host.

Pure: the surveys (NodeFacts from recon's own script, the host key the operator confirmed) go
in; the nodes' entries, the fabric subnets, the GPU count, what the hosts already hold (vLLM
images, Hugging Face caches, containers that are not the stack's) and findings come out. A
finding of level `error` means init cannot propose that part without guessing, so it writes
nothing: a host without a ConnectX-7 interface that has a carrier, nodes with different
numbers of cabled ports, addresses of one twin in different subnets, no GPU.

The ConnectX-7 of a DGX Spark shows each cabled port as two netdevs, one per PCIe link
("twins"): `enp1s0f1np1` and `enP2p1s0f1np1`, RoCE devices `rocep1s0f1` and `roceP2p1s0f1`
(NVIDIA's "Connect two Sparks" playbook,
https://github.com/NVIDIA/dgx-spark-playbooks/tree/main/nvidia/connect-two-sparks). Names
differ between units, so they are read from the node (`ibdev2netdev`, else `rdma link`), never
assumed. Twin k of every node shares subnet k, as the playbook configures them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from contract.sizes import GIB as GIB  # tools/init_cli.py reads day_zero.GIB
from inspection.facts import InterfaceFacts, NodeFacts, RoceFacts

# Where addresses go when a twin has none yet (the playbook's and the config's defaults), and
# the host number of the first node in them (.11, .12, ... as in the lab and the README).
DEFAULT_SUBNETS = ("192.168.177.0/24", "192.168.178.0/24")
FIRST_HOST = 11

Level = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Finding:
    level: Level
    node: str  # "" for the cluster as a whole
    text: str

    def __str__(self) -> str:
        return f"{self.node}: {self.text}" if self.node else self.text


@dataclass(frozen=True)
class Survey:
    """One host as init reached it: the name it will have, how to reach it, the host key the
    operator confirmed, and what recon saw there."""

    name: str
    host: str
    user: str
    port: int
    host_key: str
    facts: NodeFacts


@dataclass(frozen=True)
class Port:
    """One cabled ConnectX-7 netdev of a node, as proposed."""

    interface: str
    hca: str
    ip: str  # the address proposed (kept when the node has one in the twin's subnet)
    configured: bool  # the node already carries `ip`
    mtu: int


@dataclass
class Proposal:
    nodes: list[dict[str, Any]] = field(default_factory=list)  # spark-vllm:nodes entries
    subnets: list[str] = field(default_factory=list)  # nccl.fabricSubnets, one per twin
    gpus: int = 0  # every node's GPUs (vllm.tensorParallelSize)
    ports: dict[str, list[Port]] = field(default_factory=dict)
    images: dict[str, list[str]] = field(default_factory=dict)  # vLLM images per node
    caches: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # (repo, bytes)
    foreign: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]


def node_name(hostname: str, index: int) -> str:
    """The node's name in the stack (a DNS label): its hostname lowercased up to the first dot,
    other characters turned into '-'; `spark-<n>` when nothing usable is left."""
    label = re.sub(r"[^a-z0-9-]+", "-", hostname.split(".", 1)[0].lower()).strip("-")[:63]
    return label.strip("-") or f"spark-{index + 1}"


def fingerprint(key: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key line ('ssh-ed25519 AAAA...')."""
    import base64
    import hashlib

    blob = base64.b64decode(key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def twin_index(netdev: str) -> tuple[int, str]:
    """Sort key of a ConnectX-7 netdev: its PCI domain (`enP2p1s0f1np1` is domain 2, a name
    without `P<n>` domain 0), then its name. The ports of a node sorted by it line up with the
    other nodes' twin by twin."""
    m = re.match(r"enP(\d+)p", netdev)
    return (int(m.group(1)) if m else 0, netdev)


def cabled_ports(facts: NodeFacts) -> tuple[list[tuple[RoceFacts, InterfaceFacts]], list[str]]:
    """The node's RoCE netdevs whose interface has a carrier, in twin order, and a line for
    each one without (for the finding that names them)."""
    by_name = {i.name: i for i in facts.interfaces}
    up, down = [], []
    for roce in facts.roce:
        iface = by_name.get(roce.netdev)
        if iface is not None and iface.carrier:
            up.append((roce, iface))
        else:
            state = "no such interface" if iface is None else "no carrier"
            down.append(f"{roce.device} ==> {roce.netdev or '?'} ({state})")
    up.sort(key=lambda pair: twin_index(pair[1].name))
    return up, down


def _networks(addrs: Sequence[str]) -> list[ipaddress.IPv4Interface]:
    return [ipaddress.IPv4Interface(a) for a in addrs]


def _twin_subnet(k: int, nodes: list[tuple[str, InterfaceFacts]], given: str | None,
                 findings: list[Finding]) -> ipaddress.IPv4Network | None:
    """Subnet of twin k: given (--subnet), else the one the nodes' addresses already share,
    else the default. Addresses of twin k in different subnets: an error, never a pick."""
    if given is not None:
        return ipaddress.IPv4Network(given, strict=False)
    seen: dict[ipaddress.IPv4Network, list[str]] = {}
    for name, iface in nodes:
        for a in _networks(iface.ipv4):
            if a.network.prefixlen < 31 and not a.ip.is_loopback and not a.ip.is_link_local:
                seen.setdefault(a.network, []).append(f"{name} {iface.name} {a}")
    if len(seen) > 1:
        findings.append(Finding("error", "", (
            f"the twin-{k + 1} ports have addresses in different subnets ("
            + "; ".join(", ".join(v) for v in seen.values())
            + f"): one subnet per twin is needed; pass --subnet for twin {k + 1} or fix the "
            "addresses")))
        return None
    if seen:
        return next(iter(seen))
    default = DEFAULT_SUBNETS[k] if k < len(DEFAULT_SUBNETS) else f"192.168.{177 + k}.0/24"
    return ipaddress.IPv4Network(default)


def propose(surveys: Sequence[Survey], *, subnets: Sequence[str] = (),
            min_mtu: int = 9000, model_repo: str = "", managed: bool = True) -> Proposal:
    """The nodes, fabric and what the hosts hold, with findings (see the module's doc).
    `managed` (fabric.manage): the stack's `up` configures each port's address and MTU, so a
    port without them is a note; check-only, a warning to configure it before `up`."""
    out = Proposal()
    cabled: dict[str, list[tuple[RoceFacts, InterfaceFacts]]] = {}
    names = [s.name for s in surveys]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        out.findings.append(Finding("error", dup, "two hosts have this name: name them "
                                    "(NAME=HOST)"))
    for s in surveys:
        f = s.facts
        if not f.roce:
            why = ("ibdev2netdev and rdma are not installed" if
                   {"ibdev2netdev", "rdma"} <= set(f.missing_tools) else
                   "neither ibdev2netdev nor `rdma link` lists a RoCE device")
            out.findings.append(Finding("error", s.name, (
                f"no ConnectX-7 port found ({why}): init does not guess the fabric interfaces. "
                "Check the NIC (`ibdev2netdev`, from DGX OS's rdma tools) and its driver")))
            continue
        up, down = cabled_ports(f)
        if not up:
            out.findings.append(Finding("error", s.name, (
                "no ConnectX-7 interface has a carrier (" + ", ".join(down) + "): connect the "
                "QSFP cable between the Sparks and check `ibdev2netdev` shows (Up); init does "
                "not guess which port will be cabled")))
            continue
        cabled[s.name] = up
        if not f.gpus:
            out.findings.append(Finding("error", s.name, (
                "no GPU seen (nvidia-smi: "
                + ("not installed" if "nvidia-smi" in f.missing_tools else "no GPU listed")
                + "): vLLM needs one per node")))
        if not f.os.is_dgx_spark:
            out.findings.append(Finding("warning", s.name, (
                "not a DGX Spark (no DGX_NAME with 'Spark' in /etc/dgx-release): preflight "
                "refuses it unless preflight.requireGb10 is false")))
    counts = {name: len(up) for name, up in cabled.items()}
    if len(set(counts.values())) > 1:
        out.findings.append(Finding("error", "", (
            "the nodes have different numbers of cabled ConnectX-7 ports ("
            + ", ".join(f"{n} {c}" for n, c in counts.items())
            + "): every node needs the same twins cabled")))
    if out.errors:
        return out

    twins = min(counts.values()) if counts else 0
    given = list(subnets)
    if len(given) > twins:
        out.findings.append(Finding("error", "", (
            f"--subnet given {len(given)} times for {twins} cabled twin(s)")))
        return out
    for text in given:
        try:
            ipaddress.IPv4Network(text, strict=False)
        except ValueError as exc:
            out.findings.append(Finding("error", "", f"--subnet {text!r}: {exc}"))
    if out.errors:
        return out
    chosen: list[ipaddress.IPv4Network] = []
    for k in range(twins):
        net = _twin_subnet(k, [(s.name, cabled[s.name][k][1]) for s in surveys],
                           given[k] if k < len(given) else None, out.findings)
        if net is not None:
            chosen.append(net)
    if out.errors:
        return out
    for a, b in ((a, b) for i, a in enumerate(chosen) for b in chosen[i + 1:]):
        if a.overlaps(b):
            out.findings.append(Finding("error", "", f"twin subnets {a} and {b} overlap"))
    if out.errors:
        return out
    out.subnets = [str(n) for n in chosen]

    taken = {ipaddress.IPv4Address(a.split("/")[0]) for s in surveys
             for i in s.facts.interfaces for a in i.ipv4}
    for index, s in enumerate(surveys):
        ports = []
        for k, (roce, iface) in enumerate(cabled[s.name][:twins]):
            net = chosen[k]
            mine = [a for a in _networks(iface.ipv4) if a.ip in net and not a.ip.is_link_local]
            if mine:
                ip, configured = mine[0].ip, True
            else:
                ip = _free_address(net, FIRST_HOST + index, taken)
                taken.add(ip)
                configured = False
                # a self-assigned 169.254.x.x (what an unconfigured GB10 port shows) is no
                # configuration to keep: named, never taken
                others = ", ".join(iface.ipv4)
                has = (f"{iface.name} has "
                       + (f"no address in {net} (it has {others})" if others else "no address")
                       + f": proposed {ip}/{net.prefixlen}")
                out.findings.append(
                    Finding("note", s.name, f"{has}; `pulumi up` configures it (fabric.manage)")
                    if managed else
                    Finding("warning", s.name, (
                        f"{has}. With fabric.manage false the stack checks the fabric but does "
                        "not configure it: give the interface this address (README, \"The "
                        "fabric\") before `pulumi up`")))
            if iface.mtu < min_mtu:
                out.findings.append(
                    Finding("note", s.name, f"{iface.name} has MTU {iface.mtu}: `pulumi up` "
                            "sets fabric.mtu (fabric.manage)")
                    if managed else
                    Finding("warning", s.name, (
                        f"{iface.name} has MTU {iface.mtu}, below nccl.minMtu {min_mtu}: "
                        "preflight refuses it until the MTU is raised (README, \"The "
                        "fabric\")")))
            ports.append(Port(iface.name, roce.device, str(ip), configured, iface.mtu))
        out.ports[s.name] = ports
        out.nodes.append({
            "name": s.name, "host": s.host, "port": s.port, "user": s.user,
            "hostKey": s.host_key,
            "fabric": [{"interface": p.interface, "ip": p.ip, "hca": p.hca} for p in ports],
        })
    gpu_counts = {s.name: len(s.facts.gpus) for s in surveys}
    if len(set(gpu_counts.values())) > 1:
        out.findings.append(Finding("warning", "", (
            "the nodes have different GPU counts (" + ", ".join(
                f"{n} {c}" for n, c in gpu_counts.items()) + "): the proposal uses every GPU")))
    out.gpus = sum(gpu_counts.values())
    _holdings(out, surveys, model_repo)
    return out


def _free_address(net: ipaddress.IPv4Network, host: int,
                  taken: set[ipaddress.IPv4Address]) -> ipaddress.IPv4Address:
    hosts = list(net.hosts())
    start = min(max(host - 1, 0), len(hosts) - 1)
    for candidate in hosts[start:] + hosts[:start]:
        if candidate not in taken:
            return candidate
    raise ValueError(f"no free address left in {net}")


def _holdings(out: Proposal, surveys: Sequence[Survey], model_repo: str) -> None:
    """What the hosts already hold that the stack can reuse or must live with."""
    for s in surveys:
        docker = s.facts.docker
        if docker is None:
            out.findings.append(Finding("error", s.name, (
                "Docker did not answer (`docker info`): the stack runs everything in Docker; "
                "install it and give the ssh user access")))
            continue
        out.images[s.name] = sorted({t for img in docker.images for t in img.repo_tags
                                     if "vllm" in t.lower()})
        out.caches[s.name] = [(r.repo_id, r.size_bytes) for r in s.facts.hf_cache]
        out.foreign[s.name] = [(c.name, c.image, c.memory_bytes) for c in docker.containers
                               if c.state == "running" and not c.managed]
        for repo, size in out.caches[s.name]:
            if repo == model_repo:
                out.findings.append(Finding("note", s.name, (
                    f"the Hugging Face cache already holds {size / GIB:.1f} GiB of {repo}: the "
                    "model fetch keeps it and fetches only what is missing")))
        for name, image, memory in out.foreign[s.name]:
            out.findings.append(Finding("note", s.name, (
                f"container {name} ({image}, {memory / GIB:.1f} GiB) is not the stack's: "
                "preflight.foreignContainers decides (fail by default; stop stops it for the "
                "stack's lifetime)")))
