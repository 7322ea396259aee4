"""The seeders answer only the run's nodes, and only with what the run copies (issue 31, item 6).

Before: the model seeder listed folders and served any file of the repo's cache folder (every
revision's, gated weights included) to any host on the fabric; each GET of the image seeder
started a `docker save` that may run for an hour. Now each start makes a random token on the
head (its stdout, a secret the program hands to the syncs and pulls on stdin), the seeder gets
only its sha256, and answers 401 to a request without `Authorization: Bearer <token>`; the
model seeder serves only the files of the commit being copied (its snapshot's links, into the
repo's blobs), no listing, no other path; the image seeder serves only /image.tar and runs as
many `docker save` at once as there are nodes to copy to.

The payloads and the scripts run here as real processes (the unit tier forbids this process the
network: every client is a subprocess).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostscripts import common, images, models
from hostscripts.paths import StackNames

COMMIT, OTHER = "c" * 40, "d" * 40
REPO = "org/model"
TOKEN = "ab" * 32
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()

CLIENT = r'''
import http.client, json, sys
ip, port = sys.argv[1], int(sys.argv[2])
out = []
for method, path, token in json.loads(sys.argv[3]):
    c = http.client.HTTPConnection(ip, port, timeout=10)
    c.request(method, path, headers={"Authorization": "Bearer " + token} if token else {})
    r = c.getresponse()
    out.append([r.status, len(r.read())])
    c.close()
print(json.dumps(out))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(proc: subprocess.Popen, port: int) -> None:
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1).close()"
    for _ in range(200):
        assert proc.poll() is None, proc.returncode
        if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the seeder never listened")


def _ask(port: int, asks: list[tuple[str, str, str | None]]) -> list[list[int]]:
    p = subprocess.run([sys.executable, "-c", CLIENT, "127.0.0.1", str(port), json.dumps(asks)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _repo_with_two_commits(root: Path) -> Path:
    repo = root / "hub" / common.repo_dir(REPO)
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for commit, name, data in ((COMMIT, "w.safetensors", b"served"),
                               (OTHER, "gated.safetensors", b"not this run's")):
        etag = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / etag).write_bytes(data)
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / name).symlink_to(f"../../blobs/{etag}")
    (root / "outside.txt").write_text("secret of the host")
    return repo


@pytest.fixture
def model_seeder(tmp_path):
    repo = _repo_with_two_commits(tmp_path)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", models._MODEL_SEEDER_PY, "127.0.0.1",
                             str(port), str(repo), COMMIT, DIGEST],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(proc, port)
        yield repo, port
    finally:
        proc.kill()
        proc.wait()


def test_the_model_seeder_answers_only_with_the_runs_token(model_seeder):
    _repo, port = model_seeder
    path = f"/snapshots/{COMMIT}/w.safetensors"
    got = _ask(port, [("GET", path, None), ("GET", path, "cd" * 32), ("HEAD", path, None),
                      ("GET", path, TOKEN), ("HEAD", path, TOKEN)])
    assert got == [[401, 0], [401, 0], [401, 0], [200, 6], [200, 0]], got


def test_the_model_seeder_serves_only_the_files_of_the_commit_being_copied(model_seeder):
    _repo, port = model_seeder
    etag = hashlib.sha256(b"not this run's").hexdigest()
    asks = [
        ("GET", "/", TOKEN),  # no listing of anything
        ("GET", "/snapshots/", TOKEN),
        ("GET", f"/snapshots/{COMMIT}/", TOKEN),
        ("GET", f"/snapshots/{OTHER}/gated.safetensors", TOKEN),  # another revision's weights
        ("GET", f"/blobs/{etag}", TOKEN),  # a blob by its name
        ("GET", "/refs/main", TOKEN),
        ("GET", f"/snapshots/{COMMIT}/../{OTHER}/gated.safetensors", TOKEN),
        ("GET", f"/snapshots/{COMMIT}/%2e%2e/{OTHER}/gated.safetensors", TOKEN),
        ("GET", f"/snapshots/{COMMIT}/../../../../outside.txt", TOKEN),
        ("GET", f"/snapshots/{COMMIT}/w.safetensors", TOKEN),  # the one thing it serves
    ]
    got = _ask(port, asks)
    assert [s for s, _ in got] == [404] * 9 + [200], list(zip(asks, got, strict=True))


def test_the_model_seeder_refuses_to_start_without_a_digest(tmp_path):
    repo = _repo_with_two_commits(tmp_path)
    for bad in ([COMMIT, "x"], ["../x", DIGEST], [COMMIT]):
        p = subprocess.run([sys.executable, "-c", models._MODEL_SEEDER_PY, "127.0.0.1",
                            str(_free_port()), str(repo), *bad], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode != 0 and "model seeder:" in p.stderr, (bad, p.stderr)


def _fake_docker(tmp_path: Path) -> dict[str, str]:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/docker.log\n"
                                 "[ \"$1\" = save ] && { sleep 1; printf 'tar-of-%s' \"$2\"; }\n")
    (bin_ / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}


def test_the_image_seeder_starts_no_docker_save_without_the_token(tmp_path):
    env = _fake_docker(tmp_path)
    port = _free_port()
    seeder = subprocess.Popen([sys.executable, "-c", images._IMAGE_SEEDER_PY, "127.0.0.1",
                               str(port), "repo@sha256:abc", DIGEST, "1"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(seeder, port)
        got = _ask(port, [("GET", "/image.tar", None), ("GET", "/image.tar", "cd" * 32),
                          ("GET", "/other", TOKEN)])
        assert got == [[401, 0], [401, 0], [404, 0]], got
        assert not (tmp_path / "docker.log").exists(), "a docker save ran for nothing"
        # with the token: one save, and the fetch payload (token on stdin) reads it
        out = subprocess.run([sys.executable, "-c", images._FETCH_PY,
                              f"http://127.0.0.1:{port}/image.tar"], input=(TOKEN + "\n").encode(),
                             capture_output=True, timeout=60, check=True)
        assert out.stdout == b"tar-of-repo@sha256:abc"
        # (and, before it, the image's size for the nodes' progress lines: X-Image-Size)
        assert (tmp_path / "docker.log").read_text() == (
            "image inspect --format {{.Size}} repo@sha256:abc\nsave repo@sha256:abc\n")
        # as many saves at once as nodes to copy to (1 here): a second at once is turned away
        both = subprocess.run(
            [sys.executable, "-c", "import subprocess, sys, json\n"
             "ps = [subprocess.Popen([sys.executable, '-c', sys.argv[1], '127.0.0.1', sys.argv[2],"
             " sys.argv[3]], stdout=subprocess.PIPE, text=True) for _ in range(2)]\n"
             "print(json.dumps(sorted(json.loads(p.communicate()[0])[0][0] for p in ps)))",
             CLIENT, str(port), json.dumps([["GET", "/image.tar", TOKEN]])],
            capture_output=True, text=True, timeout=60)
        assert json.loads(both.stdout) == [200, 503], both.stderr
    finally:
        seeder.kill()
        seeder.wait()


def _run_start(tmp_path: Path, script: str, docker: str) -> subprocess.CompletedProcess[str]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "docker").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {tmp_path}/argv.log\n"
                                 + docker)
    (bin_ / "docker").chmod(0o755)
    (bin_ / "setsid").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {tmp_path}/argv.log\n")
    (bin_ / "setsid").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    script = script.replace("/run/spark-vllm-", f"{tmp_path}/run-").replace(
        "/var/log/spark-vllm-", f"{tmp_path}/log-")
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("which", ["model", "image"])
def test_each_start_makes_a_fresh_token_and_gives_the_seeder_only_its_hash(tmp_path, which):
    names = StackNames("dev")
    if which == "model":
        script = models.model_seeder_start(names, "sha256:" + "a" * 64, "/c", REPO,
                                           ["192.168.177.11"], {}, ["spark-2"], COMMIT)
    else:
        script = images.image_seeder_start(names, "r:1", "192.168.177.11", ["spark-2"])
    tokens = []
    for _ in range(2):
        done = _run_start(tmp_path, script, "exit 0\n")
        assert done.returncode == 0, done.stderr
        (token,) = done.stdout.split()  # stdout is the token, nothing else
        assert len(token) == 64 and int(token, 16) >= 0
        want = hashlib.sha256(token.encode()).hexdigest()
        for _ in range(100):  # the image seeder starts in the background (setsid ... &)
            argv = (tmp_path / "argv.log").read_text()
            if want in argv:
                break
            time.sleep(0.05)
        assert token not in argv and token not in script  # never on a command line
        assert want in argv
        tokens.append(token)
    assert tokens[0] != tokens[1]


def test_the_sync_and_the_pull_present_the_token():
    m = json.loads(models.model_manifest_json(REPO, COMMIT, "main", [], [models.Seed("x")],
                                              token=TOKEN))
    assert m["token"] == TOKEN
    assert "Authorization" in models._SYNC_PY and "Bearer" in models._SYNC_PY
    assert "Authorization" in images._FETCH_PY
    with pytest.raises(ValueError, match="token"):
        models.model_manifest_json(REPO, COMMIT, "main", [], [models.Seed("x")], token="x y")
