"""resolve_model: revision -> commit, the file list and the config.json shape, against a fake
HfApi (no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.hf_api import RepoFile, RepoFolder

from hostscripts.models import ModelFile
from inspection import hub
from inspection.hub import ModelResolutionError
from inspection.hub import resolve_model as real_resolve
from tests.unit.inspection.model_configs import QWEN35_122B_A10B_FP8

SHA = "e" * 40


class FakeApi:
    calls: list = []
    config: bytes | Exception = json.dumps(QWEN35_122B_A10B_FP8).encode()
    tree_config = True  # the listing has config.json

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
            *([RepoFile(path="config.json", size=3, oid="3" * 40)] if FakeApi.tree_config else []),
        ]

    def hf_hub_download(self, repo_id, filename, *, revision=None, cache_dir=None, **_):
        """What huggingface_hub does: a file under cache_dir (the endpoint and token are the
        instance's, as HfApi's own method uses them)."""
        FakeApi.calls.append(("download", repo_id, filename, revision, cache_dir))
        if isinstance(FakeApi.config, Exception):
            raise FakeApi.config
        path = os.path.join(cache_dir, "snapshot", filename)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            out.write(FakeApi.config)
        return path


@pytest.fixture(autouse=True)
def fake_api(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARK_VLLM_HOME", str(tmp_path / "home"))
    FakeApi.calls = []
    FakeApi.config = json.dumps(QWEN35_122B_A10B_FP8).encode()
    FakeApi.tree_config = True
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


def test_the_commits_config_json_gives_the_shape(tmp_path):
    m = real_resolve("org/m", "main", "http://10.77.0.1:8090", "tok")
    # read at the resolved commit through the api made with the endpoint and token
    (download,) = [c for c in FakeApi.calls if c[0] == "download"]
    assert download[1:4] == ("org/m", "config.json", SHA)
    assert ("init", "http://10.77.0.1:8090", "tok") in FakeApi.calls
    # this tool's own cache, not an HF cache an operator uses
    assert download[4] == str(tmp_path / "home" / "hub-configs")
    assert m.shape is not None and m.shape.known
    assert (m.shape.layers, m.shape.full_layers, m.shape.linear_layers) == (48, 12, 36)
    assert (m.shape.kv_heads, m.shape.head_dim, m.shape.mtp_layers) == (2, 256, 1)
    # nothing is remembered: the manifest travels as an argument (preflight.run, build_stack)
    assert not hasattr(hub, "known_manifest") and not hasattr(hub, "_KNOWN")


def test_a_config_that_cannot_be_read_is_a_shape_problem_not_an_error():
    FakeApi.config = b"{not json"
    m = real_resolve("org/m", "main", None, None)
    assert m.shape is not None and not m.shape.known
    assert m.shape.problem.startswith("config.json is not JSON")
    FakeApi.config = json.dumps({"model_type": "mystery"}).encode()
    m = real_resolve("org/m", "main", None, None)
    assert m.shape.problem == "config.json: no num_hidden_layers / num_layers / n_layer / n_layers"


def test_a_commit_without_config_json_is_not_downloaded():
    FakeApi.tree_config = False
    m = real_resolve("org/m", "main", None, None)
    assert m.shape.problem == f"org/m@{SHA} has no config.json"
    assert not any(c[0] == "download" for c in FakeApi.calls)


def test_a_failed_config_download_is_a_clear_error():
    FakeApi.config = RuntimeError("401 Client Error: gated repo")
    with pytest.raises(ModelResolutionError) as exc:
        real_resolve("org/m", "main", "http://mirror:8090", None)
    assert str(exc.value) == (
        f"spark-vllm:model: cannot read config.json of org/m@{SHA} at http://mirror:8090 (the "
        "memory fit needs the model's shape): 401 Client Error: gated repo")


def test_a_commits_config_in_the_cache_is_read_without_the_hub(tmp_path, monkeypatch):
    """What read_config relies on for a no-op `up` to fetch nothing: huggingface_hub's own
    hf_hub_download answers a commit-hash revision from its cache without asking the hub (its
    metadata request, recorded here, is made only for a file the cache lacks)."""
    from huggingface_hub import file_download
    from huggingface_hub.hf_api import HfApi  # the real one (the fixture patches the package's)

    asked = []

    def no_hub(url, *args, **kwargs):
        asked.append(url)
        raise OSError("no hub in this test")

    monkeypatch.setattr(file_download, "get_hf_file_metadata", no_hub)
    snapshot = tmp_path / "models--org--m" / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "x"}')
    api = HfApi(endpoint="http://127.0.0.1:9", token=None)
    path = api.hf_hub_download(repo_id="org/m", filename="config.json", revision=SHA,
                               cache_dir=str(tmp_path))
    assert Path(path).read_text() == '{"model_type": "x"}' and asked == []
    with pytest.raises(OSError, match="no hub in this test"):  # not cached: it asks the hub
        api.hf_hub_download(repo_id="org/m", filename="other.json", revision=SHA,
                            cache_dir=str(tmp_path))
    assert len(asked) == 1 and asked[0].endswith("/other.json")


@pytest.mark.parametrize("entry,why", [
    (RepoFile(path="config.json", size=3, oid="../../../../victim"), "etag '../../../../victim'"),
    (RepoFile(path="w.safetensors", size=10, oid="1" * 40,
              lfs={"size": 10, "oid": "../x", "pointerSize": 1}), "etag '../x'"),
    (RepoFile(path="../../etc/cron.d/x", size=3, oid="3" * 40), "path '../../etc/cron.d/x'"),
    (RepoFile(path="/etc/passwd", size=3, oid="3" * 40), "path '/etc/passwd'"),
    (RepoFile(path="a.json", size=-5, oid="3" * 40), "size -5"),
])
def test_a_listing_the_stack_would_not_keep_inside_the_cache_is_refused(monkeypatch, entry, why):
    """Issue 31: the hub's etags and paths name files the nodes remove and replace as root.
    A mirror (or a plain-http path to it) that answers `../../../../victim` fails the run here,
    before anything is registered, naming the value."""
    monkeypatch.setattr(FakeApi, "list_repo_tree", lambda self, *a, **k: [entry])
    with pytest.raises(ModelResolutionError) as exc:
        real_resolve("org/m", "main", "http://mirror:8090", None)
    assert str(exc.value).startswith(
        f"spark-vllm:model: the listing of org/m@{SHA} at http://mirror:8090 is refused: ")
    assert why in str(exc.value)


def test_a_listing_with_a_path_twice_or_as_a_folder_is_refused(monkeypatch):
    for listing, why in (
        ([RepoFile(path="a", size=1, oid="1" * 40), RepoFile(path="a", size=1, oid="2" * 40)],
         "lists 'a' twice"),
        ([RepoFile(path="a", size=1, oid="1" * 40), RepoFile(path="a/b", size=1, oid="2" * 40)],
         "lists 'a' as a file and as the folder of 'a/b'"),
        ([RepoFile(path="a", size=1, oid="1" * 40), RepoFile(path="b", size=2, oid="1" * 40)],
         "with two sizes"),
    ):
        monkeypatch.setattr(FakeApi, "list_repo_tree", lambda self, *a, _l=listing, **k: _l)
        with pytest.raises(ModelResolutionError, match=why):
            real_resolve("org/m", "main", None, None)
