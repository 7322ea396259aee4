"""The node's guard against memory exhaustion (config/guard.py; components/guard.py runs these):
sshd and dockerd kept out of the OOM killer's way, an early OOM killer at the stack's OS reserve
that prefers the stack's vLLM processes, and a record of every kill it makes.

What is written on a node (docs/design.md "A node that survives memory exhaustion"):

* per stack, systemd drop-ins of its own (`/etc/systemd/system/<unit>.d/50-spark-vllm-<stack>.conf`,
  0644), removed on destroy:
  - `ssh.service`, `docker.service`: `OOMScoreAdjust=` (systemd.exec(5)): the daemons and what
    they start from then on; the running sshd and dockerd get the value at once
    (/proc/<pid>/oom_score_adj), as they would at their next start. containerd keeps its own
    unit's -999 (Debian's and Docker's packages ship it);
  - `earlyoom.service` (killer earlyoom): its command line, replacing the package's
    `ExecStart` (so /etc/default/earlyoom no longer applies): SIGTERM once MemAvailable is below
    the reserve, SIGKILL below half of it (earlyoom's -M SIZE,KILL_SIZE in KiB), swap ignored
    (`-s 100`), the stack's vLLM processes preferred (`--prefer`, +300 to their oom_score), the
    node's daemons and the stack's gateway and Prometheus avoided (`--avoid`, -300), every kill
    handed to the guard's hook (`-N`). It runs as root instead of the package's DynamicUser (the
    hook writes the guard's folder; `ReadWritePaths=` opens only that one under the package's
    `ProtectSystem=strict`), with CAP_KILL and CAP_IPC_LOCK only, and the kernel never kills it
    (`OOMScoreAdjust=-1000`). earlyoom's options: its man page, earlyoom(1)
    (https://github.com/rfjakob/earlyoom/blob/v1.7/MANPAGE.md);
  - killer systemd-oomd: `system.slice` (where Docker's systemd cgroup driver puts the
    containers) `ManagedOOMMemoryPressure=kill`, and `ManagedOOMPreference=omit` for ssh,
    docker and containerd (systemd.resource-control(5)); systemd-oomd acts on memory pressure
    (PSI), not on the reserve, and kills a whole cgroup (a container), with no preference for
    vLLM's;
* per node, whichever stacks guard it, the folder GUARD_DIR (0755: nothing in it is secret, and
  the node exporter reads it as nobody): `kills` (one line per kill: `<epoch> <MemAvailable
  bytes> <MemTotal bytes> <pid> <name>`, the memory when earlyoom acted as its own log reports
  it, `-` when it does not say; the name reduced to [A-Za-z0-9_.:+-]), `count`, the
  hook `earlyoom-kill`, `metrics/spark-vllm-oom.prom` (the node exporter's textfile collector:
  the kill count, the last kill's time and available memory), `stacks/<stack>` (the stacks
  that use it; the last one to leave removes the folder) and `killer-before` (the killer's
  state before the first stack took it over: `destroy` of the last stack puts it back).

When the earlyoom drop-ins of two stacks meet on a node, systemd applies them in name order and
the last one's ExecStart wins (the apply says so); both protect and prefer the same processes.
The stack never removes a package it installed (`guard.install`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from hostscripts.common import plain, q
from hostscripts.paths import GUARD_DIR, StackNames

KILLS = f"{GUARD_DIR}/kills"
COUNT = f"{GUARD_DIR}/count"
HOOK = f"{GUARD_DIR}/earlyoom-kill"
USERS = f"{GUARD_DIR}/stacks"
BEFORE = f"{GUARD_DIR}/killer-before"
METRICS_DIR = f"{GUARD_DIR}/metrics"  # the node exporter's --collector.textfile.directory
METRICS = f"{METRICS_DIR}/spark-vllm-oom.prom"
EARLYOOM = "/usr/bin/earlyoom"  # Debian's and Ubuntu's package put it there
OOMD = ("/usr/lib/systemd/systemd-oomd", "/lib/systemd/systemd-oomd")
DAEMON_UNITS = ("ssh.service", "docker.service")
KILLER_UNITS = {"earlyoom": "earlyoom.service", "systemd-oomd": "systemd-oomd.service"}
KILLERS = tuple(KILLER_UNITS)
# earlyoom matches these against a process's name (/proc/<pid>/comm, 15 characters), from its
# start: vLLM's API server (`vllm`), the processes vLLM names itself (setproctitle:
# VLLM::EngineCore, VLLM::Worker_TP0, ...) and its ranks under Ray (ray::RayWorkerWrapper);
# the node's sshd (and sshd-session), dockerd, containerd (and its shims), systemd and its
# daemons, the stack's gateway (haproxy), Prometheus and its node exporter (node_exporter,
# Debian's prometheus-node-exporter), and earlyoom itself. Neither holds `$` or `%` (systemd
# would expand them in ExecStart) or a space.
PREFER = "^(vllm|VLLM::|ray::RayWorker)"
AVOID = "^(sshd|dockerd|containerd|systemd|haproxy|prometheus|node_exporter|earlyoom)"
REPORT_SECONDS = 3600  # earlyoom's memory report in its log (-r): hourly
KiB = 1024


@dataclass(frozen=True)
class GuardSpec:
    """One node's guard as one stack declares it."""

    node: str
    stack: str
    killer: str  # config.guard.Killer
    reserve_bytes: int  # preflight.osReserveBytes: earlyoom's SIGTERM threshold
    protect_score_adj: int  # sshd's and dockerd's OOMScoreAdjust

    def __post_init__(self) -> None:
        plain(self.node)
        StackNames(self.stack)
        if self.killer not in KILLERS:
            raise ValueError(f"not an OOM killer the guard knows: {self.killer!r}")
        if (not isinstance(self.reserve_bytes, int) or isinstance(self.reserve_bytes, bool)
                or self.reserve_bytes < 2 * KiB):
            raise ValueError(f"the OS reserve is a byte count of 2 KiB or more, not "
                             f"{self.reserve_bytes!r}")
        if not -999 <= int(self.protect_score_adj) <= 0:
            raise ValueError(f"protectScoreAdj is -999..0, not {self.protect_score_adj!r}")

    @property
    def names(self) -> StackNames:
        return StackNames(self.stack)

    @property
    def killer_unit(self) -> str:
        return KILLER_UNITS[self.killer]

    @property
    def term_kib(self) -> int:
        """earlyoom's SIGTERM threshold (MemAvailable at or below it), KiB."""
        return self.reserve_bytes // KiB

    @property
    def kill_kib(self) -> int:
        """its SIGKILL threshold: half of it (earlyoom's own default ratio)."""
        return self.term_kib // 2


def _header(spec: GuardSpec, what: str) -> str:
    return (f"# spark-vllm stack {plain(spec.stack)}: {what} (node {plain(spec.node)})\n"
            "# written by spark-vllm (hostscripts/guard.py); `pulumi up` keeps it, "
            "`pulumi destroy` removes it\n")


def earlyoom_argv(spec: GuardSpec) -> list[str]:
    """earlyoom's command line as the stack's drop-in sets it."""
    return [EARLYOOM, "-M", f"{spec.term_kib},{spec.kill_kib}", "-s", "100",
            "-r", str(REPORT_SECONDS), "--prefer", PREFER, "--avoid", AVOID, "-N", HOOK]


def daemon_files(spec: GuardSpec) -> dict[str, str]:
    """The stack's drop-ins for the node's daemons: path -> text."""
    out = {}
    units = list(DAEMON_UNITS) + (["containerd.service"] if spec.killer == "systemd-oomd" else [])
    for unit in units:
        lines = [_header(spec, f"{unit} out of the OOM killer's way"), "[Service]\n"]
        if unit in DAEMON_UNITS:
            lines.append(f"OOMScoreAdjust={int(spec.protect_score_adj)}\n")
        if spec.killer == "systemd-oomd":  # never a candidate of systemd-oomd's kills
            lines.append("ManagedOOMPreference=omit\n")
        out[spec.names.guard_dropin(unit)] = "".join(lines)
    return out


def killer_files(spec: GuardSpec) -> dict[str, str]:
    """The stack's drop-ins for its early OOM killer: path -> text."""
    if spec.killer == "earlyoom":
        words = earlyoom_argv(spec)
        assert all(re.fullmatch(r"[^\s$%\\\"']+", w) for w in words), words
        text = (_header(spec, "earlyoom at the stack's OS reserve")
                + f"# SIGTERM once MemAvailable <= {spec.term_kib} KiB (preflight.osReserveBytes), "
                f"SIGKILL <= {spec.kill_kib} KiB; every kill\n"
                f"# recorded in {KILLS} by {HOOK}\n"
                "[Service]\n"
                "DynamicUser=no\n"
                f"ReadWritePaths=-{GUARD_DIR}\n"
                "CapabilityBoundingSet=CAP_KILL CAP_IPC_LOCK\n"
                "AmbientCapabilities=CAP_KILL CAP_IPC_LOCK\n"
                "OOMScoreAdjust=-1000\n"
                "ExecStart=\n"
                f"ExecStart={' '.join(words)}\n")
        return {spec.names.guard_dropin("earlyoom.service"): text}
    slice_text = (_header(spec, "systemd-oomd kills under memory pressure in system.slice")
                  + "[Slice]\nManagedOOMMemoryPressure=kill\n")
    oomd_text = (_header(spec, "systemd-oomd never killed by the kernel")
                 + "[Service]\nOOMScoreAdjust=-1000\n")
    return {spec.names.guard_dropin("system.slice"): slice_text,
            spec.names.guard_dropin("systemd-oomd.service"): oomd_text}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def file_digests(spec: GuardSpec) -> dict[str, str]:
    """What `sha256sum` prints for each of the stack's files on the node (recon compares)."""
    return {p: sha256(t) for p, t in {**daemon_files(spec), **killer_files(spec)}.items()}


# --------------------------------------------------------------------------- node-wide records

# sh: write the textfile collector's file from the count, the last kill's time and available
# memory ("" when none yet); atomically, so the node exporter never reads half of it
_WRITE_METRICS = "\n".join([
    "write_metrics() {",
    f'  tmp="{METRICS_DIR}/.spark-vllm-oom.$$"',
    "  {",
    "    echo '# HELP spark_vllm_oom_kills_total Processes killed on this node by the early OOM "
    "killer of the spark-vllm guard.'",
    "    echo '# TYPE spark_vllm_oom_kills_total counter'",
    '    echo "spark_vllm_oom_kills_total $1"',
    '    if [ -n "$2" ]; then',
    "      echo '# HELP spark_vllm_oom_last_kill_timestamp_seconds When it last killed a process.'",
    "      echo '# TYPE spark_vllm_oom_last_kill_timestamp_seconds gauge'",
    '      echo "spark_vllm_oom_last_kill_timestamp_seconds $2"',
    "      echo '# HELP spark_vllm_oom_last_kill_available_bytes MemAvailable of the node when "
    "it did.'",
    "      echo '# TYPE spark_vllm_oom_last_kill_available_bytes gauge'",
    '      echo "spark_vllm_oom_last_kill_available_bytes $3"',
    "    fi",
    '  } > "$tmp" && chmod 644 "$tmp" && mv -f "$tmp" ' + f'"{METRICS}"',
    "}",
])


# awk over earlyoom's log (`journalctl -o cat`): the memory it reported ("mem avail: <MiB> of
# <MiB> MiB", printed before it acts) when it sent the signal to process `pid`, in bytes
_AVAIL_AWK = ('/mem avail:/ { for (i = 1; i < NF; i++) if ($i == "avail:") '
              '{ a = $(i + 1); t = $(i + 3) } } '
              '/sending SIG/ && index($0, "to process " pid " ") { fa = a; ft = t } '
              'END { if (fa != "") printf "%.0f %.0f", fa * 1048576, ft * 1048576 }')


def hook_text() -> str:
    """earlyoom's -N script: run by earlyoom after each kill (once the victim exited, or after
    10 s), with EARLYOOM_PID, EARLYOOM_NAME (the victim's name, which its owner chose: reduced
    to [A-Za-z0-9_.:+-] here) and EARLYOOM_UID in its environment. It records the kill with the
    node's memory when earlyoom acted, as earlyoom's own log reports it (the victim's memory is
    free by now); `-` when the log does not say (then MemTotal from /proc/meminfo). It updates
    the count the node exporter reads."""
    return "\n".join([
        "#!/bin/sh",
        "# spark-vllm's guard: earlyoom's kill hook (written by spark-vllm, hostscripts/guard.py)",
        "set -u",
        "umask 022",
        _WRITE_METRICS,
        "now=$(date +%s)",
        "pid=${EARLYOOM_PID:-0}",
        "case $pid in ''|*[!0-9]*) pid=0 ;; esac",
        # journald may take a moment to have earlyoom's lines
        "mem=",
        "for i in 1 2 3 4 5 6 7 8 9 10; do",
        "  mem=$(journalctl -u earlyoom.service -o cat -n 300 --no-pager 2>/dev/null | "
        f"awk -v pid=\"$pid\" {q(_AVAIL_AWK)})",
        '  [ -z "$mem" ] || break',
        "  sleep 0.2",
        "done",
        '[ -n "$mem" ] || mem="- $(awk \'$1 == "MemTotal:" {printf "%.0f", $2 * 1024}\' '
        '/proc/meminfo)"',
        "name=$(printf '%s' \"${EARLYOOM_NAME:-}\" | tr -c 'A-Za-z0-9_.:+-' '_' | cut -c 1-32)",
        "[ -n \"$name\" ] || name=-",
        f'printf \'%s %s %s %s\\n\' "$now" "$mem" "$pid" "$name" >> {KILLS}',
        # at most 10000 lines (the newest 5000 kept); the count goes on
        f'if [ "$(wc -l < {KILLS})" -gt 10000 ]; then',
        f"  tail -n 5000 {KILLS} > {KILLS}.new && mv -f {KILLS}.new {KILLS}",
        "fi",
        f"n=$(cat {COUNT} 2>/dev/null || echo 0)",
        "case $n in ''|*[!0-9]*) n=0 ;; esac",
        "n=$((n + 1))",
        f'echo "$n" > {COUNT}.new && mv -f {COUNT}.new {COUNT}',
        'avail=${mem% *}; [ "$avail" != - ] || avail=NaN',
        'write_metrics "$n" "$now" "$avail"',
        'echo "spark-vllm guard: recorded the kill of $name (pid $pid) with ${mem% *} bytes '
        'available"',
        "",
    ])


def records_script(spec: GuardSpec) -> str:
    """The node's guard folder (GUARD_DIR) made, its hook written, this stack marked as one of
    its users. Idempotent; keeps the kills recorded so far."""
    return "\n".join([
        "set -eu",
        f"me={q(spec.node)}",
        _WRITE_METRICS,
        f"mkdir -p {METRICS_DIR} {USERS}",
        # the node exporter (nobody) reads the metrics: the stack's folder must be traversable
        # (its stacks/ folder stays root-only)
        f"chmod go+x {GUARD_DIR.rsplit('/', 1)[0]}",
        f"chmod 755 {GUARD_DIR} {METRICS_DIR}",
        f"chmod 700 {USERS}",
        f"printf %s {q(hook_text())} > {HOOK}.new",
        f"chmod 755 {HOOK}.new",
        f"mv -f {HOOK}.new {HOOK}",
        f"[ -e {KILLS} ] || : > {KILLS}",
        f"chmod 644 {KILLS}",
        f"[ -s {COUNT} ] || echo 0 > {COUNT}",
        f"[ -e {METRICS} ] || write_metrics \"$(cat {COUNT})\" '' ''",
        f": > {USERS}/{q(spec.stack)}",
        f'echo "guard $me: OOM kills recorded in {KILLS} ($(cat {COUNT}) so far)"',
        "",
    ])


def records_remove(spec: GuardSpec) -> str:
    """This stack no longer uses the node's guard folder; the last one to leave removes it."""
    return "\n".join([
        "set -eu",
        f"me={q(spec.node)}",
        f"rm -f {USERS}/{q(spec.stack)}",
        f'if [ -d {USERS} ] && [ -n "$(ls -A {USERS})" ]; then',
        f'  echo "guard $me: {GUARD_DIR} kept for the stacks $(ls {USERS} | tr \'\\n\' \' \')"',
        "  exit 0",
        "fi",
        f"rm -rf {GUARD_DIR}",
        f'echo "guard $me: {GUARD_DIR} removed"',
        "",
    ])


# --------------------------------------------------------------------------- systemd units

def _write_files(files: dict[str, str]) -> list[str]:
    """sh lines that write each file (0644) when its content differs, atomically."""
    out = []
    for path, text in files.items():
        d = path.rsplit("/", 1)[0]
        out += [f"mkdir -p {q(d)}",
                f"printf %s {q(text)} > {q(path + '.new')}",
                f"chmod 644 {q(path + '.new')}",
                f"mv -f {q(path + '.new')} {q(path)}"]
    return out


def _remove_files(paths: list[str]) -> list[str]:
    out = []
    for path in paths:
        out += [f"rm -f {q(path)}", f"rmdir {q(path.rsplit('/', 1)[0])} 2>/dev/null || true"]
    return out


_NEED_SYSTEMCTL = ("command -v systemctl >/dev/null 2>&1 || fail 'systemctl is not on this node: "
                   "the guard keeps sshd, dockerd and the OOM killer through their systemd units'")


def _main_pid(unit: str) -> str:
    return (f"pid=$(systemctl show -p MainPID --value {q(unit)} 2>/dev/null || echo 0); "
            "case $pid in ''|*[!0-9]*) pid=0 ;; esac")


def daemons_script(spec: GuardSpec) -> str:
    """The daemons' drop-ins written, systemd told, and the running sshd and dockerd given the
    value now (only ever lowered: a daemon that protects itself more keeps its own; where the
    kernel refuses, a note: the drop-in applies from the daemon's next start)."""
    adj = int(spec.protect_score_adj)
    lines = [
        "set -eu",
        f"me={q(spec.node)}; adj={adj}",
        'fail() { echo "guard $me: $*" >&2; exit 1; }',
        _NEED_SYSTEMCTL,
        *_write_files(daemon_files(spec)),
        # the stack's drop-in of a daemon this killer does not need (containerd's, with
        # systemd-oomd only)
        *(f"rm -f {q(spec.names.guard_dropin(u))}" for u in ("containerd.service",)
          if spec.names.guard_dropin(u) not in daemon_files(spec)),
        "systemctl daemon-reload || fail 'systemctl daemon-reload failed'",
        "now=",
    ]
    for unit in DAEMON_UNITS:
        lines += [
            _main_pid(unit),
            'if [ "$pid" -gt 0 ] && [ -e "/proc/$pid/oom_score_adj" ]; then',
            '  cur=$(cat "/proc/$pid/oom_score_adj")',
            # lowering needs CAP_SYS_RESOURCE, which a node's root may lack (a container, the
            # lab's machine): then the drop-in alone applies, from the daemon's next start
            '  if [ "$cur" -gt "$adj" ] && ! echo "$adj" 2>/dev/null > "/proc/$pid/oom_score_adj"; '
            'then',
            f'    echo "guard $me: note: the kernel refused to lower the oom_score_adj of {unit} '
            '(pid $pid) now (no CAP_SYS_RESOURCE here); its drop-in applies from its next '
            'start" >&2',
            "  fi",
            f'  now="$now {unit}: pid $pid at $(cat "/proc/$pid/oom_score_adj");"',
            "else",
            f'  now="$now {unit}: not running;"',
            "fi",
        ]
    lines += [f'echo "guard $me: OOMScoreAdjust=$adj for {" and ".join(DAEMON_UNITS)};$now"',
              ""]
    return "\n".join(lines)


def daemons_remove(spec: GuardSpec) -> str:
    """The stack's daemon drop-ins removed (the running daemons keep their value until their
    next start, which takes the units' own again)."""
    return "\n".join([
        "set -eu",
        f"me={q(spec.node)}",
        *_remove_files(list(daemon_files(spec))),
        "if command -v systemctl >/dev/null 2>&1; then systemctl daemon-reload || true; fi",
        'echo "guard $me: the stack\'s drop-ins for the daemons removed"',
        "",
    ])


def _installed(spec: GuardSpec) -> str:
    """sh condition: the killer's program is on the node."""
    if spec.killer == "earlyoom":
        return f"[ -x {EARLYOOM} ]"
    return "{ " + " || ".join(f"[ -x {p} ]" for p in OOMD) + "; }"


def killer_script(spec: GuardSpec) -> str:
    """The killer's drop-ins written, the killer enabled and (re)started with them, and proven
    running; with earlyoom, its running command line read back (another stack's drop-in that
    sorts after this one's wins: said, not an error)."""
    unit = spec.killer_unit
    pkg = "earlyoom" if spec.killer == "earlyoom" else "systemd-oomd"
    lines = [
        "set -eu",
        f"me={q(spec.node)}; unit={q(unit)}",
        'fail() { echo "guard $me: $*" >&2; exit 1; }',
        _NEED_SYSTEMCTL,
        f"{_installed(spec)} || fail "
        + q(f"{pkg} is not installed: apt-get install {pkg} (the node's Debian/Ubuntu "
            "package), or set spark-vllm:guard.install: true"),
        f"[ -x {HOOK} ] || fail "
        + q(f"the guard folder {GUARD_DIR} is missing (its records command makes it first)"),
        # what the node ran before the first stack took the killer over (destroy puts it back)
        f"if [ ! -s {BEFORE} ]; then",
        '  a=$(systemctl is-active "$unit" 2>/dev/null || true)',
        '  e=$(systemctl is-enabled "$unit" 2>/dev/null || true)',
        f'  echo "${{a:-unknown}} ${{e:-unknown}}" > {BEFORE}',
        "fi",
        *_write_files(killer_files(spec)),
        "systemctl daemon-reload || fail 'systemctl daemon-reload failed'",
        'systemctl enable "$unit" >/dev/null 2>&1 || fail "systemctl enable $unit failed"',
        'systemctl restart "$unit" || fail "$unit did not start: $(systemctl status "$unit" '
        "2>&1 | tail -n 5 | tr '\\n' ' ')\"",
        "i=0",
        'until [ "$(systemctl is-active "$unit" 2>/dev/null || true)" = active ]; do',
        '  i=$((i + 1)); [ $i -le 20 ] || fail "$unit is not active 10 s after its restart"',
        "  sleep 0.5",
        "done",
        _main_pid(unit),
    ]
    if spec.killer == "earlyoom":
        want = f"-M {spec.term_kib},{spec.kill_kib} "
        lines += [
            'args=$(tr \'\\0\' \' \' < "/proc/$pid/cmdline" 2>/dev/null || true)',
            f'case "$args" in *{q(want)}*) ;;',
            '  *) echo "guard $me: note: earlyoom runs as: $args (a drop-in of another stack '
            'that sorts after this one wins)" >&2 ;;',
            "esac",
            f'echo "guard $me: earlyoom (pid $pid) sends SIGTERM at {spec.term_kib} KiB '
            f'available, SIGKILL at {spec.kill_kib} KiB, preferring the stack\'s vLLM"',
        ]
    else:
        lines.append('echo "guard $me: systemd-oomd (pid $pid) kills under memory pressure in '
                     'system.slice"')
    return "\n".join([*lines, ""])


def killer_remove(spec: GuardSpec) -> str:
    """The stack's killer drop-ins removed. Another stack's left on the node: the killer is
    restarted with them; none: it is put back as the node ran it before the first stack (its
    package's own settings, stopped and disabled if it was)."""
    unit = spec.killer_unit
    dropin_dir = spec.names.guard_dropin(unit).rsplit("/", 1)[0]
    return "\n".join([
        "set -eu",
        f"me={q(spec.node)}; unit={q(unit)}",
        *_remove_files(list(killer_files(spec))),
        'command -v systemctl >/dev/null 2>&1 || { echo "guard $me: no systemctl"; exit 0; }',
        "systemctl daemon-reload || true",
        f"if ls {q(dropin_dir)}/50-spark-vllm-*.conf >/dev/null 2>&1; then",
        '  systemctl restart "$unit" || true',
        '  echo "guard $me: $unit runs on with another stack\'s drop-in"',
        "  exit 0",
        "fi",
        f'before=$(cat {BEFORE} 2>/dev/null || echo "unknown unknown")',
        "set -- $before",
        'case ${1:-} in active) systemctl restart "$unit" || true ;; '
        '*) systemctl stop "$unit" || true ;; esac',
        'case ${2:-} in enabled) ;; *) systemctl disable "$unit" >/dev/null 2>&1 || true ;; esac',
        f"rm -f {BEFORE}",
        'echo "guard $me: $unit put back as the node ran it before ($before)"',
        "",
    ])


def install_script(spec: GuardSpec) -> str:
    """`guard.install`: the killer's package from the node's own package sources, when its
    program is missing (the package's own settings until the killer command applies the
    stack's)."""
    pkg = "earlyoom" if spec.killer == "earlyoom" else "systemd-oomd"
    return "\n".join([
        "set -eu",
        f"me={q(spec.node)}; pkg={pkg}",
        'fail() { echo "guard $me: $*" >&2; exit 1; }',
        f"if {_installed(spec)}; then",
        '  echo "guard $me: $pkg is installed"; exit 0',
        "fi",
        "command -v apt-get >/dev/null 2>&1 || fail \"no apt-get on this node: install $pkg "
        "by hand\"",
        "export DEBIAN_FRONTEND=noninteractive",
        'if ! apt-get install -y -q --no-install-recommends "$pkg" >/tmp/spark-vllm-guard-apt.$$ '
        "2>&1; then",
        "  apt-get update -q >/dev/null 2>&1 || true",
        '  apt-get install -y -q --no-install-recommends "$pkg" >/tmp/spark-vllm-guard-apt.$$ '
        "2>&1 || { tail -n 5 /tmp/spark-vllm-guard-apt.$$ >&2; "
        "rm -f /tmp/spark-vllm-guard-apt.$$; fail \"apt-get install $pkg failed\"; }",
        "fi",
        "rm -f /tmp/spark-vllm-guard-apt.$$",
        f"{_installed(spec)} || fail \"$pkg installed, but its program is not there\"",
        'echo "guard $me: installed $pkg $(dpkg-query -W -f \'${Version}\' "$pkg" '
        '2>/dev/null || true)"',
        "",
    ])


ALL_UNITS = (*DAEMON_UNITS, "containerd.service", "earlyoom.service", "system.slice",
             "systemd-oomd.service")


def survey_files(names: StackNames) -> list[str]:
    """Every drop-in the stack may keep on a node, whichever its killer (recon's guard section
    reads them all: inspection/snippets/guard.sh)."""
    return [names.guard_dropin(u) for u in ALL_UNITS]
