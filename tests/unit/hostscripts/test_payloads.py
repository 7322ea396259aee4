"""Each payload in hostscripts/payloads/ runs for real here, as the node would run it.

(The model seeder and sync are exercised together in test_model_copy_scripts.py.) The text
run is `common.payload(name)`, exactly what the scripts carry: the file minus its comment
header, after the preludes its header names (test_payload_preludes.py).
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hostscripts import common, images, models, vllm

PAYLOADS = Path(common.__file__).parent / "payloads"


def test_payload_text_is_the_file_without_its_comment_header():
    for path in sorted(PAYLOADS.glob("*.py")):
        if path.name == "__init__.py":
            continue
        text = path.read_text()
        sent = common.own_text(path.name)
        assert common.payload(path.name).endswith(sent), path.name
        assert text.endswith(sent) and sent.startswith("\n"), path.name
        header = text[: len(text) - len(sent)]
        assert header and all(line.startswith("#") for line in header.splitlines()), path.name
        assert "#" not in sent.splitlines()[1][:1], "the program starts right after the header"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_image_seeder_streams_docker_save_and_fetch_reads_it(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text("#!/bin/sh\n[ \"$1\" = save ] && printf 'tar-of-%s' \"$2\"\n")
    (bin_ / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    port = _free_port()
    token = "ab" * 32  # the run's token: the seeder gets its sha256, the fetch it on stdin
    seeder = subprocess.Popen([sys.executable, "-c", images._IMAGE_SEEDER_PY, "127.0.0.1",
                               str(port), "repo@sha256:abc",
                               __import__("hashlib").sha256(token.encode()).hexdigest(), "1"],
                              env=env)
    try:
        out = subprocess.run([sys.executable, "-c", images._FETCH_PY,
                              f"http://127.0.0.1:{port}/image.tar"], input=f"{token}\n".encode(),
                             capture_output=True, timeout=60, check=True)
        assert out.stdout == b"tar-of-repo@sha256:abc"
    finally:
        seeder.kill()
        seeder.wait()


def test_snapshot_download_returns_the_cached_commit_offline(tmp_path):
    commit = "f" * 40
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "blobs" / ("a" * 40)).write_text("{}")
    (snap / "config.json").symlink_to(os.path.relpath(repo / "blobs" / ("a" * 40), snap))
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", models._SNAPSHOT_PY, "org/tiny", commit, "10",
                          json.dumps([["a" * 40, 2]])],
                         input="", capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(snap)
    # the real huggingface_hub: the cache holds the one file, so nothing to fetch
    assert out.stderr.strip() == ("model-fetch org/tiny@ffffffffffff: nothing to fetch: every "
                                  "file is in the cache")


class _FakeVllm(http.server.BaseHTTPRequestHandler):
    key = "sk-payload-test"
    seen: list[str] = []

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append(f"GET {self.path} {self.headers.get('Authorization')}")
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": "tiny"}]})

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        if self.path == "/v1/embeddings":  # a fake model of dimension 4
            self.seen.append(f"POST {self.path} {body['input']}")
            self._send(200, {"data": [{"embedding": [0.5, 0.5, 0.5, 0.5]}]})
        elif self.path == "/score":
            self.seen.append(f"POST {self.path} {body['text_1']} {body['text_2']}")
            self._send(200, {"data": [{"score": 0.9}, {"score": 0.1}]})
        else:
            self.seen.append(f"POST {self.path} {body['prompt']}")
            self._send(200, {"choices": [{"text": " hello"}]})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_vllm():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeVllm.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_health_gate_passes_with_health_models_and_a_smoke_completion(tmp_path, fake_vllm):
    out = subprocess.run([sys.executable, "-c", vllm._HEALTH_PY, fake_vllm, "tiny", "Say hi",
                          "30"], input=_FakeVllm.key + "\n", capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    # the gate's figures: seconds until /health answered, the smoke request's seconds
    figures = {k: answer.pop(k) for k in ("seconds", "smokeSeconds")}
    assert answer == {"health": "ok", "models": ["tiny"], "smoke": " hello"}
    assert all(isinstance(v, float) and 0 <= v < 30 for v in figures.values()), figures
    assert f"GET /health Bearer {_FakeVllm.key}" in _FakeVllm.seen
    assert "POST /v1/completions Say hi" in _FakeVllm.seen


def test_health_probe_gives_up_after_its_timeout(tmp_path):
    out = subprocess.run([sys.executable, "-c", vllm._HEALTH_PY, f"http://127.0.0.1:{_free_port()}",
                          "tiny", "x", "1"], input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "vllm serve not healthy after 1s" in out.stderr


def test_health_gate_refuses_a_server_that_serves_another_name(tmp_path, fake_vllm):
    out = subprocess.run([sys.executable, "-c", vllm._HEALTH_PY, fake_vllm, "other", "x", "30"],
                         input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "/v1/models lists ['tiny'], not other" in out.stderr


@pytest.mark.parametrize(("task", "dim", "smoke", "request_seen"), [
    ("embed", "4", {"dimension": 4}, "POST /v1/embeddings ['Say hi']"),
    ("embed", "0", {"dimension": 4}, "POST /v1/embeddings ['Say hi']"),
    ("score", "0", {"scores": [0.9, 0.1]}, "POST /score Say hi ['Say hi', 'an unrelated text']"),
])
def test_health_gate_asks_the_endpoint_of_a_services_task(fake_vllm, task, dim, smoke,
                                                          request_seen):
    out = subprocess.run([sys.executable, "-c", vllm._HEALTH_PY, fake_vllm, "tiny", "Say hi",
                          "30", task, dim], input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["smoke"] == smoke
    assert request_seen in _FakeVllm.seen
    assert not [s for s in _FakeVllm.seen if "/v1/completions" in s]


def test_health_gate_refuses_an_embedding_of_another_dimension(fake_vllm):
    out = subprocess.run([sys.executable, "-c", vllm._HEALTH_PY, fake_vllm, "tiny", "x", "30",
                          "embed", "128"], input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "/v1/embeddings gave a vector of 4 values, expected 128" in out.stderr
