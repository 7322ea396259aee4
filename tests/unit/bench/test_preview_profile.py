"""bench/preview_profile.py: the profiled program's stats read into the no-op rows' parts, and
the sitecustomize that profiles only the language host's program process."""

from __future__ import annotations

import cProfile
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import preview_profile


def _fake_program(folder: Path) -> Path:
    """A stand-in program laid out like the real one (config/load.py, components/stack.py),
    whose functions take known times."""
    (folder / "config").mkdir(parents=True)
    (folder / "components").mkdir()
    (folder / "config" / "load.py").write_text(
        "import time\ndef load_config():\n    time.sleep(0.05)\n")
    (folder / "components" / "stack.py").write_text(
        "import time\ndef build_stack():\n    time.sleep(0.1)\n")
    return folder


def test_the_parts_are_the_cumulative_times_of_the_programs_functions(tmp_path):
    src = _fake_program(tmp_path / "prog")
    import importlib.util

    def load(name: str, path: Path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    prof = cProfile.Profile()
    prof.enable()
    __import__("json.tool")  # an import the profile sees
    loader = load("svl_fake_load", src / "config" / "load.py")
    stack = load("svl_fake_stack", src / "components" / "stack.py")
    loader.load_config()
    stack.build_stack()
    stack.build_stack()
    prof.disable()
    out = tmp_path / "stats"
    prof.dump_stats(f"{out}.123")
    Path(f"{out}.123.wall").write_text("2.500\n")
    figures = preview_profile.phases(out)
    assert 0.05 <= figures["config_s"] < 0.5
    assert 0.2 <= figures["graph_s"] < 1.0  # both calls
    assert figures["imports_s"] > 0
    assert figures["process_s"] == 2.5
    assert figures["after_program_s"] == 2.5  # no runpy in this profile: all of it is "after"


def test_no_or_several_profiled_processes_are_an_error_naming_the_folder(tmp_path):
    with pytest.raises(RuntimeError, match="found none"):
        preview_profile.phases(tmp_path / "stats")
    for pid in (1, 2):
        cProfile.Profile().dump_stats(str(tmp_path / f"stats.{pid}"))
    with pytest.raises(RuntimeError, match="expected the stats of one profiled program"):
        preview_profile.phases(tmp_path / "stats")


@pytest.mark.parametrize("argv0,profiled", [("pulumi-language-python-exec", True),
                                            ("some-other-tool", False)])
def test_only_the_language_hosts_program_process_is_profiled(tmp_path, argv0, profiled):
    out = tmp_path / "stats"
    script = tmp_path / argv0
    script.write_text("x = sum(range(1000))\n")
    env = {**os.environ, **preview_profile.env(out)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("stats."))
    assert bool(written) is profiled, written
    if profiled:
        assert preview_profile.phases(out)["process_s"] >= 0


def test_the_report_shows_the_profile_and_the_pack(tmp_path):
    from bench.bench import report
    from tests.unit.bench.test_bench_verdict import _result

    res = _result()
    res["noop"].update(profile={"preview_s": 6.1, "process_s": 4.0, "imports_s": 1.2,
                                "config_s": 0.02, "waiting_for_look_s": 0.3, "graph_s": 0.4,
                                "sdk_debug_logs_s": 0.45, "after_program_s": 1.0},
                       with_pack_s=[5.0, 5.2], with_pack_median_s=5.1)
    out = tmp_path / "b.md"
    report(res, out)
    text = out.read_text()
    assert "6.1 s in all, of which the program's process 4.0 s" in text
    assert ("| the SDK's debug log calls (one blocking RPC each; the engine drops them unless "
            "run with -v) | 0.45 |") in text
    assert "takes 5.1 s (median of 5.0, 5.2) against 4.0 s without" in text
