"""Places and ports on the nodes (and inside the stack's containers): the fixed ones, and the
ones of one stack (StackNames), so that several stacks can share nodes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from config.forms import IMAGE_SEED_PORT, MODEL_SEED_PORT, RUN_DIR, STACK_CONTAINERS, STATE_DIR

__all__ = [
           "ALERTMANAGER_DATA",
           "ALERTMANAGER_MOUNT",
           "COMPILE_CACHE_MOUNT",
           "GATEWAY_MOUNT",
           "GATEWAY_RUN_MOUNT",
           "GATEWAY_STATS_SOCKET",
           "GUARD_DIR",
           "GUARD_KILLS_MOUNT",
           "GUARD_MOUNT",
           "HF_MOUNT",
           "IMAGE_SEED_PORT",
           "LEGACY_COMPILE_CACHE_DIR",
           "LEGACY_RAY_TOKEN_FILE",
           "LEGACY_VLLM_KEY_FILE",
           "LIVENESS_STARTS",
           "MODEL_SEED_PORT",
           "RAY_SESSION_MOUNT",
           "RAY_TOKEN_MOUNT",
           "SEED_TIMEOUT_SECONDS",
           "STACK_DIR",
           "STACK_RUN_DIR",
           "STOPPED_DIR",
           "VLLM_CONFIG_ROOT",
           "VLLM_KEY",
           "StackNames",
]

HF_MOUNT = "/root/.cache/huggingface"  # HF_HOME inside every container
SEED_TIMEOUT_SECONDS = 3600
# Files of one stack only, in a folder per stack (<STACK_DIR>/<stack>/, StackNames): what
# several stacks sharing a node must not share (API keys, the Ray token).
STACK_DIR = f"{STATE_DIR}/stacks"
# Likewise under /run, emptied by a reboot (Ray's session folder)
STACK_RUN_DIR = f"{RUN_DIR}/stacks"
STOPPED_DIR = "/var/lib/spark-vllm/stopped"  # markers of foreign containers the stack stopped
# where the liveness watchdog records vLLM's starts, in the container's own writable layer
# (payloads/vllm_liveness.py; read by `spark-vllm status` and recon)
LIVENESS_STARTS = "/var/lib/spark-vllm-liveness/starts"
# The node's guard (config/guard.py, hostscripts/guard.py): one folder per node, whichever
# stacks guard it (a marker per stack in it), with the record of every OOM kill its early OOM
# killer made, the kill hook that writes it and the count the node exporter reads. Not secret:
# readable by all (the node exporter runs as nobody).
GUARD_DIR = f"{STATE_DIR}/guard"
GUARD_MOUNT = "/run/spark-vllm-guard"  # that folder in the API vLLM containers (read-only)
GUARD_KILLS_MOUNT = f"{GUARD_MOUNT}/kills"  # where their watchdog reads the node's kills
SYSTEMD_UNITS_DIR = "/etc/systemd/system"  # where the stack's drop-ins go (<unit>.d/)
VLLM_KEY = "/run/spark-vllm/api-key"  # where a vLLM container reads its API key
VLLM_CONFIG_ROOT = "/etc/spark-vllm/vllm-config"  # the stack's own VLLM_CONFIG_ROOT (container)
GATEWAY_MOUNT = "/etc/spark-vllm/gateway"  # the stack's gateway folder in the gateway container
GATEWAY_RUN_MOUNT = "/run/spark-vllm-gateway"  # its run folder there (the stats socket)
GATEWAY_STATS_SOCKET = "stats.sock"  # HAProxy's stats socket in that folder (root only)
MONITORING_MOUNT = "/etc/spark-vllm/monitoring"  # the monitoring folder in Prometheus's container
PROMETHEUS_DATA = "/prometheus"  # Prometheus's data folder in its container (upstream's path)
ALERTMANAGER_MOUNT = "/etc/spark-vllm/alertmanager"  # its folder in Alertmanager's container
ALERTMANAGER_DATA = "/alertmanager"  # Alertmanager's data folder in its container (upstream's)
RAY_SESSION_MOUNT = "/tmp/ray"  # Ray's default --temp-dir, in the Ray head and vLLM containers
RAY_TOKEN_MOUNT = "/run/spark-vllm/ray-auth-token"  # where the Ray containers read the token
# Compile and JIT caches, per node and per stack (StackNames.compile_cache_dir), kept across
# container replacements and `destroy`. Not shared between stacks: the caches hold code
# (inductor's generated modules, Triton's and FlashInfer's kernels, CUDA's JIT'd PTX) that the
# containers load, so a folder every stack's containers write let one stack's image plant code
# another stack runs (issue 31). Up to 0.18 it was this one folder; an upgrade leaves it alone.
LEGACY_COMPILE_CACHE_DIR = "/var/lib/spark-vllm/compile-cache"
COMPILE_CACHE_MOUNT = "/var/cache/spark-vllm"  # inside the stack's GPU containers

# Where releases up to 0.17.0 kept the stack's secrets, before they moved into the stack's folder:
# the commands that write the new ones remove these, so no copy stays behind after an upgrade.
LEGACY_VLLM_KEY_FILE = "/var/lib/spark-vllm/vllm/api-key"
LEGACY_RAY_TOKEN_FILE = "/var/lib/spark-vllm/ray/auth-token"

# A Pulumi stack name as it can name a container and a folder (Pulumi allows letters, digits,
# '-', '_' and '.'; Docker's container names the same, starting with a letter or digit)
_STACK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True)
class StackNames:
    """Every container name and host path that belongs to one stack, derived from the stack's
    name: two stacks on the same nodes never share one. Containers are `spark-vllm-<stack>-<what>`
    (a service's `<what>` is its name: config refuses the stack's own, config.forms
    STACK_CONTAINERS); files live in the stack's folders under STACK_DIR and STACK_RUN_DIR."""

    stack: str

    def __post_init__(self) -> None:
        if not _STACK_NAME.fullmatch(self.stack) or self.stack.strip(".") == "":
            raise ValueError(f"not a stack name that can name a container and a folder: "
                             f"{self.stack!r}")

    def _container(self, what: str) -> str:
        return f"spark-vllm-{self.stack}-{what}"

    @property
    def serve(self) -> str:
        """The main model's vLLM container (on the head; on every node with vllm.executor mp)."""
        return self._container("serve")

    @property
    def ray_head(self) -> str:
        return self._container("ray-head")

    @property
    def ray_worker(self) -> str:
        return self._container("ray-worker")

    @property
    def model_seeder(self) -> str:
        """The short-lived seeder a model's first node serves the other nodes from."""
        return self._container("model-seeder")

    def service(self, service: str) -> str:
        """A service's vLLM container (spark-vllm:services)."""
        if service in STACK_CONTAINERS:
            raise ValueError(f"a service may not be named {service!r}: the stack's own "
                             f"{self._container(service)} has that name")
        return self._container(service)

    @property
    def collective(self) -> str:
        """The collective bandwidth gate's short-lived container, one rank on every node
        (components/collective.py)."""
        return self._container("collective")

    @property
    def collective_record(self) -> str:
        """What the collective gate last measured and decided, on the head (root only): the
        figures `spark-vllm status` shows, and whether the gate stopped an up (recon reads it:
        the next up measures again)."""
        return f"{self.dir}/collective-gate.json"

    def image_probe_record(self, image_id: str) -> str:
        """What the image probe found in one image on this node (its NCCL among it), root only;
        recon reads it (`spark-vllm recon`, preflight: which NCCL the serving vLLM loads)."""
        return f"{self.image_probe_dir}/{image_id.removeprefix('sha256:')}.json"

    @property
    def image_probe_dir(self) -> str:
        return f"{self.dir}/image-probe"

    @property
    def dir(self) -> str:
        """The stack's folder of files that outlive a reboot (root only)."""
        return f"{STACK_DIR}/{self.stack}"

    @property
    def run_dir(self) -> str:
        """The stack's folder under /run (a reboot empties it)."""
        return f"{STACK_RUN_DIR}/{self.stack}"

    def guard_dropin(self, unit: str) -> str:
        """The stack's systemd drop-in for `unit` (hostscripts/guard.py): sorted after the
        unit's own and its packages' (50-), named by the stack, removed on destroy."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,60}\.(service|slice)", unit):
            raise ValueError(f"not a systemd service or slice name: {unit!r}")
        return f"{SYSTEMD_UNITS_DIR}/{unit}.d/50-spark-vllm-{self.stack}.conf"

    def fabric_netplan(self, interface: str) -> str:
        """The stack's netplan file for one fabric interface (hostscripts/fabric_config.py)."""
        return f"/etc/netplan/40-spark-vllm-{self.stack}-{interface}.yaml"

    @property
    def compile_cache_dir(self) -> str:
        """The stack's compile and JIT caches on every node (root only), mounted read-write into
        its GPU containers only."""
        return f"{self.dir}/compile-cache"

    @property
    def model_record_dir(self) -> str:
        """Where the model verify records the blobs it hashed (`verified-<repo dir>`, root
        only): the stack's own folder, never the HF cache, which containers and other stacks
        write (issue 46: a record there could be planted to pass a changed blob unhashed, and
        root wrote it through a planted link)."""
        return f"{self.dir}/models"

    @property
    def vllm_key_file(self) -> str:
        """The main vLLM's API key on the head, root only (0600)."""
        return f"{self.dir}/vllm/api-key"

    @property
    def ray_token_file(self) -> str:
        """The Ray cluster token on every Ray node, root only (0600)."""
        return f"{self.dir}/ray/auth-token"

    @property
    def ray_session_dir(self) -> str:
        """Ray's session folder (sockets, logs) on the head, shared by the Ray head container
        and the vLLM container: a Ray driver connects to its node's raylet through the files in
        it. Under /run so a reboot starts it empty; Docker creates it (a `volumes` bind) when it
        is missing."""
        return f"{self.run_dir}/ray-session"

    @property
    def image_seeder_pid(self) -> str:
        """The pid file of the image seeder on the head (a host process, not a container)."""
        return f"/run/spark-vllm-{self.stack}-image-seeder.pid"

    @property
    def image_copy_dir(self) -> str:
        """Where another node keeps the head's image archive while it is checked, before
        `docker load` (hostscripts/images.image_pull_from_head; root only, emptied after)."""
        return f"{self.dir}/image-copy"

    @property
    def image_seeder_log(self) -> str:
        return f"/var/log/spark-vllm-{self.stack}-image-seeder.log"

    @property
    def gateway(self) -> str:
        """The gateway's container (HAProxy, on the head)."""
        return self._container("gateway")

    @property
    def gateway_dir(self) -> str:
        """The gateway's folder on the head (root only), mounted read-only at GATEWAY_MOUNT:
        `conf` (a link to the `conf.<hash>` folder in use: haproxy.cfg, the model map, the
        answers it gives itself) and `secrets` (the key's digest, the TLS key and chain)."""
        return f"{self.dir}/gateway"

    @property
    def gateway_run_dir(self) -> str:
        """The gateway's run folder on the head (under /run: a reboot empties it; Docker makes
        it again, a `volumes` bind), mounted at GATEWAY_RUN_MOUNT: HAProxy's stats socket,
        which `spark-vllm status` reads."""
        return f"{self.run_dir}/gateway"

    @property
    def gateway_key_file(self) -> str:
        """The SHA-256 digest of the API key as a HAProxy map (`api-key <64 hex>`), root only."""
        return f"{self.gateway_dir}/secrets/api-key.map"

    @property
    def gateway_tls_file(self) -> str:
        """The TLS certificate chain and its private key in one PEM file, root only."""
        return f"{self.gateway_dir}/secrets/tls.pem"

    @property
    def prometheus(self) -> str:
        """Prometheus's container (spark-vllm:monitoring, on the head)."""
        return self._container("prometheus")

    @property
    def node_exporter(self) -> str:
        """The node exporter's container (spark-vllm:monitoring, on every node)."""
        return self._container("node-exporter")

    @property
    def monitoring_dir(self) -> str:
        """Prometheus's folder on the head (root only), mounted read-only at MONITORING_MOUNT:
        `conf` (a link to the `conf.<hash>` folder in use: prometheus.yml, the rules) and
        `secrets` (the API key Prometheus scrapes the gateway with)."""
        return f"{self.dir}/monitoring"

    @property
    def monitoring_key_file(self) -> str:
        """The stack's API key as Prometheus reads it (`credentials_file`), root only."""
        return f"{self.monitoring_dir}/secrets/api-key"

    @property
    def prometheus_data_dir(self) -> str:
        """Prometheus's data (its TSDB) on the head, mounted read-write at PROMETHEUS_DATA: kept
        by a container replacement and, unless monitoring.keepDataOnDestroy is false, by
        `pulumi destroy`."""
        return f"{self.dir}/prometheus-data"

    def deployment_dir(self, service: str | None = None) -> str:
        """Where a node keeps the record of a model's last verified deployment (the main
        model's, or a service's): its containers as they passed (containers.json), on the node
        of its API the summary (verified.json) and the last gate's verdict (verdict.json); root
        only (hostscripts/deployment.py)."""
        if service is None:
            return f"{self.dir}/vllm/deployment"
        return f"{self.dir}/services/{service}/deployment"
    @property
    def alertmanager(self) -> str:
        """Alertmanager's container (spark-vllm:monitoring, on the head)."""
        return self._container("alertmanager")

    @property
    def alertmanager_dir(self) -> str:
        """Alertmanager's folder on the head (root only), mounted read-only at
        ALERTMANAGER_MOUNT: `conf`, a link to the `conf.<hash>` folder in use, whose
        alertmanager.yml holds the receivers' secret values."""
        return f"{self.dir}/alertmanager"

    @property
    def alertmanager_data_dir(self) -> str:
        """Alertmanager's notification log and silences on the head, mounted read-write at
        ALERTMANAGER_DATA; kept like Prometheus's data (monitoring.keepDataOnDestroy)."""
        return f"{self.dir}/alertmanager-data"

    @property
    def textfile_dir(self) -> str:
        """The head's node exporter reads the `*.prom` files here (its textfile collector):
        `spark-vllm reconcile` writes its results into it (tools/reconcile.py)."""
        return f"{self.dir}/textfile"

    def service_key_file(self, service: str) -> str:
        """Where a service's node keeps its copy of the API key (root only), its own folder:
        adding or removing a service never touches the main vLLM's key file or another stack's."""
        return f"{self.dir}/services/{service}/api-key"
