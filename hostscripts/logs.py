"""The script `spark-vllm logs` (tools/logs.py) runs on each node: the `docker logs
--timestamps` lines of the stack's containers there, framed, on one stdout.

The node's ssh session runs `node_script` on stdin (`bash -s`). It prints one framed line per log
line (below), so the containers of a node can share the session's stdout and be told apart again
on the operator's side (inspection/logs.py parses the frames). Every container's lines come in
Docker's order.

With follow each container is followed across restarts and replacements: its history (what
since/tail ask for) is read first, then `docker logs --follow --since <the newest timestamp
printed>`; that ends when the container stops, the node's loop waits until it runs again (or
exists again) and resumes the same way. `--since` is inclusive: the lines printed with exactly
that timestamp come again and are dropped (the node's awk, `_AWK`, remembers them), so no line
prints twice and every line stamped after it prints. (A line Docker stamped before the newest
one but wrote after the call ended, stdout and stderr being copied apart, is not shown again:
that takes a call ending while the container writes, which a stopped container does not.)
When its stdin closes (the operator's Ctrl-C) the script ends every `docker logs` it started and
exits (its stdout gone, the same happens through SIGPIPE).

Frames the node script prints (container names are [A-Za-z0-9_.-], so a space ends them):
    L <container> <docker line>   a log line (or the last piece of a long one)
    P <container> <piece>         a piece of a long line (pieces stay under PIPE_BUF, so that
                                  lines of two containers written at once never mix)
    M <container> <node time> <message>   a note: no such container, stopped, running again
    S <container>                 the history of the container is complete
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

POLL_SECONDS = 1.0  # how often a node's loop asks whether a stopped container runs again
PIECE_BYTES = 3072  # a long line is sent in pieces of this size (+ the frame's prefix < 4096)
CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


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

