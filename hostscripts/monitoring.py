"""Monitoring's pieces (spark-vllm:monitoring, config/monitoring.py): Prometheus's configuration
and alert rules (`render`, `rules`), the scripts that write them, check them with the Prometheus
image's own `promtool` and reload the running Prometheus, the file that holds the API key it
scrapes the gateway with, its data folder, the node exporters' arguments, and the gate that
proves it all from the head.

What Prometheus scrapes (configuration reference:
https://prometheus.io/docs/prometheus/latest/configuration/configuration/):

* job `vllm`: every replica of every served model through the stack's gateway,
  `/metrics?model=<served name>&replica=<node>` (the gateway routes that to that node's vLLM of
  the model, never to whichever replica its balancing picks: hostscripts/gateway.py), one
  target per replica with `model` and `replica` labels, so each series is one process's and
  rates hold; the stack's API key as `Authorization: Bearer`, read by Prometheus from a
  root-only file (`credentials_file`), so no vLLM port is opened for it and the key is on no
  command line and in no configuration text;
* job `node`: each node's exporter, with a `node` label (the head's also reads the reconcile's
  results, `spark_vllm_reconcile_*`, from its textfile folder: tools/reconcile.py).

Alerts go to the stack's Alertmanager on the head (hostscripts/alertmanager.py).

The alert rules (one group, `spark-vllm`; rule syntax:
https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/) take their
thresholds from the stack's config, so the alerts and `spark-vllm status` agree. Everything here
uses only what both Debian bookworm's Prometheus 2.42 (what the lab's image is built from) and
upstream's 2.x/3.x accept.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from contract import labels as lbl
from hostscripts import daemon as dm
from hostscripts.common import (
    container_ids,
    image_id,
    payload,
    plain,
    q,
    stack_path_remove,
)
from hostscripts.guard import METRICS as GUARD_METRICS
from hostscripts.paths import MONITORING_MOUNT, PROMETHEUS_DATA, StackNames

_GATE_PY = payload("monitoring_health.py")

GROUP = "spark-vllm"  # the rule group
ALERTS = (
    "SparkVllmModelNotServing",
    "SparkVllmCrashLoop",
    "SparkVllmKvCacheFull",
    "SparkVllmRequestsWaiting",
    "SparkNodeMemoryLow",
    "SparkNodeExporterDown",
    "SparkVllmOomKilled",
    "SparkVllmDriftNotRepaired",
    "SparkVllmReconcileFailed",
    "SparkVllmReconcileStale",
)
NODE_EXPORTER_DOWN_SECONDS = 120
CONFIG_FILE = "prometheus.yml"
RULES_FILE = "rules.yml"
KEY_FILE = "api-key"  # under <root>/secrets: names.monitoring_key_file on the head
HOST_ROOT = "/host"  # where the node exporter's container sees the node's / (read-only)
# Prometheus is a Go program: a SIGHUP that arrives before it asks for that signal (its first
# milliseconds) kills it (measured with 2.42: one sent 10 ms after exec did, 50 ms after did not)
RELOAD_MIN_AGE_SECONDS = 5
_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")  # config.types.ServedName
_NODE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # config.models NodeConfig.name
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}:([0-9]{1,5})")  # IPv4 or DNS name
_FILE = re.compile(r"[a-z0-9]+\.yml")
# The head's exporter reads `*.prom` files here (its textfile collector): the reconcile's
# results. Outside the stack's root-only folder: the exporter runs as nobody.
TEXTFILE_ROOT = "/var/lib/spark-vllm-textfile"
# how many missed runs of the reconcile make its results stale (SparkVllmReconcileStale)
RECONCILE_STALE_RUNS = 3


def textfile_dir(stack: str) -> str:
    """The stack's folder of the node exporter's textfile collector on the head."""
    return f"{TEXTFILE_ROOT}/{StackNames(stack).stack}"


@dataclass(frozen=True)
class ModelTarget:
    """A served model and the nodes whose vLLM serves it (each a replica the gateway reaches
    on its own: `/metrics?model=<name>&replica=<node>`)."""

    name: str
    replicas: tuple[str, ...]


@dataclass(frozen=True)
class NodeTarget:
    """A node exporter: the node's name (the `node` label of its series) and the `host:port`
    Prometheus reaches it at."""

    node: str
    address: str


@dataclass(frozen=True)
class MonitoringSpec:
    """What Prometheus scrapes and the thresholds of its alert rules. `gateway`: the stack's
    gateway as the head reaches it (`http://127.0.0.1:8080`, or https); `models`: the served
    names, the main model first."""

    stack: str
    gateway: str
    models: tuple[ModelTarget, ...]
    nodes: tuple[NodeTarget, ...]
    scrape_interval_seconds: int
    not_serving_seconds: int
    kv_cache_usage: float
    kv_cache_seconds: int
    waiting_seconds: int
    memory_seconds: int
    crash_loop_restarts: int
    crash_loop_window_seconds: int
    os_reserve_bytes: int
    oom_killed_seconds: int = 3600  # SparkVllmOomKilled fires this long after a kill
    # Alertmanager as the head reaches it (host:port); None: no alerting section
    alertmanager: str | None = None

    def __post_init__(self) -> None:
        StackNames(self.stack)  # a stack name, or ValueError
        self.gateway_target()  # a gateway URL Prometheus can scrape, or ValueError
        names = [m.name for m in self.models if isinstance(m, ModelTarget)]
        if not self.models or len(set(names)) != len(self.models):
            raise ValueError(f"monitoring needs the served models, each once: {self.models}")
        for m in self.models:
            if not _SERVED.fullmatch(m.name):
                raise ValueError(f"not a served name: {m.name!r}")
            if not m.replicas or len(set(m.replicas)) != len(m.replicas) or \
                    not all(_NODE.fullmatch(r) for r in m.replicas):
                raise ValueError(f"model {m.name}: its replicas are node names, each once: "
                                 f"{m.replicas}")
        if self.alertmanager is not None and not _host_port(self.alertmanager):
            raise ValueError(f"not Alertmanager's host:port: {self.alertmanager!r}")
        nodes = [n.node for n in self.nodes]
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"node names must be unique: {nodes}")
        for n in self.nodes:
            if not _NODE.fullmatch(n.node) or not _host_port(n.address):
                raise ValueError(f"node exporter {n.node!r} at {n.address!r}: not a node name "
                                 "and a host:port")
        if self.scrape_interval_seconds < 1 or self.crash_loop_window_seconds < 1:
            raise ValueError("the scrape interval and the crash-loop window are 1 s or more")
        for what in ("not_serving_seconds", "kv_cache_seconds", "waiting_seconds",
                     "memory_seconds", "crash_loop_restarts", "os_reserve_bytes",
                     "oom_killed_seconds"):
            value = getattr(self, what)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{what}: expected an integer >= 0, not {value!r}")
        if not 0 < self.kv_cache_usage < 1:
            raise ValueError(f"kv_cache_usage: a share between 0 and 1, not {self.kv_cache_usage}")

    def gateway_target(self) -> tuple[str, str]:
        """(scheme, host:port) of the gateway, or ValueError."""
        u = urlsplit(self.gateway)
        if u.scheme not in ("http", "https") or u.path not in ("", "/") or u.query or \
                u.fragment or u.username is not None or u.password is not None or \
                not _host_port(u.netloc):
            raise ValueError(f"not a gateway URL http(s)://<host>:<port>: {self.gateway!r}")
        return u.scheme, u.netloc


def _host_port(value: object) -> bool:
    """`value` is `<IPv4 or DNS name>:<port>`."""
    m = _ADDRESS.fullmatch(value) if isinstance(value, str) else None
    return m is not None and 0 < int(m.group(1)) < 65536


def _s(value: str) -> str:
    """A YAML scalar: a JSON string is a valid YAML double-quoted one (YAML 1.2 is a superset
    of JSON), so no value can start a key, a list or a comment of its own."""
    return json.dumps(value)


def _seconds(n: int) -> str:
    return f"{int(n)}s"


def render(spec: MonitoringSpec, *, root: str = MONITORING_MOUNT) -> dict[str, str]:
    """Prometheus's files, by name under `<root>/conf` (the folder the running Prometheus reads;
    `root` is MONITORING_MOUNT in the container, another folder in tests): `prometheus.yml` and
    the alert rules it loads, `rules.yml`. The API key is `<root>/secrets/api-key`, written by
    its own command (key_write)."""
    scheme, address = spec.gateway_target()
    interval = spec.scrape_interval_seconds
    lines = [
        "# spark-vllm's Prometheus: written by the stack (hostscripts/monitoring.py). A change is",
        "# a new folder, checked with this image's promtool, then the running Prometheus reloads",
        "# (SIGHUP). https://prometheus.io/docs/prometheus/latest/configuration/configuration/",
        "global:",
        f"  scrape_interval: {_seconds(interval)}",
        f"  scrape_timeout: {_seconds(min(interval, 10))}",
        f"  evaluation_interval: {_seconds(interval)}",
        "  external_labels:",
        f"    stack: {_s(spec.stack)}",
    ]
    if spec.alertmanager is not None:
        lines += [
            "# the stack's Alertmanager on the head (hostscripts/alertmanager.py)",
            "alerting:",
            "  alertmanagers:",
            "    - static_configs:",
            f"        - targets: [{_s(spec.alertmanager)}]",
        ]
    lines += [
        "rule_files:",
        f"  - {_s(f'{root}/conf/{RULES_FILE}')}",
        "scrape_configs:",
        "  # every replica of every served model through the stack's gateway, which routes",
        "  # /metrics?model=<name>&replica=<node> to that node's vLLM of the model, behind the",
        "  # stack's API key (read from its root-only file)",
        f"  - job_name: {_s('vllm')}",
        f"    scheme: {_s(scheme)}",
        f"    metrics_path: {_s('/metrics')}",
        "    authorization:",
        f"      type: {_s('Bearer')}",
        f"      credentials_file: {_s(f'{root}/secrets/{KEY_FILE}')}",
    ]
    if scheme == "https":
        lines += [
            "    # the certificate is not verified: it names the stack's public address, and",
            "    # Prometheus reaches the gateway on the head's own loopback (nothing leaves it)",
            "    tls_config:",
            "      insecure_skip_verify: true",
        ]
    lines.append("    static_configs:")
    for m in spec.models:
        for r in m.replicas:
            lines += [f"      - targets: [{_s(address)}]",
                      "        labels:",
                      f"          model: {_s(m.name)}",
                      f"          replica: {_s(r)}"]
    lines += [
        "    relabel_configs:",
        "      # a __param_<name> label is the scrape's URL parameter <name>:",
        "      # ?model=<served name>&replica=<node>",
        f"      - source_labels: [{_s('model')}]",
        f"        target_label: {_s('__param_model')}",
        f"      - source_labels: [{_s('replica')}]",
        f"        target_label: {_s('__param_replica')}",
        "      # one target per replica: its instance names the replica, not the gateway",
        f"      - source_labels: [{_s('model')}, {_s('replica')}]",
        f"        separator: {_s('@')}",
        f"        target_label: {_s('instance')}",
    ]
    if spec.nodes:
        lines += ["  # each node's exporter", f"  - job_name: {_s('node')}",
                  "    static_configs:"]
        for n in spec.nodes:
            lines += [f"      - targets: [{_s(n.address)}]",
                      "        labels:",
                      f"          node: {_s(n.node)}"]
    return {CONFIG_FILE: "\n".join(lines) + "\n", RULES_FILE: rules(spec)}


def _lasting(seconds: int) -> str:
    return f" for {_seconds(seconds)}" if seconds else ""


def _alert(name: str, expr: str, seconds: int | None, severity: str, summary: str,
           description: str) -> list[str]:
    lines = [f"      - alert: {_s(name)}", f"        expr: {_s(expr)}"]
    if seconds:  # `for: 0s` is the default: a duration of 0 fires at the first evaluation
        lines.append(f"        for: {_s(_seconds(seconds))}")
    return [
        *lines,
        "        labels:",
        f"          severity: {_s(severity)}",
        "        annotations:",
        f"          summary: {_s(summary)}",
        f"          description: {_s(description)}",
    ]


def rules(spec: MonitoringSpec) -> str:
    """The stack's alert rules, one group (GROUP): see the module's docstring. Every alert
    carries the labels of its series (`model` and `replica` for vLLM's, `node` for a node's)
    and `severity`. The reconcile's (tools/reconcile.py) read what its last run left in the
    head exporter's textfile folder: drift it saw and did not repair, a run that failed, or no
    run for RECONCILE_STALE_RUNS of its intervals; none of them fires for a stack whose
    reconcile never ran."""
    stack = plain(spec.stack)
    model, node = "{{ $labels.model }}", "{{ $labels.node }}"
    replica = "{{ $labels.replica }}"
    window = _seconds(spec.crash_loop_window_seconds)
    oom_window = _seconds(spec.oom_killed_seconds)
    kv = repr(float(spec.kv_cache_usage))
    lines = [
        "# spark-vllm's alert rules: written by the stack (hostscripts/monitoring.py), loaded by",
        "# prometheus.yml. https://prometheus.io/docs/prometheus/latest/configuration/"
        "alerting_rules/",
        "groups:",
        f"  - name: {_s(GROUP)}",
        "    rules:",
        *_alert(
            "SparkVllmModelNotServing", 'up{job="vllm"} == 0', spec.not_serving_seconds,
            "critical", f"Model {model} is not serving on {replica} (stack {stack})",
            f"Prometheus could not scrape the metrics of {model}'s vLLM on {replica} through "
            "the gateway"
            f"{_lasting(spec.not_serving_seconds)}: its vLLM is down, starting or not "
            "answering, or the gateway is."),
        *_alert(
            # vLLM's API server exports the standard process collector through /metrics: a new
            # process is a new start time
            "SparkVllmCrashLoop",
            f'changes(process_start_time_seconds{{job="vllm"}}[{window}]) > '
            f"{int(spec.crash_loop_restarts)}", None,
            "critical", f"Model {model} is crash-looping (stack {stack})",
            f"The vLLM serving {model} started again {{{{ $value }}}} times within {window}, "
            f"more than {int(spec.crash_loop_restarts)}: see `spark-vllm status` and its "
            "container's log."),
        *_alert(
            "SparkVllmKvCacheFull", f'vllm:kv_cache_usage_perc{{job="vllm"}} > {kv}',
            spec.kv_cache_seconds, "warning",
            f"Model {model}'s KV cache is nearly full (stack {stack})",
            f"vLLM's KV cache for {model} is {{{{ $value | humanizePercentage }}}} used, above "
            f"{kv}{_lasting(spec.kv_cache_seconds)}: requests queue or are preempted."),
        *_alert(
            "SparkVllmRequestsWaiting", 'vllm:num_requests_waiting{job="vllm"} > 0',
            spec.waiting_seconds, "warning", f"Requests wait for model {model} (stack {stack})",
            f"Requests to {model} have been waiting{_lasting(spec.waiting_seconds)} "
            "({{ $value }} now): it gets more requests than it serves at once."),
        *_alert(
            "SparkNodeMemoryLow",
            f'node_memory_MemAvailable_bytes{{job="node"}} < {int(spec.os_reserve_bytes)}',
            spec.memory_seconds, "critical", f"Node {node} is low on memory (stack {stack})",
            f"{node} has {{{{ $value | humanize1024 }}}}B available, below the OS reserve "
            f"({int(spec.os_reserve_bytes)} bytes, preflight.osReserveBytes)"
            f"{_lasting(spec.memory_seconds)}: the kernel may kill a process."),
        *_alert(
            "SparkNodeExporterDown", 'up{job="node"} == 0', NODE_EXPORTER_DOWN_SECONDS,
            "warning", f"Node {node}'s exporter is down (stack {stack})",
            f"Prometheus could not scrape {node}'s node exporter"
            f"{_lasting(NODE_EXPORTER_DOWN_SECONDS)}: the node, its exporter or the fabric "
            "between it and the head is down."),
        *_alert(
            # the guard's early OOM killer counts its kills in the node exporter's textfile
            # (hostscripts/guard.py); the kernel's own in /proc/vmstat (oom_kill): either one
            # within the window, once per node
            "SparkVllmOomKilled",
            f'increase(spark_vllm_oom_kills_total{{job="node"}}[{oom_window}]) > 0 or '
            f'increase(node_vmstat_oom_kill{{job="node"}}[{oom_window}]) > 0', None,
            "critical", f"A process was OOM-killed on node {node} (stack {stack})",
            f"{node} ran out of memory within the last {oom_window}: the early OOM killer of "
            "the stack's guard (at the OS reserve, preflight.osReserveBytes) or the kernel "
            "killed a process, the stack's vLLM first. `spark-vllm status` says which and how "
            "much memory the node had left."),
        *_alert(
            "SparkVllmDriftNotRepaired", 'spark_vllm_reconcile_result{result="refused"} == 1',
            None, "warning", f"Drift not repaired (stack {stack})",
            "The last `spark-vllm reconcile` run found the stack changed and did not apply the "
            "repair (a change outside the classes it repairs, a policy violation, a node it "
            "could not reach, or the stack file edited since the last update): see its line "
            "in the reconcile's log (journalctl --user -u spark-vllm-reconcile-<stack>)."),
        *_alert(
            "SparkVllmReconcileFailed", 'spark_vllm_reconcile_result{result="failed"} == 1',
            None, "critical", f"The reconcile run failed (stack {stack})",
            "The last `spark-vllm reconcile` run failed (its preview or its up): the stack may "
            "be drifted and nothing repairs it; see the reconcile's log."),
        *_alert(
            "SparkVllmReconcileStale",
            f"time() - spark_vllm_reconcile_last_run_timestamp_seconds > "
            f"{RECONCILE_STALE_RUNS} * spark_vllm_reconcile_interval_seconds", None, "warning",
            f"No reconcile run lately (stack {stack})",
            f"`spark-vllm reconcile` has not reported for {RECONCILE_STALE_RUNS} of its "
            "intervals: its timer is stopped, the control machine is down, or it cannot reach "
            "the head."),
    ]
    return "\n".join(lines) + "\n"


def config_hash(files: Mapping[str, str]) -> str:
    """A short content hash of the configuration files (names the folder they go in)."""
    return dm.files_hash(json.dumps(dict(files), sort_keys=True, separators=(",", ":")))


def daemon(names: StackNames) -> dm.Daemon:
    """Prometheus as a configured daemon on the head (hostscripts/daemon.py): reloaded by SIGHUP
    (it reads its configuration and its rule files again; a configuration it refuses leaves the
    one it runs).

    Prometheus is a Go program: a SIGHUP that arrives before it asks for that signal, in its
    first milliseconds, kills it, and Go catches SIGHUP from its start, so /proc's SigCgt cannot
    tell (measured with 2.42). The reload waits until its main process has run
    RELOAD_MIN_AGE_SECONDS."""
    return dm.Daemon(name="prometheus", config="monitoring", container=names.prometheus,
                     dir=names.monitoring_dir, signal="HUP",
                     wait=dm.wait_age(RELOAD_MIN_AGE_SECONDS))


def key_write(names: StackNames) -> str:
    """On the head: the stack's API key (stdin, the key itself) into its root-only file, and a
    running Prometheus reloaded. Prints the file's sha256. (Prometheus reads `credentials_file`
    again for every scrape; the reload makes a new key take at once whatever the version.)"""
    return dm.secret_write(daemon(names), names.monitoring_key_file, "monitoring key")


def key_remove(names: StackNames) -> str:
    """The key file removed, with its folders as far as they are empty."""
    return stack_path_remove(names, names.monitoring_key_file, tree=True)


def reload_lines(names: StackNames) -> list[str]:
    """Shell lines: Prometheus, if it runs, reloaded (`daemon`; hostscripts/daemon.py
    reload_lines says why the signal goes to the process, never through `docker kill -s`)."""
    return dm.reload_lines(daemon(names))


def config_write(names: StackNames, files: Mapping[str, str], image: str,
                 labels: Mapping[str, str]) -> str:
    """On the head: the configuration into a new folder `conf.<hash>`, checked by the Prometheus
    image's own `promtool check config` (which checks the rule files prometheus.yml loads, and
    that the key file it names is there), then made the one in use (`conf` is a link, swapped
    atomically) and the running Prometheus reloaded (reload_lines): the daemon's config_write
    (hostscripts/daemon.py). A check that fails fails the command and leaves the configuration
    in use as it was. Nothing secret is in its text. Prints `monitoring config <hash>`."""
    digest = config_hash(files)
    image = image_id(image)  # read back from the head: its exact form before a shell sees it
    d = daemon(names)
    new = f"{d.dir}/conf.{digest}"
    check_labels = {**labels, lbl.ROLE: lbl.PROMETHEUS_CHECK}
    if set(files) != {CONFIG_FILE, RULES_FILE}:
        raise ValueError(f"expected the files {CONFIG_FILE} and {RULES_FILE}: {sorted(files)}")
    for path in files:
        if not _FILE.fullmatch(path):
            raise ValueError(f"not a monitoring file name: {path!r}")
    check = dm.check_run(
        check_labels, [q(new + ":" + MONITORING_MOUNT + "/conf:ro"),
                       q(d.dir + "/secrets:" + MONITORING_MOUNT + "/secrets:ro")],
        "promtool", image, f"check config {q(MONITORING_MOUNT + '/conf/' + CONFIG_FILE)} >&2")
    return dm.config_write(d, sorted(files.items()), digest, check)


def config_remove(names: StackNames) -> str:
    """Prometheus's configuration folders (its key file goes with its own command)."""
    return dm.config_remove(daemon(names), names.dir)


def data_write(names: StackNames, guard: bool = False) -> str:
    """On the head: Prometheus's and Alertmanager's data folders (root only: both run as root
    to read their root-only files), and the exporter's textfile folder the reconcile writes its
    results into (readable by the exporter, which runs as nobody; nothing secret goes there).
    With `guard`, that folder also holds a relative link to the guard's count of OOM kills
    (hostscripts/guard.METRICS): node_exporter 1.5 reads one textfile folder, and follows a link
    (a relative one resolves the same under the exporter's /host). Prints the data folders'
    paths."""
    p, a = names.prometheus_data_dir, names.alertmanager_data_dir
    text = textfile_dir(names.stack)
    link = f"{text}/{posixpath.basename(GUARD_METRICS)}"
    return "\n".join([
        "set -eu",
        "umask 077",
        f"mkdir -p {q(p)} {q(a)}",
        f"chmod 700 {q(p)} {q(a)}",
        f"mkdir -p {q(text)}",
        f"chmod 755 {q(TEXTFILE_ROOT)} {q(text)}",
        f"ln -sfn {q(posixpath.relpath(GUARD_METRICS, text))} {q(link)}" if guard
        else f"rm -f {q(link)}",
        f"echo {q('prometheus data ' + p)}",
        f"echo {q('alertmanager data ' + a)}",
    ])


def data_remove(names: StackNames, keep: bool) -> str:
    """On `pulumi destroy`: the data folders removed, or, with `keep`
    (monitoring.keepDataOnDestroy), left where they are, saying so. The textfile folder goes
    either way (the reconcile's last results: its next run writes them again)."""
    p, a = names.prometheus_data_dir, names.alertmanager_data_dir
    text = textfile_dir(names.stack)
    gone = f"rm -rf {q(text)}; rmdir {q(TEXTFILE_ROOT)} 2>/dev/null || true"
    if keep:
        kept = f"prometheus data kept (monitoring.keepDataOnDestroy): {p}"
        return "; ".join([gone, f"echo {q(kept)}", f"echo {q(f'alertmanager data kept: {a}')}"])
    return "; ".join([gone, stack_path_remove(names, a, tree=True),
                      stack_path_remove(names, p, tree=True)])


def entrypoint() -> list[str]:
    """Resolved on the image's PATH: upstream's prom/prometheus has /bin/prometheus, Debian's
    package /usr/bin/prometheus."""
    return ["prometheus"]


def command(listen: str, port: int, retention_days: int) -> list[str]:
    """Prometheus reading the configuration in use, its data in PROMETHEUS_DATA (the data
    folder's mount), its API and UI on `listen`:`port` (an address of the head)."""
    return [
        f"--config.file={MONITORING_MOUNT}/conf/{CONFIG_FILE}",
        f"--storage.tsdb.path={PROMETHEUS_DATA}",
        f"--storage.tsdb.retention.time={int(retention_days)}d",
        f"--web.listen-address={plain(listen)}:{int(port)}",
    ]


def node_exporter_entrypoint() -> list[str]:
    """Upstream's binary name (prom/node-exporter); the lab's image provides it too."""
    return ["node_exporter"]


def node_exporter_command(listen: str, port: int, textfile: str | None = None) -> list[str]:
    """The exporter on `listen`:`port`, reading the node's / that its container sees read-only
    at HOST_ROOT, and the node's /proc as the node's own processes see it (HOST_ROOT/proc: the
    same as the container's on a Spark; in the lab, each simulated node's memory: lab/README.md);
    with `textfile` (a folder of the node: the head's textfile_dir, the guard's metrics folder
    elsewhere) also the `*.prom` files there (its textfile collector; node_exporter 1.5 reads one
    folder, so the head's holds a link to the guard's count: data_write)."""
    argv = [f"--web.listen-address={plain(listen)}:{int(port)}", f"--path.rootfs={HOST_ROOT}",
            f"--path.procfs={HOST_ROOT}/proc"]
    if textfile is not None:
        argv.append(f"--collector.textfile.directory={HOST_ROOT}{plain(textfile)}")
    return argv


def gate_targets(spec: MonitoringSpec) -> list[dict[str, str]]:
    """The targets the gate waits for: one per replica of every served model, one per node
    exporter."""
    return [*({"job": "vllm", "model": m.name, "replica": r} for m in spec.models
              for r in m.replicas),
            *({"job": "node", "node": n.node} for n in spec.nodes)]


def gate_script(names: StackNames, marker: str, url: str, spec: MonitoringSpec,
                timeout: int) -> str:
    """On the head, after Prometheus's and Alertmanager's containers and configurations: each is
    started if recon found it stopped, then payloads/monitoring_health.py (the head's python3)
    proves it from the head: both are ready, every replica's and node's target is up (scraped,
    with the key, through the gateway), the rule group holds every alert, and Prometheus sends
    to Alertmanager.

    `marker`: the containers' IDs and the configurations' hashes (gate_marker), so a new
    container or configuration runs the gate again."""
    want: dict[str, object] = {"targets": gate_targets(spec), "group": GROUP,
                               "rules": list(ALERTS)}
    if spec.alertmanager is not None:
        want["alertmanager"] = spec.alertmanager
    expected = json.dumps(want, sort_keys=True, separators=(",", ":"))
    return dm.gate_script(
        "monitoring", marker,
        [names.prometheus, *([names.alertmanager] if spec.alertmanager else [])],
        f"python3 -c {q(_GATE_PY)} {q(url)} {q(expected)} {int(timeout)}")


def exporter_start_script(names: StackNames, container_id: str) -> str:
    """On a node, after its exporter's container: started if it is not running (recon found it
    stopped by hand: Docker's policy does not restart a manual stop). Its container ID is in the
    text, so a new container runs it again. Prints the exporter's state."""
    return "\n".join([
        "set -eu",
        f"# node exporter: {container_ids(container_id)}",
        *dm.start_lines(names.node_exporter, said="node exporter"),
    ])


def gate_marker(container_id: str, config_stdout: str, *more: str) -> str:
    """The gate's marker: the container's ID (checked) and the configuration's hash, then
    Alertmanager's container ID and configuration hash (the same, when it runs)."""
    words = [container_ids(container_id), dm.config_digest(config_stdout, "monitoring")]
    if more:
        am_id, am_stdout = more
        words += [container_ids(am_id), dm.config_digest(am_stdout, "alertmanager")]
    return " ".join(words)
