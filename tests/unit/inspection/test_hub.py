"""resolve_model: revision -> commit and the file list, against a fake HfApi (no network)."""

from __future__ import annotations

import huggingface_hub
import pytest
from huggingface_hub.hf_api import RepoFile, RepoFolder

from inspection.hub import ModelFile, ModelResolutionError
from inspection.hub import resolve_model as real_resolve

SHA = "e" * 40


class FakeApi:
    calls: list = []

    def __init__(self, endpoint=None, token=None):
        FakeApi.calls.append(("init", endpoint, token))

    def model_info(self, repo, revision=None):
        FakeApi.calls.append(("info", repo, revision))
        if repo == "org/missing":
            raise RuntimeError("404 repository not found")
        return type("Info", (), {"sha": SHA})()

    def list_repo_tree(self, repo, revision=None, recursive=False):
        FakeApi.calls.append(("tree", repo, revision, recursive))
        return [
            RepoFolder(path="sub", oid="f" * 40),
            RepoFile(path="sub/w.safetensors", size=10, oid="1" * 40,
                     lfs={"size": 10, "oid": "2" * 64, "pointerSize": 130}),
            RepoFile(path="config.json", size=3, oid="3" * 40),
        ]


@pytest.fixture(autouse=True)
def fake_api(monkeypatch):
    FakeApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)


def test_branch_resolves_to_commit_with_etags():
    m = real_resolve("org/m", "main", "http://10.77.0.1:8090", "tok")
    assert m.commit == SHA
    assert m.files == (
        ModelFile(path="config.json", size=3, etag="3" * 40),
        ModelFile(path="sub/w.safetensors", size=10, etag="2" * 64),  # LFS: sha256 names the blob
    )
    assert m.total_bytes == 13
    assert ("tree", "org/m", SHA, True) in FakeApi.calls


def test_commit_revision_still_lists_files():
    m = real_resolve("org/m", "a" * 40, None, None)
    assert m.commit == "a" * 40 and len(m.files) == 2
    assert not any(c[0] == "info" for c in FakeApi.calls)


def test_unknown_repo_is_a_clear_error():
    with pytest.raises(ModelResolutionError, match=r"cannot resolve org/missing@main at http://x"):
        real_resolve("org/missing", "main", "http://x", None)
