"""`spark-vllm logs`: every container log of one stack, merged in time order.

    spark-vllm logs -s STACK [MODEL] [--node N] [-f] [--since 10m] [--tail N] [--key PATH]

What is read: `docker logs --timestamps` of the stack's containers (hostscripts/paths.py
StackNames), stdout and stderr both (vLLM logs to stderr). The main model is its vLLM container
(`serve`: on the head with vllm.executor ray, whose tensor-parallel ranks print into it through
Ray as `(RayWorkerWrapper pid=.., ip=..)`; on every node with executor mp) and, with the Ray
executor, the Ray containers (`ray-head`, `ray-worker`); a service is its own container on its
nodes; without MODEL every model's containers, Ray's and the gateway's.

How: one ssh session per node (tools/stack_access.py: only the node's pinned host key, no tty)
runs the script of `node_script` on stdin. It prints one framed line per log line (below), so
the containers of a node can share the session's stdout and be told apart again here. Every
container's lines come in Docker's order; the lines of all containers are merged by Docker's
timestamp (RFC3339Nano, the node's clock: the nodes' clocks are not corrected here, so lines of
two nodes closer in time than the clocks' offset may print in the wrong order; NTP keeps that
to milliseconds).

With -f each container is followed across restarts and replacements: its history (what
--since/--tail ask for) is read first, then `docker logs --follow --since <the newest timestamp
printed>`; that ends when the container stops, the node's loop waits until it runs again (or
exists again) and resumes the same way. `--since` is inclusive: the lines printed with exactly
that timestamp come again and are dropped (the node's awk, `_AWK`, remembers them), so no line
prints twice and every line stamped after it prints. (A line Docker stamped before the newest
one but wrote after the call ended, stdout and stderr being copied apart, is not shown again:
that takes a call ending while the container writes, which a stopped container does not.)
Output is held for `REORDER_SECONDS` and printed sorted, so two nodes' lines interleave right;
the history of every container is merged exactly before following starts.
Ctrl-C closes the sessions' stdin: the node's script ends every `docker logs` it started and
exits (its stdout gone, the same happens through SIGPIPE).

Lines are untrusted: terminal control sequences and control characters are removed before
printing, a carriage return keeps what a terminal would show (the text after the last one),
and rich never interprets markup in them.

Frames the node script prints (container names are [A-Za-z0-9_.-], so a space ends them):
    L <container> <docker line>   a log line (or the last piece of a long one)
    P <container> <piece>         a piece of a long line (pieces stay under PIPE_BUF, so that
                                  lines of two containers written at once never mix)
    M <container> <node time> <message>   a note: no such container, stopped, running again
    S <container>                 the history of the container is complete
"""

from __future__ import annotations

import heapq
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import IO, Literal

import click
from rich.console import Console
from rich.text import Text

from config import ConfigError, NodeConfig, StackConfig
from hostscripts.paths import StackNames
from tools import stack_access
from tools.recon_report import load_stack_config
from tools.terminal import sanitize

POLL_SECONDS = 1.0  # how often a node's loop asks whether a stopped container runs again
REORDER_SECONDS = 0.5  # with -f, how long a line is held so later-arriving earlier lines sort
PIECE_BYTES = 3072  # a long line is sent in pieces of this size (+ the frame's prefix < 4096)
CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# --- what to read ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One container to read on one node."""

    node: str
    container: str


class SelectionError(ValueError):
    """MODEL or --node names nothing of the stack (the message lists what it knows)."""


def select_targets(cfg: StackConfig, names: StackNames, model: str | None = None,
                   node: str | None = None) -> list[Target]:
    """The containers to read, node by node in the config's order: the main model (`serve`,
    and Ray's containers with executor ray), a service (its containers on its nodes), or with
    `model` None all of them and the gateway. `node` keeps one node's only."""
    node_names = [n.name for n in cfg.nodes]
    if node is not None and node not in node_names:
        raise SelectionError(f"no node {node!r} in the stack; its nodes: {', '.join(node_names)}")
    models = [cfg.vllm.served_model_name, *(s.served_name for s in cfg.services)]
    if model is not None and model not in models:
        raise SelectionError(f"no model {model!r} in the stack; its models: {', '.join(models)}")

    wanted: list[Target] = []
    if model is None or model == cfg.vllm.served_model_name:
        if cfg.vllm.executor == "mp":
            wanted += [Target(n, names.serve) for n in node_names]
        else:
            wanted.append(Target(cfg.head.name, names.serve))
            wanted.append(Target(cfg.head.name, names.ray_head))
            wanted += [Target(n.name, names.ray_worker) for n in cfg.workers]
    for svc in cfg.services:
        if model is None or model == svc.served_name:
            wanted += [Target(n, names.service(svc.name)) for n in cfg.service_nodes(svc)]
    if model is None:
        wanted.append(Target(cfg.head.name, names.gateway))

    order = {n: i for i, n in enumerate(node_names)}
    chosen = sorted((t for t in wanted if node is None or t.node == node),
                    key=lambda t: order[t.node])  # stable: a node's containers keep their order
    if not chosen:
        raise SelectionError(f"nothing of {model or 'the stack'} runs on {node}")
    return chosen


def by_node(targets: Iterable[Target]) -> dict[str, list[str]]:
    """node -> its containers, in the targets' order."""
    out: dict[str, list[str]] = {}
    for t in targets:
        out.setdefault(t.node, []).append(t.container)
    return out


# --- --since --------------------------------------------------------------------------------

# What `docker logs --since` accepts (https://docs.docker.com/reference/cli/docker/container/logs/):
# a Go duration (10m, 1h30m), a Unix time (seconds[.nanoseconds]), or an RFC 3339 date or time
# (2006-01-02, 2006-01-02T15:04:05, RFC3339Nano; a zone Z or +-07:00, else the local one).
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|ms|s|m|h))+")
_UNIX = re.compile(r"\d{1,12}(?:\.\d{1,9})?")
_DATE = re.compile(r"(\d{4})-(\d\d)-(\d\d)(?:T(\d\d)(?::(\d\d)(?::(\d\d)(?:\.\d{1,9})?)?)?)?"
                   r"(?:Z|[+-](\d\d):(\d\d))?")


def check_since(value: str) -> str:
    """`value` when Docker's --since accepts it (see above), else ValueError saying what does."""
    if _DURATION.fullmatch(value) or _UNIX.fullmatch(value):
        return value
    m = _DATE.fullmatch(value)
    if m:
        y, mo, d, h, mi, s, zh, zm = (int(g) if g else 0 for g in m.groups())
        try:
            datetime(y, mo, d, h, mi, s)
        except ValueError:
            pass
        else:
            if zh <= 23 and zm <= 59:
                return value
    raise ValueError(f"{value!r} is not a time Docker accepts: a duration such as 10m, 1h or "
                     "90s, an RFC 3339 time such as 2024-05-01T12:00:00Z or 2024-05-01, or a "
                     "Unix time in seconds")


class SinceType(click.ParamType[str, object]):
    name = "SINCE"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        try:
            return check_since(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


# --- the node's script ----------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    since: str | None = None  # checked by check_since
    tail: int | None = None
    follow: bool = False
    poll_seconds: float = POLL_SECONDS


# Reads `docker logs --timestamps` lines, prints them as frames (the module's docstring) and
# keeps, in the state file `st`, the newest timestamp printed (line 1: the next call's --since)
# and the lines printed with exactly that timestamp (the rest): `--since` is inclusive, so the
# next call shows those again, and they are dropped. Docker's timestamps have a fixed width (9
# digits; https://docs.docker.com/reference/cli/docker/container/logs/), so comparing them as
# strings orders them. Bytes, not characters (LC_ALL=C): a piece may end inside a UTF-8
# sequence and is joined again before decoding. A frame is printed as one string: mawk's
# `-W interactive` (below) writes each argument of a printf by itself, and the containers'
# frames must not mix.
_AWK = r"""
function stamp(s) {
  return s ~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T/ && substr(s, 14, 1) == ":"
}
BEGIN {
  newest = ""
  if ((getline newest < st) > 0) {
    while ((getline l < st) > 0) seen[l] = 1
  } else newest = ""
  close(st)
}
{
  ts = $1
  if (stamp(ts)) {
    if (ts == newest) {
      if ($0 in seen) next
      seen[$0] = 1
    } else if (newest == "" || ts > newest) {
      split("", seen)
      seen[$0] = 1
      newest = ts
    }
  }
  s = $0
  while (length(s) > piece) {
    f = "P " c " " substr(s, 1, piece) "\n"
    printf "%s", f; fflush()
    s = substr(s, piece + 1)
  }
  f = "L " c " " s "\n"
  printf "%s", f; fflush()
}
END {
  if (newest != "") {
    print newest > st
    for (l in seen) print l > st
    close(st)
  }
}
"""

_SCRIPT = r"""
set -u
export LC_ALL=C
follow=@FOLLOW@
poll=@POLL@
since=@SINCE@
tail=@TAIL@
awk_prog=@AWK@
# mawk (Debian's and Ubuntu's awk) reads a pipe in blocks unless told otherwise: a followed
# line would wait for the next ones
awk_opts=()
case $(awk -W version 2>&1 </dev/null) in mawk*) awk_opts=(-W interactive) ;; esac
# one pipe for every writer: a write of at most PIPE_BUF bytes to a pipe is never split
exec > >(exec cat)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/spark-vllm-logs.XXXXXX") || exit 1
pids=()
now() { date -u +%Y-%m-%dT%H:%M:%S.%NZ; }
note() { printf 'M %s %s %s\n' "$1" "$(now)" "$2"; }
state() {
  local out
  if out=$(docker container inspect --format '{{.State.Running}}' "$1" 2>&1 </dev/null); then
    printf '%s' "$out"
  else
    case $out in
      *"No such"*|*"no such"*) printf missing ;;
      *) out=${out%$'\n'}; printf 'docker: %s' "${out##*$'\n'}" ;;
    esac
  fi
}
# a stream that ended by a signal (SIGPIPE: the operator's side is gone) ends its loop
quit() { [ "$1" -lt 128 ] || exit "$1"; }
stream() {
  local name=$1 st=$2
  shift 2
  docker logs --timestamps "$@" "$name" 2>&1 </dev/null \
    | awk ${awk_opts[@]+"${awk_opts[@]}"} -v c="$name" -v st="$st" -v piece=@PIECE@ "$awk_prog"
}
one() {
  local name=$1 st=$tmp/$2 t0 s shown=
  local first=()
  t0=$(now)
  [ -n "$since" ] && first+=(--since "$since")
  [ -n "$tail" ] && first+=(--tail "$tail")
  s=$(state "$name")
  case $s in
    true|false) stream "$name" "$st" ${first[@]+"${first[@]}"} || quit $? ;;
    missing) note "$name" "no such container"; shown=$s ;;
    *) note "$name" "$s"; shown=$s ;;
  esac
  printf 'S %s\n' "$name"
  [ "$follow" = 1 ] || return 0
  local from
  while :; do
    s=$(state "$name")
    if [ "$s" = true ]; then
      [ -n "$shown" ] && note "$name" "running again"
      shown=
      from=
      [ -s "$st" ] && IFS= read -r from < "$st"
      [ -n "$from" ] || from=${since:-$t0}
      stream "$name" "$st" --follow --since "$from" || quit $?
    elif [ "$s" != "$shown" ]; then
      case $s in
        false) note "$name" "stopped; waiting for it to run again" ;;
        missing) note "$name" "no such container; waiting for it" ;;
        *) note "$name" "$s" ;;
      esac
      shown=$s
    fi
    sleep "$poll"
  done
}
stop() {
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill -TERM -- "-$p" 2>/dev/null; done
  rm -rf "$tmp"
}
main() {
  set -m  # each container's loop in a process group of its own: stop() ends all it started
  @JOBS@
  set +m
  disown -a
  trap stop EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 141' PIPE
  trap 'exit 143' TERM
  if [ "$follow" = 1 ]; then
    # the operator's side closes our stdin (or goes away) to stop: then end every loop
    cat <&0 >/dev/null &
    wait $!
  else
    local p
    for p in "${pids[@]}"; do
      while kill -0 "$p" 2>/dev/null; do wait "$p" 2>/dev/null || sleep 0.05; done
    done
  fi
}
main; exit 0
"""


def node_script(containers: Sequence[str], opts: Options) -> str:
    """The bash script one node runs on stdin (`bash -s`): the logs of `containers`, framed
    (the module's docstring); with opts.follow it runs until its stdin closes."""
    for c in containers:
        if not CONTAINER_NAME.fullmatch(c):
            raise ValueError(f"not a container name: {c!r}")
    since = check_since(opts.since) if opts.since is not None else ""
    if opts.tail is not None and opts.tail < 0:
        raise ValueError("tail must be 0 or more")
    jobs = "\n  ".join(f"one {shlex.quote(c)} s{i} </dev/null & pids+=($!)"
                        for i, c in enumerate(containers))
    values = {
        "@FOLLOW@": "1" if opts.follow else "0",
        "@POLL@": shlex.quote(f"{opts.poll_seconds:g}"),
        "@SINCE@": shlex.quote(since),
        "@TAIL@": shlex.quote("" if opts.tail is None else str(opts.tail)),
        "@AWK@": shlex.quote(_AWK),
        "@PIECE@": str(PIECE_BYTES),
        "@JOBS@": jobs or ":",
    }
    return re.sub("|".join(values), lambda m: values[m.group(0)], _SCRIPT).lstrip()


# --- reading the node's output --------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    kind: Literal["L", "P", "M", "S", "?"]  # "?": not a frame (printed as a note)
    container: str
    payload: bytes


_KINDS: dict[bytes, Literal["L", "P", "M", "S"]] = {
    b"L ": "L", b"P ": "P", b"M ": "M", b"S ": "S"}


def parse_frame(raw: bytes) -> Frame:
    """One line of a node's output (without its newline) as a frame."""
    kind = _KINDS.get(raw[:2])
    name, _, payload = raw[2:].partition(b" ")
    container = name.decode("ascii", "replace")
    if kind is None or not CONTAINER_NAME.fullmatch(container):
        return Frame("?", "", raw)
    return Frame(kind, container, payload)


_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?"
                    r"(Z|[+-]\d\d:\d\d)")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_stamp(stamp: str) -> int | None:
    """An RFC 3339 timestamp as nanoseconds since the epoch, or None."""
    m = _STAMP.fullmatch(stamp)
    if not m:
        return None
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7) or "", m.group(8)
    tz = UTC if zone == "Z" else timezone(
        (-1 if zone[0] == "-" else 1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        at = datetime(y, mo, d, h, mi, s, tzinfo=tz)
    except ValueError:
        return None
    seconds = (at - _EPOCH) // timedelta(seconds=1)
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0"))


@dataclass(frozen=True)
class Entry:
    """A log line (kind "log") or a note of the node's script (kind "note"), at `ts`
    (nanoseconds since the epoch, the node's clock)."""

    ts: int
    node: str
    container: str
    text: str  # as received (sanitize before printing)
    kind: Literal["log", "note"] = "log"


@dataclass(frozen=True)
class Synced:
    """The history of one container of a node has been read (frame S)."""

    node: str
    container: str


@dataclass
class Assembler:
    """Turns one node's frames into entries: joins the pieces of long lines and gives a line
    without a timestamp the one of the line before it in the same container."""

    node: str
    _pieces: dict[str, list[bytes]] = field(default_factory=dict)
    _last: dict[str, int] = field(default_factory=dict)

    def feed(self, frame: Frame) -> Entry | Synced | None:
        c = frame.container
        if frame.kind == "P":
            self._pieces.setdefault(c, []).append(frame.payload)
            return None
        if frame.kind == "S":
            return Synced(self.node, c)
        if frame.kind == "?":
            text = "unexpected output: " + frame.payload.decode("utf-8", "replace")
            return Entry(self._last.get(c, 0), self.node, c, text, "note")
        line = b"".join([*self._pieces.pop(c, []), frame.payload]).decode("utf-8", "replace")
        stamp, _, text = line.partition(" ")
        ts = parse_stamp(stamp)
        if ts is None:
            ts, text = self._last.get(c, 0), line
        self._last[c] = ts
        return Entry(ts, self.node, c, text, "log" if frame.kind == "L" else "note")


def parse_output(node: str, data: bytes) -> list[Entry | Synced]:
    """A node's whole output (the non-follow case), in its order."""
    asm = Assembler(node)
    out = [asm.feed(parse_frame(raw)) for raw in data.split(b"\n") if raw]
    return [e for e in out if e is not None]


def merge(entries: Iterable[Entry | Synced]) -> list[Entry]:
    """Every entry in time order, split by (node, container) and merged (heapq.merge, stable
    for equal times). A container's lines come in Docker's order, which is time order but for
    a stdout and a stderr line stamped close together (copied apart): each stream is sorted
    first (stable, and linear on such nearly sorted input), like -f's reorder window does."""
    streams: dict[tuple[str, str], list[Entry]] = {}
    for e in entries:
        if isinstance(e, Entry):
            streams.setdefault((e.node, e.container), []).append(e)
    return list(heapq.merge(*(sorted(s, key=lambda e: e.ts) for s in streams.values()),
                            key=lambda e: e.ts))


# --- printing -------------------------------------------------------------------------------

def short_name(stack: str, container: str) -> str:
    """The container's name without the stack's `spark-vllm-<stack>-` prefix."""
    prefix = f"spark-vllm-{stack}-"
    return container[len(prefix):] if container.startswith(prefix) else container


def clock(ts: int) -> str:
    """UTC, to the millisecond (Docker's timestamps are UTC)."""
    at = _EPOCH + timedelta(microseconds=ts // 1000)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


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
