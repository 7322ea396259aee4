"""`spark-vllm:monitoring`: Prometheus on the head, scraping every model of the stack and a node
exporter on every node, with the stack's alert rules, and Alertmanager on the head delivering
what fires to the receivers the stack declares (components/monitoring.py; what it runs:
hostscripts/monitoring.py, hostscripts/alertmanager.py; docs/design.md "Metrics and alerts").

Off unless `enabled`. Keys (camelCase in the file):

    enabled                  deploy it (default false; the lab's dev stack turns it on)
    prometheus               {ref, plainHttpRegistry}: Prometheus's image (the lab's: built from
                             Debian's prometheus package; on real Sparks the upstream
                             prom/prometheus, by digest in prod). Its own promtool checks the
                             configuration and the rules before they are swapped in
    nodeExporter             {ref, plainHttpRegistry}: the node exporter's image (Debian's
                             prometheus-node-exporter in the lab; upstream prom/node-exporter)
    alertmanager             {ref, plainHttpRegistry}: Alertmanager's image (Debian's
                             prometheus-alertmanager in the lab; upstream prom/alertmanager, by
                             digest in prod). Its own amtool checks the configuration
    listen                   where Prometheus's API and UI listen on the head: `loopback`
                             (127.0.0.1, reach it with `ssh -L 9090:127.0.0.1:9090 <head>`) or
                             `fabric` (the head's first fabric address). Prometheus has no
                             authentication here: never the management network (the policy
                             pack's monitoring-not-exposed judges what reaches the engine)
    port                     Prometheus's port (9090)
    nodeExporterPort         each node exporter's port (9100): on the head's loopback, on each
                             other node's first fabric address (never the management network)
    alertmanagerPort         Alertmanager's port (9093), where Prometheus listens (`listen`);
                             its cluster (gossip) port is off: one Alertmanager per stack
    scrapeIntervalSeconds    how often every target is scraped (and the rules evaluated)
    retentionDays            how long Prometheus keeps its data (--storage.tsdb.retention.time)
    keepDataOnDestroy        `pulumi destroy` keeps Prometheus's data folder (default true)
    alerts                   the rules' thresholds (AlertsConfig below)
    alerting                 who is told, and how often (AlertingConfig below)

The vLLM targets are scraped through the stack's gateway (its `/metrics?model=<served name>`),
with the stack's API key from a root-only file: no vLLM port is opened for it.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from config.gateway import GatewayImageConfig
from config.types import ConfigModel, Fraction, Port

DEFAULT_PORT = 9090
DEFAULT_NODE_EXPORTER_PORT = 9100
DEFAULT_ALERTMANAGER_PORT = 9093

# A receiver's name: Alertmanager's receiver and the `receiver` label of status's lines
_RECEIVER_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")
# The name of a value in the secret spark-vllm:alertingSecrets (never the value itself)
SECRET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# An e-mail address as Alertmanager's `to`/`from` take it: no display name, no list, no
# whitespace or quoting a YAML scalar or a mail header could misread
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?"
                    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?)+")
# host:port of an SMTP server (a DNS name or an IPv4 address)
_SMARTHOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?:([0-9]{1,5})")
_USERNAME = re.compile(r"[A-Za-z0-9._%+@-]{1,128}")


def _receiver_name(v: str) -> str:
    if not _RECEIVER_NAME.fullmatch(v):
        raise ValueError("expected a receiver name: lowercase letters, digits and '-', at most "
                         "32, e.g. oncall")
    return v


def _secret_name(v: str) -> str:
    if not SECRET_NAME.fullmatch(v):
        raise ValueError("expected the name of a value in the secret spark-vllm:alertingSecrets "
                         "(letters, digits, '.', '_', '-'), never the value itself")
    return v


def _email(v: str) -> str:
    if not _EMAIL.fullmatch(v):
        raise ValueError("expected an e-mail address such as oncall@example.com")
    return v


def _smarthost(v: str) -> str:
    m = _SMARTHOST.fullmatch(v)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise ValueError("expected the SMTP server as host:port, e.g. smtp.example.com:587")
    return v


def _username(v: str) -> str:
    if not _USERNAME.fullmatch(v):
        raise ValueError("expected an SMTP user name (letters, digits, '.', '_', '%', '+', '@', "
                         "'-')")
    return v


ReceiverName = Annotated[str, AfterValidator(_receiver_name)]
SecretName = Annotated[str, AfterValidator(_secret_name)]
Email = Annotated[str, AfterValidator(_email)]
Smarthost = Annotated[str, AfterValidator(_smarthost)]
SmtpUser = Annotated[str, AfterValidator(_username)]


class WebhookReceiverConfig(ConfigModel):
    """Alertmanager's webhook: a JSON POST per notification
    (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config). The URL is a
    secret (it often carries a token): `urlSecret` names its value in
    spark-vllm:alertingSecrets."""

    url_secret: SecretName
    max_alerts: int = Field(default=0, ge=0, le=1000)  # 0: every alert of the group


class EmailReceiverConfig(ConfigModel):
    """E-mail over SMTP (https://prometheus.io/docs/alerting/latest/configuration/#email_config);
    the password is a secret: `passwordSecret` names its value in spark-vllm:alertingSecrets."""

    to: list[Email] = Field(min_length=1, max_length=20)
    from_: Email = Field(alias="from")
    smarthost: Smarthost
    username: SmtpUser | None = None
    password_secret: SecretName | None = None
    require_tls: bool = True  # STARTTLS required before the password is sent

    @model_validator(mode="after")
    def _login(self) -> EmailReceiverConfig:
        if (self.username is None) != (self.password_secret is None):
            raise ValueError("email.username and email.passwordSecret come together (SMTP "
                             "login) or not at all")
        return self


class ReceiverConfig(ConfigModel):
    """One receiver: a webhook or an e-mail, told of every alert of the stack (grouped by
    alert, stack and model) and, with `sendResolved`, of its resolution."""

    name: ReceiverName
    webhook: WebhookReceiverConfig | None = None
    email: EmailReceiverConfig | None = None
    send_resolved: bool = True

    @model_validator(mode="after")
    def _one(self) -> ReceiverConfig:
        if (self.webhook is None) == (self.email is None):
            raise ValueError(f"receiver {self.name}: expected exactly one of webhook or email")
        return self

    @property
    def secrets(self) -> list[str]:
        """The names of the values it takes from spark-vllm:alertingSecrets."""
        if self.webhook is not None:
            return [self.webhook.url_secret]
        assert self.email is not None
        return [self.email.password_secret] if self.email.password_secret else []


class AlertingConfig(ConfigModel):
    """Alertmanager's routing (hostscripts/alertmanager.py): every receiver gets every alert of
    the stack; alerts are grouped by alert name, stack and model (a node's alerts by node), a
    group waits `groupWaitSeconds` before its first notification, `groupIntervalSeconds`
    between notifications of new or resolved alerts in it, and is repeated every
    `repeatIntervalSeconds` while it fires. A node whose exporter is down silences the alerts of
    the models that run on it (inhibition). No receiver: Alertmanager keeps the alerts (status
    and its UI show them) and tells nobody."""

    receivers: list[ReceiverConfig] = Field(default_factory=list, max_length=20)
    group_wait_seconds: int = Field(default=30, ge=0, le=3600)
    group_interval_seconds: int = Field(default=300, ge=1, le=86400)
    repeat_interval_seconds: int = Field(default=14400, ge=60, le=604800)

    @model_validator(mode="after")
    def _unique(self) -> AlertingConfig:
        names = [r.name for r in self.receivers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"receiver names must be unique: {', '.join(twice)} more than once")
        return self

    @property
    def secret_names(self) -> list[str]:
        """Every value of spark-vllm:alertingSecrets the receivers take, each once."""
        return list(dict.fromkeys(s for r in self.receivers for s in r.secrets))


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
    alertmanager: GatewayImageConfig | None = None
    listen: Literal["loopback", "fabric"] = "loopback"
    port: Port = DEFAULT_PORT
    node_exporter_port: Port = DEFAULT_NODE_EXPORTER_PORT
    alertmanager_port: Port = DEFAULT_ALERTMANAGER_PORT
    scrape_interval_seconds: int = Field(default=15, ge=1, le=300)
    retention_days: int = Field(default=15, ge=1, le=3650)
    keep_data_on_destroy: bool = True
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    alerting: AlertingConfig = Field(default_factory=AlertingConfig)

    @model_validator(mode="after")
    def _images(self) -> MonitoringConfig:
        missing = [k for k, v in (("prometheus", self.prometheus),
                                  ("nodeExporter", self.node_exporter),
                                  ("alertmanager", self.alertmanager)) if v is None]
        if self.enabled and missing:
            raise ValueError(f"monitoring.enabled needs the image of {' and '.join(missing)} "
                             "({ref: <image>}; by digest in prod)")
        if self.node_exporter_port == self.port:
            raise ValueError(f"monitoring.nodeExporterPort: got {self.port}, the same as "
                             "monitoring.port (both listen on the head)")
        for key, port in (("port", self.port), ("nodeExporterPort", self.node_exporter_port)):
            if self.alertmanager_port == port:
                raise ValueError(f"monitoring.alertmanagerPort: got {port}, the same as "
                                 f"monitoring.{key} (both listen on the head)")
        return self
