"""The node's guard as inspection reads it (issue 48): recon's guard and oom_kills sections,
preflight's checks of what the guard needs and its warning of an OOM kill with the figure, and
`spark-vllm status`'s "OOM-killed at T (node available X GiB)". The guard snippet runs for real
here (inspection/snippets/guard.sh); the kill records are in the hook's format
(hostscripts/guard.hook_text, run for real in tests/unit/hostscripts/test_guard.py)."""

from __future__ import annotations

import subprocess
import time

import pytest

from config import validate_config
from hostscripts import guard as g
from hostscripts.paths import GUARD_DIR, LIVENESS_STARTS, StackNames
from inspection import preflight, recon
from inspection import status as st
from inspection.preflight import PreflightError
from tests.conftest import ROOT, config_raw
from tests.unit.inspection.recon_helpers import (
    NONCE,
    assemble,
    config,
    parse,
    spark_sections,
)

NAMES = StackNames("dev")
GUARD_SH = ROOT / "inspection" / "snippets" / "guard.sh"


def guard_section(*, earlyoom: str = "/usr/bin/earlyoom", systemctl: str = "/usr/bin/systemctl",
                  apt: str = "/usr/bin/apt-get", active: str = "active", records: str = "present",
                  files: dict[str, str] | None = None) -> str:
    """The guard section as guard.sh prints it on a node (its format: the snippet's header)."""
    lines = [f"tool\tearlyoom\t{earlyoom}", f"tool\tsystemctl\t{systemctl}",
             f"tool\tapt-get\t{apt}", "tool\tsystemd-oomd\tabsent",
             f"active\tearlyoom.service\t{active}", "active\tsystemd-oomd.service\tinactive",
             f"records\t{records}"]
    lines += [f"file\t{d}\t{p}" for p, d in (files or {}).items()]
    return "\n".join(lines) + "\n"


def test_guard_sh_run_here_reads_back_as_the_parser_expects(tmp_path):
    """The snippet itself, on this machine: every tool said, the folder's state, each file's
    sha256 or absent."""
    present = tmp_path / "a.conf"
    present.write_text("[Service]\nOOMScoreAdjust=-900\n")
    out = subprocess.run(["bash", str(GUARD_SH), str(tmp_path / "no-guard"), str(present),
                          str(tmp_path / "absent.conf")], capture_output=True, text=True)
    assert out.returncode == 0, out
    got = recon.p.parse_guard(out.stdout)
    assert set(got.tools) == {"earlyoom", "systemctl", "apt-get", "systemd-oomd"}
    assert got.records_present is False
    assert got.files == {str(present): g.sha256(present.read_text()),
                         str(tmp_path / "absent.conf"): None}


@pytest.mark.parametrize("bad", ["tool\tsh\t/bin/sh", "file\tabc\t/etc/x", "records\tmaybe",
                                 "active\tearlyoom.service\tACTIVE;rm", "anything else"])
def test_a_guard_record_of_another_shape_is_refused(bad):
    with pytest.raises(recon.p.ParseError):
        recon.p.parse_guard(guard_section() + bad + "\n")


def test_recon_surveys_the_guard_only_when_it_is_on():
    cfg = config()
    script = recon.recon_script(cfg, cfg.head, NONCE, NAMES)
    assert "sv_bg guard 10 bash -c " in script and "sv_bg oom_kills 10 bash -c " in script
    for path in g.survey_files(NAMES):
        assert path in script
    off = config(guard={"enabled": False})
    assert "sv_bg guard " not in recon.recon_script(off, off.head, NONCE, NAMES)
    # no stack named: nothing of the stack's to look for
    assert "sv_bg guard " not in recon.recon_script(cfg, cfg.head, NONCE, None)


def _facts(**sections):
    return parse(assemble(spark_sections(1, **sections)), sent_at=1764479999.0,
                 received_at=1764480000.5)


def test_recon_reads_the_guard_and_the_kills_in_the_control_machines_clock():
    # the node's clock is 1764480000.1-.9: 0.4 s ahead of the control machine here
    kills = "1764479000 805306368 8589934592 4242 VLLM::EngineCor\nnot a line\n"
    f = _facts(guard=guard_section(), oom_kills=kills)
    assert f.guard is not None and f.guard.has("earlyoom") and f.guard.records_present
    (k,) = f.oom_kills
    assert (k.name, k.available_bytes, k.total_bytes, k.pid) == ("VLLM::EngineCor", 768 << 20,
                                                                 8 << 30, 4242)
    assert k.time == pytest.approx(1764479000 - 0.4)


# --------------------------------------------------------------------------- preflight


def _check(cfg, guard: str, **kw):
    facts = {"spark-1": _facts(guard=guard), "spark-2": parse(assemble(spark_sections(2)),
                                                             node="spark-2")}
    return preflight.check(cfg, facts, **kw)


def test_a_node_without_earlyoom_is_refused_saying_how_to_add_it():
    with pytest.raises(PreflightError) as exc:
        _check(config(), guard_section(earlyoom="absent"))
    (f,) = [x for x in exc.value.findings if x.check == "guard"]
    assert f.node == "spark-1" and "earlyoom is not installed" in f.fact
    assert "apt-get install earlyoom" in f.fix and "guard.install: true" in f.fix
    assert "guard.enabled: false" in f.fix
    # guard.install: the up installs it with the node's apt-get
    _check(config(guard={"install": True}), guard_section(earlyoom="absent"))
    with pytest.raises(PreflightError) as exc:
        _check(config(guard={"install": True}), guard_section(earlyoom="absent", apt="absent"))
    assert "no apt-get" in str(exc.value)
    # or the guard off: nothing of it is checked
    _check(config(guard={"enabled": False}), guard_section(earlyoom="absent"))


def test_a_node_without_systemd_is_refused():
    with pytest.raises(PreflightError) as exc:
        _check(config(), guard_section(systemctl="absent"))
    assert "systemctl is not on the node" in str(exc.value)


def test_a_guard_that_could_not_be_read_stops_the_change_outside_dev():
    unreadable = ("", 124, "")  # timed out on the node
    with pytest.raises(PreflightError) as exc:
        _check(config(), unreadable)
    assert "the node's OOM guard could not be read" in str(exc.value)
    plan = _check(config(environment="dev"), unreadable)
    assert any(w.check == "survey" and "guard" in w.fact for w in plan.warnings)


def test_an_oom_kill_of_the_last_day_is_a_warning_with_the_figure():
    now = 1764480000.0
    kills = f"{int(now - 3600)} 805306368 8589934592 4242 vllm\n{int(now - 90000)} 1 2 7 old\n"
    facts = {"spark-1": _facts(guard=guard_section(), oom_kills=kills),
             "spark-2": parse(assemble(spark_sections(2)), node="spark-2")}
    plan = preflight.check(config(), facts, now=now)
    (w,) = [x for x in plan.warnings if x.check == "oom"]
    assert w.node == "spark-1"
    assert w.fact.startswith("OOM-killed at ") and "(node available 768 MiB of 8.0 GiB; " \
        "earlyoom killed vllm)" in w.fact, w.fact
    assert "1 OOM kill(s) on this node in the last 24 h" in w.fact
    assert "lower vllm.gpuMemoryUtilization" in w.fix
    # a day later: no warning
    assert not [x for x in preflight.check(config(), facts, now=now + 86400).warnings
                if x.check == "oom"]


def test_the_kernels_kill_the_watchdog_recorded_is_warned_of_too():
    now = 1764480000.0
    starts = f"{now - 600:.3f} start\n{now - 500:.3f} serving\n{now - 60:.3f} oom kernel - - -\n"
    f = _facts(**{f"starts:{NAMES.serve}": starts})
    assert [k.source for k in f.liveness_ooms[NAMES.serve]] == ["kernel"]
    (w,) = preflight.check_oom_kills(config(), f, now=now)
    assert "the kernel killed a process" in w.fact and "node available ?" in w.fact


# --------------------------------------------------------------------------- status


def _state(oom: bool = False) -> str:
    return (f'0 {{"Status":"running","StartedAt":"2026-12-06T02:00:00Z","ExitCode":0,'
            f'"OOMKilled":{"true" if oom else "false"}}}')


def _probe() -> str:
    return '{"health": 200, "models": ["tiny-moe"], "samples": []}'


def _status(**head) -> tuple[list[st.ModelStatus], dict[str, st.NodeStatus]]:
    cfg = validate_config(config_raw())  # the lab's dev stack: guard on
    sections = {"clock": "2000.5", "meminfo": "MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n",
                "docker_ps": "", "container_memory": "", "oom_kills": "",
                f"state:{NAMES.serve}": _state(), f"starts:{NAMES.serve}": "",
                f"probe:{NAMES.serve}": _probe(), f"state:{NAMES.ray_head}": _state(),
                f"state:{NAMES.gateway}": _state(), "alerts": '{"status":"success","data":'
                '{"alerts":[]}}'}
    sections.update(head)
    sections = {k: v for k, v in sections.items() if v is not None}  # None: no answer
    worker = {"clock": "2000.5", "meminfo": "MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n",
              "docker_ps": "", "container_memory": "", "oom_kills": "",
              f"state:{NAMES.ray_worker}": _state()}
    nodes = {"spark-1": st.parse_node(cfg, NAMES, cfg.head, assemble(sections), NONCE),
             "spark-2": st.parse_node(cfg, NAMES, cfg.nodes[1], assemble(worker), NONCE)}
    return st.model_states(cfg, NAMES, nodes), nodes


def test_status_reads_the_kills_section_only_with_the_guard():
    cfg = validate_config(config_raw())
    assert f"{g.KILLS}" in st.node_script(cfg, NAMES, cfg.head, NONCE)
    off = validate_config(config_raw(guard={"enabled": False}))
    assert "oom_kills" not in st.node_script(off, NAMES, off.head, NONCE)
    # the section that did not answer is a problem, never "no kills"
    (_m,), nodes = _status(oom_kills=None)
    assert nodes["spark-1"].oom_kills is None
    assert any(pr.startswith("OOM kills: ") for pr in nodes["spark-1"].problems)


def test_a_model_served_again_after_an_oom_kill_says_when_and_with_how_much():
    starts = ("1000.000 start\n1100.000 serving\n1764480000.000 oom earlyoom 805306368 "
              "8589934592 VLLM::EngineCor\n1764480010.000 start\n1764480040.000 serving\n")
    kills = "1764480000 805306368 8589934592 4242 VLLM::EngineCor\n"
    (m,), nodes = _status(**{f"starts:{NAMES.serve}": starts}, oom_kills=kills)
    assert m.state == "serving" and m.why == ""
    assert m.oom == ("OOM-killed at 2025-11-30 05:20:00 UTC (node available 768 MiB of 8.0 GiB; "
                     "earlyoom killed VLLM::EngineCor)"), m.oom
    assert [k.name for k in nodes["spark-1"].oom_kills or []] == ["VLLM::EngineCor"]


def test_dockers_oom_killed_names_the_container_and_a_crash_loop_says_memory():
    (m,), _ = _status(**{f"state:{NAMES.ray_head}": _state(oom=True)})
    assert m.oom == ("OOM-killed (Docker: spark-1/spark-vllm-dev-ray-head's last exit was the "
                     "kernel's OOM kill)")
    # the dev stack: more than 2 restarts in 300 s is a crash loop
    starts = "".join(f"{t} start\n{t + 1} oom earlyoom 1 2 vllm\n"
                     for t in (1800.0, 1850.0, 1900.0, 1950.0))
    (m,), _ = _status(**{f"starts:{NAMES.serve}": starts,
                         f"probe:{NAMES.serve}": ("", 1, "Error: refused")})
    assert m.state == "crash-looping", m
    assert m.why.endswith("the last one OOM-killed at 1970-01-01 00:32:31 UTC (node available "
                          "1 B of 2 B; earlyoom killed vllm): the node runs out of memory"), m.why


def test_preflight_and_status_agree_on_the_words():
    """One text for both (preflight.oom_text), from the same record."""
    k = recon.p.parse_oom_kills("1764480000 805306368 8589934592 4242 vllm\n")[0]
    assert preflight.oom_text(k) == ("OOM-killed at 2025-11-30 05:20:00 UTC (node available "
                                     "768 MiB of 8.0 GiB; earlyoom killed vllm)")
    assert time.gmtime(k.time).tm_year == 2025
    assert GUARD_DIR in g.KILLS and LIVENESS_STARTS.startswith("/var/lib/")
