"""Reconnaissance: what every node is, before a single resource is registered.

`survey(cfg)` opens ONE ssh round trip per node, all nodes in parallel, bounded by
`preflight.reconTimeoutSeconds`. The node runs a read-only bash script (`recon_script`) fed on
stdin; it prints one block per fact:

    === spark-vllm:<nonce>:section:<name> ===
    <stdout of the command>
    === spark-vllm:<nonce>:stderr:<name> ===
    <first 2000 bytes of its stderr>
    === spark-vllm:<nonce>:end:<name> rc=<exit code> ===

<nonce> is random and fresh for every survey (`new_nonce`), so nothing a command prints (a crafted
folder name in the HF cache, a container label) can open, close or replace a section: only
markers carrying it count, a section printed twice is refused (unreadable, never replaced), and a
marker-shaped line without it inside a section makes that section unreadable. The snippets never
print a name that is not printable ASCII, and lines end only at '\n' (the output is decoded
without universal newlines: a '\r' in a name stays inside its line).

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
import secrets
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TypeVar

from config import PLACEHOLDER, NodeConfig, StackConfig
from config.ssh import known_hosts_line, ssh_options
from hostscripts.alertmanager import CONFIG_FILE as ALERTMANAGER_CONFIG
from hostscripts.common import plain, repo_dir
from hostscripts.firewall import check_script as firewall_check_script
from hostscripts.guard import KILLS as GUARD_KILLS
from hostscripts.guard import survey_files as guard_files
from hostscripts.images import NCCL_PY
from hostscripts.monitoring import CONFIG_FILE as PROMETHEUS_CONFIG
from hostscripts.paths import GUARD_DIR, LIVENESS_STARTS, STOPPED_DIR, StackNames
from inspection import parsers as p
from inspection.facts import DockerFacts, NodeFacts, OomKill, OsFacts
from inspection.parsers import ParseError

try:  # ConfigError's base: the Pulumi CLI prints the message of a RunError without a traceback
    from pulumi import RunError as _UserError
except ImportError:  # pragma: no cover - pulumi is in requirements.txt
    _UserError = Exception  # type: ignore[misc,assignment]

NONCE = re.compile(r"[0-9a-f]{16,64}")
SECTION_NAME = r"[A-Za-z0-9_.:-]+"
MARKER_PREFIX = "=== spark-vllm:"  # what every marker starts with, this run's or not

# section -> (seconds, the tool whose absence empties it)
COMMAND_TIMEOUT = 10
DOCKER_TIMEOUT = 20
PRESENCE = 'if [ -s "$1" ]; then echo present; else echo absent; fi'  # a file, never its content
DIR_PRESENCE = 'if [ -d "$1" ]; then echo present; else echo absent; fi'  # a folder
# every one of several folders
ALL_DIRS = 'for d in "$@"; do [ -d "$d" ] || { echo absent; exit 0; }; done; echo present'
# every one of several files (never their content)
ALL_PRESENT = 'for f in "$@"; do [ -s "$f" ] || { echo absent; exit 0; }; done; echo present'
# the stack's netplan files: each one's digest, or absent (root only: mode 0600)
DIGESTS = ('for f in "$@"; do if [ -e "$f" ]; then sha256sum -- "$f"; else echo "absent $f"; '
           'fi; done')
CGROUP_ROOT = "/sys/fs/cgroup"  # where the container_memory snippet reads the cgroup counters
# the liveness watchdog's starts file out of a container, running or not ($1 container, $2 path)
READ_STARTS = 'docker cp "$1:$2" - | tar -xO'
# the image probe's records in the stack's folder: `<name>\t<its first line>` per record
IMAGE_RECORDS = ('for f in "$1"/*.json; do [ -f "$f" ] || continue; n=${f##*/}; '
                 'printf \'%s\\t\' "${n%.json}"; head -c 65536 "$f" | head -n 1; done')
# the collective gate's record (its first line), or absent
FIRST_LINE = 'if [ -s "$1" ]; then head -c 65536 "$1" | head -n 1; else echo absent; fi'
# the newest kills the node's guard recorded ($1: its record; nothing when there is none)
READ_KILLS = 'if [ -f "$1" ]; then tail -n 200 -- "$1"; fi'


class ReconError(Exception):
    """One node could not be surveyed.

    kind: unreachable | auth | host_key | timeout | ssh | output.
    """

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

def snippet(name: str) -> str:
    """A read-only shell snippet of inspection/snippets/, as the node runs it."""
    return resources.files("inspection.snippets").joinpath(name).read_text()


def stack_repos(cfg: StackConfig) -> list[str]:
    """The model repos the stack serves (the main model's, its drafter's of another repo, then
    each service's), each once."""
    drafter = [cfg.model.drafter.repo] if cfg.model.drafter is not None else []
    return list(dict.fromkeys([cfg.model.repo, *drafter, *(s.repo for s in cfg.services)]))


def new_nonce() -> str:
    """A fresh marker nonce: one per survey, never reused."""
    return secrets.token_hex(8)


def _check_nonce(nonce: str) -> str:
    if not isinstance(nonce, str) or not NONCE.fullmatch(nonce):
        raise ValueError(f"a recon nonce is 16 to 64 lowercase hex digits, got {nonce!r}")
    return nonce


def api_containers(cfg: StackConfig, names: StackNames, node: NodeConfig) -> list[str]:
    """The stack's containers on `node` that serve an API under the liveness watchdog: the main
    model's on the head, each service's on its nodes."""
    out = [names.serve] if node.name == cfg.head.name else []
    return out + [names.service(s.name) for s in cfg.services
                  if node.name in (s.nodes or [cfg.head.name])]


def recent_restarts(starts: list[float], now: float, window: float) -> int:
    """How many of `starts` (a container's, oldest first) restarted it within `window` seconds
    before `now`: every start but the container's first one is a restart."""
    return sum(1 for t in starts[1:] if t > now - window)


def recon_script(cfg: StackConfig, node: NodeConfig, nonce: str, names: StackNames | None,
                 *, speed_of: Sequence[str] | None = None) -> str:
    """The read-only bash script one node runs (`bash -s`); pure: same config and nonce, same
    text. `nonce` (`new_nonce()`, fresh for every survey) marks its sections. `names`: the
    stack's, whose own files it looks for (None: no stack known, they are not surveyed).
    `speed_of`: the interfaces whose link speed it reads (None: the node's fabric ones)."""
    q = shlex.quote
    cache_dir = cfg.model.cache_dir
    lines = [
        "# spark-vllm reconnaissance (read-only); generated by inspection/recon.py",
        f"# node: {plain(node.name)}",
        "main() {",
        f"SV_NONCE={_check_nonce(nonce)}",  # a shell variable only: not exported to any command
        # Sections run concurrently (each read-only and independent) and are printed in start
        # order, so a node costs its slowest section. Container memory is read from the cgroup
        # counters (container_memory.sh), not `docker stats`: that samples for about 2 seconds.
        snippet("survey.sh").rstrip("\n"),
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
    for iface in ([f.interface for f in node.fabric] if speed_of is None else speed_of):
        lines.append(f"sv_bg speed:{iface} {COMMAND_TIMEOUT} bash -c "
                     f"{q(snippet('speed.sh'))} _ {q(iface)}")
    lines += [
        f"sv_bg ibdev2netdev {COMMAND_TIMEOUT} ibdev2netdev",
        f"sv_bg rdma_link {COMMAND_TIMEOUT} rdma link",
        # every libnccl the node's dynamic linker knows, with its build (nothing is loaded)
        f"sv_bg nccl_host {COMMAND_TIMEOUT} python3 -c {q(NCCL_PY)} host",
        f"sv_bg docker_info {DOCKER_TIMEOUT} docker info --format '{{{{json .}}}}'",
        f"sv_bg docker_ps {DOCKER_TIMEOUT} docker ps -a --no-trunc --format '{{{{json .}}}}'",
        # the containers' labels, as JSON (docker ps's Labels column cannot be split safely)
        f"sv_bg docker_labels {DOCKER_TIMEOUT} bash -c {q(snippet('docker_labels.sh'))}",
        f"sv_bg container_memory {DOCKER_TIMEOUT} bash -c {q(snippet('container_memory.sh'))} "
        f"_ {q(CGROUP_ROOT)}",
        f"sv_bg docker_images {DOCKER_TIMEOUT} docker images --no-trunc --format '{{{{json .}}}}'",
        f"sv_bg gpu_runtime {COMMAND_TIMEOUT} bash -c {q(snippet('gpu_runtime.sh'))}",
        f"sv_bg stopped {COMMAND_TIMEOUT} bash -c {q(snippet('stopped.sh'))} _ {q(STOPPED_DIR)}",
        # the stack's repos (the main model's, each service's): their snapshots' files too
        # and the stack's record of what its verify hashed (its own folder; none without a stack)
        f"sv_bg hf_cache {DOCKER_TIMEOUT} bash -c {q(snippet('hf_cache.sh'))} _ {q(cache_dir)} "
        f"{q(names.model_record_dir if names is not None else '')} "
        + " ".join(q(repo_dir(r)) for r in stack_repos(cfg)),
        f"sv_bg disk {COMMAND_TIMEOUT} bash -c {q(snippet('disk.sh'))} _ {q(cache_dir)}",
        # nftables, which the stack's firewall needs (rc 127: missing), and the kernel's
        # ephemeral ports (the data plane's: its rule names them)
        f"sv_bg nft_version {COMMAND_TIMEOUT} nft --version",
        f"sv_bg ephemeral_ports {COMMAND_TIMEOUT} cat /proc/sys/net/ipv4/ip_local_port_range",
    ]
    if names is not None:
        # the starts the liveness watchdog recorded in the stack's API containers on this node
        # (a crash loop is a warning of the next up); absent for a container with no record
        for container in api_containers(cfg, names, node):
            lines.append(f"sv_bg starts:{container} {COMMAND_TIMEOUT} bash -c {q(READ_STARTS)} "
                         f"_ {q(container)} {q(LIVENESS_STARTS)}")
        lines += [
            # whether the stack's Ray token file is on the node (never its content)
            f"sv_bg ray_token {COMMAND_TIMEOUT} bash -c {q(PRESENCE)} _ "
            f"{q(names.ray_token_file)}",
            # and whether the head's vLLM API key file is there (never its content)
            f"sv_bg vllm_key {COMMAND_TIMEOUT} bash -c {q(PRESENCE)} _ "
            f"{q(names.vllm_key_file)}",
            # and whether the stack's compile-cache folder is (a bind mount source: a container
            # cannot be created without it)
            f"sv_bg compile_cache {COMMAND_TIMEOUT} bash -c {q(DIR_PRESENCE)} _ "
            f"{q(names.compile_cache_dir)}",
        ]
        # what the image probe found in each image of the stack on this node (its NCCL)
        lines.append(f"sv_bg image_nccl {COMMAND_TIMEOUT} bash -c {q(IMAGE_RECORDS)} _ "
                     f"{q(names.image_probe_dir)}")
        if cfg.guard.enabled:
            # the node's guard: its tools, its killer running, its folder and the stack's
            # drop-ins (a drift repaired by the up), and the kills it recorded (preflight warns)
            lines += [
                f"sv_bg guard {COMMAND_TIMEOUT} bash -c {q(snippet('guard.sh'))} _ "
                f"{q(GUARD_DIR)} " + " ".join(q(f) for f in guard_files(names)),
                f"sv_bg oom_kills {COMMAND_TIMEOUT} bash -c {q(READ_KILLS)} _ {q(GUARD_KILLS)}",
            ]
        if cfg.fabric.manage:
            # the stack's netplan file of each fabric interface (a drift repaired by the up)
            lines.append(f"sv_bg fabric_files {COMMAND_TIMEOUT} bash -c {q(DIGESTS)} _ "
                         + " ".join(q(names.fabric_netplan(f.interface)) for f in node.fabric))
        if cfg.firewall.enabled:
            # the stack's nftables table, its file, unit and last load (drift: the up repairs)
            lines.append(f"sv_bg firewall {COMMAND_TIMEOUT} bash -c "
                         f"{q(firewall_check_script(names))}")
        if node.name == cfg.head.name:
            # the collective gate's last record: a gate that stopped an up measures again
            lines.append(f"sv_bg collective_record {COMMAND_TIMEOUT} bash -c {q(FIRST_LINE)} _ "
                         f"{q(names.collective_record)}")
            # the gateway's files on the head: its configuration, the key's digest, the TLS file
            files = [f"{names.gateway_dir}/conf/haproxy.cfg", names.gateway_key_file]
            if cfg.gateway.tls:
                files.append(names.gateway_tls_file)
            lines.append(f"sv_bg gateway_files {COMMAND_TIMEOUT} bash -c {q(ALL_PRESENT)} _ "
                         + " ".join(q(f) for f in files))
            if cfg.monitoring.enabled:
                # Prometheus's configuration and key file, Alertmanager's configuration, and
                # their data folders (bind mounts' sources: a stack folder wiped behind the
                # stack would fail the containers)
                lines.append(
                    f"sv_bg monitoring_files {COMMAND_TIMEOUT} bash -c {q(ALL_PRESENT)} _ "
                    f"{q(names.monitoring_dir + '/conf/' + PROMETHEUS_CONFIG)} "
                    f"{q(names.monitoring_key_file)} "
                    f"{q(names.alertmanager_dir + '/conf/' + ALERTMANAGER_CONFIG)}")
                lines.append(f"sv_bg prometheus_data {COMMAND_TIMEOUT} bash -c "
                             f"{q(ALL_DIRS)} _ {q(names.prometheus_data_dir)} "
                             f"{q(names.alertmanager_data_dir)}")
    lines += [
        # the glob expands in the script's own bash (no `bash -c` of its own): unmatched, it
        # stays as it is and cat says so, as before
        f"sv_bg host_keys {COMMAND_TIMEOUT} cat /etc/ssh/ssh_host_*_key.pub",
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
    problem: str | None = None  # why the block cannot be trusted (then it is unreadable)

    @property
    def first_error_line(self) -> str:
        line = next((ln.strip() for ln in p.split_lines(self.stderr) if ln.strip()), "")
        return printable(line)


def printable(text: str, limit: int = 300) -> str:
    """`text` with every character that is not printable ASCII escaped (a node's error text
    reaches the operator's terminal: no escape sequences, no line breaks), cut to `limit`."""
    out = "".join(c if " " <= c <= "~" else repr(c)[1:-1] for c in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


_TWICE = "printed twice (both copies refused: the output may be forged)"
_FOREIGN = "holds a line shaped like a recon marker without this run's nonce (forged output?)"


def _marker(nonce: str) -> re.Pattern[str]:
    return re.compile(rf"=== spark-vllm:{_check_nonce(nonce)}:(?:(section|stderr):({SECTION_NAME})"
                      rf"|(end):({SECTION_NAME}) rc=(-?[0-9]{{1,5}})) ===")


def split_sections(text: str, nonce: str) -> dict[str, Section]:
    """The marker-delimited blocks of a recon output, by section name.

    Only markers carrying `nonce` count; everything else is content (or, outside a block,
    ignored). A block whose structure is broken gets a `problem` and is unreadable: a second
    block of the same name (both are refused, the first is never silently replaced), a marker
    line without the nonce in its stdout, a section starting before the previous one ended, a
    stray stderr/end marker.
    """
    marker = _marker(nonce)
    sections: dict[str, Section] = {}
    current: Section | None = None
    in_err = False
    out: list[str] = []
    err: list[str] = []

    def refuse(section: Section | None, why: str) -> None:
        if section is not None and section.problem is None:
            section.problem = why

    def finish(section: Section, rc: int | None) -> None:
        section.stdout = _strip_added_newline(out)
        section.stderr = "\n".join(err).strip()
        section.rc = rc

    for line in p.split_lines(text):
        m = marker.fullmatch(line)
        if m is None:
            if current is None:
                continue  # outside every block: not ours
            if in_err:
                err.append(line)
            else:
                if line.startswith(MARKER_PREFIX):
                    refuse(current, _FOREIGN)
                out.append(line)
            continue
        kind = m.group(1) or m.group(3)
        name = m.group(2) or m.group(4)
        if kind == "section":
            if current is not None:
                refuse(current, _TWICE if current.name == name else
                       f"cut short: section {name} started before its end marker")
                finish(current, None)
            if name in sections:
                refuse(sections[name], _TWICE)
                current = Section(name)  # the second copy is read and thrown away
            else:
                current = sections[name] = Section(name)
            out, err, in_err = [], [], False
        elif kind == "stderr" and current is not None and current.name == name and not in_err:
            in_err = True
        elif kind == "end" and current is not None and current.name == name:
            finish(current, int(m.group(5)))
            current = None
        else:  # a stray stderr/end marker: the blocks around it cannot be trusted
            why = f"a stray {kind} marker for {name}"
            refuse(current, why)
            refuse(sections.get(name), why)
    if current is not None:  # output ended inside a section: keep what came
        finish(current, None)
    return sections


def _strip_added_newline(lines: list[str]) -> str:
    # sv_run prints one newline after the command, so output without a trailing newline still
    # ends before the marker; drop that empty line.
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return "\n".join(lines) + ("\n" if lines else "")


T = TypeVar("T")

# the unreadable key of containers docker ps listed and the docker_labels section did not
# (a fact of both sections): their labels are unknown, and preflight cannot judge them
UNMATCHED_LABELS = "docker_labels:unmatched"

# the sections whose snippets print `skip\t<%q name>` records (inspection/parsers.py)
SKIP_SECTIONS = ("hf_cache", "stopped", "gpu_runtime", "container_memory")

_TOOL = {"nvidia_smi": "nvidia-smi", "nvidia_smi_query": "nvidia-smi",
         "nvidia_smi_list": "nvidia-smi", "ibdev2netdev": "ibdev2netdev", "rdma_link": "rdma",
         "docker_info": "docker", "docker_ps": "docker", "docker_labels": "docker",
         "container_memory": "docker",
         "docker_images": "docker", "ip_addr": "ip", "nccl_host": "python3", "nft_version": "nft",
         "firewall": "nft"}


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
        if s.problem is not None:
            self.unreadable[name] = s.problem
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

    def parse(self, name: str, parser: Callable[[str], T], *,
              ok_codes: tuple[int, ...] = (0,)) -> T | None:
        text = self.text(name, ok_codes=ok_codes)
        if text is None:
            return None
        try:
            return parser(text)
        except ParseError as exc:
            self.unreadable[name] = str(exc)
            return None


def parse_recon_output(node_name: str, text: str, *, nonce: str, sent_at: float | None = None,
                       received_at: float | None = None, pinned_host_key: str = "") -> NodeFacts:
    """The recon script's output -> NodeFacts (pure). `nonce`: the one its script was made with;
    only markers carrying it count (see `split_sections`).

    Clock offset: the node prints its clock first and last; see `_clock_offset` for why the last
    reading against the local time of receipt (sent_at/received_at: local epoch seconds) is used.
    Raises ReconError only when /proc/meminfo cannot be read (memory is the one fact that every
    plan needs); everything else degrades to empty facts plus a reason in `unreadable`.
    """
    sections = split_sections(text, nonce)
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
    # parse_meminfo's page-cache breakdown (MemFree, Cached, Mapped...) is what preflight's
    # memory check reads; only `unified` comes from the GPU survey
    memory = mem.model_copy(update={"unified": unified})

    interfaces = r.parse("ip_addr", p.parse_ip_json_addr) or []
    speeds: dict[str, int | None] = {}
    for name in sections:
        if name.startswith("speed:"):
            iface = name.split(":", 1)[1]
            before = dict(r.unreadable)
            speeds[iface] = r.parse(name, p.parse_ethtool_speed)
            if name in r.unreadable and name not in before and sections[name].problem is None:
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

    stopped = r.parse("stopped", p.parse_stopped_markers) or {} if "stopped" in sections else {}
    hf_cache = r.parse("hf_cache", p.parse_hf_cache) or []
    disk = r.parse("disk", p.parse_df_avail) or 0
    ray_token = r.parse("ray_token", p.parse_presence) if "ray_token" in sections else None
    vllm_key = r.parse("vllm_key", p.parse_presence) if "vllm_key" in sections else None
    compile_cache = (r.parse("compile_cache", p.parse_presence) if "compile_cache" in sections
                     else None)
    gateway_files = (r.parse("gateway_files", p.parse_presence) if "gateway_files" in sections
                     else None)
    monitoring_files = (r.parse("monitoring_files", p.parse_presence)
                        if "monitoring_files" in sections else None)
    prometheus_data = (r.parse("prometheus_data", p.parse_presence)
                       if "prometheus_data" in sections else None)
    firewall = r.parse("firewall", p.parse_firewall) if "firewall" in sections else None
    nft_version = (r.parse("nft_version", p.parse_nft_version) if "nft_version" in sections
                   else None)
    ephemeral = (r.parse("ephemeral_ports", p.parse_port_range) if "ephemeral_ports" in sections
                 else None)
    # looked at but unreadable: every file counts as missing (the apply runs again, which is
    # harmless); not looked at (an older survey): None
    fabric_files = ((r.parse("fabric_files", p.parse_fabric_files) or {})
                    if "fabric_files" in sections else None)
    nccl_host = r.parse("nccl_host", p.parse_nccl_host) if "nccl_host" in sections else None
    image_nccl = (r.parse("image_nccl", p.parse_image_nccl) or {}) if "image_nccl" in sections \
        else {}
    record_present, record_stopped = (
        r.parse("collective_record", p.parse_collective_record) or (None, None)
        if "collective_record" in sections else (None, None))
    host_keys = r.parse("host_keys", p.parse_host_keys) or []
    for name in SKIP_SECTIONS:  # names the snippets refused to print: say so, never drop quietly
        s = sections.get(name)
        skipped = p.skipped_names(s.stdout) if s is not None and name not in r.unreadable else []
        if skipped:
            r.unreadable[f"{name}:skipped"] = printable(
                f"left out {len(skipped)} name(s) that are not printable ASCII (a crafted or "
                f"broken file name?): {', '.join(skipped)}")

    clock_offset = _clock_offset(r.parse("clock_start", p.parse_epoch),
                                 r.parse("clock_end", p.parse_epoch), sent_at, received_at)
    # the watchdog's records, in the control machine's clock; a container without one (none
    # made yet, liveness off, no such container) is left out: nothing to report
    starts: dict[str, list[float]] = {}
    ooms: dict[str, list[OomKill]] = {}
    for name, s in sections.items():
        if name.startswith("starts:") and s.problem is None and s.rc == 0:
            container = name.split(":", 1)[1]
            starts[container] = [t - clock_offset for t, what in
                                 p.parse_liveness_starts(s.stdout) if what == "start"]
            got = [k.model_copy(update={"time": k.time - clock_offset})
                   for k in p.parse_liveness_ooms(s.stdout)]
            if got:
                ooms[container] = got
    node_guard = r.parse("guard", p.parse_guard) if "guard" in sections else None
    kills = [k.model_copy(update={"time": k.time - clock_offset})
             for k in ((r.parse("oom_kills", p.parse_oom_kills) or [])
                       if "oom_kills" in sections else [])]

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
        stopped_by=stopped,
        ray_token_present=ray_token,
        vllm_key_present=vllm_key,
        compile_cache_present=compile_cache,
        gateway_files_present=gateway_files,
        monitoring_files_present=monitoring_files,
        prometheus_data_present=prometheus_data,
        firewall=firewall,
        nft_version=nft_version,
        ephemeral_ports=ephemeral,
        clock_offset_seconds=clock_offset,
        liveness_starts=starts,
        liveness_ooms=ooms,
        guard=node_guard,
        oom_kills=kills,
        fabric_files=fabric_files,
        nccl_host=nccl_host,
        image_nccl=image_nccl,
        collective_record_present=record_present,
        collective_stopped=record_stopped,
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
        assert start is not None
        return round(start - sent_at, 3)
    return round(end - received_at, 3)


def _docker_facts(r: _Reader) -> DockerFacts | None:
    info = r.parse("docker_info", p.parse_docker_info_json)
    if info is None:
        return None
    evidence = r.parse("gpu_runtime", p.parse_gpu_runtime) or []
    containers = r.parse("docker_ps", p.parse_docker_ps_json) or []
    labels = r.parse("docker_labels", p.parse_docker_labels_json)
    if labels is not None:
        unlabelled = [c.name for c in containers if c.id not in labels]
        if unlabelled:  # unknown is not "no labels": preflight cannot judge them (fail closed)
            r.unreadable[UNMATCHED_LABELS] = printable(
                f"no labels read for {', '.join(unlabelled)} (removed while recon ran?)")
        containers = [c.model_copy(update={"labels": labels.get(c.id, {})}) for c in containers]
    usage, unknown = r.parse("container_memory", p.parse_container_memory) or ({}, {})
    images = r.parse("docker_images", p.parse_docker_images_json) or []
    # both sections carry full IDs (`docker ps --no-trunc`); a container without counters holds
    # 0 bytes here, as every container did when `docker stats` failed, and the section says why
    containers = [c.model_copy(update={"memory_bytes": usage.get(c.id, 0)}) for c in containers]
    if unknown:
        names = {c.id: c.name for c in containers}
        r.unreadable["container_memory"] = printable(
            "memory unknown (counted as 0 bytes) for " + "; ".join(
                f"{names.get(ident, ident[:12])} ({why})" for ident, why in unknown.items()))
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

def ssh_argv(cfg: StackConfig, node: NodeConfig, *, key_path: str, known_hosts: str) -> list[str]:
    """The one ssh command of a node's survey (pure): the same options as the docker provider's
    ssh transport (config/ssh.py), so neither trusts more than the other."""
    opts = ssh_options(node, key_path=key_path, known_hosts=known_hosts,
                       connect_timeout=cfg.ssh.connect_timeout_seconds)
    return ["ssh", *opts, "-p", str(node.port), f"{node.user}@{node.host}", "bash -s"]


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
    The output is decoded as UTF-8 (invalid bytes replaced) WITHOUT universal newlines: a '\r'
    in a file name must stay inside its line, not become a line break here.
    """
    sent = time.time()
    proc = subprocess.run(argv, input=script.encode(), capture_output=True, timeout=timeout)
    return SshResult(proc.returncode, proc.stdout.decode("utf-8", "replace"),
                     proc.stderr.decode("utf-8", "replace"), sent, time.time())


def _where(node: NodeConfig) -> str:
    return f"{node.user}@{node.host}:{node.port}"


def classify_ssh_failure(node: NodeConfig, rc: int, stderr: str, key_path: str = "") -> ReconError:
    """ssh's exit code 255 + its stderr -> what went wrong and how to fix it."""
    err = stderr or ""
    last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), f"exit code {rc}")
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


def _key_file(cfg: StackConfig, key_path: str | os.PathLike[str] | None) -> str:
    raw = str(key_path) if key_path else cfg.ssh.private_key_path
    return os.path.expanduser(raw)


def survey_node(cfg: StackConfig, node: NodeConfig, *, names: StackNames | None,
                key_path: str | os.PathLike[str] | None = None,
                runner: Runner = ssh_round_trip, timeout: float | None = None,
                speed_of: Sequence[str] | None = None) -> NodeFacts:
    """One node: one ssh round trip, parsed. Raises ReconError with a fix. `names`, `speed_of`:
    as recon_script's."""
    key = _key_file(cfg, key_path)
    if PLACEHOLDER in node.pinned_host_key:
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
        nonce = new_nonce()
        try:
            result = runner(argv, recon_script(cfg, node, nonce, names, speed_of=speed_of), limit)
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
    err_lines = [ln.strip() for ln in p.split_lines(result.stderr) if ln.strip()]
    refusal = next((ln for ln in reversed(err_lines) if ln.startswith("spark-vllm recon:")), "")
    if result.rc != 0 and refusal:
        cause = next((ln for ln in err_lines if ln.startswith("mktemp")), "")
        raise ReconError(
            node.name, f"the recon script refused to run on {_where(node)}: "
                       f"{printable(refusal.removeprefix('spark-vllm recon: '))}"
                       + (f" ({printable(cause)})" if cause else ""),
            "make `mktemp -d` work for the ssh user on the node (a writable /tmp or $TMPDIR, "
            "coreutils installed); recon never falls back to a predictable path", kind="output")
    if result.rc != 0 or f"{MARKER_PREFIX}{nonce}:section:" not in result.stdout:
        detail = printable(err_lines[-1] if err_lines else f"exit code {result.rc}")
        raise ReconError(node.name, f"the recon script did not run on {_where(node)} ({detail})",
                         "check that bash and coreutils (timeout) exist on the node", kind="output")
    return parse_recon_output(node.name, result.stdout, nonce=nonce, sent_at=result.sent_at,
                              received_at=result.received_at, pinned_host_key=node.pinned_host_key)


def _raise(exc: ReconError) -> NodeFacts:
    raise exc


def survey_all(cfg: StackConfig, *, names: StackNames | None,
               key_path: str | os.PathLike[str] | None = None,
               runner: Runner = ssh_round_trip) -> dict[str, NodeFacts | ReconError]:
    """Every node in parallel; each value is the node's facts or why it could not be surveyed."""
    limit = float(cfg.preflight.recon_timeout_seconds)
    results: dict[str, NodeFacts | ReconError] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, len(cfg.nodes)), thread_name_prefix="recon")
    try:
        futures = {pool.submit(survey_node, cfg, node, names=names, key_path=key_path,
                               runner=runner, timeout=limit): node for node in cfg.nodes}
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
                                                "report this as a bug in inspection/recon.py")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {node.name: results[node.name] for node in cfg.nodes}


def survey(cfg: StackConfig, *, names: StackNames | None,
           key_path: str | os.PathLike[str] | None = None,
           runner: Runner = ssh_round_trip) -> dict[str, NodeFacts]:
    """Facts of every node, or SurveyError listing each node that could not be surveyed."""
    results = survey_all(cfg, names=names, key_path=key_path, runner=runner)
    errors = [v for v in results.values() if isinstance(v, ReconError)]
    facts = {k: v for k, v in results.items() if isinstance(v, NodeFacts)}
    if errors:
        raise SurveyError(errors, facts)
    return facts
