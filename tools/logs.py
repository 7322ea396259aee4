"""`spark-vllm logs`: every container log of one stack, merged in time order.

    spark-vllm logs -s STACK [MODEL] [--node N] [-f] [--since 10m] [--tail N] [--key PATH]

What is read: `docker logs --timestamps` of the stack's containers (hostscripts/paths.py
StackNames), stdout and stderr both (vLLM logs to stderr). The main model is its vLLM container
(`serve`: on the head with vllm.executor ray, whose tensor-parallel ranks print into it through
Ray as `(RayWorkerWrapper pid=.., ip=..)`; on every node with executor mp) and, with the Ray
executor, the Ray containers (`ray-head`, `ray-worker`); a service is its own container on its
nodes; without MODEL every model's containers, Ray's and the gateway's (inspection/logs.py
`select_targets`).

How: one ssh session per node (tools/stack_access.py: only the node's pinned host key, no tty)
runs the script of hostscripts/logs.py `node_script` on stdin. It prints one framed line per log
line (that module's docstring says the frames and how -f follows a container across restarts
and replacements), so the containers of a node can share the session's stdout and be told apart
again here (inspection/logs.py: the frames read back into entries, merged by Docker's
timestamp, the node's clock).

With -f output is held for `REORDER_SECONDS` and printed sorted, so two nodes' lines interleave
right; the history of every container is merged exactly before following starts.
Ctrl-C closes the sessions' stdin: the node's script ends every `docker logs` it started and
exits (its stdout gone, the same happens through SIGPIPE).

Lines are untrusted: terminal control sequences and control characters are removed before
printing, a carriage return keeps what a terminal would show (the text after the last one),
and rich never interprets markup in them.

This module is the command: the sessions, the printing loop and the click CLI.
"""

from __future__ import annotations

import heapq
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, suppress
from dataclasses import dataclass
from typing import IO

import click
from rich.console import Console
from rich.text import Text

from config import ConfigError, NodeConfig, StackConfig
from hostscripts.logs import Options, check_since, node_script
from hostscripts.paths import StackNames
from inspection.logs import (
    Assembler,
    Entry,
    SelectionError,
    Synced,
    Target,
    by_node,
    clock,
    merge,
    parse_frame,
    select_targets,
    short_name,
)
from tools import stack_access
from tools.recon_report import load_stack_config
from tools.terminal import sanitize

REORDER_SECONDS = 0.5  # with -f, how long a line is held so later-arriving earlier lines sort

# --- --since --------------------------------------------------------------------------------


class SinceType(click.ParamType[str, object]):
    """A --since value Docker accepts (hostscripts/logs.py check_since)."""

    name = "SINCE"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            return check_since(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)

# --- printing -------------------------------------------------------------------------------


def format_plain(entry: Entry, stack: str) -> str:
    """`<time> <node>/<short name> | <line>` of a log line, sanitized."""
    return (f"{clock(entry.ts)} {entry.node}/{short_name(stack, entry.container)} | "
            f"{sanitize(entry.text)}")


_PALETTE = ("cyan", "green", "magenta", "blue", "yellow", "bright_cyan", "bright_green",
            "bright_magenta", "bright_blue")


class Printer:
    """Prints entries: log lines to stdout (rich colours when `color`), notes and failures to
    stderr as `<node>/<container>: <message>`."""

    def __init__(self, stack: str, color: bool, out: IO[str] | None = None,
                 err: IO[str] | None = None) -> None:
        self.stack = stack
        self.color = color
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._styles: dict[tuple[str, str], str] = {}
        self.console = Console(file=self.out, force_terminal=True, highlight=False,
                               soft_wrap=True, markup=False, emoji=False) if color else None

    def entry(self, e: Entry) -> None:
        if e.kind == "note":
            self.note(f"{e.node}/{e.container}: {sanitize(e.text)}")
            return
        if self.console is None:
            self.out.write(format_plain(e, self.stack) + "\n")
            self.out.flush()
            return
        style = self._styles.setdefault((e.node, e.container),
                                        _PALETTE[len(self._styles) % len(_PALETTE)])
        line = Text()
        line.append(clock(e.ts), style="dim")
        line.append(" ")
        line.append(f"{e.node}/{short_name(self.stack, e.container)}", style=style)
        line.append(" | ", style="dim")
        line.append(sanitize(e.text))
        self.console.print(line)

    def note(self, message: str) -> None:
        self.err.write(message + "\n")
        self.err.flush()


# --- the nodes ------------------------------------------------------------------------------

ArgvFor = Callable[[StackConfig, NodeConfig, str | None], AbstractContextManager[list[str]]]


def ssh_argv_for(cfg: StackConfig, node: NodeConfig, key: str | None
                 ) -> AbstractContextManager[list[str]]:
    """The ssh command to a node (tools/stack_access.py): the script goes on its stdin."""
    return stack_access.ssh_argv(cfg, node, key=key)


# The command that runs a node's script on stdin; tests put `bash -s` here
ARGV_FOR: ArgvFor = ssh_argv_for


@dataclass(frozen=True)
class Ended:
    """A node's session ended: `rc` its exit status, `why` ssh's last line on stderr."""

    node: str
    rc: int
    why: str


Event = Entry | Synced | Ended


class NodeSession:
    """One node's process (ssh, or what ARGV_FOR gives): writes the script, reads the frames
    into `events`, and reports its end (Ended)."""

    def __init__(self, node: str, argv: list[str], script: str, follow: bool,
                 events: queue.Queue[tuple[float, Event]]) -> None:
        self.node = node
        self.events = events
        self.stopping = False
        self._why = ""
        # a session of its own: the terminal's Ctrl-C reaches this process only, which then
        # stops the node's side in order (stop())
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(script.encode())
            self.proc.stdin.flush()
            if not follow:
                self.proc.stdin.close()
        except OSError:  # it ended already: its stderr says why
            pass
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._out = threading.Thread(target=self._read_out, daemon=True)
        self._err.start()
        self._out.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = sanitize(raw.decode("utf-8", "replace")).strip()
            if line:
                self._why = line

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        asm = Assembler(self.node)
        for raw in self.proc.stdout:
            event = asm.feed(parse_frame(raw.rstrip(b"\n")))
            if event is not None:
                self.events.put((time.monotonic(), event))
        rc = self.proc.wait()
        self._err.join()
        self.events.put((time.monotonic(), Ended(self.node, rc, self._why)))

    def stop(self, grace: float = 3.0) -> None:
        """Close the script's stdin (its loops end, it exits), then make sure the process is
        gone."""
        self.stopping = True
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _failure(ended: Ended) -> str:
    why = f": {ended.why}" if ended.why else ""
    if ended.rc == 255:
        return f"{ended.node}: cannot reach the node (ssh exit 255){why}"
    return f"{ended.node}: the logs session failed (exit {ended.rc}){why}"


def run(cfg: StackConfig, targets: Sequence[Target], opts: Options, printer: Printer, *,
        key: str | None = None, argv_for: ArgvFor | None = None,
        stop: threading.Event | None = None) -> int:
    """Read and print the targets' logs: 0, or 1 when a node could not be read (the others'
    logs still print). With opts.follow it runs until Ctrl-C (KeyboardInterrupt, caught here)
    or `stop` is set, or every node's session ended."""
    argv_for = argv_for or ARGV_FOR
    plan = by_node(targets)
    events: queue.Queue[tuple[float, Event]] = queue.Queue()
    failed = False
    with ExitStack() as stack:
        sessions: list[NodeSession] = []
        for node in cfg.nodes:
            if node.name not in plan:
                continue
            argv = stack.enter_context(argv_for(cfg, node, key))
            try:
                sessions.append(NodeSession(node.name, argv, node_script(plan[node.name], opts),
                                            opts.follow, events))
            except OSError as exc:  # no ssh client
                printer.note(f"{node.name}: cannot start {argv[0]}: {exc.strerror}")
                failed = True
        started = {s.node for s in sessions}
        try:
            failed = _print_events(events, sessions, [t for t in targets if t.node in started],
                                   opts, printer, stop) or failed
        except KeyboardInterrupt:
            pass
        finally:
            for s in sessions:
                s.stopping = True
            for s in sessions:
                s.stop()
    return 1 if failed else 0


def _print_events(events: queue.Queue[tuple[float, Event]], sessions: Sequence[NodeSession],
                  targets: Sequence[Target], opts: Options, printer: Printer,
                  stop: threading.Event | None) -> bool:
    """The printing loop; True when a node failed. Until every container's history has come
    (or its node ended) entries are held and merged exactly; then, with -f, each is held
    REORDER_SECONDS after it arrived and the held ones print in time order."""
    running = {s.node for s in sessions}
    unsynced = {(t.node, t.container) for t in targets}
    history: list[Entry] = []
    held: list[tuple[int, int, float, Entry]] = []  # (ts, arrival order, arrival, entry)
    seq = 0
    failed = False

    def flush(upto: float | None) -> None:
        while held and (upto is None or held[0][2] <= upto):
            printer.entry(heapq.heappop(held)[3])

    while running and not (stop is not None and stop.is_set()):
        try:
            arrived, event = events.get(timeout=0.1)
        except queue.Empty:
            if not unsynced:
                flush(time.monotonic() - REORDER_SECONDS)
            continue
        if isinstance(event, Ended):
            running.discard(event.node)
            unsynced = {u for u in unsynced if u[0] != event.node}
            stopping = any(s.stopping for s in sessions if s.node == event.node)
            if event.rc != 0 and not stopping:
                failed = True
                printer.note(_failure(event))
        elif isinstance(event, Synced):
            unsynced.discard((event.node, event.container))
        elif unsynced:
            history.append(event)
        else:
            seq += 1
            heapq.heappush(held, (event.ts, seq, arrived, event))
        if not unsynced and history:
            for e in merge(history):
                printer.entry(e)
            history.clear()
        if not unsynced:
            flush(time.monotonic() - REORDER_SECONDS)
    for e in merge(history):
        printer.entry(e)
    flush(None)
    return failed


# --- the command ----------------------------------------------------------------------------


@click.command("logs")
@click.option("-s", "--stack", required=True, help="stack name: reads Pulumi.<stack>.yaml")
@click.argument("model", required=False)
@click.option("--node", "node", metavar="NAME", help="only this node's containers")
@click.option("-f", "--follow", is_flag=True,
              help="keep printing new lines, across restarts, until Ctrl-C")
@click.option("--since", type=SinceType(),
              help="only lines since then: 10m, 1h, 2024-05-01T12:00:00Z (what docker takes)")
@click.option("--tail", type=click.IntRange(min=0), metavar="N",
              help="only the last N lines of each container (before following)")
@click.option("--key", metavar="PATH",
              help="ssh private key file (overrides spark-vllm:ssh.privateKeyPath)")
@click.option("--color", type=click.Choice(["auto", "always", "never"]), default="auto",
              show_default=True, help="colours (auto: when stdout is a terminal)")
def command(stack: str, model: str | None, node: str | None, follow: bool, since: str | None,
            tail: int | None, key: str | None, color: str) -> None:
    """Every rank's vLLM log (and Ray's) of a stack, merged in time order.

    MODEL is a served model name: the main model (its vLLM containers, and with vllm.executor
    ray the Ray containers, where its ranks run) or a service. Without MODEL: every model's
    containers, Ray's and the gateway's. Each line reads `<time> <node>/<container> | <line>`
    (time in UTC, each node's own clock); notes (a container missing, stopped, running again)
    and unreachable nodes go to stderr.

    Exit status: 0; 1 when a node could not be read (the others' logs still print); 2 for a
    usage or config problem. With -f, Ctrl-C ends it (exit 0 unless a node failed).
    """
    try:
        cfg = load_stack_config(stack)
        names = StackNames(stack)
    except (ConfigError, ValueError) as exc:
        click.echo(str(exc), err=True)
        sys.exit(2)
    try:
        targets = select_targets(cfg, names, model, node)
    except SelectionError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    use_color = color == "always" or (color == "auto" and sys.stdout.isatty())
    printer = Printer(stack, use_color)
    opts = Options(since=since, tail=tail, follow=follow)
    if follow:  # a supervisor's SIGTERM ends it as Ctrl-C does, the nodes' side included
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(run(cfg, targets, opts, printer, key=key))
