"""The model seeder and sync programs (hostscripts/payloads/) run for real on this machine:
the seeder serves a snapshot of an HF cache on 127.0.0.1, the sync fills another cache from it.
(On the nodes both run inside the serving image; here the local python stands in for it.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from hostscripts import common, images, models
from inspection.hub import ModelFile

COMMIT = "c" * 40
REPO = "org/model"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cache_with(root, files: dict[str, bytes]) -> None:
    repo = root / "hub" / common.repo_dir(REPO)
    for path, data in files.items():
        etag = f"{abs(hash(path)):064x}"[:64]
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / etag).write_bytes(data)
        link = repo / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / etag, link.parent))


def _manifest(root, port: int) -> str:
    repo = root / "hub" / common.repo_dir(REPO) / "snapshots" / COMMIT
    files = []
    for p in sorted(repo.rglob("*")):
        if p.is_symlink():
            files.append(ModelFile(path=str(p.relative_to(repo)), size=p.stat().st_size,
                                   etag=os.path.basename(os.readlink(p))))
    m = json.loads(models.model_manifest_json(REPO, COMMIT, "main", files, "127.0.0.1"))
    m["seedPort"] = port
    return json.dumps(m)


def test_seeder_serves_the_snapshot_and_sync_copies_only_what_is_missing(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    big = os.urandom(5 << 20) + b"tail"  # several sendfile/readinto rounds
    _cache_with(src, {"config.json": b'{"a": 1}', "model.safetensors": big, "sub/t.json": b"x"})
    port = _free_port()
    seeder = subprocess.Popen(
        [sys.executable, "-c", models._MODEL_SEEDER_PY, "127.0.0.1", str(port),
         str(src / "hub" / common.repo_dir(REPO))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    sync_py = models._SYNC_PY.replace('"/root/.cache/huggingface/hub/"', repr(str(dst / "hub") + "/"))
    try:
        manifest = _manifest(src, port)

        def sync() -> dict:
            p = subprocess.run([sys.executable, "-c", sync_py], input=manifest, text=True,
                               capture_output=True, timeout=60)
            assert p.returncode == 0, p.stderr
            return json.loads(p.stdout.strip().splitlines()[-1])

        t0 = time.monotonic()
        first = sync()
        assert first == {"files": 3, "bytesMoved": len(big) + 8 + 1}, first
        snap = dst / "hub" / common.repo_dir(REPO) / "snapshots" / COMMIT
        assert (snap / "model.safetensors").read_bytes() == big
        assert (snap / "sub" / "t.json").read_bytes() == b"x"
        assert (snap / "model.safetensors").is_symlink()  # HF cache layout: snapshot -> blob
        assert sync() == {"files": 3, "bytesMoved": 0}  # already there: nothing moves
        print(f"sync of {len(big)} B: {time.monotonic() - t0:.2f} s")
    finally:
        seeder.kill()
        seeder.wait()


def test_seeders_listen_without_a_reverse_dns_lookup(tmp_path):
    """http.server's stock bind calls socket.getfqdn on the bind address; where no resolver
    answers for the fabric subnet that costs ~10 s per seeder start (measured on the lab).
    Both seeders run here with getfqdn made fatal and must still answer."""
    guard = ("import socket, sys\n"
             "def _no(*a):\n    sys.exit('getfqdn called')\n"
             "socket.getfqdn = _no\n")
    (tmp_path / "f.txt").write_text("x")
    for program, arg3 in ((models._MODEL_SEEDER_PY, str(tmp_path)),
                          (images._IMAGE_SEEDER_PY, "some/ref:tag")):
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-c", guard + program, "127.0.0.1", str(port), arg3],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 10
            probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1).close()"
            while True:  # (this process may not connect: the unit tier forbids the network)
                assert proc.poll() is None, proc.stderr.read()
                if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
                    break
                assert time.monotonic() < deadline, "the seeder never listened"
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
