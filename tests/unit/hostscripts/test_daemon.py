"""A configured daemon on the head (hostscripts/daemon.py), once for the gateway, Prometheus and
Alertmanager: the reload (its text, and run against a process that takes the signal), the
versioned configuration and its swap, the removal, the gate's marker and script. What is each
daemon's own (HAProxy's configuration, promtool's and amtool's checks, Alertmanager's secret
values) is in test_gateway_*.py, test_monitoring.py and test_alertmanager.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostscripts import alertmanager, gateway, monitoring
from hostscripts import daemon as dm
from hostscripts.paths import StackNames

NAMES = StackNames("t")
MODULES = {"gateway": gateway, "monitoring": monitoring, "alertmanager": alertmanager}
# (module, its reload line's word, its config word, its signal)
DAEMONS = [("gateway", "gateway", "gateway", "USR2"),
           ("monitoring", "prometheus", "monitoring", "HUP"),
           ("alertmanager", "alertmanager", "alertmanager", "HUP")]


@pytest.mark.parametrize(("module", "name", "config", "sig"), DAEMONS)
def test_each_daemon_reloads_by_its_signal_to_its_process_never_dockers_kill(module, name,
                                                                            config, sig):
    d = MODULES[module].daemon(NAMES)
    assert (d.name, d.config, d.signal) == (name, config, sig)
    assert d.dir.rsplit("/", 1)[0] == NAMES.dir
    lines = MODULES[module].reload_lines(NAMES)
    assert lines == dm.reload_lines(d)
    assert lines[0] == dm.running_test(d.container) and lines[-1] == "fi"
    assert lines[1] == f"  pid=$(docker inspect -f '{{{{.State.Pid}}}}' {d.container})"
    assert lines[-3:-1] == [f'  kill -{sig} "$pid"', f"  echo '{name} reloaded'"]
    # Docker's kill API marks the container manually stopped (not started when dockerd restarts)
    assert not any("docker kill" in line for line in lines)


# A process that takes a reload signal: it writes `got` to the file $OUT on each one. With
# $LATE it asks for the signal only after that many seconds (as HAProxy's master does once it
# has started); before that the signal's default action applies.
TAKER = """
import os, signal, sys, time
sig = getattr(signal, "SIG" + sys.argv[1])
time.sleep(float(os.environ.get("LATE", "0")))
signal.signal(sig, lambda *_: open(os.environ["OUT"], "a").write("got\\n"))
open(os.environ["OUT"] + ".ready", "w").close()
time.sleep(60)
"""

DOCKER = """#!/bin/sh
# inspect -f '{{.State.Running}}' NAME | inspect -f '{{.State.Pid}}' NAME
case "$3" in
  *Running*) echo "${FAKE_RUNNING:-true}" ;;
  *Pid*) echo "$FAKE_PID" ;;
  *) exit 1 ;;
esac
"""


def _docker(tmp: Path, pid: int, running: str = "true") -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_PID": str(pid),
            "FAKE_RUNNING": running}


@pytest.mark.parametrize(("sig", "wait", "late"), [
    # HAProxy's master loses a SIGUSR2 sent before it asks for it: wait until it is caught
    ("USR2", dm.wait_caught("test daemon", "SIGUSR2", bit=11), 1.0),
    # a Go program dies of a SIGHUP in its first moments: wait until it has run long enough
    ("HUP", dm.wait_age(2), 1.0),
])
def test_the_reload_waits_until_the_process_can_take_its_signal(tmp_path, sig, wait, late):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", TAKER, sig],
                            env={**os.environ, "OUT": str(out), "LATE": str(late)})
    try:
        d = dm.Daemon(name="test", config="test", container="c", dir=f"{NAMES.dir}/test",
                      signal=sig, wait=wait)
        done = subprocess.run(["sh", "-c", "set -eu\n" + "\n".join(dm.reload_lines(d))],
                              capture_output=True, text=True, env=_docker(tmp_path, proc.pid),
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "test reloaded\n"
        for _ in range(100):
            if out.exists():
                break
            time.sleep(0.05)
        assert proc.poll() is None and out.read_text() == "got\n"
    finally:
        proc.kill()
        proc.wait()


def test_a_signal_never_caught_fails_the_reload_after_its_limit(tmp_path):
    proc = subprocess.Popen(["sleep", "30"])  # never catches SIGUSR2
    try:
        d = dm.Daemon(name="test", config="test", container="c", dir=f"{NAMES.dir}/test",
                      signal="USR2", wait=dm.wait_caught("test daemon", "SIGUSR2", 11, seconds=1))
        done = subprocess.run(["sh", "-c", "set -eu\n" + "\n".join(dm.reload_lines(d))],
                              capture_output=True, text=True, env=_docker(tmp_path, proc.pid),
                              timeout=30)
        assert done.returncode == 1 and proc.poll() is None
        assert "the test daemon does not take its reload signal (SIGUSR2) after 1 s" in done.stderr
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("module", "name", "config", "sig"), DAEMONS[:2])  # Alertmanager's
# own config_write (its secret values from stdin) swaps with the same lines: test_alertmanager
def test_config_write_swaps_in_a_checked_folder_and_keeps_the_one_in_use_on_a_failed_check(
        tmp_path, module, name, config, sig):
    """The daemon's config_write, run (the daemon not running: nothing reloads): the new folder
    becomes `conf` and the older ones go; a check that fails fails the script and `conf` stays."""
    d = MODULES[module].daemon(NAMES)
    env = _docker(tmp_path, 0, running="false")
    root = tmp_path / "node"

    def run(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", text.replace(NAMES.dir, str(root))],
                              capture_output=True, text=True, env=env, timeout=30)

    here = root / d.dir.removeprefix(NAMES.dir + "/")
    for text in ("a: 1\n", "a: 2\n"):
        digest = dm.files_hash(text)
        done = run(dm.config_write(d, [("x.yml", text)], digest, "true", subdir="errors"))
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"{config} config {digest}\n"
        assert os.readlink(here / "conf") == f"conf.{digest}"
        assert (here / "conf" / "x.yml").read_text() == text and (here / "conf" / "errors").is_dir()
        assert sorted(p.name for p in here.iterdir()) == ["conf", f"conf.{digest}", "secrets"]
        assert oct(here.stat().st_mode & 0o777) == "0o700"
    done = run(dm.config_write(d, [("x.yml", "a: 3\n")], dm.files_hash("a: 3\n"), "false"))
    assert done.returncode != 0 and f"{config} config" not in done.stdout
    assert os.readlink(here / "conf") == f"conf.{dm.files_hash('a: 2' + chr(10))}"
    # removed: the configuration folders, then the empty ones up to the stack's
    done = run(MODULES[module].config_remove(NAMES))
    assert done.returncode == 0 and not root.exists()
    with pytest.raises(ValueError, match="config hash"):
        dm.config_write(d, [], "not-a-hash", "true")


def test_config_remove_names_each_daemons_folders():
    g, a = gateway.daemon(NAMES), alertmanager.daemon(NAMES)
    assert gateway.config_remove(NAMES) == (
        f"rm -rf {g.dir}/conf {g.dir}/conf.*; "
        f"rmdir {g.dir}/secrets {g.dir} {NAMES.dir} 2>/dev/null || true")
    # Alertmanager has no secrets folder; a run may leave its check and new folders
    assert alertmanager.config_remove(NAMES) == (
        f"rm -rf {a.dir}/conf {a.dir}/conf.* {a.dir}/check.* {a.dir}/new.*; "
        f"rmdir {a.dir} {NAMES.dir} 2>/dev/null || true")
    with pytest.raises(ValueError, match="not a folder of the stack"):
        dm.config_remove(g, "/elsewhere")


@pytest.mark.parametrize("what", ["gateway", "monitoring", "alertmanager"])
def test_the_config_hash_is_read_back_from_what_config_write_printed(what):
    assert dm.config_digest(f"{what} reloaded\n{what} config 0123456789abcdef\n", what) == \
        "0123456789abcdef"
    for bad in ("", f"{what} config xyz", "ok", f"{what} config 0123456789abcdef0"):
        with pytest.raises(ValueError, match=f"not a {what} config hash"):
            dm.config_digest(bad, what)


def test_the_gate_starts_each_container_then_checks_and_its_marker_is_plain():
    script = dm.gate_script("monitoring", "c1 0123456789abcdef", ["one", "two"], "check-it")
    assert script.split("\n") == [
        "set -eu",
        "# monitoring: 'c1 0123456789abcdef'",
        *dm.start_lines("one"), *dm.start_lines("two"),
        "check-it",
    ]
    assert dm.start_lines("one") == [
        "if [ \"$(docker inspect -f '{{.State.Running}}' one)\" != true ]; then",
        "  docker start one >/dev/null", "fi"]
    assert dm.start_lines("one", said="node exporter")[2:] == [
        "  echo 'node exporter started'", "else", "  echo 'node exporter running'", "fi"]
    for bad in ("x\nreboot", "x #", ""):
        with pytest.raises(ValueError):
            dm.gate_script("monitoring", bad, ["one"], "check-it")
    with pytest.raises(ValueError):
        dm.start_lines("one", said="it's")


def test_a_daemon_is_named_by_plain_words():
    dm.Daemon(name="node-exporter", config="x", container="c", dir="/d", signal="HUP")
    for over in ({"name": "x'; reboot"}, {"config": "a b"}, {"signal": "HUP; id"}):
        with pytest.raises(ValueError, match="not a daemon's word"):
            dm.Daemon(**{"name": "x", "config": "x", "container": "c", "dir": "/d",
                         "signal": "HUP", **over})


def test_a_check_runs_the_daemons_image_without_network_with_the_labels():
    text = dm.check_run({"b": "2", "a": "1"}, ["'/x:/y:ro'", '"$check":/z:ro'], "promtool",
                        "sha256:" + "a" * 64, "check config /y/p.yml >&2")
    assert text == ("docker run --rm --network none --user 0 --label a=1 --label b=2 "
                    "-v '/x:/y:ro' -v \"$check\":/z:ro --entrypoint promtool "
                    f"sha256:{'a' * 64} check config /y/p.yml >&2")


def test_a_secret_write_reloads_after_the_file_is_in_place():
    d = monitoring.daemon(NAMES)
    text = dm.secret_write(d, NAMES.monitoring_key_file, "monitoring key")
    assert text.index(f"mv {NAMES.monitoring_key_file}.new") < text.index('kill -HUP "$pid"')
    assert text == monitoring.key_write(NAMES)
