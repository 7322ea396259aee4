"""The image copy checks the head's archive before `docker load` (issue 46, item 4).

With `image.source: head` a node fetched `docker save <ref>` from the head's seeder and piped it
into `docker load`, comparing the image ID only afterwards: the node never authenticates the
seeder (anyone on the fabric who can answer for it), and `docker load` tags every name the
archive's manifest.json lists (moby daemon/internal/image/tarexport/load.go, `setLoadedTag`),
so a forged stream had retagged other images (another stack's, the gateway's) before the ID
check failed. Now the archive lands in a root-only scratch file and payloads/image_verify.py
reads it first: one image, its config the head's image ID, named only as the ref.

The archives here are built like Docker's: the legacy layout as the lab's dockerd (20.10.24,
Debian bookworm's docker.io) writes it for `docker save` (members recorded on spark-1: `<image
id>.json`, `<layer>/VERSION`, `<layer>/json`, `<layer>/layer.tar`, `manifest.json`), and the OCI
layout Docker 25+ writes (moby daemon/internal/image/tarexport/save.go: `blobs/sha256/...`,
`index.json` with `io.containerd.image.name` and `org.opencontainers.image.ref.name`,
`manifest.json`, `oci-layout`, `repositories`). A real Docker's save and load of a forged
archive: tests/engine/test_image_copy.py.
"""

from __future__ import annotations

import hashlib
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

REF = "vllm-node:latest"
TOKEN = "ab" * 32


def _config(marker: str = "honest") -> bytes:
    return json.dumps({"architecture": "arm64", "os": "linux", "config": {"Labels": {
        "marker": marker}}, "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "1" * 64]}},
        separators=(",", ":")).encode()


def _id(config: bytes) -> str:
    return "sha256:" + hashlib.sha256(config).hexdigest()


class Tar:
    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w:")

    def file(self, name: str, data: bytes) -> Tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))
        return self

    def json(self, name: str, value: object) -> Tar:
        return self.file(name, json.dumps(value).encode())

    def add(self, info: tarfile.TarInfo) -> Tar:
        self.tar.addfile(info)
        return self

    def bytes(self) -> bytes:
        self.tar.close()
        return self.buf.getvalue()


def legacy(config: bytes, tags: list[str] | None, manifest: list | None = None) -> Tar:
    """What Docker 20.10's `docker save` writes (the layer is a stand-in: docker itself checks
    layers against the config's diff_ids)."""
    cid, layer = _id(config)[7:], "e1" * 32
    t = Tar().file(f"{cid}.json", config).file(f"{layer}/VERSION", b"1.0")
    t.json(f"{layer}/json", {"id": layer}).file(f"{layer}/layer.tar", b"layer bytes")
    return t.json("manifest.json", manifest if manifest is not None else [
        {"Config": f"{cid}.json", "RepoTags": tags, "Layers": [f"{layer}/layer.tar"]}])


def oci(config: bytes, tags: list[str], names: dict[str, str] | None = None) -> Tar:
    """What Docker 25+'s `docker save` writes (OCI layout and Docker's manifest.json)."""
    cid = _id(config)[7:]
    layer = hashlib.sha256(b"layer bytes").hexdigest()
    man = json.dumps({"schemaVersion": 2, "config": {"digest": f"sha256:{cid}"},
                      "layers": [{"digest": f"sha256:{layer}"}]}).encode()
    mid = hashlib.sha256(man).hexdigest()
    t = Tar().file(f"blobs/sha256/{cid}", config).file(f"blobs/sha256/{layer}", b"layer bytes")
    t.file(f"blobs/sha256/{mid}", man)
    t.json("index.json", {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{mid}",
        "annotations": names if names is not None else {
            "io.containerd.image.name": "docker.io/library/vllm-node:latest",
            "org.opencontainers.image.ref.name": "latest"}}]})
    t.json("manifest.json", [{"Config": f"blobs/sha256/{cid}", "RepoTags": tags,
                              "Layers": [f"blobs/sha256/{layer}"]}])
    t.file("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    return t.json("repositories", {"vllm-node": {"latest": cid}})


def _verify(tmp_path: Path, archive: bytes, want: str, ref: str = REF
            ) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "image.tar"
    path.write_bytes(archive)
    return subprocess.run(["python3", "-c", images._VERIFY_PY, str(path), ref, want],
                          capture_output=True, text=True, timeout=60)


def _refused(out: subprocess.CompletedProcess[str], why: str) -> None:
    assert out.returncode == 1, out.stdout
    assert out.stderr.startswith("image archive refused: ") and why in out.stderr, out.stderr
    assert "nothing was loaded" in out.stderr and "Traceback" not in out.stderr


def test_the_heads_archive_is_verified_in_either_layout(tmp_path):
    config = _config()
    for archive in (legacy(config, [REF]).bytes(), oci(config, [REF]).bytes()):
        out = _verify(tmp_path, archive, _id(config))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"image archive verified: {_id(config)}"
    # pinned by digest: docker save tags nothing
    out = _verify(tmp_path, legacy(config, None).bytes(), _id(config),
                  ref="10.77.0.1:5000/spark-lab/vllm-spark@sha256:" + "4" * 64)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("layout", [legacy, oci])
def test_a_stream_that_would_retag_another_image_is_refused(tmp_path, layout):
    """The attack: the head's own image, with one more name in its RepoTags (the gateway's, or
    an image another stack runs): docker load would point that name at it."""
    config = _config()
    out = _verify(tmp_path, layout(config, [REF, "haproxy:lab"]).bytes(), _id(config))
    _refused(out, "manifest.json tags ['vllm-node:latest', 'haproxy:lab'], not only vllm-node")


def test_a_second_image_in_the_stream_is_refused(tmp_path):
    honest, forged = _config(), _config("forged")
    entry = {"Config": f"{_id(honest)[7:]}.json", "RepoTags": [REF], "Layers": ["l/layer.tar"]}
    other = {"Config": f"{_id(forged)[7:]}.json", "RepoTags": ["haproxy:lab"],
             "Layers": ["l/layer.tar"]}
    t = legacy(honest, [REF], manifest=[entry, other]).file(f"{_id(forged)[7:]}.json", forged)
    _refused(_verify(tmp_path, t.bytes(), _id(honest)), "does not describe exactly one image")


def test_another_image_under_the_ref_is_refused(tmp_path):
    """A stream of some other image tagged as the ref: refused before the load (the old check
    after it came too late: the ref was moved already)."""
    forged = _config("forged")
    out = _verify(tmp_path, legacy(forged, [REF]).bytes(), _id(_config()))
    _refused(out, f"it holds image {_id(forged)}, not {_id(_config())}")


def test_a_manifest_twice_is_refused(tmp_path):
    """docker load extracts the whole archive, so a later copy of a name wins: the verifier
    must never read one manifest while docker reads another."""
    config = _config()
    t = legacy(config, [REF]).json("manifest.json", [{"Config": f"{_id(config)[7:]}.json",
                                                      "RepoTags": ["haproxy:lab"],
                                                      "Layers": []}])
    _refused(_verify(tmp_path, t.bytes(), _id(config)), "'manifest.json' is in it twice")


@pytest.mark.parametrize("kind,why", [
    ("escape", "is outside the archive"), ("hardlink", "neither a file, a folder nor a link"),
    ("link-out", "leaves the archive"), ("sources", "LayerSources"),
    ("index-name", "index.json names 'docker.io/library/haproxy:lab'"),
    ("repositories", "repositories tags"), ("not-tar", "not a tar archive"),
])
def test_what_else_a_forged_archive_could_carry_is_refused(tmp_path, kind, why):
    config = _config()
    if kind == "index-name":
        archive = oci(config, [REF], names={"io.containerd.image.name":
                                            "docker.io/library/haproxy:lab"}).bytes()
    elif kind == "not-tar":
        archive = b"<html>not an archive</html>"
    else:
        t = legacy(config, [REF])
        if kind == "escape":
            t.file("../../etc/cron.d/x", b"* * * * * root id\n")
        elif kind == "hardlink":
            info = tarfile.TarInfo("hard")
            info.type, info.linkname = tarfile.LNKTYPE, "manifest.json"
            t.add(info)
        elif kind == "link-out":
            info = tarfile.TarInfo("out")
            info.type, info.linkname = tarfile.SYMTYPE, "../../etc/shadow"
            t.add(info)
        elif kind == "sources":
            t = legacy(config, [REF], manifest=[{"Config": f"{_id(config)[7:]}.json",
                                                 "RepoTags": [REF], "Layers": [],
                                                 "LayerSources": {"sha256:x": {"urls": ["http://e"]}}}])
        elif kind == "repositories":
            t.json("repositories", {"haproxy": {"lab": _id(config)[7:]}})
        archive = t.bytes()
    _refused(_verify(tmp_path, archive, _id(config)), why)


# ------------------------------------------------------------------ the copy, as a node runs it

class _Seeder(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # whoever answers on the seeder's address: no token needed
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_: object) -> None:
        pass


def _copy(tmp_path: Path, body: bytes, want: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """image_pull_from_head against a seeder that answers `body`, with a `docker` that records
    whether it was asked to load anything (and then reports the loaded image)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = type("H", (_Seeder,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "docker").write_text(
        "#!/bin/sh\n"
        f'case "$1" in load) echo "$@" >> {tmp_path}/loads; touch {tmp_path}/loaded ;;\n'
        f"  image) [ -f {tmp_path}/loaded ] && echo {want} ;; esac\nexit 0\n")
    (bin_ / "docker").chmod(0o755)
    names = StackNames("t")
    scratch = tmp_path / "stack" / "image-copy"
    script = images.image_pull_from_head(names, REF, "127.0.0.1", want).replace(
        names.image_copy_dir, str(scratch)).replace(
        f"127.0.0.1:{images.IMAGE_SEED_PORT}", f"127.0.0.1:{port}")
    try:
        out = subprocess.run(["sh", "-c", script], input=TOKEN + "\n", capture_output=True,
                             text=True, timeout=120,
                             env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"})
    finally:
        server.shutdown()
    return out, scratch


def test_the_copy_loads_nothing_from_a_forged_stream_and_keeps_no_file(tmp_path):
    config = _config()
    out, scratch = _copy(tmp_path, legacy(config, [REF, "haproxy:lab"]).bytes(), _id(config))
    assert out.returncode == 1 and "image archive refused" in out.stderr, out.stderr
    assert not (tmp_path / "loads").exists()  # docker load never ran
    assert scratch.is_dir() and list(scratch.iterdir()) == []  # the archive is gone
    assert oct(scratch.stat().st_mode & 0o777) == "0o700"


def test_the_copy_loads_the_verified_file(tmp_path):
    config = _config()
    out, scratch = _copy(tmp_path, legacy(config, [REF]).bytes(), _id(config))
    assert out.returncode == 0 and out.stdout.strip().endswith("image loaded"), out.stderr
    assert f"image archive verified: {_id(config)}" in out.stdout
    (load,) = (tmp_path / "loads").read_text().splitlines()
    assert load.startswith(f"load -i {scratch}/image.")
    assert list(scratch.iterdir()) == []
