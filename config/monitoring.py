"""`spark-vllm:monitoring`: Prometheus on the head, scraping every model of the stack and a node
exporter on every node, with the stack's alert rules (components/monitoring.py; what it runs:
hostscripts/monitoring.py; docs/design.md "Metrics and alerts").

Off unless `enabled`. Keys (camelCase in the file):

    enabled                  deploy it (default false; the lab's dev stack turns it on)
    prometheus               {ref, plainHttpRegistry}: Prometheus's image (the lab's: built from
                             Debian's prometheus package; on real Sparks the upstream
                             prom/prometheus, by digest in prod). Its own promtool checks the
                             configuration and the rules before they are swapped in
    nodeExporter             {ref, plainHttpRegistry}: the node exporter's image (Debian's
                             prometheus-node-exporter in the lab; upstream prom/node-exporter)
    listen                   where Prometheus's API and UI listen on the head: `loopback`
                             (127.0.0.1, reach it with `ssh -L 9090:127.0.0.1:9090 <head>`) or
                             `fabric` (the head's first fabric address). Prometheus has no
                             authentication here: never the management network (the policy
                             pack's monitoring-not-exposed judges what reaches the engine)
    port                     Prometheus's port (9090)
    nodeExporterPort         each node exporter's port (9100): on the head's loopback, on each
                             other node's first fabric address (never the management network)
    scrapeIntervalSeconds    how often every target is scraped (and the rules evaluated)
    retentionDays            how long Prometheus keeps its data (--storage.tsdb.retention.time)
    keepDataOnDestroy        `pulumi destroy` keeps Prometheus's data folder (default true)
    alerts                   the rules' thresholds (AlertsConfig below)

The vLLM targets are scraped through the stack's gateway (its `/metrics?model=<served name>`),
with the stack's API key from a root-only file: no vLLM port is opened for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from config.gateway import GatewayImageConfig
from config.types import ConfigModel, Fraction, Port

DEFAULT_PORT = 9090
DEFAULT_NODE_EXPORTER_PORT = 9100


class AlertsConfig(ConfigModel):
    """Thresholds of the alert rules (hostscripts/monitoring.py `rules`). The crash-loop rule
    takes `health.liveness.crashLoopRestarts` / `crashLoopWindowSeconds` and the memory rule
    `preflight.osReserveBytes`, so the alerts and `spark-vllm status` agree. The OOM rule reads
    the guard's record of the kills (config/guard.py) through each node exporter."""

    # a model's target down (its vLLM not answering through the gateway) this long
    not_serving_seconds: int = Field(default=60, ge=0, le=86400)
    # vLLM's KV cache usage above this share ...
    kv_cache_usage: Fraction = 0.9
    # ... for this long
    kv_cache_seconds: int = Field(default=300, ge=0, le=86400)
    # requests waiting (vllm:num_requests_waiting > 0) this long
    waiting_seconds: int = Field(default=60, ge=0, le=86400)
    # a node's available memory below the OS reserve this long
    memory_seconds: int = Field(default=120, ge=0, le=86400)
    # an OOM kill on a node (earlyoom's, the guard's record; or the kernel's) fires
    # SparkVllmOomKilled for this long after it
    oom_killed_seconds: int = Field(default=3600, ge=60, le=86400)


class MonitoringConfig(ConfigModel):
    enabled: bool = False
    prometheus: GatewayImageConfig | None = None
    node_exporter: GatewayImageConfig | None = None
    listen: Literal["loopback", "fabric"] = "loopback"
    port: Port = DEFAULT_PORT
    node_exporter_port: Port = DEFAULT_NODE_EXPORTER_PORT
    scrape_interval_seconds: int = Field(default=15, ge=1, le=300)
    retention_days: int = Field(default=15, ge=1, le=3650)
    keep_data_on_destroy: bool = True
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)

    @model_validator(mode="after")
    def _images(self) -> MonitoringConfig:
        missing = [k for k, v in (("prometheus", self.prometheus),
                                  ("nodeExporter", self.node_exporter)) if v is None]
        if self.enabled and missing:
            raise ValueError(f"monitoring.enabled needs the image of {' and '.join(missing)} "
                             "({ref: <image>}; by digest in prod)")
        if self.node_exporter_port == self.port:
            raise ValueError(f"monitoring.nodeExporterPort: got {self.port}, the same as "
                             "monitoring.port (both listen on the head)")
        return self
