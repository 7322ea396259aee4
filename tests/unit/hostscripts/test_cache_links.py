"""Root never follows a link planted in the model cache (issue 46, item 1).

The cache is written by containers (the fetch and sync mount its hub/ read-write, and another
stack naming the same cache does too) and a /home/<user> cache by that user, while the model
commands write, remove and rename there as root: the verify (and its --prune before every fetch
and sync) removes wrong blobs and wrote its record in `<cache>/.spark-vllm/`, the fetch wrote the
revision's ref with a shell `>`. A link planted at one of those names made root truncate and
overwrite the link's target (shown on the lab: `refs/main` linked to a file on the head, whose
content became the commit hash on the next `up`). Now every such operation goes through
payloads/cache_fs.py's Tree, and the record lives in the stack's own folder.

Here the payloads run for real, as the nodes run them (the fetch script with a fake `docker`,
the verify and the ref with this machine's python3, the sync as the image's python would), on a
real cache with a link planted at each name root writes: each run fails naming the path, and
the file the link points to (outside the cache) is byte for byte what it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from hostscripts import models
from hostscripts.models import ModelFile

REPO = "org/m"
REPO_DIR = "models--org--m"
COMMIT = "c" * 40
VICTIM_TEXT = "a file outside the cache: root must never write it\n"


def _cache(root: Path) -> tuple[Path, list[ModelFile]]:
    """A real HF cache layout (blobs by the hub's etag, relative snapshot links), as
    huggingface_hub leaves it."""
    cache = root / "cache"
    repo = cache / "hub" / REPO_DIR
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    files = []
    for path, data in (("config.json", b"{}"), ("w.safetensors", b"weights!")):
        etag = (hashlib.sha256(data).hexdigest() if path.endswith(".safetensors")
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (repo / "blobs" / etag).write_bytes(data)
        link = repo / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / etag, link.parent))
        files.append(ModelFile(path, len(data), etag))
    return cache, files


def _victim(root: Path, name: str = "victim") -> Path:
    victim = root / "outside" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(VICTIM_TEXT)
    return victim


def _plant(at: Path, target: Path) -> None:
    """`at` made a link to `target`, whatever was there."""
    if at.is_symlink() or at.is_file():
        at.unlink()
    elif at.is_dir():
        import shutil
        shutil.rmtree(at)
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)


def _verify(cache: Path, records: Path, files: list[ModelFile], *, prune: bool = False
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", "-c", models._VERIFY_PY, str(cache), str(records),
                           *(["--prune"] if prune else [])],
                          input=models.verify_manifest_json(REPO, COMMIT, files),
                          capture_output=True, text=True, timeout=60)


def _refused(out: subprocess.CompletedProcess[str], path: Path) -> None:
    assert out.returncode != 0, out.stdout
    assert f"refused: {path}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


# ------------------------------------------------------------------ the verify (every node)

def test_the_record_is_the_stacks_not_the_caches_and_a_planted_record_folder_is_never_written(
        tmp_path):
    cache, files = _cache(tmp_path)
    victim_dir = tmp_path / "outside"
    victim = _victim(tmp_path)
    _plant(cache / ".spark-vllm", victim_dir)  # where the record was: root wrote through it
    records = tmp_path / "stack" / "models"
    out = _verify(cache, records, files)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in victim_dir.iterdir()) == ["victim"]
    assert victim.read_text() == VICTIM_TEXT
    record = records / f"verified-{REPO_DIR}"
    assert sorted(line.split()[0] for line in record.read_text().splitlines()) == \
        sorted(f.etag for f in files)
    assert oct(records.stat().st_mode & 0o777) == "0o700"
    assert oct(record.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("prune", [False, True])
def test_a_link_planted_at_a_blob_is_refused_never_read_or_removed(tmp_path, prune):
    """A blob name linked to a file outside (of another size, so the old code removed the
    link and hashed the target as root): refused, naming the blob."""
    cache, files = _cache(tmp_path)
    victim = _victim(tmp_path)
    blob = cache / "hub" / REPO_DIR / "blobs" / files[1].etag
    _plant(blob, victim)
    out = _verify(cache, tmp_path / "records", files, prune=prune)
    _refused(out, blob)
    assert "symbolic link" in out.stderr
    assert blob.is_symlink() and victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize("where", ["hub", f"hub/{REPO_DIR}", f"hub/{REPO_DIR}/blobs",
                                   f"hub/{REPO_DIR}/snapshots", f"hub/{REPO_DIR}/snapshots/{COMMIT}"])
@pytest.mark.parametrize("prune", [False, True])
def test_a_link_planted_at_a_folder_of_the_cache_is_refused(tmp_path, where, prune):
    """Each folder root walks through: a link to a folder outside holding a blob of the wrong
    size (which the old prune removed there) is refused, naming the folder."""
    cache, files = _cache(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    for f in files:  # what root would remove through the link: a wrong blob by that name
        (outside / f.etag).write_text(VICTIM_TEXT)
    _plant(cache / where, outside)
    out = _verify(cache, tmp_path / "records", files, prune=prune)
    if prune and "snapshots" in where:
        assert out.returncode == 0, out.stderr  # the prune reads no snapshot link
    else:
        _refused(out, cache / where)
    assert all((outside / f.etag).read_text() == VICTIM_TEXT for f in files)


def test_a_cache_folder_that_is_a_link_is_refused(tmp_path):
    cache, files = _cache(tmp_path)
    real = tmp_path / "real-cache"
    cache.rename(real)
    cache.symlink_to(real)
    out = _verify(cache, tmp_path / "records", files)
    _refused(out, cache)


def test_a_snapshot_link_is_read_never_followed(tmp_path):
    """The verify compares where a snapshot link points (readlink) with the blob it must name:
    one planted to a file outside is a bad snapshot, and the file is not opened."""
    cache, files = _cache(tmp_path)
    victim = _victim(tmp_path)
    link = cache / "hub" / REPO_DIR / "snapshots" / COMMIT / files[0].path
    _plant(link, victim)
    out = _verify(cache, tmp_path / "records", files)
    assert out.returncode == 1
    assert f"{files[0].path}: the snapshot does not link to its blob" in out.stderr
    assert victim.read_text() == VICTIM_TEXT


def test_a_component_owned_by_another_user_is_refused(tmp_path):
    assert os.geteuid() == 0, ("this test changes a folder's owner: run the fast tier as root "
                               "(make test does)")
    cache, files = _cache(tmp_path)
    blobs = cache / "hub" / REPO_DIR / "blobs"
    os.chown(blobs, 65534, 65534)
    out = _verify(cache, tmp_path / "records", files, prune=True)
    _refused(out, blobs)
    assert "owned by uid 65534" in out.stderr


def test_a_cache_in_a_home_is_refused_unless_its_user_runs_the_command():
    """The node's own passwd says whose home it is; root (or any other user) may not write
    there: that user could plant links for root to follow."""
    other = next((u for u in pwd.getpwall() if u.pw_uid != os.getuid()
                  and u.pw_name.isidentifier()), None)
    assert other is not None, "no other user in this machine's passwd"
    for cache in (f"/home/{other.pw_name}/.cache/huggingface", "/home/no-such-user-46/x"):
        out = subprocess.run(["python3", "-c", models._VERIFY_PY, cache, "/nonexistent/records"],
                             input=models.verify_manifest_json(REPO, COMMIT, []),
                             capture_output=True, text=True, timeout=60)
        _refused(out, Path(cache))
        assert "home of" in out.stderr


# ------------------------------------------------------------------ the fetch (the head)

def _fetch_script(cache: Path, records: Path, files: list[ModelFile]) -> str:
    return models.model_fetch("sha256:" + "a" * 64, str(cache), REPO, COMMIT, "main", None,
                              {"spark-vllm.stack": "t"}, files, str(records))


def _run(script: str, bin_: Path) -> subprocess.CompletedProcess[str]:
    """The script as the node runs it, with a `docker` that does nothing (the download is the
    image's huggingface_hub; here the cache already holds the commit)."""
    bin_.mkdir(exist_ok=True)
    (bin_ / "docker").write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    (bin_ / "docker").chmod(0o755)
    return subprocess.run(["sh", "-c", script], input="", capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"})


def test_the_fetch_writes_the_ref_through_no_link(tmp_path):
    """The reproduction: `refs/main` linked to a file elsewhere on the head. The shell's `>`
    wrote the commit into that file; the ref payload refuses, naming the ref."""
    cache, files = _cache(tmp_path)
    victim = _victim(tmp_path)
    ref = cache / "hub" / REPO_DIR / "refs" / "main"
    _plant(ref, victim)
    out = _run(_fetch_script(cache, tmp_path / "records", files), tmp_path / "bin")
    _refused(out, ref)
    assert victim.read_text() == VICTIM_TEXT and ref.is_symlink()
    # the folder of the refs linked elsewhere: refused too
    ref.unlink()
    _plant(cache / "hub" / REPO_DIR / "refs", victim.parent)
    out = _run(_fetch_script(cache, tmp_path / "records", files), tmp_path / "bin")
    _refused(out, cache / "hub" / REPO_DIR / "refs")
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim"]


def test_the_fetch_writes_the_ref_as_a_file_where_nothing_is_planted(tmp_path):
    cache, files = _cache(tmp_path)
    ref = cache / "hub" / REPO_DIR / "refs" / "main"
    ref.unlink()
    out = _run(_fetch_script(cache, tmp_path / "records", files), tmp_path / "bin")
    assert out.returncode == 0, out.stderr
    assert ref.read_text() == COMMIT and not ref.is_symlink()
    # a new cache: made, with its hub/ (what the container mounts), by the prune step
    fresh = tmp_path / "fresh" / "cache"
    out = _run(_fetch_script(fresh, tmp_path / "records", files), tmp_path / "bin")
    assert out.returncode == 0, out.stderr
    assert (fresh / "hub" / REPO_DIR / "refs" / "main").read_text() == COMMIT


def test_the_fetch_and_the_sync_mount_the_hub_only_never_the_token(tmp_path):
    """`hf auth login` leaves the node's token in HF_HOME (the cache folder): the model
    commands' containers mount its hub/ only."""
    cache = "/root/.cache/huggingface"
    for script in (_fetch_script(Path(cache), tmp_path, []),
                   models.model_sync("sha256:" + "a" * 64, cache, {}, "/r"),
                   models.model_seeder_start(models.StackNames("t"), "sha256:" + "a" * 64, cache,
                                             REPO, ["192.168.177.11"], {}, ["spark-2"], COMMIT)):
        assert f"-v {cache}/hub:/root/.cache/huggingface/hub" in script
        assert f"-v {cache}:" not in script


# ------------------------------------------------------------------ the sync (the other nodes)

def _sync(cache: Path, manifest: str) -> subprocess.CompletedProcess[str]:
    """model_sync.py as the image's python runs it in its container, the hub where the
    container mounts it replaced by this cache's."""
    text = models._SYNC_PY.replace('"/root/.cache/huggingface/hub/"', repr(f"{cache}/hub/"))
    return subprocess.run([sys.executable, "-c", text, "0.05", "node-x"], input=manifest,
                          capture_output=True, text=True, timeout=60)


def _manifest(files: list[ModelFile], revision: str = "main") -> str:
    return models.model_manifest_json(REPO, COMMIT, revision, files,
                                      [models.Seed("127.0.0.1")], token="ab" * 32)


def test_the_sync_refuses_a_link_planted_at_the_ref_or_an_incomplete_blob(tmp_path):
    cache, files = _cache(tmp_path)
    victim = _victim(tmp_path)
    ref = cache / "hub" / REPO_DIR / "refs" / "main"
    _plant(ref, victim)
    # every blob is there: nothing to fetch, the links are made, and the ref is refused
    out = _sync(cache, _manifest(files))
    _refused(out, ref)
    assert ref.is_symlink() and victim.read_text() == VICTIM_TEXT
    ref.unlink()
    # a blob missing, and a link planted where its download would start
    blob = cache / "hub" / REPO_DIR / "blobs" / files[1].etag
    blob.unlink()
    partial = blob.with_name(blob.name + ".incomplete")
    _plant(partial, victim)
    out = _sync(cache, _manifest(files))
    _refused(out, partial)
    assert victim.read_text() == VICTIM_TEXT


def test_the_sync_refuses_a_snapshot_folder_planted_as_a_link(tmp_path):
    cache, files = _cache(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    snap = cache / "hub" / REPO_DIR / "snapshots" / COMMIT
    _plant(snap, outside)
    out = _sync(cache, _manifest(files))
    _refused(out, snap)
    assert list(outside.iterdir()) == []


def test_a_ref_write_replaces_a_planted_file_atomically_and_leaves_no_temporary(tmp_path):
    cache, _ = _cache(tmp_path)
    out = subprocess.run(["python3", "-c", models._REF_PY, str(cache), REPO_DIR, "v1/rc", COMMIT],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    refs = cache / "hub" / REPO_DIR / "refs"
    assert (refs / "v1" / "rc").read_text() == COMMIT
    assert sorted(p.name for p in (refs / "v1").iterdir()) == ["rc"]
    for bad in ("../../x", "a/../b", "", "a//b"):
        out = subprocess.run(["python3", "-c", models._REF_PY, str(cache), REPO_DIR, bad, COMMIT],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "model ref: argv" in out.stderr, bad
    assert json.loads(models.verify_manifest_json(REPO, COMMIT, []))["repoDir"] == REPO_DIR
