"""`spark-vllm status -s STACK [--json] [--watch [SECONDS]] [--key PATH]`: per model (the main
one and each service) serving / starting / crash-looping / stopped / missing / unknown, since
when, restarts, requests running and waiting, KV cache use and tokens/s, and its last OOM kill
("OOM-killed at T (node available X GiB)"); per node the memory each container holds, what is
available and the newest OOM kills the node's guard recorded; with `monitoring.enabled`, the
alerts the stack's Prometheus has pending or firing and what its Alertmanager sent (each alert
it holds: sent to which receivers since when, or held back by an inhibition or a silence; the
notifications per integration, and how many failed), both asked on the head; the fabric's
collective bandwidth as the stack's collective gate last measured it (its record on the head,
components/collective.py). Read-only: one ssh round trip per node, all in parallel
(inspection/status.py says what each reads).

Exit codes: 0 every model serves, 1 at least one does not (or a node could not be reached),
2 a config or usage problem. An alert, firing or not, does not change the exit code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from config import ConfigError, NodeConfig, StackConfig
from hostscripts.paths import StackNames
from inspection import recon
from inspection import status as st
from inspection.preflight import oom_text
from tools import stack_access
from tools.recon_report import load_stack_config

# (argv, script, timeout) -> (rc, stdout, stderr): the ssh round trip; tests replace it
Runner = Callable[[list[str], str, float], tuple[int, str, str]]
ROUND_TRIP_TIMEOUT = 60.0
OOM_KILLS_SHOWN = 5  # a node's newest OOM kills (the guard's record) in the table and the JSON


def ssh_runner(argv: list[str], script: str, timeout: float) -> tuple[int, str, str]:
    """LIVE PATH: ssh with the script on stdin."""
    done = subprocess.run(argv, input=script.encode(), capture_output=True, timeout=timeout)
    return (done.returncode, done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"))


def survey_node(cfg: StackConfig, names: StackNames, node: NodeConfig, key: str | None,
                runner: Runner) -> st.NodeStatus:
    nonce = recon.new_nonce()
    script = st.node_script(cfg, names, node, nonce)
    try:
        with stack_access.ssh_argv(cfg, node, key=key) as argv:
            rc, out, err = runner(argv, script, ROUND_TRIP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return st.NodeStatus(node.name, error=f"no answer within {ROUND_TRIP_TIMEOUT:g} s")
    except OSError as exc:
        return st.NodeStatus(node.name, error=f"could not run ssh: {exc}")
    if rc == 255:
        return st.NodeStatus(node.name, error=str(recon.classify_ssh_failure(node, rc, err)))
    if f"{recon.MARKER_PREFIX}{nonce}:section:" not in out:
        last = next((ln for ln in reversed(err.splitlines()) if ln.strip()), f"exit code {rc}")
        return st.NodeStatus(node.name, error=f"the status script did not run "
                                              f"({recon.printable(last)})")
    return st.parse_node(cfg, names, node, out, nonce)


def collect(cfg: StackConfig, stack: str, key: str | None,
            runner: Runner = ssh_runner) -> tuple[list[st.ModelStatus], dict[str, st.NodeStatus]]:
    names = StackNames(stack)
    with ThreadPoolExecutor(max_workers=max(1, len(cfg.nodes))) as pool:
        futures = {n.name: pool.submit(survey_node, cfg, names, n, key, runner)
                   for n in cfg.nodes}
        nodes = {name: f.result() for name, f in futures.items()}
    return st.model_states(cfg, names, nodes), nodes


STYLE = {"serving": "green", "starting": "yellow", "crash-looping": "bold red",
         "stopped": "red", "missing": "red", "unknown": "magenta"}
ALERT_STYLE = {"firing": "bold red", "pending": "yellow"}
DRAFTER_STYLE = {"present": "green", "missing": "bold red", "unknown": "magenta"}


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024**3:.1f} GiB"


def _since(started_at: str) -> str:
    if not started_at or started_at.startswith("0001-"):
        return "-"
    try:
        t = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    except ValueError:
        return recon.printable(started_at, 40)
    return t.strftime("%Y-%m-%d %H:%M:%S")


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _alerts_of(nodes: dict[str, st.NodeStatus]) -> st.NodeStatus | None:
    """The node whose status holds Prometheus's alerts (the head, with monitoring on)."""
    return next((n for n in nodes.values() if n.alerts is not None), None)


def render_alerts(head: str, nodes: dict[str, st.NodeStatus]) -> Table | Text:
    """Prometheus's pending and firing alerts (monitoring on): a table, a line when there is
    none, or a line saying they could not be read (never nothing: that is monitoring off)."""
    held = _alerts_of(nodes)
    if held is None or held.alerts is None:
        ns = nodes.get(head)
        why = ("not surveyed" if ns is None else ns.error or next(
            (pr.removeprefix("alerts: ") for pr in ns.problems if pr.startswith("alerts: ")),
            "no answer"))
        return Text(f"alerts: unknown, could not be read on {head} ({recon.printable(why)})",
                    style="magenta")
    if not held.alerts:
        return Text("alerts: none pending or firing")
    at = Table(title=f"alerts (Prometheus on {held.node})", title_justify="left")
    for col in ("alert", "state", "model", "node", "since", "summary"):
        at.add_column(col)
    for a in held.alerts:
        at.add_row(Text(a.name), Text(a.state, style=ALERT_STYLE[a.state]), Text(a.model or "-"),
                   Text(a.node or "-"), Text(_since(a.active_at)), Text(a.summary))
    if held.alerts_omitted:
        at.caption = f"{held.alerts_omitted} more not shown (Prometheus's UI lists them all)"
    return at


def render_gateway(head: str, nodes: dict[str, st.NodeStatus]) -> Text:
    """The gateway's counters (issue 46): connections now and its limit, connections refused as
    they arrived by the per-source limits, the 401s of the addresses seen in the last 10
    minutes and those past a limit now; a line saying they could not be read otherwise."""
    ns = nodes.get(head)
    g = ns.gateway if ns is not None else None
    if g is None:
        why = ("not surveyed" if ns is None else ns.error or next(
            (pr.removeprefix("gateway: ") for pr in ns.problems if pr.startswith("gateway: ")),
            "no answer"))
        return Text(f"gateway: counters unknown, could not be read on {head} "
                    f"({recon.printable(why)})", style="magenta")
    text = (f"gateway: {g.connections} connections now (limit {g.connection_limit}), "
            f"{g.connections_total} since it started, {g.refused} refused as they arrived "
            f"(per-source limits); {g.unauthorized} answered 401 to {g.sources} client "
            f"address(es) seen in the last 10 min")
    if g.over_limit:
        return Text(text + f"; past a limit now: {', '.join(g.over_limit)}", style="yellow")
    return Text(text)


def render_drafter(repo: str, drafter: list[st.DrafterStatus]) -> Text:
    """One line: the speculative drafter (model.drafter) and where its commit is."""
    text = Text(f"drafter {repo}: ")
    for i, d in enumerate(drafter):
        text.append(", " if i else "")
        detail = (f"{d.commit[:12]}, {d.files} files" if d.state == "present"
                  else recon.printable(d.why))
        text.append(f"{d.node} {d.state} ({detail})", style=DRAFTER_STYLE[d.state])
    return text


def _notifications_of(nodes: dict[str, st.NodeStatus]) -> st.NodeStatus | None:
    return next((n for n in nodes.values() if n.notifications is not None), None)


def render_notifications(head: str, nodes: dict[str, st.NodeStatus]) -> Table | Text:
    """What the stack's Alertmanager holds and sent: a table of its alerts (to whom, since
    when, last sent by Prometheus; or held back, and why) captioned with the notifications per
    integration; a line when it holds none; or a line saying it could not be read."""
    held = _notifications_of(nodes)
    if held is None or held.notifications is None:
        ns = nodes.get(head)
        why = ("not surveyed" if ns is None else ns.error or next(
            (pr.removeprefix("notifications: ") for pr in ns.problems
             if pr.startswith("notifications: ")), "no answer"))
        return Text(f"notifications: unknown, could not be read on {head} "
                    f"({recon.printable(why)})", style="magenta")
    n = held.notifications
    sent = ", ".join(f"{k} {v['attempted']} sent ({v['failed']} failed)"
                     for k, v in n.sent.items()) or "none sent yet"
    if not n.alerts:
        return Text(f"notifications (Alertmanager on {held.node}): no alert held; {sent}")
    at = Table(title=f"notifications (Alertmanager on {held.node})", title_justify="left")
    for col in ("alert", "model / node", "sent to", "since", "last sent by Prometheus"):
        at.add_column(col)
    for a in n.alerts:
        who = a.model + (f" on {a.replica}" if a.replica else "") if a.model else a.node or "-"
        if a.state == "active":
            to = Text(", ".join(a.receivers) or "nobody (no receiver declared)",
                      style="bold" if a.receivers else "")
        else:
            why = "its node is down (inhibited)" if a.inhibited else \
                "silenced" if a.silenced else a.state
            to = Text(f"held back: {why}", style="yellow")
        at.add_row(Text(a.name), Text(who), to, Text(_since(a.starts_at)),
                   Text(_since(a.updated_at)))
    at.caption = f"notifications: {sent}" + (
        f"; {n.omitted} more alerts not shown" if n.omitted else "")
    return at


def render(stack: str, models: list[st.ModelStatus], nodes: dict[str, st.NodeStatus],
           monitoring_on: str = "", head: str = "", firewall_on: bool = False,
           drafter: tuple[str, list[st.DrafterStatus]] | None = None) -> Group:
    """The tables; `monitoring_on`: the head's name when the stack has monitoring on (then its
    alerts follow the models), "" when off; `firewall_on`: the drops of each node's firewall
    last; `drafter`: model.drafter's repo and its state per node (a line after the models)."""
    mt = Table(title=f"stack {stack}: models", title_justify="left")
    for col in ("model", "kind", "state", "since", "restarts", "running", "waiting",
                "KV cache", "tokens/s", "why"):
        mt.add_column(col, justify="right" if col in ("restarts", "running", "waiting",
                                                      "KV cache", "tokens/s") else "left")
    for m in models:
        restarts = "-" if m.restarts is None else str(m.restarts)
        if m.restarts_in_window:
            restarts += f" ({m.restarts_in_window} recent)"
        why = Text(m.why)
        if m.oom and m.oom not in m.why:  # its last OOM kill, serving again or not
            why = Text(f"{m.why}; {m.oom}" if m.why else m.oom, style="yellow")
        mt.add_row(Text(m.name), m.kind, Text(m.state, style=STYLE[m.state]), Text(_since(m.since)),
                   restarts, _num(m.running, ".0f"), _num(m.waiting, ".0f"),
                   "-" if m.kv_cache is None else f"{m.kv_cache * 100:.1f}%",
                   _num(m.tokens_per_second, ".1f"), why)
    dt = render_deployments(models)
    nt = Table(title="nodes: memory", title_justify="left")
    for col in ("node", "total", "available", "container", "holds"):
        nt.add_column(col, justify="right" if col in ("total", "available", "holds") else "left")
    for ns in nodes.values():
        if ns.error:
            nt.add_row(ns.node, "?", "?", Text(recon.printable(ns.error), style="red"), "")
            continue
        rows = sorted(ns.memory.items()) or [("(no running container)", None)]
        for i, (name, held) in enumerate(rows):
            first = i == 0
            nt.add_row(ns.node if first else "", _gib(ns.memory_total) if first else "",
                       _gib(ns.memory_available) if first else "", Text(name),
                       "" if name.startswith("(") else _gib(held))
        for kill in (ns.oom_kills or [])[-OOM_KILLS_SHOWN:]:  # the guard's record, newest last
            nt.add_row("", "", "", Text(oom_text(kill), style="yellow"), "")
        for problem in ns.problems:
            nt.add_row("", "", "", Text(f"could not read {recon.printable(problem)}",
                                        style="magenta"), "")
    parts: list[Table | Text] = [mt, dt]
    if drafter is not None:
        parts.append(render_drafter(*drafter))
    if head:
        parts.append(render_gateway(head, nodes))
    if monitoring_on:
        parts.append(render_alerts(monitoring_on, nodes))
        parts.append(render_notifications(monitoring_on, nodes))
    parts.append(render_gate(nodes))
    parts.append(nt)
    if firewall_on:
        parts.append(render_firewall(nodes))
    return Group(*parts)


def _gate_of(nodes: dict[str, st.NodeStatus]) -> st.NodeStatus | None:
    """The node whose status holds the collective gate's record (the head)."""
    return next((n for n in nodes.values() if n.collective is not None or n.collective_problem),
                None)


def render_gate(nodes: dict[str, st.NodeStatus]) -> Text:
    """The fabric's collective bandwidth, as the stack's gate last measured it."""
    held = _gate_of(nodes)
    if held is None or held.collective is None:
        why = held.collective_problem if held is not None else "the head was not surveyed"
        return Text(f"fabric: {recon.printable(why)}", style="magenta")
    at = (datetime.fromtimestamp(held.collective_at).strftime("%Y-%m-%d %H:%M:%S")
          if held.collective_at else "?")
    bad = held.collective.verdict != "passed"
    return Text(f"fabric: collective gate {held.collective.line()}, measured {at}",
                style="bold red" if bad else "")


def render_firewall(nodes: dict[str, st.NodeStatus]) -> Table:
    """What each node's firewall dropped since its table was loaded, rule by rule (a table not
    loaded, or not read, is in the node's problems above)."""
    ft = Table(title="nodes: firewall (packets dropped since the table was loaded)",
               title_justify="left")
    ft.add_column("node")
    ft.add_column("dropped")
    for ns in nodes.values():
        if ns.error:
            continue
        if ns.dropped is None:
            ft.add_row(ns.node, Text("table not read (see above)", style="magenta"))
            continue
        hits = {k: v for k, v in sorted(ns.dropped.items()) if v}
        ft.add_row(ns.node, Text(", ".join(f"{k} {v}" for k, v in hits.items()) or "none"))
    return ft


def render_deployments(models: list[st.ModelStatus]) -> Table:
    """Per model, what runs now against its last verified deployment (issue 49): `verified`
    when the API container is it, `not verified` when it is another (an up that failed with
    health.onFailure keep, a change by hand), and when it was last put back."""
    t = Table(title="deployments: what runs now, the last verified one", title_justify="left")
    for col in ("model", "running now", "last verified", "at", "image", "model commit",
                "gate", "put back"):
        t.add_column(col, justify="right" if col == "gate" else "left")
    for m in models:
        d = m.deployment
        if d is None:
            t.add_row(Text(m.name), Text(f"unknown ({m.deployment_why or 'not read'})",
                                         style="magenta"), "", "", "", "", "", "")
            continue
        v = d.get("verified")
        if v is None:
            t.add_row(Text(m.name), Text("none verified", style="yellow"), "-", "", "", "", "",
                      "")
            continue
        now = Text("the last verified", style="green") if d["matches"] else \
            Text("not verified", style="bold red")
        gate = "-" if v.get("gateSeconds") is None else f"{v['gateSeconds']:.1f} s"
        back = v.get("restoredAt") or "-"
        t.add_row(Text(m.name), now, Text(v.get("deployment") or "?"),
                  Text(_since(v.get("verifiedAt") or "")), Text((v.get("image") or "?")[:19]),
                  Text(f"{v.get('model')}@{(v.get('commit') or '?')[:12]}"), gate, Text(back))
    return t


def as_json(stack: str, models: list[st.ModelStatus],
            nodes: dict[str, st.NodeStatus],
            drafter: tuple[str, list[st.DrafterStatus]] | None = None) -> dict[str, Any]:
    """`alerts`: Prometheus's pending and firing alerts; `notifications`: what Alertmanager
    holds and sent; each null with monitoring off, or when it could not be read (then the head's
    `problems` says why). Per node `dropped`: packets each
    rule of the stack's firewall dropped ({rule: packets}); null with the firewall off, or when
    its table is not loaded or could not be read (its `problems` says why). `drafter`:
    model.drafter's repo and per node whether its commit is there; null without one."""
    held = _alerts_of(nodes)
    told = _notifications_of(nodes)
    return {
        "stack": stack,
        "drafter": None if drafter is None else {
            "repo": drafter[0], "nodes": {d.node: d.as_json() for d in drafter[1]}},
        "serving": all(m.state == "serving" for m in models),
        "models": [m.as_json() for m in models],
        "alerts": None if held is None or held.alerts is None else
        [a.as_json() for a in held.alerts],
        "alertsOmitted": held.alerts_omitted if held is not None else 0,
        "collectiveGate": _gate_json(nodes),
        # the gateway's counters (the head's); null when they could not be read (the head's
        # `problems` says why)
        "gateway": next((n.gateway.as_json() for n in nodes.values() if n.gateway is not None),
                        None),
        "notifications": None if told is None or told.notifications is None else
        told.notifications.as_json(),
        "nodes": {n.node: {"error": n.error, "memoryTotal": n.memory_total,
                           "memoryAvailable": n.memory_available, "containers": n.memory,
                           # the guard's record of its OOM kills (null: guard off or unread)
                           "oomKills": None if n.oom_kills is None else [
                               {**k.model_dump(), "text": oom_text(k)}
                               for k in n.oom_kills[-OOM_KILLS_SHOWN:]],
                           "problems": n.problems, "dropped": n.dropped}
                  for n in nodes.values()},
    }


def _gate_json(nodes: dict[str, st.NodeStatus]) -> dict[str, Any] | None:
    """The gate's record (with `measuredAt`, the node's epoch seconds), or None with `why`."""
    held = _gate_of(nodes)
    if held is None or held.collective is None:
        return {"record": None, "why": held.collective_problem if held else "not surveyed"}
    return {"record": held.collective.model_dump(by_alias=True),
            "measuredAt": held.collective_at, "why": None}


def _monitoring_on(cfg: StackConfig) -> str:
    return cfg.head.name if cfg.monitoring.enabled else ""


def _drafter(cfg: StackConfig, nodes: dict[str, st.NodeStatus]
             ) -> tuple[str, list[st.DrafterStatus]] | None:
    d = cfg.model.drafter
    return None if d is None else (d.repo, st.drafter_states(cfg, nodes))


def _code(models: list[st.ModelStatus], nodes: dict[str, st.NodeStatus]) -> int:
    ok = all(m.state == "serving" for m in models) and not any(n.error for n in nodes.values())
    return 0 if ok else 1


@click.command("status")
@click.option("-s", "--stack", default="dev", show_default=True,
              help="the stack: reads Pulumi.<stack>.yaml in the current folder")
@click.option("--key", help="ssh private key (default: spark-vllm:ssh.privateKeyPath)")
@click.option("--json", "as_json_", is_flag=True, help="print JSON, not tables")
@click.option("--watch", type=click.FloatRange(min=1), default=None, is_flag=False,
              flag_value=5.0, help="refresh every SECONDS (default 5) until Ctrl-C")
@click.pass_context
def command(ctx: click.Context, stack: str, key: str | None, as_json_: bool,
            watch: float | None) -> None:
    """Every model's state and figures, every node's memory and, with monitoring, the alerts
    Prometheus has pending or firing (exit 0 only when every model serves)."""
    if as_json_ and watch is not None:
        raise click.UsageError("--json prints once; leave out --watch (or loop in the script)")
    try:
        cfg = load_stack_config(stack)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    # a pipe or a file gets the whole table, not one cut to 80 columns
    console = Console(highlight=False, markup=False,
                      width=None if sys.stdout.isatty() else 160)
    if watch is None:
        models, nodes = collect(cfg, stack, key, runner=RUNNER[0])
        if as_json_:
            click.echo(json.dumps(as_json(stack, models, nodes, _drafter(cfg, nodes)), indent=2,
                                  sort_keys=True))
        else:
            console.print(render(stack, models, nodes, _monitoring_on(cfg), cfg.head.name,
                                 cfg.firewall.enabled, _drafter(cfg, nodes)))
        ctx.exit(_code(models, nodes))
    code = 1
    try:
        with Live(console=console, auto_refresh=False) as live:
            while True:
                models, nodes = collect(cfg, stack, key, runner=RUNNER[0])
                code = _code(models, nodes)
                live.update(Group(render(stack, models, nodes, _monitoring_on(cfg), cfg.head.name,
                                         cfg.firewall.enabled, _drafter(cfg, nodes)),
                                  Text(f"refreshed {time.strftime('%H:%M:%S')}, every "
                                       f"{watch:g} s; Ctrl-C ends")), refresh=True)
                time.sleep(watch)
    except KeyboardInterrupt:
        pass
    ctx.exit(code)


# the ssh round trip status uses: tests put a local runner here
RUNNER: list[Runner] = [ssh_runner]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(command())
