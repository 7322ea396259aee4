"""Typed facts about one node, gathered by reconnaissance before any resource is registered.

Everything the plan and the preflight checks decide on is a field here; parsers in
`inspection/parsers.py` build these objects from real command output (see tests/fixtures/gb10).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from contract import labels as lbl


class _Facts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OsFacts(_Facts):
    id: str = ""  # e.g. "ubuntu"
    version_id: str = ""  # e.g. "24.04"
    pretty_name: str = ""
    kernel: str = ""  # uname -r
    arch: str = ""  # uname -m: aarch64 on a Spark
    dgx_release: dict[str, str] = Field(default_factory=dict)  # /etc/dgx-release key=value

    @property
    def is_dgx_spark(self) -> bool:
        return "spark" in self.dgx_release.get("DGX_NAME", "").lower()


class GpuFacts(_Facts):
    name: str  # "NVIDIA GB10"
    compute_capability: str = ""  # "12.1"
    driver_version: str = ""  # "580.95.05"
    cuda_version: str = ""  # "13.0" (nvidia-smi header)
    memory_total_mib: int | None = None  # None on GB10: nvidia-smi reports [N/A]
    uuid: str = ""  # "GPU-b0ec33a0-..." from nvidia-smi -L (added by recon)


class MemoryFacts(_Facts):
    """/proc/meminfo in bytes. The page-cache breakdown (None when the survey did not carry it)
    is what preflight needs to say what vLLM will get on unified memory: MemFree plus what a
    page-cache drop reclaims (`drop_reclaimable_bytes`)."""

    total_bytes: int  # MemTotal
    available_bytes: int  # MemAvailable (the kernel's estimate; it counts the page cache)
    unified: bool = False  # True when the GPU has no memory of its own (GB10)
    free_bytes: int | None = None  # MemFree
    buffers_bytes: int | None = None  # Buffers
    cached_bytes: int | None = None  # Cached (page cache, includes Shmem)
    shmem_bytes: int | None = None  # Shmem (tmpfs, /dev/shm: a drop cannot free it)
    mapped_bytes: int | None = None  # Mapped (file pages mapped by processes: not dropped)
    sreclaimable_bytes: int | None = None  # SReclaimable (dentries, inodes)

    @property
    def has_breakdown(self) -> bool:
        return self.free_bytes is not None and self.cached_bytes is not None

    @property
    def page_cache_droppable_bytes(self) -> int:
        """Cached - Shmem - Mapped, at least 0: the clean, unmapped page cache `sync; echo 3 >
        /proc/sys/vm/drop_caches` frees (shmem pages that are also mapped are subtracted twice:
        on the safe side). Dirty pages count: the drop runs `sync` first (hostscripts/models.py
        drop_page_cache), which makes them clean."""
        cached = self.cached_bytes or 0
        return max(0, cached - (self.shmem_bytes or 0) - (self.mapped_bytes or 0))

    @property
    def drop_reclaimable_bytes(self) -> int:
        """What a page-cache drop turns into MemFree: Buffers + droppable page cache +
        SReclaimable (the kernel's MemAvailable counts reclaimable slab too; dentries and inodes
        in use stay, so this is an upper bound by at most that)."""
        return ((self.buffers_bytes or 0) + self.page_cache_droppable_bytes
                + (self.sreclaimable_bytes or 0))


class ContainerFacts(_Facts):
    id: str
    name: str
    image: str
    image_id: str = ""
    state: str = ""  # running, exited, ...
    # its cgroup's usage minus the inactive page cache, what docker stats shows (recon's
    # container_memory section); 0 when not running or unknown
    memory_bytes: int = 0
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def managed(self) -> bool:
        return self.labels.get(lbl.MANAGED) == "true"


class ImageFacts(_Facts):
    id: str  # sha256:...
    repo_tags: list[str] = Field(default_factory=list)
    repo_digests: list[str] = Field(default_factory=list)
    size_bytes: int = 0


class DockerFacts(_Facts):
    version: str  # server version
    runtimes: list[str] = Field(default_factory=list)
    gpu_support: bool = False  # nvidia runtime or CDI/hook registered
    cgroup_driver: str = ""
    containers: list[ContainerFacts] = Field(default_factory=list)
    images: list[ImageFacts] = Field(default_factory=list)


class HfRepoFacts(_Facts):
    repo_id: str  # "Qwen/Qwen3.5-122B-A10B-FP8"
    refs: dict[str, str] = Field(default_factory=dict)  # "main" -> commit
    snapshots: list[str] = Field(default_factory=list)  # commits present under snapshots/
    size_bytes: int = 0  # bytes in blobs/
    changed_blobs: int = 0  # blobs the stack verified that are gone or changed size/mtime since
    # the stack's repos only: {commit: {path in its snapshot: bytes}}, each file reached through
    # its link (a link to a missing blob is no file); None: not looked at
    snapshot_files: dict[str, dict[str, int]] | None = None


class InterfaceFacts(_Facts):
    name: str
    ipv4: list[str] = Field(default_factory=list)  # CIDR form, e.g. "192.168.177.11/24"
    mtu: int = 0
    carrier: bool = False  # operstate UP and carrier present
    speed_mbps: int | None = None  # ethtool / sysfs speed, None when unknown


class RoceFacts(_Facts):
    device: str  # rocep1s0f1
    port: int = 1
    netdev: str = ""  # enp1s0f1np1
    state: str = ""  # "Up"/"Down" from ibdev2netdev, or ACTIVE/DOWN from sysfs

    @property
    def up(self) -> bool:
        return self.state.lower() in {"up", "active"}


class IbPort(_Facts):
    """One port of `ibstat` (infiniband-diags): the CA, its type, and the port's state."""

    ca: str  # mlx5_0, rocep1s0f1
    ca_type: str = ""  # MT4129 = ConnectX-7
    port: int
    state: str  # Active | Down | Initializing | Armed | ...
    physical_state: str = ""  # LinkUp | Disabled | Polling | ...
    rate_gbps: float | None = None  # `Rate: 200` (None when the block holds no Rate line)
    link_layer: str = ""  # Ethernet (RoCE) | InfiniBand

    @property
    def up(self) -> bool:
        return self.state == "Active" and self.physical_state == "LinkUp"


class NcclLibrary(_Facts):
    """One libnccl as payloads/nccl_library.py describes it: the build is the ELF GNU build ID
    (two builds of one version differ there), the source where it comes from."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    path: str
    real_path: str = Field(default="", alias="realPath")
    size: int | None = None
    build: str | None = None  # GNU build ID, hex
    version: str | None = None  # 2.28.9
    source: str = "other"  # pip (a wheel's), system (a Debian package's), other
    package: str | None = None  # nvidia-nccl-cu13, libnccl2
    package_version: str | None = Field(default=None, alias="packageVersion")

    def line(self) -> str:
        where = {"pip": "pip's", "system": "the system's"}.get(self.source, "a")
        text = f"NCCL {self.version or '?'} ({where} {self.package or self.real_path or self.path}"
        if self.build:
            text += f", build {self.build[:12]}"
        return text + ")"

    @property
    def identity(self) -> tuple[str | None, str | None, str]:
        """What makes two libraries the same build: the build ID, else version and file size."""
        return (self.build, self.version, "" if self.build else str(self.size))


class ImageNccl(_Facts):
    """The NCCL the serving vLLM of one image loads, as the image probe found it (its record on
    the node, StackNames.image_probe_record)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    vllm: NcclLibrary | None = None  # what vLLM's collectives load
    torch: list[NcclLibrary] = Field(default_factory=list)  # what torch's import mapped
    so_path: str | None = Field(default=None, alias="soPath")  # VLLM_NCCL_SO_PATH
    reason: str | None = None  # why `vllm` is not known

    def line(self) -> str:
        if self.vllm is None:
            return f"unknown ({self.reason or 'no answer'})"
        text = f"vLLM loads {self.vllm.line()}"
        if self.so_path:
            text += f" through VLLM_NCCL_SO_PATH={self.so_path}"
        others = [t for t in self.torch if t.identity != self.vllm.identity]
        if others:
            text += "; torch's own: " + ", ".join(t.line() for t in others)
        return text


class FirewallFacts(_Facts):
    """The stack's nftables table on a node as recon read it (hostscripts/firewall.py
    check_script): each digest a sha256, None when absent."""

    table: str | None = None  # `nft -s list table inet spark-vllm-<stack>` (no counters)
    file: str | None = None  # the ruleset file the unit loads
    unit: str | None = None  # the stack's systemd unit file
    enabled: bool = False  # `systemctl is-enabled` of that unit
    # what the last load recorded: the file's and the listed table's digests
    record: tuple[str, str] | None = None


class GuardFacts(_Facts):
    """What recon found of the node's guard (inspection/snippets/guard.sh; hostscripts/guard.py
    writes what it looks for)."""

    # earlyoom, systemctl, apt-get, systemd-oomd: where each is, None when absent
    tools: dict[str, str | None] = Field(default_factory=dict)
    # earlyoom.service, systemd-oomd.service: `systemctl is-active`'s answer
    active: dict[str, str] = Field(default_factory=dict)
    records_present: bool = False  # the guard's folder with its kill hook
    # the stack's drop-ins: path -> sha256, None when absent
    files: dict[str, str | None] = Field(default_factory=dict)

    def has(self, tool: str) -> bool:
        return self.tools.get(tool) is not None


class OomKill(_Facts):
    """An OOM kill, in the control machine's clock: one the node's early OOM killer recorded
    (the guard's `kills`), or one vLLM's watchdog recorded as the end of its vLLM (`source`
    earlyoom or kernel)."""

    time: float
    source: str = "earlyoom"  # earlyoom | kernel
    available_bytes: int | None = None  # the node's MemAvailable then (None: not known)
    total_bytes: int | None = None
    pid: int | None = None
    name: str = ""  # the victim's process name, as recorded ("" when not known)


class NodeFacts(_Facts):
    node: str  # the config name of the node
    hostname: str = ""
    host_key: str = ""  # the key the node presented ("ssh-ed25519 AAAA...")
    os: OsFacts = Field(default_factory=OsFacts)
    gpus: list[GpuFacts] = Field(default_factory=list)
    memory: MemoryFacts
    docker: DockerFacts | None = None  # None when docker is missing
    hf_cache: list[HfRepoFacts] = Field(default_factory=list)
    interfaces: list[InterfaceFacts] = Field(default_factory=list)
    roce: list[RoceFacts] = Field(default_factory=list)
    disk_free_bytes: int = 0  # free bytes on the filesystem holding the HF cache dir
    # foreign containers a stack stopped (marker files): {container name: "<project>/<stack>"}
    stopped_by: dict[str, str] = Field(default_factory=dict)
    # the stack's Ray token file (hostscripts/paths.StackNames.ray_token_file) is on the node;
    # None: not surveyed (an older recon output, or no stack named)
    ray_token_present: bool | None = None
    # the stack's vLLM API key file (StackNames.vllm_key_file; the head's matters)
    vllm_key_present: bool | None = None
    # the stack's compile-cache folder (StackNames.compile_cache_dir), a bind mount's source
    compile_cache_present: bool | None = None
    # the head only: the gateway's configuration, key digest and TLS file all there
    # (StackNames.gateway_dir)
    gateway_files_present: bool | None = None
    # the head only, with monitoring: Prometheus's configuration and key file
    # (StackNames.monitoring_dir) and Alertmanager's configuration, and their data folders
    # (StackNames.prometheus_data_dir, alertmanager_data_dir)
    monitoring_files_present: bool | None = None
    prometheus_data_present: bool | None = None
    # the stack's firewall (config/firewall.py, hostscripts/firewall.py); None: not surveyed
    # (firewall off, no stack named), or nft missing (then in missing_tools)
    firewall: FirewallFacts | None = None
    # `nft --version`'s version; None: not read (nft missing: missing_tools)
    nft_version: str | None = None
    # net.ipv4.ip_local_port_range: the ports the kernel hands to sockets bound to port 0
    # (the data plane's) and to outgoing connections; None: not read
    ephemeral_ports: tuple[int, int] | None = None
    clock_offset_seconds: float = 0.0  # node clock minus the control machine's clock
    # the starts the liveness watchdog recorded in the stack's API containers on the node
    # (control machine's clock, oldest first): {container: [time, ...]}
    liveness_starts: dict[str, list[float]] = Field(default_factory=dict)
    # the stack's netplan files of its managed fabric interfaces: path -> sha256, None when the
    # file is absent; {} when the survey could not read them (each counts as missing); None when
    # not surveyed
    fabric_files: dict[str, str | None] | None = None
    # every libnccl the node's dynamic linker knows (payloads/nccl_library.py `host`); None:
    # not surveyed (no python3 on the node, an older survey)
    nccl_host: list[NcclLibrary] | None = None
    # the image probe's records in the stack's folder: {image ID: the NCCL its vLLM loads}
    image_nccl: dict[str, ImageNccl] = Field(default_factory=dict)
    # the head only: the collective gate's last record (StackNames.collective_record) is there,
    # and whether it stopped an up; None: not surveyed
    collective_record_present: bool | None = None
    collective_stopped: bool | None = None
    # the node's guard (config/guard.py) as recon found it; None: not surveyed (guard off, or no
    # stack named)
    guard: GuardFacts | None = None
    # the kills the node's early OOM killer recorded (the guard's record, newest last), and the
    # OOM kills the liveness watchdog recorded as the end of its vLLM, by container
    oom_kills: list[OomKill] = Field(default_factory=list)
    liveness_ooms: dict[str, list[OomKill]] = Field(default_factory=dict)
    # added by recon: every host key the node holds (/etc/ssh/ssh_host_*_key.pub), the tools the
    # survey did not find (nvidia-smi, docker, ibdev2netdev, ...), and the sections whose output
    # could not be read or timed out: {section: readable reason}. Preflight reports these.
    host_keys: list[str] = Field(default_factory=list)
    missing_tools: list[str] = Field(default_factory=list)
    unreadable: dict[str, str] = Field(default_factory=dict)

    def interface(self, name: str) -> InterfaceFacts | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def roce_device(self, name: str) -> RoceFacts | None:
        return next((r for r in self.roce if r.device == name), None)

    def hf_repo(self, repo_id: str) -> HfRepoFacts | None:
        return next((r for r in self.hf_cache if r.repo_id == repo_id), None)

    def foreign_containers(self) -> list[ContainerFacts]:
        """Running containers the stack did not create."""
        if self.docker is None:
            return []
        return [c for c in self.docker.containers if c.state == "running" and not c.managed]
