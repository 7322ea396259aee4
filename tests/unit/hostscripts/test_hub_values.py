"""Values the hub (or a mirror, or whoever sits on a plain-http path to it) answers never reach a
root file operation on the nodes unchecked (issue 31, item 1).

A file's `etag` names its blob (`<cache>/hub/<repo>/blobs/<etag>`) and its `path` names the
snapshot link (`<cache>/hub/<repo>/snapshots/<commit>/<path>`); model_verify.py removes a blob
whose size or content is wrong, model_sync.py replaces links and writes blobs, both as root. The
values are checked where they enter (ModelFile, filled by inspection/hub.py) and again by each
payload before it joins them (defence in depth): the payloads run here as real processes, as the
nodes run them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostscripts import common, models
from hostscripts.models import ModelFile

COMMIT = "c" * 40
REPO = "org/m"

BAD_ETAGS = ["../../../../victim", "A" * 40, "a" * 39, "a" * 63, "a" * 65, "g" * 40,
             "a" * 40 + "\n", "", "a" * 40 + "/../x", "/etc/passwd"]
BAD_PATHS = ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/./b", "a/", "", ".", "..",
             "a\nb", "a\x00b", "a/\x7f", "x" * 5000]
BAD_SIZES = [-1, True, 2**41, 1.5, "10", None]


def _verify(cache: Path, files: list[dict], *, prune: bool = False) -> subprocess.CompletedProcess:
    manifest = json.dumps({"repoDir": common.repo_dir(REPO), "commit": COMMIT, "files": files})
    return subprocess.run([sys.executable, "-c", models._VERIFY_PY, str(cache),
                           str(cache.parent / "records"), *(["--prune"] if prune else [])],
                          input=manifest, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("prune", [False, True])
def test_an_etag_that_climbs_out_of_the_cache_deletes_nothing(tmp_path, prune):
    """The reproduction of the issue: an etag of ../../../../victim and a size that does not
    match made model_verify.py remove <cache>/hub/models--org--m/blobs/../../../../victim, a file
    outside the cache. Now the payload refuses the manifest before it touches a file."""
    cache = tmp_path / "cache"
    (cache / "hub" / common.repo_dir(REPO) / "blobs").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("not the cache's")
    out = _verify(cache, [{"path": "config.json", "size": 1, "etag": "../../../../victim"}],
                  prune=prune)
    assert victim.read_text() == "not the cache's", out.stdout + out.stderr
    assert out.returncode != 0
    assert "model manifest refused" in out.stderr and "etag" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("path", ["../../../outside", "/tmp/outside", "a/../../../outside"])
def test_verify_refuses_a_path_outside_the_snapshot(tmp_path, path):
    cache = tmp_path / "cache"
    (cache / "hub").mkdir(parents=True)
    out = _verify(cache, [{"path": path, "size": 1, "etag": "a" * 40}])
    assert out.returncode != 0 and "model manifest refused" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_sync_refuses_a_path_or_etag_outside_the_cache(tmp_path):
    """model_sync.py links <snapshot>/<path> to its blob, removing what was there: a path of
    ../../../x would replace a file outside the snapshot. It refuses the manifest at once."""
    root = tmp_path / "root"
    text = models._SYNC_PY.replace("/root/.cache/huggingface/hub", f"{root}/hub")
    outside = tmp_path / "outside"
    outside.write_text("keep")
    for files in ([{"path": "../../../../../outside", "size": 0, "etag": "a" * 40}],
                  [{"path": "ok.json", "size": 0, "etag": "../../../../outside"}]):
        m = json.loads(models.model_manifest_json(REPO, COMMIT, "main", [], [models.Seed("x")],
                                                  token="ab" * 32))
        m["files"] = files
        out = subprocess.run([sys.executable, "-c", text], input=json.dumps(m),
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and "model manifest refused" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        assert outside.read_text() == "keep"


@pytest.mark.parametrize("etag", BAD_ETAGS)
def test_a_model_file_refuses_an_etag_that_is_not_a_blob_id(etag):
    with pytest.raises(ValueError, match="etag"):
        ModelFile(path="config.json", size=1, etag=etag)


@pytest.mark.parametrize("path", BAD_PATHS)
def test_a_model_file_refuses_a_path_that_is_not_relative_and_normalised(path):
    with pytest.raises(ValueError, match="path"):
        ModelFile(path=path, size=1, etag="a" * 40)


@pytest.mark.parametrize("size", BAD_SIZES)
def test_a_model_file_refuses_a_size_that_is_not_a_byte_count(size):
    with pytest.raises(ValueError, match="size"):
        ModelFile(path="config.json", size=size, etag="a" * 40)


@pytest.mark.parametrize("path", [".gitattributes", "sub/dir/w.safetensors", "a b/é.json",
                                  "tokenizer/tokenizer.json", "x.." , "..x/y"])
def test_a_model_file_keeps_every_real_hub_path(path):
    assert ModelFile(path=path, size=0, etag="0" * 64).path == path


def test_the_manifests_files_are_checked_once_more_by_the_builders():
    """A ModelFile made around its checks (object.__setattr__, model_construct-like) is still
    refused before it lands in a script."""
    f = ModelFile(path="config.json", size=1, etag="a" * 40)
    object.__setattr__(f, "etag", "../../x")
    with pytest.raises(ValueError, match="etag"):
        models.verify_manifest_json(REPO, COMMIT, [f])
    with pytest.raises(ValueError, match="etag"):
        models.model_manifest_json(REPO, COMMIT, "main", [f], [models.Seed("10.0.0.1")])
    assert os.sep == "/"
