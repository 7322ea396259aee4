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
- `alerts` (the head, only with `monitoring.enabled`): the alerts the stack's Prometheus has
  pending or firing (its /api/v1/alerts, asked with the head's own python3 at
  `prometheus_url`); an answer that cannot be read is a problem, never "no alerts";
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

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from config import NodeConfig, StackConfig
from config.listen import LOOPBACK, service_host, vllm_host
from hostscripts.common import payload, plain
from hostscripts.paths import LIVENESS_STARTS, StackNames
from inspection import parsers as p
from inspection import recon
from inspection.parsers import ParseError
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
                           names.vllm_key_file))
    elif cfg.vllm.executor == "mp":
        out.append(Watched(names.serve))
    if cfg.vllm.executor != "mp":
        out.append(Watched(names.ray_head if head else names.ray_worker))
    for svc in cfg.services:
        svc_nodes = svc.nodes or [cfg.head.name]
        if node.name in svc_nodes:
            out.append(Watched(names.service(svc.name),
                               f"http://{service_host(cfg, node.name)}:{svc.port}",
                               names.service_key_file(svc.name)))
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
    for w in watched(cfg, names, node):
        c = q(w.container)
        lines.append(f"sv_bg state:{w.container} {STATE_TIMEOUT} docker inspect -f "
                     f"'{{{{.RestartCount}}}} {{{{json .State}}}}' {c}")
        if w.url:
            lines.append(f"sv_bg starts:{w.container} {STATE_TIMEOUT} bash -c "
                         f"{q(recon.READ_STARTS)} _ {c} {q(LIVENESS_STARTS)}")
            probe = f"docker exec -i {c} python3 -c {q(_probe_py())} {q(w.url)} < {q(w.key_file)}"
            lines.append(f"sv_bg probe:{w.container} {PROBE_TIMEOUT} bash -c {q(probe)}")
    if cfg.monitoring.enabled and node.name == cfg.head.name:
        lines.append(f"sv_bg alerts {ALERTS_TIMEOUT} python3 -c {q(_ALERTS_PY)} "
                     f"{q(prometheus_url(cfg) + '/api/v1/alerts')}")
        for section, path in (("am_alerts", "/api/v2/alerts"), ("am_metrics", "/metrics")):
            lines.append(f"sv_bg {section} {ALERTS_TIMEOUT} python3 -c {q(_ALERTS_PY)} "
                         f"{q(alertmanager_url(cfg) + path)}")
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
    probe: dict[str, Any] | None = None
    probe_problem: str = ""


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
            except (ValueError, AttributeError) as exc:
                cs.problem = f"docker inspect printed something else ({exc})"
        if not w.url:
            continue
        starts, _why = _section_text(sections, f"starts:{w.container}")
        if starts is not None and out.clock is not None:
            (cs.restarts_in_window, cs.last_start, cs.last_serving,
             cs.unready_starts) = parse_starts(starts, out.clock, window)
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
        m.since, m.restarts = api.started_at, api.restart_count if api.exists else None
        m.restarts_in_window = api.restarts_in_window
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
                     f"{cfg.health.liveness.crash_loop_window_seconds} s (more than {limit})")
        elif api.status in ("running", "restarting"):
            m.state = "starting"
            m.why = rank_problem or (f"vLLM does not answer yet: /health {health}"
                                     if api.probe else f"probe: {api.probe_problem}")
        else:
            m.state = "stopped"
            m.why = f"{api_name} is {api.status} (exit code {api.exit_code})"
    for m in out:  # what came from the nodes is shown as one printable line, never as markup
        m.why, m.since = recon.printable(m.why), recon.printable(m.since, 60)
    return out
