"""payloads/vllm_liveness.py, the main process of the head's vLLM container and of each service's,
run for real with tests/fake_vllm_engine.py (a FAKE vLLM: an HTTP server with vLLM's probed paths
and no model) as the child it supervises, as `vllm serve` is on a node."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostscripts.common import payload
from hostscripts.guard import PREFER
from tests.conftest import ROOT

INTERVAL, DEADLINE, FAILURES = 0.3, 0.5, 3
KEY = "sk-liveness-test"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Watched:
    """The watchdog over the fake, its state file and request log in tmp_path."""

    def __init__(self, tmp_path: Path, *flags: str, task: str = "generate",
                 kills: str = "-") -> None:
        self.state, self.log = tmp_path / "state", tmp_path / "requests.log"
        self.state.write_text("ok")
        self.log.write_text("")
        key = tmp_path / "api-key"
        key.write_text(KEY + "\n")
        port = _port()
        self.argv = [sys.executable, "-c", payload("vllm_liveness.py"), f"http://127.0.0.1:{port}",
                     "tiny", task, str(INTERVAL), str(DEADLINE), str(FAILURES), str(key),
                     str(tmp_path / "liveness" / "starts"), "0.01", "0.04", "2", "600",
                     kills, PREFER, "0.5",
                     sys.executable, str(ROOT / "tests" / "fake_vllm_engine.py"), str(port),
                     str(self.state), str(self.log), *flags]
        self.p = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)

    def requests(self) -> list[str]:
        return self.log.read_text().splitlines()

    def wait_for(self, line: str, within: float = 30) -> None:
        end = time.monotonic() + within
        while not any(r.startswith(line) for r in self.requests()):
            assert time.monotonic() < end, f"no {line!r} request in {within} s: {self.requests()}"
            assert self.p.poll() is None, self.p.communicate()[0]
            time.sleep(0.05)

    def armed(self) -> None:
        """Probing: the watchdog has asked for the metrics at least once (after /health)."""
        self.wait_for("GET /metrics")

    def end(self, within: float = 30) -> tuple[int, str]:
        try:
            out, _ = self.p.communicate(timeout=within)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, _ = self.p.communicate()
            raise AssertionError(f"the watchdog did not end within {within} s:\n{out}") from None
        return self.p.returncode, out


@pytest.fixture
def watched(tmp_path) -> Iterator[list[Watched]]:
    made: list[Watched] = []
    yield made
    for w in made:
        if w.p.poll() is None:
            # the fake runs in a process group of its own (the watchdog's stop_all): end it
            # too, or it keeps the output pipe open
            for pid in _children(w.p.pid):
                os.killpg(pid, signal.SIGKILL)
            w.p.kill()
            w.p.communicate(timeout=30)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_frozen_engine_is_stopped_after_the_failures_and_the_container_exits(
        tmp_path, watched):
    """/health answers 200 and the metrics answer (as with vLLM's EngineCore stopped), the
    1-token probe never does: FAILURES probes in a row, then the watchdog stops the whole
    process group (the stopped engine process too) and exits 70 for Docker to restart it."""
    w = Watched(tmp_path, "--engine")
    watched.append(w)
    w.armed()
    engine = int(next(r for r in w.requests() if r.startswith("engine ")).split()[1])
    assert _alive(engine)
    w.wait_for("POST /v1/completions")
    w.state.write_text("frozen")
    code, out = w.end()
    assert code == 70, out
    assert out.count("spark-vllm liveness: probe ") == FAILURES, out
    assert "idle, and a 1-token request failed within 0.5s" in out, out
    assert "vLLM is alive but does not serve; stopping it" in out, out
    assert not _alive(engine), "the stopped engine process outlived the watchdog"
    # every request carried the key from the key file
    posts = [r for r in w.requests() if r.startswith("POST ")]
    assert posts and all(r.split()[2:4] == ["Bearer", KEY] for r in posts), posts
    assert KEY not in " ".join(w.argv)


def test_a_busy_engine_whose_counters_move_is_left_alone_a_stuck_one_is_stopped(
        tmp_path, watched):
    """With a request running, no probe request is sent: the counters must move. They do
    (busy): nothing happens for many intervals; they stop (stuck): FAILURES probes, exit 70."""
    w = Watched(tmp_path)
    watched.append(w)
    w.armed()
    w.state.write_text("busy")
    n = len(w.requests())
    # a probe begun before `busy` (its /metrics read idle) may still send its 1-token request
    # after it: judged are the probes that began in `busy`, from their first /health on
    end = time.monotonic() + 60
    while not any(r.startswith("GET /health") and r.endswith(" busy")
                  for r in w.requests()[n:]):
        assert time.monotonic() < end, w.requests()[n:]
        time.sleep(0.05)
    n += next(i for i, r in enumerate(w.requests()[n:])
              if r.startswith("GET /health") and r.endswith(" busy"))
    # more probes than FAILURES, counted (not slept for: a loaded machine probes less often)
    while sum(r.startswith("GET /metrics") for r in w.requests()[n:]) < 2 * FAILURES:
        assert time.monotonic() < end, w.requests()[n:]
        assert w.p.poll() is None, w.p.communicate()[0]
        time.sleep(0.05)
    later = w.requests()[n:]
    assert not any(r.startswith("POST ") and r.endswith(" busy") for r in later), later
    w.state.write_text("stuck")
    code, out = w.end()
    assert code == 70, out
    assert "1 requests running or waiting and no counter moved" in out, out


def test_a_recovered_engine_resets_the_count(tmp_path, watched):
    """Failures must come in a row: a probe that passes in between starts the count again."""
    w = Watched(tmp_path)
    watched.append(w)
    w.armed()
    # FAILURES rounds of one failed probe then a passed one: as many failures as would stop
    # vLLM in a row (and room for one more to slip in before `ok` is written, on a slow machine)
    for _ in range(FAILURES):
        w.state.write_text("frozen")
        n = len(w.requests())
        end = time.monotonic() + 30
        while not any(r.startswith("POST ") and r.endswith(" frozen") for r in w.requests()[n:]):
            assert time.monotonic() < end and w.p.poll() is None
            time.sleep(0.05)
        w.state.write_text("ok")
        n = len(w.requests())  # a probe request answered in `ok`: the count starts again
        end = time.monotonic() + 30
        while not any(r.startswith("POST ") and r.endswith(" ok") for r in w.requests()[n:]):
            assert time.monotonic() < end and w.p.poll() is None
            time.sleep(0.05)
    assert w.p.poll() is None, w.p.communicate()[0]
    w.p.send_signal(signal.SIGTERM)  # docker stop: to vLLM, whose exit code the container gets
    code, out = w.end()
    assert code == 15, out
    assert "stopping it" not in out, out


def test_a_vllm_still_loading_is_not_probed(tmp_path, watched):
    """Until /health first answers (the 122B loads for minutes), nothing counts: the watchdog
    waits, however long."""
    w = Watched(tmp_path, "--no-health")
    watched.append(w)
    w.state.write_text("frozen")
    time.sleep(FAILURES * (INTERVAL + DEADLINE) * 2)
    assert w.p.poll() is None
    assert not any(r.startswith(("GET /metrics", "POST ")) for r in w.requests()), w.requests()


def test_vllm_exiting_ends_the_watchdog_with_its_code(tmp_path, watched):
    w = Watched(tmp_path)
    watched.append(w)
    w.armed()
    (child,) = _children(w.p.pid)
    os.kill(child, signal.SIGTERM)  # the fake exits 15, as vLLM on SIGTERM
    code, _ = w.end()
    assert code == 15


def test_an_embedding_service_is_probed_with_an_embedding(tmp_path, watched):
    w = Watched(tmp_path, task="embed")
    watched.append(w)
    w.wait_for("POST /v1/embeddings")
    assert not any(r.startswith("POST /v1/completions") for r in w.requests())
    w.state.write_text("frozen")
    code, out = w.end()
    assert code == 70, out


def test_vllm_exiting_after_it_answered_records_the_start_and_the_serving(tmp_path, watched):
    """The starts file (in the container's writable layer on a node) gets one `start` and, once
    /health answered, one `serving`: a later start follows a start that served, so it does not
    wait."""
    w = Watched(tmp_path)
    watched.append(w)
    w.armed()
    (child,) = _children(w.p.pid)
    os.kill(child, signal.SIGTERM)
    w.end()
    kinds = [line.split()[1] for line in (tmp_path / "liveness" / "starts").read_text().splitlines()]
    assert kinds == ["start", "serving"], kinds


def _start_and_exit(tmp_path: Path, starts: Path) -> str:
    """One start of a vLLM that exits at once, as Docker runs the container again after each."""
    key = tmp_path / "api-key"
    key.write_text(KEY)
    done = subprocess.run(
        [sys.executable, "-c", payload("vllm_liveness.py"), f"http://127.0.0.1:{_port()}", "tiny",
         "generate", str(INTERVAL), str(DEADLINE), str(FAILURES), str(key), str(starts),
         "0.01", "0.04", "2", "600", "-", PREFER, "0.5", sys.executable, "-c",
         "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done  # vLLM's own exit code, for Docker
    return done.stdout


def test_a_vllm_that_keeps_exiting_before_it_answers_backs_off_and_is_a_crash_loop(tmp_path):
    """Each start after starts that never answered waits twice as long as the one before, up to
    the maximum (0.01, 0.02, 0.04, 0.04 s here); more than 2 restarts in the window is said to
    be a crash loop at each start from the third restart on."""
    starts = tmp_path / "liveness" / "starts"
    said = [_start_and_exit(tmp_path, starts) for _ in range(5)]
    assert "waiting" not in said[0] and "restart" not in said[0], said[0]
    waits = [re.search(r"waiting (\S+)s before starting it", out) for out in said[1:]]
    assert [m.group(1) if m else None for m in waits] == ["0.01", "0.02", "0.04", "0.04"], said
    assert "did not answer in its last 3 start(s)" in said[3], said[3]
    looping = ["crash-looping: " in out for out in said]
    assert looping == [False, False, False, True, True], said
    assert "crash-looping: 4 restarts in the last 600s (more than 2)" in said[4], said[4]
    kinds = [line.split()[1] for line in starts.read_text().splitlines()]
    assert kinds == ["start"] * 5, kinds


def test_a_start_after_one_that_served_does_not_wait(tmp_path):
    starts = tmp_path / "liveness" / "starts"
    starts.parent.mkdir()
    starts.write_text("100.000 start\n101.000 serving\nnot a line\n")
    out = _start_and_exit(tmp_path, starts)
    assert "waiting" not in out, out
    lines = starts.read_text().splitlines()
    assert lines[:2] == ["100.000 start", "101.000 serving"] and lines[2].endswith(" start"), lines


def test_restarts_are_counted_as_status_counts_them_and_the_first_start_is_kept(tmp_path):
    """Every start but the container's first is a restart, counted in the window whatever the
    age of that first start (inspection/recon.recent_restarts, which `status` and preflight
    use); the record stays at 100 lines and keeps the first start."""
    from inspection.recon import recent_restarts

    starts = tmp_path / "liveness" / "starts"
    starts.parent.mkdir()
    now = time.time()
    old = [f"{now - 90000 - i:.3f} start" for i in range(120, 0, -1)]  # a day ago: out of it
    starts.write_text("\n".join([*old, f"{now - 30:.3f} start", f"{now - 20:.3f} start"]) + "\n")
    out = _start_and_exit(tmp_path, starts)
    # two restarts in the window, and this start is the third: more than 2
    assert "crash-looping: 3 restarts in the last 600s (more than 2)" in out, out
    lines = starts.read_text().splitlines()
    assert len(lines) == 100 and lines[0] == old[0], (len(lines), lines[:2])
    times = [float(ln.split()[0]) for ln in lines]
    assert recent_restarts(times, time.time(), 600) == 3


# --------------------------------------------------------------------------- OOM kills (issue 48)


def _kill_line(name: str, at: float | None = None, avail: int = 900 << 20,
               total: int = 8 << 30) -> str:
    """A line of the node guard's record, as its hook writes it (hostscripts/guard.hook_text)."""
    return f"{int(time.time() if at is None else at)} {avail} {total} 4242 {name}\n"


def _lines(starts: Path) -> list[list[str]]:
    return [line.split() for line in starts.read_text().splitlines()]


def test_a_vllm_the_nodes_earlyoom_killed_is_recorded_as_oom_killed(tmp_path, watched):
    """vLLM killed from outside (SIGKILL, as earlyoom escalates) and, a moment later, the node's
    guard records the kill of a vLLM process (earlyoom's hook runs once the victim is gone): the
    watchdog says so with the node's memory, records it, and exits with vLLM's code."""
    kills = tmp_path / "kills"
    kills.write_text(_kill_line("vllm", at=time.time() - 3600))  # an old one: not this start's
    w = Watched(tmp_path, kills=str(kills))
    watched.append(w)
    w.armed()
    (child,) = _children(w.p.pid)
    os.kill(child, signal.SIGKILL)
    time.sleep(0.5)
    with kills.open("a") as f:
        f.write(_kill_line("VLLM::EngineCor"))
    code, out = w.end()
    assert code == 137, out
    assert re.search(r"vLLM was OOM-killed at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(node available "
                     r"0\.9 GiB of 8\.0 GiB; earlyoom killed VLLM::EngineCor\)", out), out
    last = _lines(tmp_path / "liveness" / "starts")[-1]
    assert last[1:] == ["oom", "earlyoom", str(900 << 20), str(8 << 30), "VLLM::EngineCor"]


def test_an_exit_with_no_kill_of_vllm_recorded_is_no_oom_kill(tmp_path, watched):
    """A kill the node recorded of another process (not vLLM's), and no kill at all: vLLM's end
    is no OOM kill (the watchdog looks for 3 s after an exit with a code)."""
    kills = tmp_path / "kills"
    kills.write_text(_kill_line("python3"))
    w = Watched(tmp_path, kills=str(kills))
    watched.append(w)
    w.armed()
    (child,) = _children(w.p.pid)
    os.kill(child, signal.SIGTERM)  # the fake exits 15
    code, out = w.end()
    assert code == 15 and "OOM" not in out, out
    assert [p[1] for p in _lines(tmp_path / "liveness" / "starts")] == ["start", "serving"]


def test_docker_stop_is_never_taken_for_an_oom_kill(tmp_path, watched):
    """SIGTERM to the watchdog (docker stop) goes to vLLM; its end then is Docker's doing, even
    with a fresh kill of a vLLM process in the node's record (another stack's, say)."""
    kills = tmp_path / "kills"
    kills.write_text(_kill_line("vllm", at=time.time() + 1))
    w = Watched(tmp_path, kills=str(kills))
    watched.append(w)
    w.armed()
    w.p.send_signal(signal.SIGTERM)
    code, out = w.end()
    assert code == 15 and "OOM" not in out, out


def _start(tmp_path: Path, starts: Path, backoff_max: str = "0.04",
           oom_backoff: str = "0.2") -> str:
    key = tmp_path / "api-key"
    key.write_text(KEY)
    done = subprocess.run(
        [sys.executable, "-c", payload("vllm_liveness.py"), f"http://127.0.0.1:{_port()}", "tiny",
         "generate", str(INTERVAL), str(DEADLINE), str(FAILURES), str(key), str(starts),
         "0.01", backoff_max, "2", "600", "-", PREFER, oom_backoff, sys.executable, "-c",
         "raise SystemExit(3)"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done
    return done.stdout


def test_a_start_after_an_oom_kill_waits_longer_and_says_why(tmp_path):
    """After an OOM kill the next start waits oomBackoffSeconds, doubling with each OOM kill in
    the window, at most the larger of it and backoffMaxSeconds; a crash loop of OOM kills says
    it is memory."""
    starts = tmp_path / "liveness" / "starts"
    starts.parent.mkdir()
    now = time.time()
    oom = f"oom earlyoom {1 << 30} {8 << 30} vllm"
    starts.write_text(f"{now - 50:.3f} start\n{now - 40:.3f} serving\n{now - 30:.3f} {oom}\n")
    out = _start(tmp_path, starts)
    assert re.search(r"vLLM was OOM-killed at \S+ \(node available 1\.0 GiB of 8\.0 GiB; "
                     r"earlyoom killed vllm\): 1 OOM kill\(s\) in the last 600s; waiting 0\.2s "
                     r"before starting it again", out), out
    # two more OOM kills in the window: 0.2 x 2 x 2, at most max(backoff_max 1, 0.2)
    with starts.open("a") as f:
        f.write(f"{now - 20:.3f} serving\n{now - 15:.3f} {oom}\n{now - 12:.3f} start\n"
                f"{now - 11:.3f} serving\n{now - 10:.3f} {oom}\n")
    out = _start(tmp_path, starts, backoff_max="1")
    assert "3 OOM kill(s) in the last 600s; waiting 0.8s" in out, out
    assert "crash-looping: 3 restarts in the last 600s (more than 2), 3 of them OOM kills: the " \
           "node runs out of memory" in out, out
    # what status and recon read back: the starts, and the OOM kills with their figures
    from inspection.parsers import parse_liveness_ooms, parse_liveness_starts

    text = starts.read_text()
    assert [w for _t, w in parse_liveness_starts(text)].count("start") == 4
    ooms = parse_liveness_ooms(text)
    assert [(k.source, k.available_bytes, k.name) for k in ooms] == [
        ("earlyoom", 1 << 30, "vllm")] * 3
