"""The image copy against a real Docker daemon (issue 46, item 4): a forged `docker save` stream
that would retag another image is refused before `docker load`, and the head's own archive
loads.

The daemon is the engine tier's private one (tests/engine/test_docker_plugin.py: started here as
root when absent, no bridge, no iptables), so the archives are what this machine's Docker
writes (`docker save`) and the load is Docker's own. The stream is forged the simplest way: the
head's real archive with one more name in its manifest.json's RepoTags, the name of an image the
node already has. Before this change the copy piped the stream into `docker load`, which
pointed that name at the copied image (moby's tarexport load tags every RepoTags entry) before
the copy compared the image ID; the victim here would then have the copied image's ID.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import socket
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from hostscripts import images
from hostscripts.paths import StackNames
from tests.engine.test_docker_plugin import DOCKER_HOST, _docker, daemon  # noqa: F401

pytestmark = pytest.mark.engine

COPIED, VICTIM = "svl-copy:head", "svl-copy:victim"
TOKEN = "cd" * 32


def _import(tag: str, marker: str) -> str:
    """An image of one file, made from a tar (no registry is reachable); its ID."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        info = tarfile.TarInfo("marker")
        info.size = len(marker)
        tar.addfile(info, io.BytesIO(marker.encode()))
    subprocess.run(["docker", "-H", DOCKER_HOST, "import", "-", tag], input=buf.getvalue(),
                   capture_output=True, timeout=120, check=True)
    return _docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def _forged(archive: bytes) -> bytes:
    """The archive with VICTIM added to its manifest.json's RepoTags, every other member as is."""
    src = tarfile.open(fileobj=io.BytesIO(archive), mode="r:")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:") as dst:
        for m in src:
            data = src.extractfile(m).read() if m.isreg() else None
            if m.name == "manifest.json":
                manifest = json.loads(data)
                manifest[0]["RepoTags"] = [*(manifest[0].get("RepoTags") or []), VICTIM]
                data = json.dumps(manifest).encode()
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _serve(body: bytes) -> tuple[http.server.ThreadingHTTPServer, int]:
    handler = type("H", (http.server.BaseHTTPRequestHandler,), {
        "do_GET": lambda self: (self.send_response(200), self.end_headers(),
                                self.wfile.write(body)),
        "log_message": lambda self, *a: None})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, port


def _copy(daemon_host: str, tmp_path: Path, body: bytes, want: str
          ) -> subprocess.CompletedProcess[str]:
    """The node's copy script (the real python3 payloads, the real docker CLI on the test's
    daemon) against a seeder that answers `body`."""
    server, port = _serve(body)
    names = StackNames("svl-copy")
    script = images.image_pull_from_head(names, COPIED, "127.0.0.1", want).replace(
        names.image_copy_dir, str(tmp_path / "image-copy")).replace(
        f"127.0.0.1:{images.IMAGE_SEED_PORT}", f"127.0.0.1:{port}")
    try:
        return subprocess.run(["sh", "-c", script], input=TOKEN + "\n", capture_output=True,
                              text=True, timeout=300,
                              env={**os.environ, "DOCKER_HOST": daemon_host})
    finally:
        server.shutdown()


def test_a_forged_stream_retags_nothing_and_the_heads_archive_loads(daemon, tmp_path):  # noqa: F811
    head_id = _import(COPIED, "the head's image")
    victim_id = _import(VICTIM, "another image the node runs")
    archive = subprocess.run(["docker", "-H", daemon, "save", COPIED], capture_output=True,
                             timeout=120, check=True).stdout
    _docker("rmi", COPIED)  # the node lacks the image: the copy must load it

    forged = _copy(daemon, tmp_path, _forged(archive), head_id)
    assert forged.returncode == 1, forged.stdout + forged.stderr
    assert "image archive refused: manifest.json tags" in forged.stderr, forged.stderr
    assert VICTIM in forged.stderr
    assert _docker("image", "inspect", "--format", "{{.Id}}", VICTIM).stdout.strip() == victim_id
    assert _docker("image", "inspect", COPIED, check=False).returncode != 0  # nothing loaded
    assert list((tmp_path / "image-copy").iterdir()) == []

    honest = _copy(daemon, tmp_path, archive, head_id)
    assert honest.returncode == 0, honest.stdout + honest.stderr
    assert honest.stdout.strip().endswith("image loaded")
    assert _docker("image", "inspect", "--format", "{{.Id}}", COPIED).stdout.strip() == head_id
    assert _docker("image", "inspect", "--format", "{{.Id}}", VICTIM).stdout.strip() == victim_id
    _docker("rmi", COPIED, VICTIM, check=False)
