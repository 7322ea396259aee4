"""`spark-vllm status`: every model of a stack, serving or not, and every node's memory.

One ssh round trip per node, all nodes in parallel (the tool, tools/status.py, runs them), each
a read-only bash script in recon's frame (inspection/snippets/survey.sh: sections marked with a
fresh nonce, every command under `timeout`), with these sections:

- `clock`, `meminfo`, `docker_ps`, `container_memory`: the node's time, its memory, every
  container and what each holds (as recon reads them);
- `state:<container>`: Docker's state of each of the stack's containers on the node (running or
  not, since when, how often Docker restarted it, its last exit code);
- `starts:<container>`: for each container the liveness watchdog runs in (the main model's API
  container, each service's), the starts it recorded (hostscripts/payloads/vllm_liveness.py):
  how many restarts in the crash-loop window, and whether it is crash-looping;
- `probe:<container>`: the same containers' vLLM as they see it
  (hostscripts/payloads/vllm_probe.py, run in the container, the API key on stdin from the
  node's root-only key file): /health, /v1/models, and vLLM's metrics sampled twice a second
  apart (requests running and waiting, KV cache use, tokens/s);
- `firewall` (with `firewall.enabled`): the stack's nftables table as JSON (`nft -j list
  table`; hostscripts/firewall.counters_script), read for what each rule dropped; a table that
  is not loaded, or an answer that cannot be read, is a problem of the node;
- `drafter` (only with `model.drafter`): the node's HF cache listing for the speculative
  drafter's repo (recon's hf_cache.sh), so status names the drafter and whether its commit's
  snapshot is on every node (`drafter_states`);
- `oom_kills` (with `guard.enabled`): the kills the node's early OOM killer recorded (the
  guard's record, hostscripts/guard.py), each with the node's available memory then; with the
  watchdog's `oom` records and Docker's `State.OOMKilled`, what makes a model "OOM-killed at T
  (node available X GiB)";
- `deployment:<container>`: for the same containers, the model's last verified deployment
  recorded on the node and whether the running container is it (hostscripts/payloads/
  deployment.py `status`, the node's python3: issue 49);
- `alerts` (the head, only with `monitoring.enabled`): the alerts the stack's Prometheus has
  pending or firing (its /api/v1/alerts, asked with the head's own python3 at
  `prometheus_url`); an answer that cannot be read is a problem, never "no alerts";
- `collective` (the head): the collective bandwidth gate's last record
  (StackNames.collective_record, components/collective.py) and when it was written: the
  fabric's measured bus bandwidth against the threshold.
- `gateway` (the head): the gateway's counters from HAProxy's stats socket
  (hostscripts/payloads/gateway_stats.py with the head's python3): connections now and its
  limit, connections refused as they arrived by the per-source limits, and per client address
  seen in the last 10 minutes its connections and 401s (issue 46).
- `am_alerts`, `am_metrics` (the head, with `monitoring.enabled`): what the stack's Alertmanager
  holds and has sent: its /api/v2/alerts (each alert, active or suppressed by an inhibition or
  a silence, the receivers it goes to, since when and when Prometheus last sent it) and the
  notification counters of its /metrics (`alertmanager_notifications_total` and `_failed_total`
  per integration: webhook, email). Alertmanager keeps no list of the notifications themselves
  (its notification log is internal): the counters say how many went, the alerts' times when.

`node_script` builds a node's script (pure), `parse_node` reads its output into NodeStatus
(pure), `model_states` turns the nodes' NodeStatus into one ModelStatus per model. A section
that cannot be read is never taken for good news: the model's state is `unknown` with the
reason, and only `serving` counts as serving.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from config import NodeConfig, StackConfig
from config.listen import LOOPBACK, service_host, vllm_host
from hostscripts.common import payload, plain, repo_dir
from hostscripts.deployment import status_args
from hostscripts.firewall import counters_script as firewall_counters
from hostscripts.gateway import SOURCE_TABLE
from hostscripts.guard import KILLS as GUARD_KILLS
from hostscripts.paths import GATEWAY_STATS_SOCKET, LIVENESS_STARTS, StackNames
from inspection import parsers as p
from inspection import recon
from inspection.collective import GateRecord, parse_record
from inspection.facts import HfRepoFacts, OomKill
from inspection.parsers import ParseError
from inspection.preflight import oom_text
from inspection.recon import recent_restarts

STATE_TIMEOUT = 15
PROBE_TIMEOUT = 25  # the probe's calls are 5 s each, and it sleeps 1 s between the samples
ALERTS_TIMEOUT = 15  # the request itself gives up after 10 s
ALERTS_MAX_BYTES = 1 << 20  # a longer answer is refused (a problem), not cut
ALERTS_KEPT = 100  # at most this many alerts are kept (and shown); the rest are counted
State = Literal["serving", "starting", "crash-looping", "stopped", "missing", "unknown"]


def _probe_py() -> str:
    return payload("vllm_probe.py")


# The head's python3 (standard library only, no proxy from the environment): Prometheus's
# alerts API, printed as it answered. argv: the URL. An error is one line on stderr, exit 1.
_ALERTS_PY = f"""import sys, urllib.request
url = sys.argv[1]
try:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
    with opener.open(url, timeout=10) as r:
        body = r.read({ALERTS_MAX_BYTES} + 1)
except Exception as e:
    sys.exit("%s: %r" % (url, e))
if len(body) > {ALERTS_MAX_BYTES}:
    sys.exit("%s: the answer is longer than {ALERTS_MAX_BYTES} bytes" % url)
sys.stdout.write(body.decode("utf-8", "replace"))
"""


# the collective gate's record with its time (the file's mtime, the node's clock), or absent
GATE_RECORD = ('if [ -s "$1" ]; then stat -c %Y "$1"; head -c 65536 "$1" | head -n 1; '
               'else echo absent; fi')
def alertmanager_url(cfg: StackConfig) -> str:
    """Alertmanager's API as the head reaches it (beside Prometheus: components/monitoring.py)."""
    m = cfg.monitoring
    host = LOOPBACK if m.listen == "loopback" else cfg.head.fabric[0].ip
    return f"http://{host}:{m.alertmanager_port}"


def prometheus_url(cfg: StackConfig) -> str:
    """Prometheus's API as the head reaches it (components/monitoring.py listens there): the
    head's loopback with `monitoring.listen: loopback`, its first fabric address with
    `fabric`."""
    m = cfg.monitoring
    host = LOOPBACK if m.listen == "loopback" else cfg.head.fabric[0].ip
    return f"http://{host}:{m.port}"


@dataclass(frozen=True)
class Watched:
    """A container of the stack on one node, and for an API container where its vLLM listens
    and which key file holds its API key."""

    container: str
    url: str = ""  # "" for a container with no API of its own (a rank, Ray, the gateway)
    key_file: str = ""
    record: str = ""  # the model's record folder on this node (StackNames.deployment_dir)


@dataclass(frozen=True)
class Model:
    """One model of the stack: its served name and, per node, its containers. `api` is the
    (node, container) that serves its API; every other container is a rank (or Ray) it needs."""

    name: str
    kind: str  # "main" or the service's task
    api: tuple[str, str]
    needs: tuple[tuple[str, str], ...]


def models(cfg: StackConfig, names: StackNames) -> list[Model]:
    """The stack's models and the containers each depends on, from its config."""
    head = cfg.head.name
    needs: list[tuple[str, str]] = []
    if cfg.vllm.executor == "mp":
        needs += [(n.name, names.serve) for n in cfg.nodes if n.name != head]
    else:
        needs += [(head, names.ray_head)]
        needs += [(n.name, names.ray_worker) for n in cfg.nodes if n.name != head]
    out = [Model(cfg.vllm.served_model_name, "main", (head, names.serve), tuple(needs))]
    for svc in cfg.services:
        svc_nodes = svc.nodes or [head]
        out.append(Model(svc.served_name, svc.task, (svc_nodes[0], names.service(svc.name)),
                         tuple((n, names.service(svc.name)) for n in svc_nodes[1:])))
    return out


def watched(cfg: StackConfig, names: StackNames, node: NodeConfig) -> list[Watched]:
    """The stack's containers on `node`, in a fixed order; the API containers with their URL
    and key file."""
    out: list[Watched] = []
    head = node.name == cfg.head.name
    if head:
        out.append(Watched(names.serve, f"http://{vllm_host(cfg)}:{cfg.vllm.port}",
                           names.vllm_key_file, names.deployment_dir()))
    elif cfg.vllm.executor == "mp":
        out.append(Watched(names.serve))
    if cfg.vllm.executor != "mp":
        out.append(Watched(names.ray_head if head else names.ray_worker))
    for svc in cfg.services:
        svc_nodes = svc.nodes or [cfg.head.name]
        if node.name in svc_nodes:
            out.append(Watched(names.service(svc.name),
                               f"http://{service_host(cfg, node.name)}:{svc.port}",
                               names.service_key_file(svc.name),
                               names.deployment_dir(svc.name)))
    if head:
        out.append(Watched(names.gateway))
    return out


def node_script(cfg: StackConfig, names: StackNames, node: NodeConfig, nonce: str) -> str:
    """The read-only bash script `node` runs for `spark-vllm status` (pure)."""
    q = shlex.quote
    lines = [
        "# spark-vllm status (read-only); generated by inspection/status.py",
        f"# node: {plain(node.name)}",
        "main() {",
        f"SV_NONCE={recon._check_nonce(nonce)}",
        recon.snippet("survey.sh").rstrip("\n"),
        f"sv_run clock {recon.COMMAND_TIMEOUT} date +%s.%N",
        f"sv_bg meminfo {recon.COMMAND_TIMEOUT} cat /proc/meminfo",
        f"sv_bg docker_ps {recon.DOCKER_TIMEOUT} docker ps -a --no-trunc --format '{{{{json .}}}}'",
        f"sv_bg container_memory {recon.DOCKER_TIMEOUT} bash -c "
        f"{q(recon.snippet('container_memory.sh'))} _ {q(recon.CGROUP_ROOT)}",
    ]
    if cfg.guard.enabled:
        lines.append(f"sv_bg oom_kills {recon.COMMAND_TIMEOUT} bash -c {q(recon.READ_KILLS)} _ "
                     f"{q(GUARD_KILLS)}")
    for w in watched(cfg, names, node):
        c = q(w.container)
        lines.append(f"sv_bg state:{w.container} {STATE_TIMEOUT} docker inspect -f "
                     f"'{{{{.RestartCount}}}} {{{{json .State}}}}' {c}")
        if w.url:
            lines.append(f"sv_bg starts:{w.container} {STATE_TIMEOUT} bash -c "
                         f"{q(recon.READ_STARTS)} _ {c} {q(LIVENESS_STARTS)}")
            probe = f"docker exec -i {c} python3 -c {q(_probe_py())} {q(w.url)} < {q(w.key_file)}"
            lines.append(f"sv_bg probe:{w.container} {PROBE_TIMEOUT} bash -c {q(probe)}")
            lines.append(f"sv_bg deployment:{w.container} {STATE_TIMEOUT} bash -c "
                         f"{q(status_args(w.record, w.container))}")
    if node.name == cfg.head.name:
        lines.append(f"sv_bg collective {STATE_TIMEOUT} bash -c {q(GATE_RECORD)} _ "
                     f"{q(names.collective_record)}")
    if cfg.firewall.enabled:
        lines.append(f"sv_bg firewall {recon.COMMAND_TIMEOUT} bash -c "
                     f"{q(firewall_counters(names))}")
    if cfg.model.drafter is not None:
        listing = recon.snippet("hf_cache.sh")
        lines.append(f"sv_bg drafter {recon.DOCKER_TIMEOUT} bash -c {q(listing)} _ "
                     f"{q(cfg.model.cache_dir)} {q(names.model_record_dir)} "
                     f"{q(repo_dir(cfg.model.drafter.repo))}")
    if cfg.monitoring.enabled and node.name == cfg.head.name:
        lines.append(f"sv_bg alerts {ALERTS_TIMEOUT} python3 -c {q(_ALERTS_PY)} "
                     f"{q(prometheus_url(cfg) + '/api/v1/alerts')}")
        for section, path in (("am_alerts", "/api/v2/alerts"), ("am_metrics", "/metrics")):
            lines.append(f"sv_bg {section} {ALERTS_TIMEOUT} python3 -c {q(_ALERTS_PY)} "
                         f"{q(alertmanager_url(cfg) + path)}")
    if node.name == cfg.head.name:
        lines.append(f"sv_bg gateway {STATE_TIMEOUT} python3 -c {q(payload('gateway_stats.py'))} "
                     f"{q(names.gateway_run_dir + '/' + GATEWAY_STATS_SOCKET)}")
    lines += ["wait", 'cat "$SV_DIR"/out.*', 'rm -rf "$SV_DIR"', "}", "main", "exit 0", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- parsing


@dataclass
class ContainerStatus:
    name: str
    exists: bool = False
    status: str = ""  # Docker's: running, restarting, exited, ...
    started_at: str = ""  # RFC 3339, Docker's
    restart_count: int = 0  # Docker's restarts since the container was created
    exit_code: int | None = None
    memory_bytes: int | None = None
    problem: str = ""  # why the state could not be read ("" when it was)
    # the watchdog's record (API containers): restarts in the window, the last start and the
    # last time it served (node clock), None when it has no record
    restarts_in_window: int | None = None
    last_start: float | None = None
    last_serving: float | None = None
    unready_starts: int = 0  # starts in a row since vLLM last answered
    oom_killed: bool = False  # Docker's State.OOMKilled: its last exit was the kernel's OOM kill
    ooms: list[OomKill] = field(default_factory=list)  # the watchdog's OOM records (node clock)
    probe: dict[str, Any] | None = None
    probe_problem: str = ""
    # the model's last verified deployment on this node and whether this container is it
    # (parse_deployment); None with deployment_problem when it could not be read
    deployment: dict[str, Any] | None = None
    deployment_problem: str = ""


@dataclass(frozen=True)
class Alert:
    """An alert the stack's Prometheus has pending or firing (hostscripts/monitoring.py `rules`
    names them), each text printable and capped."""

    name: str  # the alertname label
    state: Literal["firing", "pending"]
    model: str = ""  # the `model` label (vLLM's alerts)
    node: str = ""  # the `node` label (a node's alerts)
    active_at: str = ""  # RFC 3339, Prometheus's: since when it is pending (then firing)
    summary: str = ""  # the `summary` annotation

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GatewayCounters:
    """What the gateway's HAProxy counts (its stats socket, read on the head): connections now
    and its limit (`maxconn`), connections since it started and those refused as they arrived
    by the per-source limits (`dcon`: gateway.maxConnectionsPerSource,
    gateway.unauthorizedPerMinute), and the client addresses seen in the last
    hostscripts.gateway.SOURCE_MEMORY_SECONDS: how many, the 401s they got, and those past a
    limit now."""

    connections: int
    connection_limit: int
    connections_total: int
    refused: int
    sources: int
    unauthorized: int
    over_limit: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {"connections": self.connections, "connectionLimit": self.connection_limit,
                "connectionsTotal": self.connections_total, "refused": self.refused,
                "sources": self.sources, "unauthorized": self.unauthorized,
                "overLimit": list(self.over_limit)}


class GatewayError(ValueError):
    """The gateway's stats are not what HAProxy's management guide documents."""


_TABLE_ROW = re.compile(r"0x[0-9a-f]+: key=(\S+) use=\d+ exp=\d+ gpc0=(\d+) "
                        r"gpc0_rate\(\d+\)=(\d+) conn_cur=(\d+)")


def parse_gateway(text: str, max_connections: int, unauthorized_per_minute: int
                  ) -> GatewayCounters:
    """payloads/gateway_stats.py's output -> GatewayCounters (pure): `show stat` as CSV (the
    frontend `api`'s row), `show table api` one line per address
    (https://docs.haproxy.org/2.6/management.html, "show stat", "show table"). Anything else is
    a GatewayError: unknown is never taken for "nothing refused"."""
    parts: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = parts.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    stat, table = parts.get("show stat"), parts.get(f"show table {SOURCE_TABLE}")
    if stat is None or table is None:
        raise GatewayError("the stats socket's answer lacks `show stat` or `show table`")
    rows = list(csv.DictReader(io.StringIO("\n".join(stat).lstrip("# "))))
    front = next((r for r in rows if r.get("pxname") == SOURCE_TABLE
                  and r.get("svname") == "FRONTEND"), None)
    if front is None:
        raise GatewayError(f"`show stat` has no row for the frontend {SOURCE_TABLE}")
    try:
        numbers = {k: int(front[k]) for k in ("scur", "slim", "conn_tot", "dcon")}
    except (KeyError, TypeError, ValueError) as exc:
        raise GatewayError(f"`show stat` lacks a count of the frontend ({exc})") from None
    if not table or not table[0].startswith(f"# table: {SOURCE_TABLE},"):
        raise GatewayError(f"`show table {SOURCE_TABLE}` answered "
                           f"{recon.printable(table[0] if table else '', 120)!r}")
    sources, unauthorized, over = 0, 0, []
    for line in table[1:]:
        if not line.strip():
            continue
        m = _TABLE_ROW.fullmatch(line.strip())
        if m is None:
            raise GatewayError(f"`show table {SOURCE_TABLE}` has a line "
                               f"{recon.printable(line, 120)!r}")
        sources += 1
        unauthorized += int(m.group(2))
        if int(m.group(3)) > unauthorized_per_minute or int(m.group(4)) > max_connections:
            over.append(recon.printable(m.group(1), 64))
    return GatewayCounters(numbers["scur"], numbers["slim"], numbers["conn_tot"],
                           numbers["dcon"], sources, unauthorized, tuple(sorted(over)))


@dataclass(frozen=True)
class Notice:
    """An alert the stack's Alertmanager holds: whether it goes out (`active`) or is held back
    (`suppressed`: inhibited by another alert, e.g. its node down, or silenced), the receivers
    it goes to, since when it fires and when Prometheus last sent it."""

    name: str
    state: str  # active | suppressed | unprocessed (Alertmanager's)
    model: str = ""
    replica: str = ""
    node: str = ""
    receivers: tuple[str, ...] = ()
    inhibited: bool = False
    silenced: bool = False
    starts_at: str = ""
    updated_at: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "receivers": list(self.receivers)}


@dataclass
class Notifications:
    """Alertmanager's view: its alerts, and per integration the notifications it attempted
    and those that failed."""

    alerts: list[Notice]
    sent: dict[str, dict[str, int]]  # integration -> {"attempted": n, "failed": m}
    omitted: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"alerts": [a.as_json() for a in self.alerts], "sent": self.sent,
                "alertsOmitted": self.omitted}


@dataclass
class NodeStatus:
    node: str
    clock: float | None = None
    memory_total: int | None = None
    memory_available: int | None = None
    containers: dict[str, ContainerStatus] = field(default_factory=dict)  # the stack's
    # every running container on the node: name -> memory bytes (None: unknown); foreign too
    memory: dict[str, int | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    error: str = ""  # the node could not be reached (then nothing else is known)
    # the head with monitoring.enabled: Prometheus's pending and firing alerts, firing first
    # (at most ALERTS_KEPT); None when not asked, or when they could not be read (a problem)
    alerts: list[Alert] | None = None
    alerts_omitted: int = 0  # alerts beyond ALERTS_KEPT, counted, not kept
    # the head: the collective gate's last record and when it was written (node clock); None
    # when there is none (collective_problem says so, or why it could not be read)
    collective: GateRecord | None = None
    collective_at: float | None = None
    collective_problem: str = ""
    # the head: the gateway's counters; None when not asked, or when they could not be read
    # (a problem)
    gateway: GatewayCounters | None = None
    # firewall.enabled: packets each rule of the stack's table dropped since it was loaded
    # ({rule: packets}); None when the table is not loaded or could not be read (a problem)
    dropped: dict[str, int] | None = None
    # with model.drafter: the drafter's repo as the node's HF cache holds it (None: not
    # asked, or it could not be read: a problem says why)
    drafter: HfRepoFacts | None = None
    drafter_read: bool = False  # the listing was read (the repo may be absent from it)
    # the kills the node's guard recorded (node clock, oldest first); None: not read
    oom_kills: list[OomKill] | None = None
    # the head with monitoring.enabled: what its Alertmanager holds and sent; None when not
    # asked, or when it could not be read (a problem)
    notifications: Notifications | None = None


def _section_text(sections: dict[str, recon.Section], name: str) -> tuple[str | None, str]:
    """(stdout, "") of a section that ran and exited 0, else (None, why not)."""
    s = sections.get(name)
    if s is None:
        return None, "no answer"
    if s.problem:
        return None, s.problem
    if s.rc is None:
        return None, "cut short"
    if s.rc != 0:
        return None, s.first_error_line or f"exit code {s.rc}"
    return s.stdout, ""


def parse_starts(text: str, now: float, window: float) -> tuple[int, float | None, float | None,
                                                                int]:
    """The watchdog's starts file -> (restarts within `window` before `now`, the last start,
    the last time it served, starts since it last served)."""
    events = p.parse_liveness_starts(text)
    starts = [t for t, w in events if w == "start"]
    serving = [t for t, w in events if w == "serving"]
    unready = 0
    for _t, w in reversed(events):
        if w == "serving":
            break
        unready += 1
    return (recent_restarts(starts, now, window), starts[-1] if starts else None,
            serving[-1] if serving else None, unready)


class AlertsError(ValueError):
    """Prometheus's alerts answer is not what its API documents."""


def _label(d: dict[str, Any], key: str, what: str, limit: int) -> str:
    v = d.get(key, "")
    if not isinstance(v, str):
        raise AlertsError(f"{what} {key} is {type(v).__name__}, not a string")
    return recon.printable(v, limit)


def parse_alerts(text: str) -> list[Alert]:
    """Prometheus's /api/v1/alerts answer -> its alerts, firing first, then by name, model and
    node (pure). Every field is checked for its type; anything else than the API documents
    (https://prometheus.io/docs/prometheus/latest/querying/api/#alerts) is an AlertsError."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise AlertsError(f"Prometheus's answer is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise AlertsError("Prometheus's answer is not a JSON object")
    if body.get("status") != "success":
        status, error = body.get("status"), body.get("error", "")
        raise AlertsError(f"Prometheus answered status {recon.printable(repr(status), 40)}"
                         + (f": {recon.printable(str(error), 200)}" if error else ""))
    data = body.get("data")
    alerts = data.get("alerts") if isinstance(data, dict) else None
    if not isinstance(alerts, list):
        raise AlertsError("Prometheus's answer has no data.alerts list")
    out: list[Alert] = []
    for i, a in enumerate(alerts):
        what = f"alert {i}"
        if not isinstance(a, dict):
            raise AlertsError(f"{what} is not an object")
        labels, annotations = a.get("labels"), a.get("annotations", {})
        if not isinstance(labels, dict) or not isinstance(annotations, dict):
            raise AlertsError(f"{what}: its labels or annotations are not an object")
        name = _label(labels, "alertname", f"{what}'s label", 100)
        if not name:
            raise AlertsError(f"{what} has no alertname")
        state = a.get("state")
        if state not in ("firing", "pending"):
            raise AlertsError(f"{what} ({name}) is {recon.printable(repr(state), 40)}, "
                             "neither firing nor pending")
        out.append(Alert(name, "firing" if state == "firing" else "pending",
                         model=_label(labels, "model", f"{what}'s label", 128),
                         node=_label(labels, "node", f"{what}'s label", 64),
                         active_at=_label(a, "activeAt", what, 40),
                         summary=_label(annotations, "summary", f"{what}'s annotation", 200)))
    out.sort(key=lambda x: (x.state != "firing", x.name, x.model, x.node))
    return out


class FirewallError(ValueError):
    """The stack's table is not loaded, or `nft -j` printed something else."""


def parse_drops(text: str) -> dict[str, int]:
    """`nft -j list table` of the stack's table -> packets dropped per rule (its comment: the
    `what` of config/ports.node_ports, `data-plane`), summed; `absent` (the script's answer
    when the table is not loaded) is a FirewallError, as is anything else than nft's JSON
    (https://manpages.debian.org/bookworm/nftables/libnftables-json.5.en.html)."""
    if text.strip() == "absent":
        raise FirewallError("the stack's table is not loaded (nft lists no such table)")
    try:
        body = json.loads(text)
        items = body["nftables"]
        if not isinstance(items, list):
            raise TypeError("nftables is not a list")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise FirewallError(f"nft -j printed something else ({recon.printable(str(exc))})") \
            from None
    out: dict[str, int] = {}
    for item in items:
        rule = item.get("rule") if isinstance(item, dict) else None
        if not isinstance(rule, dict):
            continue
        exprs = rule.get("expr")
        if not isinstance(exprs, list) or not any(isinstance(e, dict) and "drop" in e
                                                  for e in exprs):
            continue
        counter = next((e["counter"] for e in exprs if isinstance(e, dict) and "counter" in e),
                       None)
        packets = counter.get("packets") if isinstance(counter, dict) else None
        if not isinstance(packets, int) or isinstance(packets, bool) or packets < 0:
            raise FirewallError("a drop rule of the stack's table has no packet counter")
        what = recon.printable(str(rule.get("comment", "?")), 40)
        out[what] = out.get(what, 0) + packets
    return out
def parse_deployment(text: str) -> dict[str, Any]:
    """payloads/deployment.py `status` -> what `status` shows of a model's deployment (pure):
    `matches` (the running container is the last verified deployment), `verified` (its id,
    when, the image, the model, the gate's seconds, when it was last put back and after what),
    `current` (the running container's image), each value checked for its type and printable.
    ValueError when the answer is not that."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        body = json.loads(lines[-1]) if lines else None
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("matches"), bool):
        raise ValueError("the deployment record's answer is not JSON with `matches`")

    def text_of(d: Any, *keys: str, limit: int = 80) -> str:
        for k in keys:
            d = d.get(k) if isinstance(d, dict) else None
        return recon.printable(d, limit) if isinstance(d, str) else ""

    v, cur = body.get("verified"), body.get("current")
    verified = None
    if isinstance(v, dict):
        seconds = (v.get("gate") or {}).get("seconds") if isinstance(v.get("gate"), dict) \
            else None
        verified = {
            "deployment": text_of(v, "deployment", limit=16),
            "verifiedAt": text_of(v, "verifiedAt", limit=40),
            "image": text_of(v, "image", "id", limit=71),
            "repoDigest": recon.printable(next(iter(
                (v.get("image") or {}).get("repoDigests") or []), ""), 200)
            if isinstance(v.get("image"), dict) else "",
            "model": text_of(v, "model", "repo", limit=200),
            "commit": text_of(v, "model", "commit", limit=40),
            "gateSeconds": float(seconds) if isinstance(seconds, int | float) else None,
            "restoredAt": text_of(v, "restoredAt", limit=40),
            "restoredAfter": text_of(v, "restoredAfter", limit=200),
        }
    current = None
    if isinstance(cur, dict):
        current = {"image": text_of(cur, "image", limit=71),
                   "restored": text_of(cur, "restored", limit=16)}
    return {"matches": body["matches"], "verified": verified, "current": current}
_NOTIFY_LINE = re.compile(
    r'alertmanager_notifications(_failed)?_total\{([^}]*)\}\s+([0-9.eE+]+)\s*$')


def parse_notifications(alerts_text: str, metrics_text: str) -> Notifications:
    """Alertmanager's /api/v2/alerts answer and its /metrics -> Notifications (pure). Every
    alert field is checked for its type (the API:
    https://github.com/prometheus/alertmanager/blob/v0.25.0/api/v2/openapi.yaml); an answer of
    another shape is an AlertsError. Integrations that sent nothing and failed nothing are
    left out."""
    try:
        body = json.loads(alerts_text)
    except (ValueError, RecursionError) as exc:
        raise AlertsError(f"Alertmanager's answer is not JSON ({exc})") from None
    if not isinstance(body, list):
        raise AlertsError("Alertmanager's answer is not a JSON list")
    out: list[Notice] = []
    for i, a in enumerate(body):
        what = f"alert {i}"
        if not isinstance(a, dict):
            raise AlertsError(f"{what} is not an object")
        labels, status = a.get("labels"), a.get("status")
        receivers = a.get("receivers", [])
        if not isinstance(labels, dict) or not isinstance(status, dict) or \
                not isinstance(receivers, list):
            raise AlertsError(f"{what}: its labels, status or receivers are not what the API "
                              "says")
        name = _label(labels, "alertname", f"{what}'s label", 100)
        state = _label(status, "state", what, 20)
        if not name or state not in ("active", "suppressed", "unprocessed"):
            raise AlertsError(f"{what}: no alertname, or state {state!r}")
        inhibited, silenced = status.get("inhibitedBy") or [], status.get("silencedBy") or []
        if not isinstance(inhibited, list) or not isinstance(silenced, list):
            raise AlertsError(f"{what}: inhibitedBy or silencedBy is not a list")
        names = []
        for r in receivers:
            if not isinstance(r, dict):
                raise AlertsError(f"{what}: a receiver is not an object")
            names.append(_label(r, "name", f"{what}'s receiver", 64))
        out.append(Notice(
            name, state, model=_label(labels, "model", f"{what}'s label", 128),
            replica=_label(labels, "replica", f"{what}'s label", 64),
            node=_label(labels, "node", f"{what}'s label", 64),
            receivers=tuple(n for n in names if n != "spark-vllm-none"),
            inhibited=bool(inhibited), silenced=bool(silenced),
            starts_at=_label(a, "startsAt", what, 40),
            updated_at=_label(a, "updatedAt", what, 40)))
    out.sort(key=lambda x: (x.state != "active", x.name, x.model, x.replica, x.node))
    sent: dict[str, dict[str, int]] = {}
    seen = False
    for line in metrics_text.splitlines():
        m = _NOTIFY_LINE.match(line.strip())
        if not m:
            continue
        seen = True
        integration = re.search(r'integration="([a-z0-9_]{1,32})"', m.group(2))
        if integration is None:
            continue
        value = int(float(m.group(3)))
        entry = sent.setdefault(integration.group(1), {"attempted": 0, "failed": 0})
        entry["failed" if m.group(1) else "attempted"] += value
    if not seen:
        raise AlertsError("Alertmanager's metrics have no alertmanager_notifications_total")
    sent = {k: v for k, v in sorted(sent.items()) if v["attempted"] or v["failed"]}
    return Notifications(out[:ALERTS_KEPT], sent, len(out[ALERTS_KEPT:]))


def parse_node(cfg: StackConfig, names: StackNames, node: NodeConfig, text: str,
               nonce: str) -> NodeStatus:
    """A node's status output -> NodeStatus (pure). Each unreadable section is a problem of
    its own; the rest is still read."""
    out = NodeStatus(node.name)
    sections = recon.split_sections(text, nonce)
    clock, why = _section_text(sections, "clock")
    try:
        out.clock = p.parse_epoch(clock) if clock is not None else None
    except ParseError as exc:
        why = str(exc)
    if out.clock is None:
        out.problems.append(f"clock: {why}")
    meminfo, why = _section_text(sections, "meminfo")
    try:
        if meminfo is not None:
            mem = p.parse_meminfo(meminfo)
            out.memory_total, out.memory_available = mem.total_bytes, mem.available_bytes
    except ParseError as exc:
        why = str(exc)
    if out.memory_total is None:
        out.problems.append(f"meminfo: {why}")
    ps_text, why = _section_text(sections, "docker_ps")
    mem_text, mem_why = _section_text(sections, "container_memory")
    ps: list[Any] = []
    try:
        ps = p.parse_docker_ps_json(ps_text) if ps_text is not None else []
    except ParseError as exc:
        why = str(exc)
    if ps_text is None or why:
        out.problems.append(f"docker ps: {why}")
    usage: dict[str, int] = {}
    try:
        usage = p.parse_container_memory(mem_text)[0] if mem_text is not None else {}
    except ParseError as exc:
        mem_why = str(exc)
    if mem_text is None or mem_why:
        out.problems.append(f"container memory: {mem_why}")
    for c in ps:
        if c.state == "running":
            out.memory[c.name] = usage.get(c.id)
    if cfg.guard.enabled:
        kills, why = _section_text(sections, "oom_kills")
        if kills is None:
            out.problems.append(f"OOM kills: {why}")
        else:
            out.oom_kills = p.parse_oom_kills(kills)
    window = float(cfg.health.liveness.crash_loop_window_seconds)
    for w in watched(cfg, names, node):
        cs = out.containers[w.container] = ContainerStatus(w.container)
        cs.memory_bytes = out.memory.get(w.container)
        text_, why = _section_text(sections, f"state:{w.container}")
        if text_ is None:
            if "No such object" in why or "No such container" in why:
                cs.problem = ""
            else:
                cs.problem = f"docker inspect: {why}"
        else:
            count, _, state_json = text_.strip().partition(" ")
            try:
                state = json.loads(state_json)
                cs.exists = True
                cs.restart_count = int(count)
                cs.status = str(state.get("Status", ""))
                cs.started_at = str(state.get("StartedAt", ""))
                code = state.get("ExitCode")
                cs.exit_code = code if isinstance(code, int) else None
                cs.oom_killed = state.get("OOMKilled") is True
            except (ValueError, AttributeError) as exc:
                cs.problem = f"docker inspect printed something else ({exc})"
        if not w.url:
            continue
        starts, _why = _section_text(sections, f"starts:{w.container}")
        if starts is not None and out.clock is not None:
            (cs.restarts_in_window, cs.last_start, cs.last_serving,
             cs.unready_starts) = parse_starts(starts, out.clock, window)
            cs.ooms = p.parse_liveness_ooms(starts)
        record, why = _section_text(sections, f"deployment:{w.container}")
        try:
            cs.deployment = parse_deployment(record) if record is not None else None
        except ValueError as exc:
            why = str(exc)
        if cs.deployment is None:
            cs.deployment_problem = recon.printable(why)
        probe, why = _section_text(sections, f"probe:{w.container}")
        if probe is None:
            cs.probe_problem = why
            continue
        try:
            data = json.loads(probe.strip().splitlines()[-1] if probe.strip() else "")
            if not isinstance(data, dict):
                raise ValueError("not an object")
            cs.probe = data
        except (ValueError, IndexError) as exc:
            cs.probe_problem = f"the probe printed no JSON ({exc})"
    if node.name == cfg.head.name:
        out.collective, out.collective_at, out.collective_problem = _gate_record(sections)
    if cfg.firewall.enabled:
        fw_text, why = _section_text(sections, "firewall")
        try:
            if fw_text is not None:
                out.dropped = parse_drops(fw_text)
        except FirewallError as exc:
            why = str(exc)
        if out.dropped is None:
            out.problems.append(f"firewall: {recon.printable(why)}")
    if cfg.model.drafter is not None:
        listing, why = _section_text(sections, "drafter")
        try:
            if listing is not None:
                out.drafter = next((r for r in p.parse_hf_cache(listing)
                                    if r.repo_id == cfg.model.drafter.repo), None)
                out.drafter_read = True
        except ParseError as exc:
            why = str(exc)
        if not out.drafter_read:
            out.problems.append(f"drafter: {recon.printable(why)}")
    if cfg.monitoring.enabled and node.name == cfg.head.name:
        alerts_text, why = _section_text(sections, "alerts")
        try:
            if alerts_text is not None:
                alerts = parse_alerts(alerts_text)
                out.alerts, out.alerts_omitted = alerts[:ALERTS_KEPT], len(alerts[ALERTS_KEPT:])
        except AlertsError as exc:
            why = str(exc)
        if out.alerts is None:  # never an empty list for alerts that could not be read
            out.problems.append(f"alerts: {recon.printable(why)}")
        am_text, why = _section_text(sections, "am_alerts")
        metrics, metrics_why = _section_text(sections, "am_metrics")
        why = why or metrics_why
        try:
            if am_text is not None and metrics is not None:
                out.notifications = parse_notifications(am_text, metrics)
        except AlertsError as exc:
            why = str(exc)
        if out.notifications is None:
            out.problems.append(f"notifications: {recon.printable(why)}")
    if node.name == cfg.head.name:
        stats, why = _section_text(sections, "gateway")
        try:
            if stats is not None:
                out.gateway = parse_gateway(stats, cfg.gateway.max_connections_per_source,
                                            cfg.gateway.unauthorized_per_minute)
        except GatewayError as exc:
            why = str(exc)
        if out.gateway is None:
            out.problems.append(f"gateway: {recon.printable(why)}")
    return out


def _gate_record(sections: dict[str, recon.Section]
                 ) -> tuple[GateRecord | None, float | None, str]:
    """(the collective gate's record, its time, why there is none)."""
    text, why = _section_text(sections, "collective")
    if text is None:
        return None, None, f"could not read the collective gate's record: {why}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines == ["absent"]:
        return None, None, "no record: the gate has not run (disabled, or one node)"
    try:
        return parse_record(lines[1]), float(lines[0]), ""
    except (ValueError, IndexError) as exc:
        return None, None, recon.printable(f"the collective gate's record: {exc}")


# --------------------------------------------------------------------------- the drafter


@dataclass
class DrafterStatus:
    """model.drafter on one node: `present` when the node's cache holds the snapshot of the
    commit (the revision when it is one, else what the cache's ref for it names) with files in
    it; `missing` when it does not; `unknown` when the cache could not be read."""

    node: str
    state: Literal["present", "missing", "unknown"]
    commit: str = ""
    files: int = 0
    why: str = ""

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def drafter_states(cfg: StackConfig, nodes: dict[str, NodeStatus]) -> list[DrafterStatus]:
    """Per node, whether the drafter's commit is in its cache ([] without model.drafter)."""
    d = cfg.model.drafter
    if d is None:
        return []
    out = []
    for node in cfg.nodes:
        ns = nodes.get(node.name)
        if ns is None or ns.error or not ns.drafter_read:
            why = ("not surveyed" if ns is None else ns.error or next(
                (pr.removeprefix("drafter: ") for pr in ns.problems
                 if pr.startswith("drafter: ")), "no answer"))
            out.append(DrafterStatus(node.name, "unknown", why=recon.printable(why)))
            continue
        repo = ns.drafter
        commit = d.revision if d.pinned else (repo.refs.get(d.revision, "") if repo else "")
        files = (repo.snapshot_files or {}).get(commit, {}) if repo and commit else {}
        if repo is None or not commit or commit not in repo.snapshots or not files:
            why = ("no copy of the repo in the cache" if repo is None else
                   f"no ref {d.revision}" if not commit else f"no snapshot of {commit[:12]}")
            out.append(DrafterStatus(node.name, "missing", commit, why=why))
        else:
            out.append(DrafterStatus(node.name, "present", commit, len(files)))
    return out


# --------------------------------------------------------------------------- per model


@dataclass
class ModelStatus:
    name: str
    kind: str
    state: State
    why: str = ""  # what the state rests on, for a state that is not `serving`
    node: str = ""  # where its API is
    since: str = ""  # the API container's start (Docker's StartedAt)
    restarts: int | None = None  # Docker's, since the container was created
    restarts_in_window: int | None = None  # the watchdog's
    running: float | None = None
    waiting: float | None = None
    kv_cache: float | None = None  # 0..1
    tokens_per_second: float | None = None  # prompt + generated
    ranks: dict[str, str] = field(default_factory=dict)  # node/container -> Docker status
    # its vLLM's last OOM kill: "OOM-killed at <UTC> (node available X GiB of Y; who)", from
    # its watchdog's record, else Docker's OOMKilled of one of its containers; "" when none
    oom: str = ""
    # the API container's deployment (parse_deployment), or None with deployment_why
    deployment: dict[str, Any] | None = None
    deployment_why: str = ""

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _figures(m: ModelStatus, probe: dict[str, Any]) -> None:
    samples = [s for s in probe.get("samples", []) if isinstance(s, dict)]
    if not samples:
        return
    last = samples[-1].get("m", {})
    if not isinstance(last, dict):
        return

    def num(d: dict[str, Any], k: str) -> float | None:
        v = d.get(k)
        return float(v) if isinstance(v, int | float) else None

    m.running = num(last, "vllm:num_requests_running")
    m.waiting = num(last, "vllm:num_requests_waiting")
    m.kv_cache = num(last, "vllm:kv_cache_usage_perc")
    if len(samples) >= 2:
        first = samples[0].get("m", {})
        dt = float(samples[-1].get("t", 0)) - float(samples[0].get("t", 0))
        if isinstance(first, dict) and dt > 0:
            done = 0.0
            for k in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
                a, b = num(first, k), num(last, k)
                if a is not None and b is not None:
                    done += max(0.0, b - a)
            m.tokens_per_second = done / dt


def model_states(cfg: StackConfig, names: StackNames,
                 nodes: dict[str, NodeStatus]) -> list[ModelStatus]:
    """Each model's state from its API container, its ranks and the watchdog's record:
    - serving: /health answers 200 and /v1/models lists the name, every rank's container runs;
    - crash-looping: more than health.liveness.crashLoopRestarts restarts in the window and not
      serving;
    - starting: the API container runs, vLLM does not answer yet (or a rank is not running);
    - stopped: a container exists but does not run; missing: the API container does not exist;
    - unknown: its node could not be reached or its state not read."""
    limit = cfg.health.liveness.crash_loop_restarts
    out: list[ModelStatus] = []
    for model in models(cfg, names):
        api_node, api_name = model.api
        m = ModelStatus(model.name, model.kind, "unknown", node=api_node)
        out.append(m)
        ns = nodes.get(api_node)
        if ns is None or ns.error:
            m.why = f"{api_node}: {ns.error if ns else 'not surveyed'}"
            continue
        api = ns.containers.get(api_name)
        if api is None or api.problem:
            m.why = api.problem if api else "not surveyed"
            continue
        m.deployment, m.deployment_why = api.deployment, api.deployment_problem
        m.since, m.restarts = api.started_at, api.restart_count if api.exists else None
        m.restarts_in_window = api.restarts_in_window
        m.oom = _oom(model, api, nodes)
        m.ranks[f"{api_node}/{api_name}"] = api.status if api.exists else "missing"
        rank_problem = rank_unknown = ""
        for rank_node, rank_name in model.needs:
            rs = nodes.get(rank_node)
            rank = rs.containers.get(rank_name) if rs and not rs.error else None
            status = ("unknown" if rank is None or rank.problem else
                      recon.printable(rank.status, 40) if rank.exists else "missing")
            m.ranks[f"{rank_node}/{rank_name}"] = status
            if status == "unknown" and not rank_unknown:
                why = rs.error if rs is not None and rs.error else (
                    rank.problem if rank is not None else "not surveyed")
                rank_unknown = f"{rank_node}/{rank_name}: {why}"
            elif status != "running" and not rank_problem:
                rank_problem = f"{rank_node}/{rank_name} is {status}"
        if not api.exists:
            m.state, m.why = "missing", f"no container {api_name} on {api_node}"
            continue
        probe = api.probe or {}
        if probe:
            _figures(m, probe)
        health, listed = probe.get("health"), probe.get("models")
        serving = (api.status == "running" and health == 200 and isinstance(listed, list)
                   and model.name in listed)
        looping = (api.restarts_in_window or 0) > limit
        if serving and not rank_problem and not rank_unknown:
            m.state = "serving"
        elif rank_unknown:  # a rank whose state could not be read: never good news
            m.why = rank_unknown
        elif looping:
            m.state = "crash-looping"
            m.why = (f"{api.restarts_in_window} restarts in the last "
                     f"{cfg.health.liveness.crash_loop_window_seconds} s (more than {limit})"
                     + (f", the last one {m.oom}: the node runs out of memory"
                        if m.oom else ""))
        elif api.status in ("running", "restarting"):
            m.state = "starting"
            m.why = rank_problem or (f"vLLM does not answer yet: /health {health}"
                                     if api.probe else f"probe: {api.probe_problem}")
        else:
            m.state = "stopped"
            m.why = f"{api_name} is {api.status} (exit code {api.exit_code})"
    for m in out:  # what came from the nodes is shown as one printable line, never as markup
        m.why, m.since = recon.printable(m.why), recon.printable(m.since, 60)
        m.oom = recon.printable(m.oom)
    return out


def _oom(model: Model, api: ContainerStatus, nodes: dict[str, NodeStatus]) -> str:
    """The model's last OOM kill as text (ModelStatus.oom): its watchdog's record, else a
    container of it whose last exit Docker says was an OOM kill; "" when neither."""
    if api.ooms:
        return oom_text(max(api.ooms, key=lambda k: k.time))
    for node, name in (model.api, *model.needs):
        ns = nodes.get(node)
        c = ns.containers.get(name) if ns is not None and not ns.error else None
        if c is not None and c.oom_killed:
            return f"OOM-killed (Docker: {node}/{name}'s last exit was the kernel's OOM kill)"
    return ""
