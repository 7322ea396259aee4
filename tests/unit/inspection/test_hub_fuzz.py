"""Hub fuzzing (issue 31): whatever the hub or a mirror answers (etags, paths, sizes, commits),
the program makes a manifest whose every file stays inside the cache, or refuses with a
ModelResolutionError; the payloads that join those values on the nodes refuse on their own
what got past (defence in depth) and touch no path outside the cache.

Three properties, each one pytest item that asserts its own case count (so the counts hold
under xdist), derandomized, no deadline, no database:

* `test_hub_answers_make_a_safe_manifest_or_a_refusal` (1000 cases): a fake HfApi lists
  random entries; `resolve_model` must return a ModelManifest whose blobs join to
  `<cache>/hub/<repo>/blobs/<etag>` and whose links stay under the commit's snapshot folder, or
  raise ModelResolutionError. Any other exception is a traceback.
* `test_verify_payload_touches_nothing_outside_the_cache` (500): model_verify.py, run
  in-process on a random manifest (values straight from the strategies, past the boundary) in
  a sandbox with victim files around and inside the cache, with and without --prune: only
  SystemExit may leave it; every file it removes is a blob in the repo's blobs/ folder, every
  file it writes is its record in the stack's folder (never the cache); the victims are untouched.
* `test_sync_payload_touches_nothing_outside_the_repo` (300): model_sync.py likewise, with
  every blob already present (no network): every link, folder and ref it makes is under the
  repo's folder in the cache.

The totals are printed (`-s`) and written to `.hypothesis/spark-vllm-hub-fuzz-count.json`.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub.hf_api import RepoFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostscripts import common, models
from inspection import hub
from inspection.hub import ModelManifest, ModelResolutionError
from inspection.hub import resolve_model as real_resolve
from tests.conftest import ROOT

REPO = "org/m"
REPO_DIR = common.repo_dir(REPO)
COMMIT = "e" * 40
COUNTS: dict[str, int] = {}
OUTCOMES: dict[str, int] = {}


def fuzz(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# ---------------------------------------------------------------------------- strategies

HEX = "0123456789abcdef"
TRAVERSALS = [("../" * k) + "victim" for k in range(1, 8)] + [
    "/etc/passwd", "..", ".", "", "/", "//", "a/../../victim", "blobs/../../victim",
    "../" * 7 + "tmp", "%2e%2e/victim", "..\\victim", "\x00", "a\x00b", "victim\n",
]
ETAGS = st.one_of(
    st.text(HEX, min_size=40, max_size=40),
    st.text(HEX, min_size=64, max_size=64),
    st.text(HEX.upper(), min_size=40, max_size=40),
    st.text(HEX, min_size=0, max_size=70),
    st.sampled_from(TRAVERSALS),
    st.text(max_size=80),
    st.none(), st.integers(), st.booleans(),
)
COMPONENT = st.one_of(
    st.text("abcXYZ019._- é", min_size=1, max_size=12),
    st.sampled_from([".", "..", "", ".gitattributes", "...", "..a", "a..", "victim", " "]),
    st.text(min_size=0, max_size=8),
)
PATHS = st.one_of(
    st.lists(COMPONENT, min_size=1, max_size=6).map("/".join),
    st.lists(COMPONENT, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    st.sampled_from(TRAVERSALS),
    st.text(max_size=40),
    st.text(min_size=300, max_size=300, alphabet="a/"),
    st.none(), st.integers(),
)
SIZES = st.one_of(
    st.integers(min_value=0, max_value=64),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([-1, 0, 2**40, 2**40 + 1, 2**63, True, False]),
    st.floats(allow_nan=True), st.text(max_size=6), st.none(),
)
COMMITS = st.one_of(st.just(COMMIT), st.just(COMMIT), st.text(HEX, min_size=39, max_size=41),
                    st.sampled_from(["../../x", COMMIT + "\n", "E" * 40]), st.none())


@st.composite
def entries(draw: Any) -> dict[str, Any]:
    lfs = draw(st.booleans())
    return {"path": draw(PATHS), "size": draw(SIZES), "etag": draw(ETAGS), "lfs": lfs,
            "blob_id": draw(ETAGS) if lfs else None}


GOOD_COMPONENT = st.text("abcXYZ019._- é", min_size=1, max_size=12).filter(
    lambda c: c not in (".", ".."))


@st.composite
def good_entries(draw: Any) -> dict[str, Any]:
    """An entry as the real hub lists one (the property must see many manifests too)."""
    lfs = draw(st.booleans())
    return {"path": "/".join(draw(st.lists(GOOD_COMPONENT, min_size=1, max_size=4))),
            "size": draw(st.integers(min_value=0, max_value=64)),
            "etag": draw(st.text(HEX, min_size=64 if lfs else 40, max_size=64 if lfs else 40)),
            "lfs": lfs, "blob_id": "0" * 40 if lfs else None}


LISTINGS = st.one_of(
    st.lists(good_entries(), min_size=1, max_size=5),
    st.lists(st.one_of(good_entries(), entries()), min_size=0, max_size=5),
    st.lists(entries(), min_size=0, max_size=5),
)


def _repo_file(e: dict[str, Any]) -> RepoFile:
    """A RepoFile as huggingface_hub builds it from the hub's JSON, holding whatever came."""
    f = RepoFile.__new__(RepoFile)
    f.path, f.size = e["path"], e["size"]
    if e["lfs"]:
        f.lfs = type("Lfs", (), {"sha256": e["etag"], "size": e["size"]})()
        f.blob_id = e["blob_id"]
    else:
        f.lfs, f.blob_id = None, e["etag"]
    return f


# ---------------------------------------------------------------------------- 1: the boundary


class FuzzApi:
    listing: list[RepoFile] = []
    commit: Any = COMMIT

    def __init__(self, endpoint=None, token=None):
        pass

    def model_info(self, repo, revision=None):
        return type("Info", (), {"sha": FuzzApi.commit})()

    def list_repo_tree(self, repo, revision=None, recursive=False):
        return list(FuzzApi.listing)

    def hf_hub_download(self, *a, **k):  # the listings have no config.json of a sane size
        raise AssertionError("not reached: config.json is refused or absent")


def _safe(manifest: ModelManifest) -> None:
    cache = "/srv/hf"
    root = f"{cache}/hub/{REPO_DIR}"
    snap = f"{root}/snapshots/{manifest.commit}"
    assert manifest.files and len(manifest.commit) == 40
    for f in manifest.files:
        assert os.path.dirname(os.path.normpath(f"{root}/blobs/{f.etag}")) == f"{root}/blobs"
        assert os.path.normpath(f"{snap}/{f.path}") == f"{snap}/{f.path}", f.path
        assert os.path.normpath(f"{snap}/{f.path}").startswith(snap + "/")
        assert type(f.size) is int and f.size >= 0
    # and what the builders make of it
    models.verify_manifest_json(manifest.repo, manifest.commit, manifest.files)


def test_hub_answers_make_a_safe_manifest_or_a_refusal(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARK_VLLM_HOME", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "HfApi", FuzzApi)
    prop = "hub_answers"

    @fuzz(1000)
    @given(LISTINGS, COMMITS)
    def check(listing: list[dict[str, Any]], commit: Any) -> None:
        COUNTS[prop] = COUNTS.get(prop, 0) + 1
        FuzzApi.listing = [_repo_file(e) for e in listing if e["path"] != "config.json"]
        FuzzApi.commit = commit
        try:
            manifest = real_resolve(REPO, "main", "http://mirror:8090", None)
        except ModelResolutionError as exc:
            assert str(exc).startswith("spark-vllm:model: ")
            OUTCOMES["refused"] = OUTCOMES.get("refused", 0) + 1
            return
        OUTCOMES["manifest"] = OUTCOMES.get("manifest", 0) + 1
        _safe(manifest)

    check()
    assert COUNTS[prop] >= 1000, COUNTS
    assert OUTCOMES.get("manifest", 0) >= 50 and OUTCOMES.get("refused", 0) >= 50, OUTCOMES


# ---------------------------------------------------------------------------- 2, 3: payloads


class Outside(AssertionError):
    pass


@contextlib.contextmanager
def _watched(allowed: list[str]) -> Iterator[list[tuple[str, str]]]:
    """Every path the payload removes, replaces, links, makes or opens for writing, recorded;
    one outside `allowed` (normalised prefixes) raises Outside before the call is made."""
    seen: list[tuple[str, str]] = []
    saved = {n: getattr(os, n) for n in ("remove", "unlink", "replace", "rename", "symlink",
                                         "makedirs", "mkdir", "rmdir")}
    real_open, real_os_open = builtins.open, os.open

    def check(op: str, path: Any, dir_fd: Any = None) -> None:
        path = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(path):  # cache_fs.py's Tree: at a folder
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        p = os.path.normpath(os.path.abspath(path))
        seen.append((op, p))
        if not any(p == a or p.startswith(a + "/") for a in allowed):
            raise Outside(f"{op} {p} is outside {allowed}")

    def wrap(name: str):
        def f(*args: Any, **kwargs: Any) -> Any:
            targets = args[1:2] if name in ("replace", "rename", "symlink") else args[:1]
            fd = kwargs.get("dst_dir_fd" if name in ("replace", "rename") else "dir_fd")
            for t in targets:
                check(name, t, fd)
            return saved[name](*args, **kwargs)
        return f

    def opened(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
            check("open", file)
        return real_open(file, mode, *a, **k)

    def os_opened(path: Any, flags: int, *a: Any, **k: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
            check("os.open", path, k.get("dir_fd"))
        return real_os_open(path, flags, *a, **k)

    try:
        for n in saved:
            setattr(os, n, wrap(n))
        builtins.open, os.open = opened, os_opened
        yield seen
    finally:
        for n, f in saved.items():
            setattr(os, n, f)
        builtins.open, os.open = real_open, real_os_open


def _run_payload(text: str, argv: list[str], stdin: str, allowed: list[str]) -> str:
    """The payload's program, in this process, as `python3 -c text argv...` would run it.
    Returns how it ended: ok, exit (SystemExit), or raises what else came out of it."""
    saved = sys.argv, sys.stdin, sys.stdout, sys.stderr
    sys.argv, sys.stdin = ["-c", *argv], io.StringIO(stdin)
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        with _watched(allowed):
            exec(compile(text, "<payload>", "exec"), {"__name__": "__main__"})
        return "ok"
    except SystemExit as e:
        return "refused" if "model manifest refused" in str(e.code) else f"exit {e.code}"
    finally:
        sys.argv, sys.stdin, sys.stdout, sys.stderr = saved


def _sandbox(tmp: Path) -> tuple[Path, dict[Path, str]]:
    """A cache at tmp/a/b/cache with the repo's folders, and victims at every level around."""
    cache = tmp / "a" / "b" / "cache"
    root = cache / "hub" / REPO_DIR
    (root / "blobs").mkdir(parents=True)
    (root / "snapshots" / COMMIT).mkdir(parents=True)
    victims = {}
    for d in (tmp, tmp / "a", tmp / "a" / "b", cache, cache / "hub", root,
              root / "snapshots", root / "snapshots" / COMMIT):
        v = d / "victim"
        v.write_text(f"victim in {d.name}")
        victims[v] = v.read_text()
    return cache, victims


def _files(listing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"path": e["path"], "size": e["size"], "etag": e["etag"]} for e in listing]


def test_verify_payload_touches_nothing_outside_the_cache():
    prop = "verify_payload"

    @fuzz(500)
    @given(LISTINGS, COMMITS, st.booleans(),
           st.sampled_from([REPO_DIR, "../x", "models--a--b/../../..", "models--o--n"]))
    def check(listing: list[dict[str, Any]], commit: Any, prune: bool, repo_dir: str) -> None:
        COUNTS[prop] = COUNTS.get(prop, 0) + 1
        with tempfile.TemporaryDirectory() as t:
            cache, victims = _sandbox(Path(t))
            root = cache / "hub" / REPO_DIR
            files = _files(listing)
            # a blob of the wrong size for every entry whose etag can name one: removed
            for f in files:
                if isinstance(f["etag"], str) and f["etag"] and "/" not in f["etag"] \
                        and f["etag"] not in (".", "..") and "\x00" not in f["etag"]:
                    with contextlib.suppress(OSError):
                        (root / "blobs" / f["etag"]).write_bytes(b"wrong size, surely")
            manifest = json.dumps({"repoDir": repo_dir, "commit": commit, "files": files})
            blobs, records = str(root / "blobs"), str(Path(t) / "records")
            ended = _run_payload(models._VERIFY_PY, [str(cache), records,
                                                     *(["--prune"] * prune)],
                                 manifest, [blobs, records])
            OUTCOMES[f"verify {ended.split()[0]}"] = OUTCOMES.get(f"verify {ended.split()[0]}",
                                                                 0) + 1
            for v, text in victims.items():
                assert v.read_text() == text, v

    check()
    assert COUNTS[prop] >= 500, COUNTS


def test_sync_payload_touches_nothing_outside_the_repo():
    prop = "sync_payload"
    hub_literal = '"/root/.cache/huggingface/hub/"'
    assert hub_literal in models._SYNC_PY

    @fuzz(300)
    @given(LISTINGS, COMMITS,
           st.sampled_from(["main", "../../../victim", "a/../../b", "refs/x", "/abs", "v1.0"]))
    def check(listing: list[dict[str, Any]], commit: Any, revision: str) -> None:
        COUNTS[prop] = COUNTS.get(prop, 0) + 1
        with tempfile.TemporaryDirectory() as t:
            cache, victims = _sandbox(Path(t))
            root = cache / "hub" / REPO_DIR
            files = _files(listing)
            for f in files:  # every blob present with its size: nothing to fetch, no network
                if isinstance(f["etag"], str) and len(f["etag"]) in (40, 64) \
                        and set(f["etag"]) <= set(HEX) and type(f["size"]) is int \
                        and 0 <= f["size"] <= 2**40:
                    with open(root / "blobs" / f["etag"], "wb") as out:
                        out.truncate(f["size"])
            m = json.loads(models.model_manifest_json(REPO, COMMIT, "main", [],
                                                      [models.Seed("192.0.2.1")],
                                                      token="ab" * 32))
            m.update({"commit": commit, "revision": revision, "files": files})
            text = models._SYNC_PY.replace(hub_literal, repr(str(cache / "hub") + "/"))
            ended = _run_payload(text, [], json.dumps(m), [str(root)])
            OUTCOMES[f"sync {ended.split()[0]}"] = OUTCOMES.get(f"sync {ended.split()[0]}",
                                                               0) + 1
            for v, victim_text in victims.items():
                if v.parent == root / "snapshots" / COMMIT:
                    continue  # a file of the snapshot folder: a link of that name may replace it
                assert v.read_text() == victim_text, v

    check()
    assert COUNTS[prop] >= 300, COUNTS


def test_zz_report_case_count():
    """How many hub answers and manifests the properties above tried (when they ran here)."""
    total = sum(COUNTS.values())
    report = {"total": total, "per_property": COUNTS, "outcomes": OUTCOMES}
    print(f"\nhub fuzz: {total} cases ran: {json.dumps(report)}")
    out = ROOT / ".hypothesis"
    out.mkdir(exist_ok=True)
    (out / "spark-vllm-hub-fuzz-count.json").write_text(json.dumps(report, indent=2) + "\n")


@pytest.fixture(autouse=True)
def _keep_hub_module(monkeypatch):
    """The unit conftest replaces hub.resolve_model; this module tests the real one."""
    monkeypatch.setattr(hub, "resolve_model", real_resolve)
