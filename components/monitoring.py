"""Monitoring: Prometheus on the head, a node exporter on every node, the stack's alert rules,
Alertmanager on the head telling the stack's receivers (`monitoring.enabled`;
config/monitoring.py; what runs on the nodes: hostscripts/monitoring.py,
hostscripts/alertmanager.py; docs/design.md "Metrics and alerts").

Prometheus scrapes every replica of every model of the stack through the gateway
(`/metrics?model=<served name>&replica=<node>`, with the stack's API key from a root-only file:
no vLLM port is opened for it) and each node's exporter, which listens on the head's loopback or
another node's first fabric address, never the management network. Prometheus and Alertmanager
listen on the head's loopback (or its fabric address, `monitoring.listen`): neither has
authentication of its own here.

Children:
* `monitoring-prometheus-image`, `monitoring-node-exporter-image-<node>`: the images, pulled by
  digest (a tag is resolved at the registry first, like the gateway's);
* `monitoring-key`: the API key on stdin into a root-only file Prometheus reads
  (`credentials_file`); nothing derived from it is in any command's text;
* `monitoring-data`: Prometheus's data folder, which outlives the container; `destroy` keeps it
  unless `monitoring.keepDataOnDestroy` is false;
* `monitoring-config`: prometheus.yml and the rules, written into a new folder, checked with the
  image's own `promtool`, swapped in, and the running Prometheus reloaded (SIGHUP). A new scrape
  interval, threshold or model is this command's update and nothing else of the stack's;
* `monitoring-prometheus`: the container (`spark-vllm-<stack>-prometheus`, host network, restart
  `unless-stopped`); none of the configuration is in its inputs, so it is reloaded, never
  replaced, by a new configuration;
* `monitoring-node-exporter-<node>`: the exporter on every node (host network and pid
  namespace, the node's / read-only at /host, its /proc read there too; the head's also reads
  the reconcile's results from its textfile folder, and with the guard the guard's count of OOM
  kills (through a link there; the other nodes' exporters read the guard's folder itself);
* `monitoring-node-exporter-start-<node>`: starts that node's exporter when recon found it
  stopped (a `docker stop` by hand is a manual stop, which Docker's restart policy keeps);
* `monitoring-alertmanager-image`, `monitoring-alertmanager-config` (alertmanager.yml with the
  receivers' secret values on stdin into a root-only folder, the redacted text in the command,
  both checked by the image's amtool; a reload), `monitoring-alertmanager` (the container);
* `monitoring-health`: from the head, Prometheus and Alertmanager ready (each started first
  when recon found it stopped), every target up, the stack's rules loaded, Prometheus sending
  to Alertmanager (payloads/monitoring_health.py), again after every new configuration or
  container.

Recon looks at the head first: where Prometheus's configuration, key file or data folder is gone
(the stack's folder wiped behind it), the commands that made them run again and Prometheus's
container is replaced with them (its bind mounts held the folders that went).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import daemon, rerun
from components.rerun import Again
from components.spark_node import SparkNode
from config.models import StackConfig
from config.monitoring import MonitoringConfig
from contract import labels as lbl
from contract import types
from contract.props import MonitoringProps
from hostscripts import alertmanager as am
from hostscripts import monitoring as mon
from hostscripts.gateway import Route
from hostscripts.guard import METRICS_DIR as GUARD_METRICS_DIR
from hostscripts.paths import (
    ALERTMANAGER_DATA,
    ALERTMANAGER_MOUNT,
    MONITORING_MOUNT,
    PROMETHEUS_DATA,
    StackNames,
)

ROLE = "prometheus"
EXPORTER_ROLE = "node-exporter"
ALERTMANAGER_ROLE = "alertmanager"


def exporter_address(node: SparkNode, head: SparkNode) -> str:
    """Where a node's exporter listens: the head's loopback (Prometheus is there), another
    node's first fabric address (Prometheus reaches it over the fabric)."""
    return "127.0.0.1" if node is head else node.node.fabric[0].ip


def prometheus_address(m: MonitoringConfig, head: SparkNode) -> str:
    return "127.0.0.1" if m.listen == "loopback" else head.node.fabric[0].ip


def monitoring_spec(cfg: StackConfig, nodes: Sequence[SparkNode], stack: str,
                    routes: Sequence[Route]) -> mon.MonitoringSpec:
    """What Prometheus scrapes and alerts on: every replica of every route of the gateway (the
    main model's first), each node's exporter; the crash-loop rule takes health.liveness's
    limits and the memory rule preflight.osReserveBytes; alerts go to Alertmanager."""
    m, head = cfg.monitoring, nodes[0]
    a, live = m.alerts, cfg.health.liveness
    return mon.MonitoringSpec(
        stack=stack,
        gateway=f"{cfg.gateway.scheme}://127.0.0.1:{cfg.gateway.port}",
        models=tuple(mon.ModelTarget(r.name, tuple(s.node for s in r.servers)) for r in routes),
        nodes=tuple(mon.NodeTarget(n.name, f"{exporter_address(n, head)}:{m.node_exporter_port}")
                    for n in nodes),
        scrape_interval_seconds=m.scrape_interval_seconds,
        not_serving_seconds=a.not_serving_seconds,
        kv_cache_usage=a.kv_cache_usage,
        kv_cache_seconds=a.kv_cache_seconds,
        waiting_seconds=a.waiting_seconds,
        memory_seconds=a.memory_seconds,
        crash_loop_restarts=live.crash_loop_restarts,
        crash_loop_window_seconds=live.crash_loop_window_seconds,
        os_reserve_bytes=cfg.preflight.os_reserve_bytes,
        oom_killed_seconds=a.oom_killed_seconds,
        alertmanager=f"{prometheus_address(m, head)}:{m.alertmanager_port}",
    )


def alerting_spec(cfg: StackConfig, stack: str, routes: Sequence[Route]) -> am.AlertingSpec:
    """Alertmanager's configuration: the declared receivers, the intervals, and where each model
    runs (inhibition): the main model (`routes[0]`) on every node, a service's replicas each on
    its own node."""
    al = cfg.monitoring.alerting
    receivers = []
    for r in al.receivers:
        if r.webhook is not None:
            receivers.append(am.Receiver(r.name, webhook=am.Webhook(
                r.webhook.url_secret, r.webhook.max_alerts), send_resolved=r.send_resolved))
        elif r.email is not None:
            e = r.email
            receivers.append(am.Receiver(r.name, email=am.Email(
                tuple(e.to), e.from_, e.smarthost, e.username, e.password_secret,
                e.require_tls), send_resolved=r.send_resolved))
    nodes = tuple(n.name for n in cfg.nodes)
    models = [am.Placement(routes[0].name, nodes)]
    models += [am.Placement(r.name, tuple(s.node for s in r.servers), replicas=True)
               for r in routes[1:]]
    return am.AlertingSpec(
        stack=stack, nodes=nodes, models=tuple(models), receivers=tuple(receivers),
        group_wait_seconds=al.group_wait_seconds,
        group_interval_seconds=al.group_interval_seconds,
        repeat_interval_seconds=al.repeat_interval_seconds)


@dataclass
class MonitoringArgs:
    monitoring: MonitoringConfig
    nodes: Sequence[SparkNode]  # the head first
    names: StackNames
    labels: Mapping[str, str]  # managed + stack
    environment: str
    spec: mon.MonitoringSpec
    alerting: am.AlertingSpec
    api_key: pulumi.Output[str]  # the stack's: secret
    guard: bool = False  # guard.enabled: the exporters read the guard's OOM kill count too
    # the values the receivers name (config.load Secrets.alerting): secret
    alerting_secrets: pulumi.Output[Mapping[str, str]] | None = None
    gate_timeout_seconds: int = 300
    after: list[pulumi.Resource] = field(default_factory=list)  # the gateway's gate
    # what every listener waits for: the nodes' firewall tables (components/firewall.py); the
    # exporters wait for nothing else of the stack
    firewall: list[pulumi.Resource] = field(default_factory=list)
    # recon found Prometheus's or Alertmanager's container not running (stopped by hand): the
    # gate starts it
    restart_reason: str | None = None
    # per node: recon found its exporter not running; its start command starts it
    exporter_restart_reasons: Mapping[str, str | None] = field(default_factory=dict)


class Monitoring(pulumi.ComponentResource):
    image: docker.RemoteImage
    key: remote.Command
    data: remote.Command
    config: remote.Command
    container: docker.Container
    exporter_containers: dict[str, docker.Container]  # not `exporters`: a prop of that name
    exporter_starts: dict[str, remote.Command]
    alertmanager_image: docker.RemoteImage
    alertmanager_config: remote.Command
    alertmanager_container: docker.Container  # not `alertmanager`: a prop of that name
    gate: remote.Command
    url: str  # Prometheus, as the head reaches it
    alertmanager_url: str  # Alertmanager, as the head reaches it
    files: dict[str, str]  # the configuration files (what `monitoring-config` writes)

    def __init__(self, name: str, args: MonitoringArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m, names, head = args.monitoring, args.names, args.nodes[0]
        if m.prometheus is None or m.node_exporter is None or m.alertmanager is None:
            raise ValueError("monitoring.enabled without its images (config/monitoring.py "
                             "refuses this)")
        props = self._props(args)
        super().__init__(types.MONITORING, name, props, opts)
        self.files = mon.render(args.spec)
        listen = prometheus_address(m, head)
        self.url = f"http://{listen}:{m.port}"
        self.alertmanager_url = f"http://{listen}:{m.alertmanager_port}"
        self.image = daemon.remote_image(f"{name}-prometheus-image", self, m.prometheus.ref,
                                         head)
        # what recon found gone from the head (the stack's folder wiped behind it: another
        # stack's destroy on the same nodes, a reinstall): the commands that made it run again
        # (a fresh trigger: delete first, then create), and Prometheus's container, whose bind
        # mounts held the folders that went, is replaced with them (its label below)
        again_files = Again.when_wiped([rerun.fresh_trigger()]
                                 if head.facts.monitoring_files_present is False else [])
        again_data = Again.when_wiped([rerun.fresh_trigger()]
                                if head.facts.prometheus_data_present is False else [])
        self.key = daemon.secret_command(
            head, f"{name}-key", self, again_files, mon.key_write(names), mon.key_remove(names),
            pulumi.Output.secret(args.api_key))
        self.data = daemon.rerun_command(
            head,
            f"{name}-data",
            self,
            again_data,
            create=mon.data_write(names, guard=args.guard),
            delete=mon.data_remove(names, keep=m.keep_data_on_destroy),
        )
        files = self.files
        self.config = daemon.config_command(
            head, f"{name}-config", self, again_files, self.image,
            lambda i: mon.config_write(names, files, i, args.labels), mon.config_remove(names),
            depends_on=[self.key, self.data, *args.after],
        )
        labels = {**args.labels, lbl.ROLE: ROLE, lbl.NODE: head.name,
                  lbl.PORT: str(m.port)}
        # the commands that make its bind mounts' sources: made again (a new ID) after recon
        # found them gone, they replace the container, which still held the folders that went
        # (a configuration change is an update of the same command: a reload, no replacement)
        mounts = pulumi.Output.all(self.key.id, self.config.id, self.data.id).apply(
            lambda ids: " ".join(ids))
        # root in the container (daemon.container's default): it reads the root-only key file
        # and writes the root-only data folder (upstream's image runs as nobody, which could
        # read neither)
        self.container = daemon.container(
            f"{name}-prometheus", self, head, self.image, names.prometheus, mon.entrypoint(),
            mon.command(listen, m.port, m.retention_days),
            mounts=daemon.bind_mounts((MONITORING_MOUNT, names.monitoring_dir),
                                      (PROMETHEUS_DATA, names.prometheus_data_dir)),
            labels=_labels(labels, mounts),
            destroy_grace_seconds=30,
            depends_on=[self.config, self.data],
        )
        self.exporter_containers = {}
        exporter_images = {}
        for node in args.nodes:
            exporter_images[node.name] = daemon.remote_image(
                f"{name}-node-exporter-image-{node.name}", self, m.node_exporter.ref, node)
            elabels = {**args.labels, lbl.ROLE: EXPORTER_ROLE,
                       lbl.NODE: node.name,
                       lbl.PORT: str(m.node_exporter_port)}
            self.exporter_containers[node.name] = daemon.container(
                f"{name}-node-exporter-{node.name}", self, node, exporter_images[node.name],
                names.node_exporter, mon.node_exporter_entrypoint(),
                mon.node_exporter_command(
                    exporter_address(node, head), m.node_exporter_port,
                    textfile=mon.textfile_dir(names.stack) if node is head
                    else GUARD_METRICS_DIR if args.guard else None),
                user=None,  # the image's own (nobody): it reads what every user may
                pid_mode="host",
                mounts=[docker.ContainerMountArgs(target="/host", type="bind", source="/",
                                                  read_only=True)],
                labels=_labels(elabels),
                destroy_grace_seconds=10,
                depends_on=list(args.firewall) or None,
            )
        # an exporter stopped by hand (a manual stop: Docker's policy leaves it stopped) is
        # started again by its node's start command, whose marker recon's reason renews
        self.exporter_starts = {}
        for node in args.nodes:
            restart = Again.because(args.exporter_restart_reasons.get(node.name))
            self.exporter_starts[node.name] = daemon.rerun_command(
                node,
                f"{name}-node-exporter-start-{node.name}",
                self,
                restart,
                create=self.exporter_containers[node.name].id.apply(
                    lambda cid: mon.exporter_start_script(names, cid)),
                depends_on=[self.exporter_containers[node.name]],
            )
        self._alertmanager(name, args, head, again_files, again_data)
        # recon's reason to start Prometheus or Alertmanager again travels in `triggers` (a
        # new marker replaces the gate, whose script starts them); none: the state's marker is
        # kept, nothing diffs
        restart = Again.because(args.restart_reason)
        self.gate = daemon.rerun_command(
            head,
            f"{name}-health",
            self,
            restart,
            create=pulumi.Output.all(
                self.container.id, self.config.stdout, self.alertmanager_container.id,
                self.alertmanager_config.stdout).apply(
                lambda v: mon.gate_script(names, mon.gate_marker(*v), self.url,
                                          args.spec, args.gate_timeout_seconds)),
            depends_on=[self.container, self.config, *self.exporter_containers.values(),
                        *self.exporter_starts.values(), self.alertmanager_container,
                        self.alertmanager_config, *args.after],
            timeout_seconds=args.gate_timeout_seconds + 120,
        )
        self.register_outputs({**props, "url": self.url, "alertmanagerUrl": self.alertmanager_url,
                               "health": self.gate.stdout,
                               "container": self.container.name})

    def _alertmanager(self, name: str, args: MonitoringArgs, head: SparkNode, again_files: Again,
                      again_data: Again) -> None:
        """Alertmanager on the head: its image, its configuration (the secret values only on
        stdin) and its container, which like Prometheus's keeps nothing of the configuration in
        its inputs (a new receiver or interval is a reload)."""
        m, names = args.monitoring, args.names
        assert m.alertmanager is not None
        spec = args.alerting
        self.alertmanager_image = daemon.remote_image(
            f"{name}-alertmanager-image", self, m.alertmanager.ref, head)
        redacted = am.render(spec)
        wanted = sorted(spec.secrets)
        secrets = args.alerting_secrets
        if wanted and secrets is None:
            raise ValueError(f"monitoring.alerting names the secrets {wanted} and none were "
                             "loaded (config.load_secrets refuses this)")
        def real(values: Mapping[str, str]) -> str:
            return am.render(spec, values)

        text: pulumi.Output[str] = (
            pulumi.Output.secret(secrets.apply(real))
            if wanted and secrets is not None else pulumi.Output.secret(redacted))
        labels = args.labels
        self.alertmanager_config = daemon.config_command(
            head, f"{name}-alertmanager-config", self, again_files, self.alertmanager_image,
            lambda i: am.config_write(names, redacted, i, labels), am.config_remove(names),
            stdin=text,
            secret_outputs=["stdin"],
            depends_on=[self.data, *args.after],
        )
        alabels = {**labels, lbl.ROLE: ALERTMANAGER_ROLE,
                   lbl.NODE: head.name, lbl.PORT: str(m.alertmanager_port)}
        mounts = pulumi.Output.all(self.alertmanager_config.id, self.data.id).apply(
            lambda ids: " ".join(ids))
        # root in the container (daemon.container's default): it reads the root-only
        # configuration (the secret values) and writes the root-only data folder
        self.alertmanager_container = daemon.container(
            f"{name}-alertmanager", self, head, self.alertmanager_image, names.alertmanager,
            am.entrypoint(), am.command(prometheus_address(m, head), m.alertmanager_port),
            mounts=daemon.bind_mounts((ALERTMANAGER_MOUNT, names.alertmanager_dir),
                                      (ALERTMANAGER_DATA, names.alertmanager_data_dir)),
            labels=_labels(alabels, mounts),
            destroy_grace_seconds=10,
            depends_on=[self.alertmanager_config, self.data],
        )

    @staticmethod
    def _props(args: MonitoringArgs) -> MonitoringProps:
        """What the policy pack reviews (policies/rules/monitoring.py)."""
        m, head = args.monitoring, args.nodes[0]
        return {
            "environment": args.environment,
            "node": head.name,
            "host": head.node.host,
            "listen": f"{prometheus_address(m, head)}:{m.port}",
            "authentication": False,  # Prometheus's own: none (loopback or fabric only)
            "fabricAddresses": [f.ip for n in args.nodes for f in n.node.fabric],
            "images": {"prometheus": m.prometheus.ref if m.prometheus else None,
                       "nodeExporter": m.node_exporter.ref if m.node_exporter else None,
                       "alertmanager": m.alertmanager.ref if m.alertmanager else None},
            # Alertmanager: its API and UI (no authentication either), its cluster listener
            # (gossip: "" is off)
            "alertmanager": {"listen": f"{prometheus_address(m, head)}:{m.alertmanager_port}",
                             "clusterListen": ""},
            "receivers": [{"name": r.name, "kind": "webhook" if r.webhook else "email",
                           "sendResolved": r.send_resolved} for r in m.alerting.receivers],
            "exporters": [{"node": n.name, "host": n.node.host,
                           "listen": f"{exporter_address(n, head)}:{m.node_exporter_port}"}
                          for n in args.nodes],
            "targets": {"models": [t.name for t in args.spec.models],
                        "replicas": {t.name: list(t.replicas) for t in args.spec.models},
                        "nodes": [t.node for t in args.spec.nodes]},
            "scrapeIntervalSeconds": m.scrape_interval_seconds,
            "retentionDays": m.retention_days,
            "keepDataOnDestroy": m.keep_data_on_destroy,
        }


MOUNTS_LABEL = "spark-vllm.mounts-made-by"  # the IDs of the commands that made its mounts


def _labels(labels: Mapping[str, str],
            mounts: pulumi.Output[str] | None = None) -> list[docker.ContainerLabelArgs]:
    out = [docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())]
    if mounts is not None:
        out.append(docker.ContainerLabelArgs(label=MOUNTS_LABEL, value=mounts))
    return out
