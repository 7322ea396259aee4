"""Container memory from the cgroup counters (recon's container_memory section), which replaced
`docker stats --no-stream` (it samples for about 2 s per node): the parser, the snippet against
fake cgroup trees (v2 and v1, as the systemd and cgroupfs drivers lay them out, under a cgroup
parent as the lab's dockerds use) and the facts recon assembles from it, which must be what docker
stats gave for the same containers."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from inspection import parsers as p
from inspection import preflight
from inspection.parsers import ParseError
from inspection.recon import CGROUP_ROOT, recon_script, snippet
from tests.unit.inspection.recon_helpers import (
    NAMES,
    NONCE,
    assemble,
    config,
    docker_stats_json,
    parse,
    sample,
    spark_output,
    spark_sections,
)

GIB = 1024**3
A, B, C, D, E = (c * 64 for c in "abcde")  # full container IDs, as `docker ps --no-trunc` prints
SEED = {  # docker-ps-json-seed.txt: the running containers' full IDs
    "vllm_node": "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "reranker": "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809",
    "vllm_embeddings": "2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a",
    "spark-vllm-ray-head": "3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b",
}


# --------------------------------------------------------------------------- the parser

def test_cgroup_v2_counters_are_usage_minus_inactive_file():
    usage, unknown = p.parse_container_memory(sample("cgroup-memory-seed.txt"))
    assert unknown == {}
    assert usage[SEED["vllm_node"]] == 75072392397 - 1843200000 == round(68.2 * GIB)
    assert usage[SEED["spark-vllm-ray-head"]] == 1022 * 1024**2
    assert set(usage) == set(SEED.values())  # the exited old_bench has no line


def test_cgroup_v1_counters_recorded_on_the_lab():
    usage, unknown = p.parse_container_memory(sample("cgroup-memory-lab-v1.txt"))
    head = "61d6f4e6e7fc74c1403d991f9161daecd2814d5a375813195d0d94da1ed538be"
    assert usage == {head: 2394566656 - 864256} and unknown == {}


def test_a_container_without_counters_is_unknown_not_dropped():
    text = (f"{A} v2 2000 500\n{B} unavailable no cgroup directory named after it\n"
            f"{C} unavailable memory.current is not a number\n")
    usage, unknown = p.parse_container_memory(text)
    assert usage == {A: 1500}
    assert unknown == {B: "no cgroup directory named after it",
                       C: "memory.current is not a number"}


@pytest.mark.parametrize("line,why", [
    (f"{A} v2 12x 500", "memory.current is not a number"),
    (f"{A} v2 1000 -5", "inactive_file is not a number"),
    (f"{A} v1 1.5 5", "memory.usage_in_bytes is not a number"),
    (f"{A} v1 n/a n/a", "memory.usage_in_bytes and total_inactive_file are not numbers"),
    (f"{A} v2 {'9' * 21} 0", "memory.current is not a number"),  # above any 64-bit counter
])
def test_a_counter_that_is_not_a_number_makes_that_container_unknown(line, why):
    usage, unknown = p.parse_container_memory(f"{line}\n{B} v2 10 4\n")
    assert usage == {B: 6} and unknown == {A: why}


@pytest.mark.parametrize("line", [f"{A} v2 4096 8192", f"{A} v1 0 1"])
def test_inactive_file_above_the_usage_clamps_at_zero(line):
    # the two counters are read a moment apart: never a negative size
    assert p.parse_container_memory(line) == ({A: 0}, {})


def test_skip_records_are_left_out():
    text = f"skip\t$'x\\nevil'\n{A} v2 10 1\n"
    assert p.parse_container_memory(text) == ({A: 9}, {})
    assert p.skipped_names(text) == ["$'x\\nevil'"]


@pytest.mark.parametrize("text,words", [
    (f"{A[:12]} v2 10 1", ["64-hex id"]),  # a short ID cannot be joined to docker ps safely
    (f"{A} v3 10 1", ["v1|v2"]),
    (f"{A} v2 10", ["v1|v2"]),
    (f"{A} v2 10 1 7", ["v1|v2"]),
    (f"{A} unavailable", ["unavailable <why>"]),
    (f"{A} unavailable no cgroup\x1b[2J", ["unavailable <why>"]),
    (f"{A.upper()} v2 10 1", ["64-hex id"]),
    (f"{A} v2 10 1\n{A} v2 20 1", ["listed twice"]),
    (f"{A} v2 10 1\n{A} unavailable gone", ["listed twice"]),
])
def test_lines_outside_the_format_are_refused(text, words):
    with pytest.raises(ParseError) as exc:
        p.parse_container_memory(text)
    assert str(exc.value).startswith("cannot read the output of container memory")
    for word in words:
        assert word in str(exc.value)


def test_empty_output_is_no_running_container():
    assert p.parse_container_memory("") == ({}, {})


# --------------------------------------------------------------------------- the facts

def test_the_facts_equal_what_docker_stats_gave_for_the_same_containers():
    """The reference head's recorded docker stats (docker-stats-json-seed.txt) and the cgroup
    counters of the same containers (cgroup-memory-seed.txt): every container holds exactly the
    bytes docker stats showed, the exited one none."""
    facts = parse(spark_output(1, seed=True))
    stats = docker_stats_json(sample("docker-stats-json-seed.txt"))
    memory = {c.name: c.memory_bytes for c in facts.docker.containers}
    assert memory == {**{name: stats[name] for name in SEED}, "old_bench": 0}
    assert stats["vllm_node"] == round(68.2 * GIB)
    held = stats["vllm_node"] + stats["reranker"] + stats["vllm_embeddings"]
    assert 97e9 < held < 99e9  # the reference head's ~98 GB
    assert facts.unreadable == {}


def test_the_lab_recording_agrees_with_docker_stats_to_its_printed_digits():
    """Recorded on the lab (cgroup v1, cgroupfs driver, a cgroup parent): docker stats printed
    2.229GiB; the counters read right after give the same to docker's 4 printed digits."""
    head = "61d6f4e6e7fc74c1403d991f9161daecd2814d5a375813195d0d94da1ed538be"
    ps = (f'{{"ID":"{head}","Names":"spark-vllm-ray-head","Image":"x","State":"running",'
          '"Labels":"spark-vllm.managed=true,spark-vllm.role=ray-head"}')
    facts = parse(assemble(spark_sections(1, docker_ps=ps,
                                          container_memory=sample("cgroup-memory-lab-v1.txt"))))
    (container,) = facts.docker.containers
    stats = docker_stats_json(sample("docker-stats-json-lab-v1.txt"))
    printed = stats["spark-vllm-ray-head"]  # round(2.229 GiB)
    assert abs(container.memory_bytes - printed) <= 0.0005 * GIB
    assert container.memory_bytes == 2394566656 - 864256


def test_a_container_whose_cgroup_is_not_found_is_unknown_and_said_so():
    counters = sample("cgroup-memory-seed.txt").replace(
        f"{SEED['reranker']} v2 12752656794 512000000",
        f"{SEED['reranker']} unavailable no cgroup directory named after it")
    facts = parse(assemble(spark_sections(1, seed=True, container_memory=counters)))
    memory = {c.name: c.memory_bytes for c in facts.docker.containers}
    assert memory["reranker"] == 0  # counted as nothing, as when docker stats failed
    assert memory["vllm_node"] == round(68.2 * GIB)  # the others keep theirs
    why = facts.unreadable["container_memory"]
    assert "reranker" in why and "no cgroup directory" in why and "vllm_node" not in why


@pytest.mark.parametrize("section,missing", [
    (("", 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."), False),
    (("", 124), False),
    (("", 127, "bash: line 15: docker: command not found"), True),
])
def test_unreadable_counters_leave_every_container_at_zero_like_a_failed_docker_stats(
        section, missing):
    facts = parse(assemble(spark_sections(1, seed=True, container_memory=section)))
    assert [c.memory_bytes for c in facts.docker.containers] == [0] * 5
    if missing:
        assert "docker" in facts.missing_tools
    else:
        assert "container_memory" in facts.unreadable
    assert [c.name for c in facts.docker.containers][:3] == ["vllm_node", "reranker",
                                                             "vllm_embeddings"]


def test_garbled_counters_make_the_section_unreadable():
    facts = parse(assemble(spark_sections(1, seed=True, container_memory="garbage line\n")))
    assert "container memory" in facts.unreadable["container_memory"]
    assert all(c.memory_bytes == 0 for c in facts.docker.containers)


def test_unknown_memory_is_a_survey_warning_in_preflight():
    counters = sample("cgroup-memory-seed.txt").replace(
        f"{SEED['vllm_node']} v2 75072392397 1843200000",
        f"{SEED['vllm_node']} unavailable memory.stat unreadable")
    cfg = config(preflight={"foreignContainers": "ignore"})
    facts = {"spark-1": parse(assemble(spark_sections(1, seed=True, container_memory=counters))),
             "spark-2": parse(spark_output(2), node="spark-2")}
    try:
        warnings = preflight.check(cfg, facts).warnings
    except preflight.PreflightError as exc:  # a refusal still carries the warnings
        warnings = exc.warnings
    assert [f.fact for f in warnings if f.check == "survey"] == [
        "could not read container_memory: memory unknown (counted as 0 bytes) for vllm_node "
        "(memory.stat unreadable)"]


# --------------------------------------------------------------------------- the snippet

def run(root: Path, bin_: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LC_ALL="C", PATH=f"{bin_}:/usr/bin:/bin")
    proc = subprocess.run(["bash", "-c", snippet("container_memory.sh"), "_", str(root)],
                          capture_output=True, env=env, timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       proc.stdout.decode("utf-8", "replace"),
                                       proc.stderr.decode("utf-8", "replace"))


def fake_docker(bin_: Path, ids: list[str], rc: int = 0) -> Path:
    bin_.mkdir(exist_ok=True)
    out = "".join(f"{i}\\n" for i in ids)
    err = "echo 'Cannot connect to the Docker daemon' >&2; " if rc else ""
    (bin_ / "docker").write_text(
        f'#!/bin/sh\n[ "$*" = "ps -q --no-trunc" ] || exit 99\n{err}printf "{out}"\nexit {rc}\n')
    (bin_ / "docker").chmod(0o755)
    return bin_


def cgroup(path: Path, stat: dict[str, str], **counters: str) -> None:
    path.mkdir(parents=True)
    (path / "memory.stat").write_text("".join(f"{k} {v}\n" for k, v in stat.items()))
    for name, value in counters.items():
        (path / name.replace("_", ".", 1)).write_text(value + "\n")


def test_snippet_reads_cgroup_v2_under_either_driver_and_a_cgroup_parent(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    v2 = {"anon": "1", "file": "9", "active_file": "700", "inactive_file": "300"}
    cgroup(root / "system.slice" / f"docker-{A}.scope", v2, memory_current="5000")  # systemd
    cgroup(root / "docker" / B, {**v2, "inactive_file": "9000"}, memory_current="4096")  # cgroupfs
    cgroup(root / "svl" / "spark-1" / "containers" / C, v2, memory_current="1300")  # a parent
    cgroup(root / "system.slice" / f"docker-{E}.scope", v2, memory_current="lots")
    (root / "system.slice" / "ssh.service").mkdir()
    out = run(root, fake_docker(tmp_path / "bin", [A, B, C, D, E]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{A} v2 5000 300", f"{B} v2 4096 9000", f"{C} v2 1300 300",
        f"{D} unavailable no cgroup directory named after it",
        f"{E} unavailable memory.current is not a number"]
    usage, unknown = p.parse_container_memory(out.stdout)
    assert usage == {A: 4700, B: 0, C: 1000}
    assert set(unknown) == {D, E}


def test_snippet_reads_cgroup_v1_memory_as_the_lab_lays_it_out(tmp_path):
    """The lab's dockerds: cgroup v1 (hybrid), cgroupfs driver, --cgroup-parent
    /svl-lab/spark-N/containers: memory/svl-lab/spark-1/containers/<id>, 4 levels down. The
    unified tree holds the same directory without memory counters: it must not be read."""
    root = tmp_path / "cg"
    mem = root / "memory"
    cgroup(mem, {"total_inactive_file": "1"}, memory_usage_in_bytes="99")  # the root's own
    v1 = {"cache": "900", "inactive_file": "100", "total_inactive_file": "864256"}
    cgroup(mem / "svl-lab" / "spark-1" / "containers" / A, v1,
           memory_usage_in_bytes="2394566656")
    cgroup(mem / "system.slice" / f"docker-{B}.scope", {"inactive_file": "5"},
           memory_usage_in_bytes="50")  # no total_inactive_file: never the non-hierarchical one
    (root / "unified" / "svl-lab" / "spark-1" / "containers" / A).mkdir(parents=True)
    out = run(root, fake_docker(tmp_path / "bin", [A, B]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{A} v1 2394566656 864256",
                                       f"{B} unavailable no total_inactive_file in memory.stat"]
    assert p.parse_container_memory(out.stdout)[0] == {A: 2394566656 - 864256}


def test_snippet_bounds_its_search(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory\n")
    deep = root / "a" / "b" / "c" / "d" / "e" / A  # 6 levels: beyond -maxdepth 5
    cgroup(deep, {"inactive_file": "0"}, memory_current="10")
    out = run(root, fake_docker(tmp_path / "bin", [A]))
    assert out.stdout == f"{A} unavailable no cgroup directory named after it\n"


def test_snippet_without_a_memory_hierarchy_says_so_per_container(tmp_path):
    (tmp_path / "cg").mkdir()
    out = run(tmp_path / "cg", fake_docker(tmp_path / "bin", [A, B]))
    assert out.returncode == 0, out.stderr
    usage, unknown = p.parse_container_memory(out.stdout)
    assert usage == {} and set(unknown) == {A, B}
    assert "no memory cgroup hierarchy" in unknown[A]


def test_snippet_fails_with_docker_and_prints_nothing_without_containers(tmp_path):
    out = run(tmp_path, fake_docker(tmp_path / "bin", [], rc=1))
    assert out.returncode == 1 and "Cannot connect" in out.stderr and out.stdout == ""
    out = run(tmp_path, fake_docker(tmp_path / "bin2", []))
    assert out.returncode == 0 and out.stdout == ""


def test_snippet_never_prints_an_id_raw_and_never_globs_it(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory\n")
    cgroup(root / "docker" / A, {"inactive_file": "1"}, memory_current="3")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text(
        f"#!/bin/sh\nprintf '{A}\\n*\\nabc\\n{B[:63]}\\033\\n'\n")
    (tmp_path / "bin" / "docker").chmod(0o755)
    out = run(root, tmp_path / "bin")
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        assert all(ch == "\t" or 32 <= ord(ch) < 127 for ch in line), repr(line)
    usage, unknown = p.parse_container_memory(out.stdout)
    assert usage == {A: 2} and unknown == {}
    assert p.skipped_names(out.stdout) == ["\\*", "abc", f"$'{B[:63]}\\E'"]


def test_every_snippet_and_the_whole_script_pass_bash_n():
    """`bash -n`: each snippet as the node's bash parses it, and the generated script."""
    from inspection import snippets

    folder = Path(snippets.__file__).parent
    names = sorted(f.name for f in folder.glob("*.sh"))
    assert "container_memory.sh" in names
    for name in names:
        proc = subprocess.run(["bash", "-n", "-c", snippet(name)], capture_output=True, text=True)
        assert proc.returncode == 0, (name, proc.stderr)
    cfg = config()
    script = recon_script(cfg, cfg.nodes[0], NONCE, NAMES)
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "\nsv_bg container_memory 20 bash -c " in script and f"_ {CGROUP_ROOT}\n" in script
    assert not re.search(r"^sv_bg \S+ \d+ docker stats", script, re.M)  # replaced
