"""Recon output fuzzing: whatever a node prints, parsing answers with NodeFacts or a ReconError, and
text injected into one section never forges the facts of another.

Real recorded GB10 outputs (recon_helpers.spark_sections, assembled with the run's nonce) get
random marker lines (with this run's nonce, another, none, near misses), control characters,
random bytes, truncations and duplicated sections. Properties:

* zero tracebacks: `parse_recon_output` returns NodeFacts or raises ReconError, nothing else;
* zero forged facts: every group of facts that depends only on sections the mutation did not
  legitimately touch equals the clean output's. A section is touched when the mutation lands in
  its block (boundaries count for both neighbours) or when the mutated text holds a marker line
  with this run's nonce that the clean text does not have (the name of that marker is touched);
* refusals: a marker-shaped line without the nonce inside a section's stdout, any extra marker
  with the nonce inside a section, and a second block of a section make that section unreadable
  (never silently replaced).

Fixed budgets, derandomized (CI runs the same cases every time); the number of cases is counted
and printed at the end of the module (`-s` shows it) and written to
`.hypothesis/spark-vllm-recon-fuzz-count.json`, like tests/unit/config/test_config_fuzz.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inspection import recon
from inspection.facts import NodeFacts
from inspection.recon import ReconError
from tests.conftest import ROOT
from tests.unit.inspection.recon_helpers import KEY_1, KEY_2, NONCE, assemble, spark_sections

FUZZ = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COUNTS: dict[str, int] = {}
OUTCOMES = {"facts": 0, "recon_error": 0}
SENT, RECEIVED = 1764479999.0, 1764480000.5

FORGED_PS = '{"ID":"e0e0","Names":"evil","Image":"evil:latest","State":"running","Labels":""}'


# ---------------------------------------------------------------------------- the clean outputs

@dataclass(frozen=True)
class Base:
    text: str
    pinned: str
    clean: NodeFacts
    names: tuple[str, ...]  # sections in print order
    spans: dict[str, tuple[int, int]]  # name -> [start of its section marker, after its end line]
    marker_lines: Counter[str]

    @property
    def ibdev2netdev_answers(self) -> bool:
        return "ibdev2netdev" not in self.clean.missing_tools


MARKER = re.compile(rf"=== spark-vllm:{NONCE}:(?:(?:section|stderr):(\S+)|end:(\S+) rc=-?\d+) ===")


def _marker_names(text: str) -> Counter[str]:
    return Counter(line for line in text.split("\n") if MARKER.fullmatch(line))


def _base(sections: dict[str, Any], pinned: str) -> Base:
    text = assemble(sections)
    spans: dict[str, tuple[int, int]] = {}
    offset, start = 0, 0
    for line in text.split("\n"):
        if line.startswith(f"=== spark-vllm:{NONCE}:section:"):
            start = offset
        m = re.fullmatch(rf"=== spark-vllm:{NONCE}:end:(\S+) rc=-?\d+ ===", line)
        if m:
            spans[m.group(1)] = (start, offset + len(line) + 1)
        offset += len(line) + 1
    clean = recon.parse_recon_output("spark-1", text, nonce=NONCE, sent_at=SENT,
                                     received_at=RECEIVED, pinned_host_key=pinned)
    return Base(text, pinned, clean, tuple(sections), spans, _marker_names(text))


# the guard's sections (issue 48) in guard.sh's and the kill hook's formats (the snippet runs
# for real in tests/unit/inspection/test_guard.py, the hook in tests/unit/hostscripts/test_guard.py)
GUARD = ("tool\tearlyoom\t/usr/bin/earlyoom\ntool\tsystemctl\t/usr/bin/systemctl\n"
         "tool\tapt-get\t/usr/bin/apt-get\ntool\tsystemd-oomd\tabsent\n"
         "active\tearlyoom.service\tactive\nactive\tsystemd-oomd.service\tinactive\n"
         "records\tpresent\nfile\t" + "ab" * 32 + "\t/etc/systemd/system/ssh.service.d/"
         "50-spark-vllm-dev.conf\nfile\tabsent\t/etc/systemd/system/earlyoom.service.d/"
         "50-spark-vllm-dev.conf\n")
KILLS = "1764470000 805306368 8589934592 4242 VLLM::EngineCor\n1764470100 - - 77 python3\n"

BASES = [
    # the reference head: foreign containers, a stopped marker, a partial HF cache, the guard
    _base(spark_sections(1, seed=True, stopped="marker\tvllm_node\tspark-vllm/dev\n",
                         guard=GUARD, oom_kills=KILLS), KEY_1),
    # a worker where some tools are missing or answer with errors
    _base(spark_sections(2, ibdev2netdev=("", 127, "ibdev2netdev: command not found"),
                         dgx_release=("", 1, "cat: /etc/dgx-release: No such file or directory"),
                         stopped=""), KEY_2),
]
SECTION_NAMES = sorted({n for b in BASES for n in b.names})

# fact groups and the sections each depends on: the unit of "equal to the clean output"
GPU = {"nvidia_smi_query", "nvidia_smi", "nvidia_smi_list"}
DOCKER = {"docker_info"}
DOCKER_READS = {"docker_ps", "docker_labels", "container_memory", "docker_images",
                "gpu_runtime"}
GROUPS: dict[str, tuple[Callable[[NodeFacts], Any], set[str]]] = {
    "uname": (lambda f: (f.hostname, f.os.kernel, f.os.arch), {"uname"}),
    "os_release": (lambda f: (f.os.id, f.os.version_id, f.os.pretty_name), {"os_release"}),
    "dgx_release": (lambda f: f.os.dgx_release, {"dgx_release"}),
    "gpus": (lambda f: f.gpus, GPU),
    "memory": (lambda f: (f.memory.total_bytes, f.memory.available_bytes), {"meminfo"}),
    "unified": (lambda f: f.memory.unified, GPU),
    "interfaces": (lambda f: [(i.name, i.ipv4, i.mtu, i.carrier) for i in f.interfaces],
                   {"ip_addr"}),
    "speeds": (lambda f: {i.name: i.speed_mbps for i in f.interfaces},
               {"ip_addr", "speed:enp1s0f1np1", "speed:enP2p1s0f1np1"}),
    "roce": (lambda f: f.roce, {"ibdev2netdev", "rdma_link"}),
    "docker": (lambda f: f.docker and (f.docker.version, f.docker.runtimes,
                                       f.docker.cgroup_driver), DOCKER),
    "gpu_support": (lambda f: f.docker and f.docker.gpu_support, DOCKER | {"gpu_runtime"}),
    "containers": (lambda f: f.docker and [(c.id, c.name, c.image, c.state, c.labels)
                                           for c in f.docker.containers],
                   DOCKER | {"docker_ps", "docker_labels"}),
    "container_memory": (lambda f: f.docker and [c.memory_bytes for c in f.docker.containers],
                         DOCKER | {"docker_ps", "container_memory"}),
    "images": (lambda f: f.docker and f.docker.images, DOCKER | {"docker_images"}),
    "stopped": (lambda f: f.stopped_by, {"stopped"}),
    "hf_cache": (lambda f: f.hf_cache, {"hf_cache"}),
    "disk": (lambda f: f.disk_free_bytes, {"disk"}),
    "host_keys": (lambda f: (f.host_keys, f.host_key), {"host_keys"}),
    "clock": (lambda f: f.clock_offset_seconds, {"clock_start", "clock_end"}),
    "guard": (lambda f: f.guard, {"guard"}),
    "oom_kills": (lambda f: f.oom_kills, {"oom_kills", "clock_start", "clock_end"}),
}


def _sections_of_key(key: str) -> set[str]:
    if key == recon.UNMATCHED_LABELS:  # containers of docker_ps without docker_labels' entry
        return {"docker_ps", "docker_labels"}
    return {key.removesuffix(":skipped")}


def check(base: Base, text: str, touched: set[str], prop: str,
          must_be_unreadable: set[str] = frozenset()) -> NodeFacts | None:  # type: ignore[assignment]
    """Parse the mutated text; assert no traceback, no forged fact, the expected refusals."""
    COUNTS[prop] = COUNTS.get(prop, 0) + 1
    new = _marker_names(text) - base.marker_lines  # marker lines with the nonce the clean lacks
    affected = set(touched)
    for line in new:
        m = MARKER.fullmatch(line)
        assert m is not None
        affected.add(m.group(1) or m.group(2))
    try:
        facts = recon.parse_recon_output("spark-1", text, nonce=NONCE, sent_at=SENT,
                                         received_at=RECEIVED, pinned_host_key=base.pinned)
    except ReconError as exc:  # the module's own error: only when /proc/meminfo is not readable
        OUTCOMES["recon_error"] += 1
        assert "meminfo" in affected, (str(exc), affected)
        assert exc.node == "spark-1" and "/proc/meminfo" in exc.reason
        return None
    OUTCOMES["facts"] += 1
    assert isinstance(facts, NodeFacts)
    for group, (get, deps) in GROUPS.items():
        if not deps & affected:
            assert get(facts) == get(base.clean), (f"forged {group}", affected)
    for key in set(facts.unreadable) | set(base.clean.unreadable):
        if not _sections_of_key(key) & affected:
            assert facts.unreadable.get(key) == base.clean.unreadable.get(key), (key, affected)
    tools = {recon._TOOL.get(s, s) for s in affected}
    if affected & {"ibdev2netdev", "rdma_link"}:  # either answering hides the other's absence
        tools |= {"ibdev2netdev", "rdma"}
    for tool in facts.missing_tools:
        assert tool in base.clean.missing_tools or tool in tools, (tool, affected)
    for name in must_be_unreadable:
        if name == "rdma_link" and "ibdev2netdev" not in affected and base.ibdev2netdev_answers:
            continue  # only read when ibdev2netdev gives nothing
        if name in DOCKER_READS and facts.docker is None:
            continue  # only read when docker info answered
        assert name in facts.unreadable, (name, facts.unreadable, affected)
    return facts


def touched_by(base: Base, offset: int) -> set[str]:
    return {n for n, (a, b) in base.spans.items() if a <= offset <= b}


# ---------------------------------------------------------------------------- strategies

def nonce_variant(kind: str, rnd: str) -> str | None:
    return {"right": NONCE, "other": rnd if rnd != NONCE else "0" * 16, "none": None,
            "upper": NONCE.upper(), "short": NONCE[:-1], "long": NONCE + "0",
            "spaced": f" {NONCE}"}[kind]


NONCE_KINDS = st.sampled_from(["right", "other", "none", "upper", "short", "long", "spaced"])
NAMES = st.one_of(st.sampled_from([*SECTION_NAMES, "docker_ps", "meminfo", "speed:eth9"]),
                  st.text(alphabet="abcdefghijklmnopqrstuvwxyz_:.-0123456789", min_size=1,
                          max_size=12))


@st.composite
def marker_lines(draw: Any) -> tuple[str, str, str | None]:
    kind = draw(st.sampled_from(["section", "stderr", "end"]))
    name = draw(NAMES)
    nonce = nonce_variant(draw(NONCE_KINDS), draw(st.text(alphabet="0123456789abcdef",
                                                          min_size=16, max_size=16)))
    rc = f" rc={draw(st.sampled_from([0, 1, 124, 127, -1, 99999]))}" if kind == "end" else ""
    head = f"=== spark-vllm:{nonce}:" if nonce is not None else "=== spark-vllm:"
    return f"{head}{kind}:{name}{rc} ===", name, nonce


def _insert_lines(base: Base, where: str | None, part: str, pick: int, extra: list[str]) -> str:
    lines = base.text.split("\n")
    if where is None:  # between two blocks (or before the first, after the last)
        starts = [i for i, ln in enumerate(lines) if ln.startswith(f"=== spark-vllm:{NONCE}:section:")]
        at = [*starts, len(lines) - 1][pick % (len(starts) + 1)]
    else:
        first = lines.index(f"=== spark-vllm:{NONCE}:section:{where} ===")
        err = lines.index(f"=== spark-vllm:{NONCE}:stderr:{where} ===", first)
        end = next(i for i in range(err, len(lines))
                   if lines[i].startswith(f"=== spark-vllm:{NONCE}:end:{where} rc="))
        lo, hi = (first + 1, err) if part == "stdout" else (err + 1, end)
        at = lo + pick % (hi - lo + 1)
    return "\n".join(lines[:at] + extra + lines[at:])


# ---------------------------------------------------------------------------- properties

@FUZZ
@given(i=st.sampled_from(range(len(BASES))), where=st.one_of(st.none(), st.sampled_from(SECTION_NAMES)),
       part=st.sampled_from(["stdout", "stderr"]), pick=st.integers(0, 10**6),
       markers=st.lists(marker_lines(), min_size=1, max_size=4),
       filler=st.lists(st.sampled_from(["", FORGED_PS, "repo\tmodels--forged--repo", "x"]),
                       max_size=3))
def test_marker_lines_injected(i, where, part, pick, markers, filler):
    """Marker lines, with and without this run's nonce, inside a section's stdout or stderr or
    between two blocks."""
    b = BASES[i]
    if where not in b.names:
        where = None
    extra = [m for m, _, _ in markers] + filler
    text = _insert_lines(b, where, part, pick, extra)
    right = [(line, name) for line, name, nonce in markers if nonce == NONCE]
    must = set()
    if where is not None and (part == "stdout" or right):
        must.add(where)  # a marker-shaped line in its stdout, or any extra marker with the nonce
    must |= {name for line, name in right if ":section:" in line and name in b.names}
    check(b, text, {where} if where else set(), "marker_lines", must)


CONTROL = st.text(alphabet=[chr(c) for c in range(32)] + ["\x7f", "\x85", "\xa0", "\u2028",
                                                          "\u2029", "\ufeff", " ",
                                                          "=", "\\", "'", '"', "{", "}", "$"],
                  min_size=1, max_size=8)


@FUZZ
@given(i=st.sampled_from(range(len(BASES))), at=st.floats(0, 1), chars=CONTROL)
def test_control_characters_injected(i, at, chars):
    """Control characters (newlines, CR, NEL, line separators, escapes, NUL ...) anywhere: inside
    content, inside a marker line, between blocks."""
    b = BASES[i]
    offset = int(at * len(b.text))
    text = b.text[:offset] + chars + b.text[offset:]
    check(b, text, touched_by(b, offset), "control_chars")


@FUZZ
@given(i=st.sampled_from(range(len(BASES))), at=st.floats(0, 1), raw=st.binary(min_size=1, max_size=64))
def test_random_bytes_injected(i, at, raw):
    """Random bytes, decoded the way ssh_round_trip decodes the node's output."""
    b = BASES[i]
    offset = int(at * len(b.text))
    text = b.text[:offset] + raw.decode("utf-8", "replace") + b.text[offset:]
    check(b, text, touched_by(b, offset), "random_bytes")


@FUZZ
@given(i=st.sampled_from(range(len(BASES))), at=st.floats(0, 1), mode=st.sampled_from(["cut", "section"]),
       where=st.sampled_from(SECTION_NAMES), keep=st.floats(0, 1))
def test_truncated(i, at, mode, where, keep):
    """The output cut short anywhere, or one section's stdout cut short (its markers intact)."""
    b = BASES[i]
    if mode == "cut":
        offset = int(at * len(b.text))
        later = {n for n, (_, end) in b.spans.items() if end > offset}
        check(b, b.text[:offset], later, "truncated")
        return
    if where not in b.names:
        where = b.names[0]
    start, end = b.spans[where]
    block = b.text[start:end]
    head, rest = block.split("\n", 1)
    stdout, tail = rest.split(f"=== spark-vllm:{NONCE}:stderr:{where} ===", 1)
    stdout = stdout[: int(keep * len(stdout))]
    if stdout and not stdout.endswith("\n"):
        stdout += "\n"
    mutated = (b.text[:start] + head + "\n" + stdout + f"=== spark-vllm:{NONCE}:stderr:{where} ==="
               + tail + b.text[end:])
    check(b, mutated, {where}, "truncated")


@FUZZ
@given(i=st.sampled_from(range(len(BASES))), where=st.sampled_from(SECTION_NAMES),
       content=st.sampled_from(["same", "forged", "empty", "garbage"]),
       nonce=NONCE_KINDS, pick=st.integers(0, 10**6),
       garbage=st.text(max_size=40))
def test_duplicate_sections(i, where, content, nonce, pick, garbage):
    """A second block of a section (the same, forged, empty or random content) between two
    blocks: with the nonce it makes the section unreadable (both copies refused); without it is
    not a block at all and changes nothing."""
    b = BASES[i]
    if where not in b.names:
        where = b.names[0]
    clean_block = b.text[slice(*b.spans[where])]
    body = {"same": None, "forged": FORGED_PS, "empty": "", "garbage": garbage}[content]
    variant = nonce_variant(nonce, "abcdef0123456789")
    block = clean_block if body is None else assemble({where: body}, nonce=NONCE)
    if variant != NONCE:
        block = block.replace(f"spark-vllm:{NONCE}:", f"spark-vllm:{variant}:" if variant
                              else "spark-vllm:")
    boundaries = sorted({s for s, _ in b.spans.values()} | {len(b.text)})
    offset = boundaries[pick % len(boundaries)]
    text = b.text[:offset] + block + b.text[offset:]
    if variant == NONCE:
        facts = check(b, text, {where}, "duplicates", {where})
        # (rdma_link is read only when ibdev2netdev gives nothing, the docker sections only
        # when docker info answered: check() knows, and this draw may hit either)
        unread = (where == "rdma_link" and b.ibdev2netdev_answers) or (
            facts is not None and where in DOCKER_READS and facts.docker is None)
        if facts is not None and not unread:
            assert "printed twice" in facts.unreadable[where]
            if where == "docker_ps":
                assert facts.docker is not None and facts.docker.containers == []
    else:  # not this run's markers: nothing changes at all
        facts = check(b, text, set(), "duplicates")
        assert facts == b.clean


# ---------------------------------------------------------------------------- sanity and count

def test_fact_groups_cover_every_section():
    covered = set().union(*(deps for _, deps in GROUPS.values()))
    for b in BASES:
        assert set(b.names) <= covered, set(b.names) - covered
        assert b.clean.unreadable == {} and set(b.spans) == set(b.names)


def test_zz_report_case_count():
    """Runs last in this module: how many mutated recon outputs the properties above parsed."""
    total = sum(COUNTS.values())
    report = {"total": total, "per_property": COUNTS, "outcomes": OUTCOMES,
              "max_examples_per_property": FUZZ.max_examples}
    print(f"\nrecon fuzz: {total} cases ran: {json.dumps(report)}")
    out = ROOT / ".hypothesis"
    out.mkdir(exist_ok=True)
    (out / "spark-vllm-recon-fuzz-count.json").write_text(json.dumps(report, indent=2) + "\n")
    if COUNTS:  # the module ran as a whole
        assert total >= 1000, report
