"""Reconnaissance: what every node is, before a single resource is registered.

`survey(cfg)` opens ONE ssh round trip per node, all nodes in parallel, bounded by
`preflight.reconTimeoutSeconds`. The node runs a read-only bash script (`recon_script`) fed on
stdin; it prints one block per fact:

    === spark-vllm:section:<name> ===
    <stdout of the command>
    === spark-vllm:stderr:<name> ===
    <first 2000 bytes of its stderr>
    === spark-vllm:end:<name> rc=<exit code> ===

Every command runs under `timeout`, with stdin from /dev/null, so one hung tool (a wedged
nvidia-smi, an unresponsive dockerd) costs its own few seconds and nothing else. A missing tool
(rc 127) becomes an empty fact listed in NodeFacts.missing_tools; a block that cannot be read is
listed in NodeFacts.unreadable with the reason; preflight decides which of them matter.

`parse_recon_output(node, text)` turns that text into NodeFacts (pure, tested on the recorded
GB10 outputs). The ssh part is `ssh_round_trip` (the only function that starts a process);
`classify_ssh_failure` turns ssh's exit code 255 + stderr into a ReconError with a fix.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from components.scripts import STOPPED_DIR, VLLM_PID
from components import parsers as p
from components.facts import DockerFacts, MemoryFacts, NodeFacts, OsFacts
from components.parsers import ParseError

try:  # ConfigError's base: the Pulumi CLI prints the message of a RunError without a traceback
    from pulumi import RunError as _UserError
except ImportError:  # pragma: no cover - pulumi is in requirements.txt
    _UserError = Exception  # type: ignore[misc,assignment]

MARKER = re.compile(r"^=== spark-vllm:(section|stderr|end):(\S+?)(?: rc=(-?\d+))? ===$")

# section -> (seconds, the tool whose absence empties it)
COMMAND_TIMEOUT = 10
DOCKER_TIMEOUT = 20


class ReconError(Exception):
    """One node could not be surveyed. kind: unreachable | auth | host_key | timeout | ssh | output."""

    def __init__(self, node: str, reason: str, fix: str, kind: str = "ssh") -> None:
        self.node, self.reason, self.fix, self.kind = node, reason, fix, kind
        super().__init__(f"{node}: {reason} — {fix}")


class SurveyError(_UserError):
    """Raised by `survey` when one or more nodes could not be surveyed."""

    def __init__(self, errors: list[ReconError], facts: Mapping[str, NodeFacts]) -> None:
        self.errors, self.facts = errors, dict(facts)
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"reconnaissance failed on {len(errors)} node(s):\n{lines}")


# --------------------------------------------------------------------------- the remote script

_HF_CACHE = r'''
root=$1
[ -d "$root/hub" ] && root="$root/hub"
[ -d "$root" ] || exit 0
for repo in "$root"/models--*; do
  [ -d "$repo" ] || continue
  printf 'repo\t%s\n' "${repo##*/}"
  if [ -d "$repo/refs" ]; then
    (cd "$repo/refs" && find . -type f | sed 's|^\./||' | while read -r ref; do
      printf 'ref\t%s\t%s\n' "$ref" "$(head -c 64 "$ref" | tr -d '[:space:]')"; done)
  fi
  for snap in "$repo"/snapshots/*; do [ -d "$snap" ] && printf 'snapshot\t%s\n' "${snap##*/}"; done
  bytes=$(find "$repo/blobs" -type f ! -name '*.incomplete' -printf '%s\n' 2>/dev/null | awk '{s+=$1} END {printf "%d", s}')
  printf 'blobs\t%s\n' "${bytes:-0}"
done
'''

_DF = r'''
p=$1
while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done
df -B1 --output=avail "$p"
'''

_SPEED = r'''
out=$(ethtool "$1" 2>/dev/null | grep -i 'speed:')
if [ -n "$out" ]; then echo "$out"; else cat "/sys/class/net/$1/speed"; fi
'''

_GPU_RUNTIME = r'''
x=$(command -v nvidia-container-runtime-hook) && echo "hook $x"
x=$(command -v nvidia-container-runtime) && echo "hook $x"
for f in /etc/cdi/*nvidia* /var/run/cdi/*nvidia*; do [ -e "$f" ] && echo "cdi $f"; done
exit 0
'''


# Is the stack's own `vllm serve` alive inside a running Ray head container? (Its pid file is
# written by scripts.vllm_start.) One line per head container: "<name> running|stopped".
_VLLM_SERVE = (
    "for c in $(docker ps --filter label=spark-vllm.managed=true "
    "--filter label=spark-vllm.role=ray-head --format '{{.Names}}'); do "
    "if docker exec \"$c\" sh -c 'kill -0 $(cat " + VLLM_PID + ") 2>/dev/null'; "
    "then echo \"$c running\"; else echo \"$c stopped\"; fi; done; exit 0"
)


# Foreign containers a stack stopped (preflight.foreignContainers: stop) leave a marker holding the
# stack's label (scripts.stop_foreign_container): "<container>\t<project>/<stack>" per marker.
_STOPPED = (
    f"for f in {STOPPED_DIR}/*; do [ -f \"$f\" ] && "
    "printf '%s\\t%s\\n' \"${f##*/}\" \"$(head -n 1 \"$f\")\"; done; exit 0"
)


def recon_script(cfg: Any, node: Any) -> str:
    """The read-only bash script one node runs (`bash -s`); pure: same config, same text."""
    q = shlex.quote
    cache_dir = cfg.model.cache_dir
    lines = [
        "# spark-vllm reconnaissance (read-only); generated by components/recon.py",
        f"# node: {node.name}",
        "main() {",
        "export LC_ALL=C",
        # Sections run concurrently (each read-only and independent; `docker stats` alone takes
        # seconds) and are printed in start order, so a node costs its slowest section.
        'SV_DIR=$(mktemp -d 2>/dev/null) || { SV_DIR=/tmp/spark-vllm-recon.$$; mkdir -p "$SV_DIR"; }',
        "SV_N=0",
        "sv_run() {  # <section> <seconds> <command...>",
        '  local name=$1 secs=$2 err="$SV_DIR/err.$BASHPID"; shift 2',
        '  echo "=== spark-vllm:section:$name ==="',
        '  if command -v "$1" >/dev/null 2>&1; then',
        '    timeout -k 2 "$secs" "$@" </dev/null 2>"$err"; rc=$?',
        "  else",
        '    echo "$1: command not found" >"$err"; rc=127',
        "  fi",
        "  echo",
        '  echo "=== spark-vllm:stderr:$name ==="',
        '  head -c 2000 "$err"; echo',
        '  echo "=== spark-vllm:end:$name rc=$rc ==="',
        "}",
        "sv_bg() {  # sv_run in the background; after `wait` the outputs are printed in start order",
        "  SV_N=$((SV_N + 1))",
        '  sv_run "$@" >"$SV_DIR/out.$(printf %03d "$SV_N")" &',
        "}",
        f"sv_run clock_start {COMMAND_TIMEOUT} date +%s.%N",
        f"sv_bg os_release {COMMAND_TIMEOUT} cat /etc/os-release",
        f"sv_bg dgx_release {COMMAND_TIMEOUT} cat /etc/dgx-release",
        f"sv_bg uname {COMMAND_TIMEOUT} uname -a",
        f"sv_bg meminfo {COMMAND_TIMEOUT} cat /proc/meminfo",
        f"sv_bg nvidia_smi_query {COMMAND_TIMEOUT} nvidia-smi "
        f"--query-gpu={','.join(p.QUERY_GPU_FIELDS)} --format=csv,noheader",
        f"sv_bg nvidia_smi {COMMAND_TIMEOUT} nvidia-smi",
        f"sv_bg nvidia_smi_list {COMMAND_TIMEOUT} nvidia-smi -L",
        f"sv_bg ip_addr {COMMAND_TIMEOUT} ip -j addr",
    ]
    for fabric in node.fabric:
        lines.append(f"sv_bg speed:{fabric.interface} {COMMAND_TIMEOUT} bash -c {q(_SPEED)} _ "
                     f"{q(fabric.interface)}")
    lines += [
        f"sv_bg ibdev2netdev {COMMAND_TIMEOUT} ibdev2netdev",
        f"sv_bg rdma_link {COMMAND_TIMEOUT} rdma link",
        f"sv_bg docker_info {DOCKER_TIMEOUT} docker info --format '{{{{json .}}}}'",
        f"sv_bg docker_ps {DOCKER_TIMEOUT} docker ps -a --no-trunc --format '{{{{json .}}}}'",
        f"sv_bg docker_stats {DOCKER_TIMEOUT} docker stats --no-stream --format '{{{{json .}}}}'",
        f"sv_bg docker_images {DOCKER_TIMEOUT} docker images --no-trunc --format '{{{{json .}}}}'",
        f"sv_bg gpu_runtime {COMMAND_TIMEOUT} bash -c {q(_GPU_RUNTIME)}",
        f"sv_bg vllm_serve {DOCKER_TIMEOUT} bash -c {q(_VLLM_SERVE)}",
        f"sv_bg stopped {COMMAND_TIMEOUT} bash -c {q(_STOPPED)}",
        f"sv_bg hf_cache {DOCKER_TIMEOUT} bash -c {q(_HF_CACHE)} _ {q(cache_dir)}",
        f"sv_bg disk {COMMAND_TIMEOUT} bash -c {q(_DF)} _ {q(cache_dir)}",
        f"sv_bg host_keys {COMMAND_TIMEOUT} bash -c 'cat /etc/ssh/ssh_host_*_key.pub'",
        "wait",
        'cat "$SV_DIR"/out.*',
        f"sv_run clock_end {COMMAND_TIMEOUT} date +%s.%N",
        'rm -rf "$SV_DIR"',
        "}",
        "main",  # the whole script is parsed before it runs: nothing can read the rest from stdin
        "exit 0",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- parsing the output

@dataclass
class Section:
    name: str
    stdout: str = ""
    stderr: str = ""
    rc: int | None = None  # None: the end marker never came (cut short)

    @property
    def first_error_line(self) -> str:
        return next((l.strip() for l in self.stderr.splitlines() if l.strip()), "")


def split_sections(text: str) -> dict[str, Section]:
    """The marker-delimited blocks of a recon output, by section name."""
    sections: dict[str, Section] = {}
    current: Section | None = None
    target: list[str] = []
    out: list[str] = []
    err: list[str] = []
    for line in (text or "").splitlines():
        m = MARKER.match(line.rstrip())
        if not m:
            if current is not None:
                target.append(line)
            continue
        kind, name, rc = m.groups()
        if kind == "section":
            current = sections.setdefault(name, Section(name))
            out, err = [], []
            target = out
        elif kind == "stderr" and current is not None and current.name == name:
            target = err
        elif kind == "end" and current is not None and current.name == name:
            current.stdout = _strip_added_newline(out)
            current.stderr = "\n".join(err).strip()
            current.rc = int(rc) if rc is not None else None
            current = None
    if current is not None:  # output ended inside a section: keep what came
        current.stdout = _strip_added_newline(out)
        current.stderr = "\n".join(err).strip()
    return sections


def _strip_added_newline(lines: list[str]) -> str:
    # sv_run prints one newline after the command, so output without a trailing newline still
    # ends before the marker; drop that empty line.
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return "\n".join(lines) + ("\n" if lines else "")


_TOOL = {"nvidia_smi": "nvidia-smi", "nvidia_smi_query": "nvidia-smi",
         "nvidia_smi_list": "nvidia-smi", "ibdev2netdev": "ibdev2netdev", "rdma_link": "rdma",
         "docker_info": "docker", "docker_ps": "docker", "docker_stats": "docker",
         "docker_images": "docker", "ip_addr": "ip"}


class _Reader:
    """Reads sections, recording why a section gave nothing instead of raising."""

    def __init__(self, sections: dict[str, Section]) -> None:
        self.sections = sections
        self.missing_tools: list[str] = []
        self.unreadable: dict[str, str] = {}

    def text(self, name: str, *, ok_codes: tuple[int, ...] = (0,)) -> str | None:
        s = self.sections.get(name)
        if s is None:
            self.unreadable[name] = "no output (the survey was cut short before this step)"
            return None
        if s.rc is None:
            self.unreadable[name] = "output cut short (no end marker)"
            return None
        if s.rc == 127:
            tool = _TOOL.get(name, name)
            if tool not in self.missing_tools:
                self.missing_tools.append(tool)
            return None
        if s.rc in (124, 137):
            self.unreadable[name] = "timed out on the node (killed by `timeout`)"
            return None
        if s.rc not in ok_codes:
            detail = s.first_error_line or "no error text"
            self.unreadable[name] = f"exit code {s.rc}: {detail}"
            return None
        return s.stdout

    def parse(self, name: str, parser: Callable[[str], Any], **kw: Any) -> Any:
        text = self.text(name, **kw)
        if text is None:
            return None
        try:
            return parser(text)
        except ParseError as exc:
            self.unreadable[name] = str(exc)
            return None


def parse_recon_output(node_name: str, text: str, *, sent_at: float | None = None,
                       received_at: float | None = None, pinned_host_key: str = "") -> NodeFacts:
    """The recon script's output -> NodeFacts (pure).

    Clock offset: the node prints its clock first and last; see `_clock_offset` for why the last
    reading against the local time of receipt (sent_at/received_at: local epoch seconds) is used.
    Raises ReconError only when /proc/meminfo cannot be read (memory is the one fact that every
    plan needs); everything else degrades to empty facts plus a reason in `unreadable`.
    """
    sections = split_sections(text)
    r = _Reader(sections)

    mem = r.parse("meminfo", p.parse_meminfo)
    if mem is None:
        reason = r.unreadable.get("meminfo", "no /proc/meminfo output")
        raise ReconError(node_name, f"could not read /proc/meminfo ({reason})",
                         "check that the node runs Linux and that the ssh user may read "
                         "/proc/meminfo; run `cat /proc/meminfo` on it", kind="output")

    os_release = r.parse("os_release", p.parse_os_release) or {}
    dgx = r.parse("dgx_release", p.parse_dgx_release, ok_codes=(0, 1)) or {}
    uname = r.parse("uname", p.parse_uname) or {}

    query = r.parse("nvidia_smi_query", p.parse_nvidia_smi_query) or []
    table = r.parse("nvidia_smi", p.parse_nvidia_smi) or []
    listed = r.parse("nvidia_smi_list", p.parse_nvidia_smi_list) or []
    gpus = p.merge_gpu_facts(query, table)
    gpus = [g.model_copy(update={"uuid": listed[i].uuid}) if i < len(listed) and not g.uuid else g
            for i, g in enumerate(gpus)]
    unified = bool(gpus) and all(g.memory_total_mib is None for g in gpus)
    memory = MemoryFacts(total_bytes=mem.total_bytes, available_bytes=mem.available_bytes,
                         unified=unified)

    interfaces = r.parse("ip_addr", p.parse_ip_json_addr) or []
    speeds: dict[str, int | None] = {}
    for name in sections:
        if name.startswith("speed:"):
            iface = name.split(":", 1)[1]
            before = dict(r.unreadable)
            speeds[iface] = r.parse(name, p.parse_ethtool_speed)
            if name in r.unreadable and name not in before:
                # no speed is not a fault of its own (a DOWN port has none); keep it quiet
                r.unreadable.pop(name)
    interfaces = [i.model_copy(update={"speed_mbps": speeds[i.name]}) if speeds.get(i.name)
                  else i for i in interfaces]

    roce = r.parse("ibdev2netdev", p.parse_ibdev2netdev)
    if not roce:
        rdma = r.parse("rdma_link", p.parse_rdma_link)
        if rdma:
            roce = rdma
            r.missing_tools = [t for t in r.missing_tools if t != "ibdev2netdev"]
    if roce:  # one of the two tools answered: the other missing is no news
        r.missing_tools = [t for t in r.missing_tools if t not in {"ibdev2netdev", "rdma"}]

    docker = _docker_facts(r)

    vllm_serve = r.parse("vllm_serve", p.parse_vllm_serve) or {}
    stopped = r.parse("stopped", p.parse_stopped_markers) or {} if "stopped" in sections else {}
    hf_cache = r.parse("hf_cache", p.parse_hf_cache) or []
    disk = r.parse("disk", p.parse_df_avail) or 0
    host_keys = r.parse("host_keys", p.parse_host_keys) or []

    clock_offset = _clock_offset(r.parse("clock_start", p.parse_epoch),
                                 r.parse("clock_end", p.parse_epoch), sent_at, received_at)

    return NodeFacts(
        node=node_name,
        hostname=uname.get("hostname", ""),
        host_key=_presented_key(host_keys, pinned_host_key),
        host_keys=host_keys,
        os=OsFacts(id=os_release.get("ID", ""), version_id=os_release.get("VERSION_ID", ""),
                   pretty_name=os_release.get("PRETTY_NAME", ""), kernel=uname.get("kernel", ""),
                   arch=uname.get("arch", ""), dgx_release=dgx),
        gpus=gpus,
        memory=memory,
        docker=docker,
        hf_cache=hf_cache,
        interfaces=interfaces,
        roce=roce or [],
        disk_free_bytes=disk,
        vllm_serve=vllm_serve,
        stopped_by=stopped,
        clock_offset_seconds=clock_offset,
        missing_tools=r.missing_tools,
        unreadable=r.unreadable,
    )


def _clock_offset(start: float | None, end: float | None, sent_at: float | None,
                  received_at: float | None) -> float:
    """Node clock minus local clock, from one round trip.

    The true offset lies between `end - received_at` (the node's last reading reached us one
    return latency later) and `start - sent_at` (the node's first reading came after the whole
    ssh handshake). The round trip's midpoint would carry half the handshake as error (0.6 s
    measured against a local sshd); the node's last reading against our receipt carries only the
    return latency (milliseconds), so that is the estimate.
    """
    if sent_at is None or received_at is None or (start is None and end is None):
        return 0.0
    if end is None:  # cut short: only the first reading, bounded by the handshake
        return round(start - sent_at, 3)
    return round(end - received_at, 3)


def _docker_facts(r: _Reader) -> DockerFacts | None:
    info = r.parse("docker_info", p.parse_docker_info_json)
    if info is None:
        return None
    evidence = r.parse("gpu_runtime", p.parse_gpu_runtime) or []
    containers = r.parse("docker_ps", p.parse_docker_ps_json) or []
    usage = r.parse("docker_stats", p.parse_docker_stats_json) or {}
    images = r.parse("docker_images", p.parse_docker_images_json) or []

    def memory_of(c: Any) -> int:
        if c.name in usage:
            return usage[c.name]
        return next((v for k, v in usage.items() if len(k) >= 12 and c.id.startswith(k)), 0)

    containers = [c.model_copy(update={"memory_bytes": memory_of(c)}) for c in containers]
    return info.model_copy(update={
        "gpu_support": info.gpu_support or any(e.startswith(("hook ", "cdi ")) for e in evidence),
        "containers": containers,
        "images": images,
    })


def _presented_key(keys: list[str], pinned: str) -> str:
    pinned = (pinned or "").strip()
    if pinned in keys:
        return pinned
    kind = pinned.split(" ", 1)[0] if pinned else ""
    return next((k for k in keys if k.split(" ", 1)[0] == kind), keys[0] if keys else "")


# --------------------------------------------------------------------------- ssh

def ssh_argv(cfg: Any, node: Any, *, key_path: str, known_hosts: str) -> list[str]:
    """The one ssh command of a node's survey (pure)."""
    return [
        "ssh", "-i", key_path, "-p", str(node.port),
        "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"HostKeyAlias={host_key_alias(node)}",
        "-o", "CheckHostIP=no",
        "-o", f"ConnectTimeout={cfg.ssh.connect_timeout_seconds}",
        f"{node.user}@{node.host}", "bash -s",
    ]


def host_key_alias(node: Any) -> str:
    return f"spark-vllm-{node.name}"


def known_hosts_line(node: Any) -> str:
    """The temporary known_hosts entry holding only the node's pinned key."""
    return f"{host_key_alias(node)} {node.pinned_host_key}\n"


@dataclass
class SshResult:
    rc: int
    stdout: str
    stderr: str
    sent_at: float
    received_at: float


Runner = Callable[[list[str], str, float], SshResult]


def ssh_round_trip(argv: list[str], script: str, timeout: float) -> SshResult:
    """LIVE PATH: run ssh with the script on stdin. The only place a process is started.

    Raises subprocess.TimeoutExpired (the child is killed) when the node does not finish in time.
    """
    sent = time.time()
    proc = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=timeout,
                          errors="replace")
    return SshResult(proc.returncode, proc.stdout, proc.stderr, sent, time.time())


def _where(node: Any) -> str:
    return f"{node.user}@{node.host}:{node.port}"


def classify_ssh_failure(node: Any, rc: int, stderr: str, key_path: str = "") -> ReconError:
    """ssh's exit code 255 + its stderr -> what went wrong and how to fix it."""
    err = stderr or ""
    last = next((l.strip() for l in reversed(err.splitlines()) if l.strip()), f"exit code {rc}")
    where = _where(node)
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err \
            or re.search(r"No \S+ host key is known", err):
        return ReconError(
            node.name, f"host key mismatch: {where} did not present the pinned hostKey ({last})",
            f"if the node was reinstalled, verify its key out of band (ssh-keyscan -p {node.port} "
            f"{node.host}) and update spark-vllm:nodes[].hostKey for {node.name}; otherwise treat "
            "this as a possible man-in-the-middle and do not proceed", kind="host_key")
    if "UNPROTECTED PRIVATE KEY FILE" in err or "bad permissions" in err:
        return ReconError(node.name, f"ssh refused the private key {key_path}: its permissions are "
                                     "too open", f"chmod 600 {key_path}", kind="auth")
    if "Permission denied" in err or "Too many authentication failures" in err:
        return ReconError(
            node.name, f"authentication refused by {where} ({last})",
            f"add the public key of {key_path or 'spark-vllm:ssh.privateKeyPath'} to "
            f"~{node.user}/.ssh/authorized_keys on {node.host}, or fix spark-vllm:nodes[].user",
            kind="auth")
    unreachable = ("Connection refused", "Connection timed out", "Operation timed out",
                   "No route to host", "Network is unreachable", "Could not resolve hostname",
                   "Name or service not known", "Connection reset", "Connection closed",
                   "kex_exchange_identification", "banner exchange")
    if any(s in err for s in unreachable):
        return ReconError(
            node.name, f"unreachable: {where} ({last})",
            f"check that {node.host} is up, that sshd listens on port {node.port} and that no "
            f"firewall drops it (try: ssh -p {node.port} {node.user}@{node.host} true)",
            kind="unreachable")
    return ReconError(node.name, f"ssh to {where} failed with exit code {rc} ({last})",
                      "run the same ssh by hand with -v to see why", kind="ssh")


def _key_file(cfg: Any, key_path: str | os.PathLike[str] | None) -> str:
    raw = str(key_path) if key_path else cfg.ssh.private_key_path
    return os.path.expanduser(raw)


def survey_node(cfg: Any, node: Any, *, key_path: str | os.PathLike[str] | None = None,
                runner: Runner = ssh_round_trip, timeout: float | None = None) -> NodeFacts:
    """One node: one ssh round trip, parsed. Raises ReconError with a fix."""
    key = _key_file(cfg, key_path)
    if "PLACEHOLDER" in node.pinned_host_key:
        return _raise(ReconError(
            node.name, "hostKey is still a placeholder, so the node cannot be authenticated",
            f"put the node's real key in spark-vllm:nodes[].hostKey for {node.name} (ssh-keyscan "
            f"-t ed25519 -p {node.port} {node.host}; in the lab `make lab-up` writes it)",
            kind="host_key"))
    if runner is ssh_round_trip and not Path(key).is_file():
        return _raise(ReconError(node.name, f"the ssh private key {key} does not exist",
                                 "set spark-vllm:ssh.privateKeyPath to an existing key file, or "
                                 "the secret spark-vllm:sshPrivateKey", kind="auth"))
    limit = timeout if timeout is not None else float(cfg.preflight.recon_timeout_seconds)
    with tempfile.TemporaryDirectory(prefix="spark-vllm-recon-") as tmp:
        known_hosts = os.path.join(tmp, "known_hosts")
        with open(known_hosts, "w") as fh:
            fh.write(known_hosts_line(node))
        argv = ssh_argv(cfg, node, key_path=key, known_hosts=known_hosts)
        try:
            result = runner(argv, recon_script(cfg, node), limit)
        except subprocess.TimeoutExpired:
            return _raise(ReconError(
                node.name, f"no complete answer from {_where(node)} within {limit:g} s",
                "check the node's load and its sshd; raise spark-vllm:preflight."
                "reconTimeoutSeconds if the node is just slow", kind="timeout"))
        except OSError as exc:
            return _raise(ReconError(node.name, f"could not run ssh: {exc}",
                                     "install an OpenSSH client on the control machine"))
    if result.rc == 255:
        raise classify_ssh_failure(node, result.rc, result.stderr, key)
    if result.rc != 0 or "=== spark-vllm:section:" not in result.stdout:
        detail = (result.stderr.strip().splitlines() or [f"exit code {result.rc}"])[-1]
        raise ReconError(node.name, f"the recon script did not run on {_where(node)} ({detail})",
                         "check that bash and coreutils (timeout) exist on the node", kind="output")
    return parse_recon_output(node.name, result.stdout, sent_at=result.sent_at,
                              received_at=result.received_at, pinned_host_key=node.pinned_host_key)


def _raise(exc: ReconError) -> NodeFacts:
    raise exc


def survey_all(cfg: Any, *, key_path: str | os.PathLike[str] | None = None,
               runner: Runner = ssh_round_trip) -> dict[str, NodeFacts | ReconError]:
    """Every node in parallel; each value is the node's facts or why it could not be surveyed."""
    limit = float(cfg.preflight.recon_timeout_seconds)
    results: dict[str, NodeFacts | ReconError] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, len(cfg.nodes)), thread_name_prefix="recon")
    try:
        futures = {pool.submit(survey_node, cfg, node, key_path=key_path, runner=runner,
                               timeout=limit): node for node in cfg.nodes}
        done, _ = wait(futures, timeout=limit + 5)
        for future, node in futures.items():
            if future not in done:
                results[node.name] = ReconError(
                    node.name, f"no answer within {limit:g} s", "check the node; raise "
                    "spark-vllm:preflight.reconTimeoutSeconds if it is just slow", kind="timeout")
                continue
            try:
                results[node.name] = future.result()
            except ReconError as exc:
                results[node.name] = exc
            except Exception as exc:  # a bug must still name the node, not print a traceback
                results[node.name] = ReconError(node.name, f"survey failed: {exc!r}",
                                                "report this as a bug in components/recon.py")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {node.name: results[node.name] for node in cfg.nodes}


def survey(cfg: Any, *, key_path: str | os.PathLike[str] | None = None,
           runner: Runner = ssh_round_trip) -> dict[str, NodeFacts]:
    """Facts of every node, or SurveyError listing each node that could not be surveyed."""
    results = survey_all(cfg, key_path=key_path, runner=runner)
    errors = [v for v in results.values() if isinstance(v, ReconError)]
    facts = {k: v for k, v in results.items() if isinstance(v, NodeFacts)}
    if errors:
        raise SurveyError(errors, facts)
    return facts
