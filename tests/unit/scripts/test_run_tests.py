"""scripts/run_tests.py, the runner `make test` calls: tiers in the background beside the others.

Each case runs the real runner on tiny pytest files of its own (real pytest processes), with the
reports in a temporary folder.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def runner(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("run_tests_under_test",
                                                  ROOT / "scripts" / "run_tests.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "CACHE", tmp_path / "cache")
    return mod


def _test_file(tmp_path: Path, name: str, body: str) -> str:
    f = tmp_path / f"test_{name}.py"
    f.write_text("import pathlib, time\n\n\ndef test_it():\n" + body)
    return str(f)


def _use(mod, monkeypatch, tiers):
    monkeypatch.setattr(mod, "TIERS", tiers)
    monkeypatch.setattr(mod, "DEFAULT", [t.name for t in tiers])


def test_a_background_tier_runs_beside_the_foreground_and_its_dependant_waits(
        runner, tmp_path, monkeypatch, capsys):
    marks = tmp_path / "marks"
    marks.mkdir()
    bg = _test_file(tmp_path, "bg", f"    time.sleep(2)\n    (pathlib.Path({str(marks)!r}) / 'bg').write_text(str(time.time()))\n")
    fg = _test_file(tmp_path, "fg", f"    (pathlib.Path({str(marks)!r}) / 'fg').write_text(str(time.time()))\n")
    after = _test_file(tmp_path, "after", f"    assert (pathlib.Path({str(marks)!r}) / 'bg').exists()\n")
    T = runner.Tier
    _use(runner, monkeypatch, [T("fg", [fg]), T("bg", [bg], background=True, nice=5),
                               T("after", [after], after="bg")])
    t0 = time.monotonic()
    assert runner.main([]) == 0
    out = capsys.readouterr().out
    # the foreground tier did not wait for the background one (it ended first)
    assert float((marks / "fg").read_text()) < float((marks / "bg").read_text())
    assert time.monotonic() - t0 < 60
    assert "===== tier bg (in the background, nice 5; output in " in out
    assert "===== tier bg (background) ended: ok" in out
    table = out[out.index("===== spark-vllm test run: tiers"):]
    rows = [ln.split()[0] for ln in table.splitlines()[2:5]]
    assert rows == ["fg", "bg", "after"], table  # the tiers table's order
    # the background tier's time is its own run (~2 s), not the time until the runner waited
    bg_time = table.splitlines()[3].split()[2]
    minutes, seconds = bg_time.split(":")
    assert int(minutes) == 0 and float(seconds) < 30, table


def test_a_background_tiers_time_is_its_own_even_when_waited_for_late(runner, tmp_path,
                                                                       monkeypatch, capsys):
    bg = _test_file(tmp_path, "bg", "    pass\n")
    fg = _test_file(tmp_path, "fg", "    time.sleep(8)\n")
    T = runner.Tier
    _use(runner, monkeypatch, [T("bg", [bg], background=True), T("fg", [fg])])
    assert runner.main([]) == 0
    out = capsys.readouterr().out
    table = out[out.index("===== spark-vllm test run: tiers"):].splitlines()
    bg_secs = float(table[2].split()[2].split(":")[1])
    fg_secs = float(table[3].split()[2].split(":")[1])
    assert bg_secs < fg_secs, table  # it ended long before the runner waited for it


def test_a_failed_background_tier_fails_the_run_and_keeps_its_dependants_from_running(
        runner, tmp_path, monkeypatch, capsys):
    bg = _test_file(tmp_path, "bg", "    assert False, 'the background tier fails'\n")
    after = _test_file(tmp_path, "after", "    pass\n")
    other = _test_file(tmp_path, "other", "    pass\n")
    T = runner.Tier
    _use(runner, monkeypatch, [T("bg", [bg], background=True), T("other", [other]),
                               T("after", [after], after="bg")])
    assert runner.main([]) == 1
    out = capsys.readouterr().out
    assert "===== tier bg (background) ended: exit 1" in out
    assert "the background tier fails" in out  # its log's lines, printed on failure
    assert "tier bg failed (exit 1); the tiers that need it (after) did not run" in out
    table = out[out.index("===== spark-vllm test run: tiers"):]
    assert [ln.split()[0] for ln in table.splitlines()[2:4]] == ["bg", "other"], table
    assert "after" not in table.split("total")[0]


def test_a_failed_foreground_tier_still_waits_for_the_background(runner, tmp_path, monkeypatch,
                                                                 capsys):
    bg = _test_file(tmp_path, "bg", "    time.sleep(1)\n")
    fg = _test_file(tmp_path, "fg", "    assert False\n")
    later = _test_file(tmp_path, "later", "    pass\n")
    T = runner.Tier
    _use(runner, monkeypatch, [T("fg", [fg]), T("bg", [bg], background=True),
                               T("later", [later])])
    assert runner.main([]) == 1
    out = capsys.readouterr().out
    assert "tier fg failed (exit 1); the later tiers (later) did not run" in out
    assert "===== tier bg (background) ended: ok" in out
