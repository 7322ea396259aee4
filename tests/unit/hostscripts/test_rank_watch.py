"""payloads/vllm_rank_watch.py, the main process of a headless vLLM container (mp), run for real
against a local HTTP server that plays the head's /health and a shell child that plays vLLM."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostscripts.common import payload

INTERVAL = 0.2


class _Head(http.server.BaseHTTPRequestHandler):
    up = True  # the head's vLLM answers /health
    answered = 0  # how many checks it answered with 200

    def do_GET(self) -> None:
        if _Head.up:
            _Head.answered += 1
        self.send_response(200 if _Head.up else 503)
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def head() -> Iterator[str]:
    _Head.up = True
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Head)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/health"
    srv.shutdown()


def watch(url: str, child: str, tmp_path: Path, misses: int = 3) -> subprocess.Popen[str]:
    """The watcher over `sh -c child`; the child writes its pid to tmp_path/pid first."""
    return subprocess.Popen(
        [sys.executable, "-c", payload("vllm_rank_watch.py"), url, str(INTERVAL), str(misses),
         "sh", "-c", f"echo $$ > {tmp_path}/pid; {child}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _armed(checks: int = 2) -> None:
    """Wait until the watch has had `checks` answers from the head (it is armed after the
    first): a machine under load starts the watcher late, a fixed sleep would race it."""
    start, deadline = _Head.answered, time.monotonic() + 60
    while _Head.answered - start < checks:
        assert time.monotonic() < deadline, "the watch never asked the head"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _child_pid(tmp_path: Path) -> int:
    for _ in range(100):
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip():
            return int((tmp_path / "pid").read_text())
        time.sleep(0.05)
    raise AssertionError("the child never started")


def test_a_head_that_stops_answering_ends_the_rank(head, tmp_path):
    w = watch(head, "exec sleep 60", tmp_path)
    pid = _child_pid(tmp_path)
    _armed()
    assert w.poll() is None, "the head answers: the rank runs on"
    _Head.up = False
    out, _ = w.communicate(timeout=20)
    assert w.returncode == 75, out
    assert "stopped answering (3 checks" in out and "answers at" in out, out
    assert not _alive(pid), "vLLM must be stopped with its container"


def test_a_head_not_up_yet_is_waited_for(head, tmp_path):
    """A rank starts before its head (the stack creates the headless ranks first): the watch is
    armed only once the head answered."""
    _Head.up = False
    w = watch(head, "exec sleep 60", tmp_path)
    time.sleep(INTERVAL * 10)
    assert w.poll() is None, "the head never answered yet: nothing to follow"
    _Head.up = True
    _armed()
    _Head.up = False
    w.wait(timeout=20)
    assert w.returncode == 75


def test_a_slow_blip_shorter_than_the_misses_is_ignored(head, tmp_path):
    w = watch(head, "exec sleep 60", tmp_path, misses=50)
    time.sleep(INTERVAL * 3)
    _Head.up = False
    time.sleep(INTERVAL * 3)
    _Head.up = True
    time.sleep(INTERVAL * 3)
    assert w.poll() is None
    w.terminate()
    w.wait(timeout=20)


def test_vllm_exiting_ends_the_rank_with_its_code(head, tmp_path):
    w = watch(head, "sleep 0.5; exit 3", tmp_path)
    assert w.wait(timeout=20) == 3


def test_docker_stop_reaches_vllm(head, tmp_path):
    """SIGTERM to the container's main process (docker stop) goes to vLLM, whose own exit
    ends the container (a signal's death reads as the shell's 128+n)."""
    w = watch(head, "exec sleep 60", tmp_path)
    pid = _child_pid(tmp_path)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=20) == 128 + signal.SIGTERM
    assert not _alive(pid)


def test_an_unreachable_head_counts_as_not_answering(tmp_path):
    """Refused connections (the head's host or container gone) count like a failed /health,
    once the watch is armed."""
    _Head.up = True
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Head)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    w = watch(f"http://127.0.0.1:{srv.server_address[1]}/health", "exec sleep 60", tmp_path)
    _armed()
    assert w.poll() is None
    srv.shutdown()
    srv.server_close()  # nothing listens there now
    assert w.wait(timeout=20) == 75
