"""A model cache wiped behind the stack's back is put back by the next `up`.

Commands have no Read, so the engine alone would never notice. Recon's hf_cache facts decide:
an intact node keeps whatever `triggers` token the state holds (`ignore_changes`), a node whose
snapshot is gone gets a fresh token on its fetch/sync and verify (and the seeder, for a worker),
so exactly those commands run again. The e2e proof is tests/e2e/test_lab_stack.py.
"""

from __future__ import annotations

import pulumi
import pytest

from components import rerun, stack
from config import validate_config
from inspection.facts import HfRepoFacts
from inspection.hub import ModelManifest, cache_intact
from inspection.preflight import Plan
from tests.unit.conftest import COMMIT, MODEL_FILES, secrets, settled

REPO = "Qwen/Qwen3.5-122B-A10B-FP8"
MANIFEST = ModelManifest(REPO, "main", COMMIT, MODEL_FILES)
TOTAL = MANIFEST.total_bytes
MODEL_STEPS = ("model-fetch", "model-seed", "model-seed-stop")


ALL_FILES = {f.path: f.size for f in MODEL_FILES}
WEIGHTS = next(f.path for f in MODEL_FILES if f.path.endswith(".safetensors"))
DEFAULT = object()


def with_cache(facts, *, snapshots=(COMMIT,), size=TOTAL, repo=REPO, files=DEFAULT):
    """files: the commit's snapshot listing (default: every manifest file); None: not listed."""
    listing = ({c: dict(ALL_FILES) for c in snapshots} if files is DEFAULT
               else None if files is None else {COMMIT: files})
    repo_facts = HfRepoFacts(repo_id=repo, snapshots=list(snapshots), size_bytes=size,
                             snapshot_files=listing)
    return facts.model_copy(update={"hf_cache": [repo_facts]})


@pytest.mark.parametrize(
    "kw,intact",
    [
        ({}, True),
        ({"size": TOTAL + 10}, True),  # other revisions' blobs too
        ({"files": {**ALL_FILES, "extra.md": 5}}, True),  # a file the stack does not fetch
        ({"snapshots": ()}, False),  # snapshot folder deleted
        ({"snapshots": ("f" * 40,)}, False),  # only another commit
        ({"size": TOTAL - 1}, False),  # a blob gone
        ({"repo": "other/model"}, False),  # this repo never fetched
        # the seed scenario's partly filled cache: config and tokenizer linked, the weights not,
        # while other revisions' blobs make up the bytes (seen on the lab: vLLM then found no
        # weights after its next restart, and the model steps had not run)
        ({"files": {k: v for k, v in ALL_FILES.items() if k != WEIGHTS},
          "size": TOTAL + 10}, False),
        ({"files": {**ALL_FILES, WEIGHTS: ALL_FILES[WEIGHTS] - 1}}, False),  # a short file
        ({"files": None}, False),  # not listed: what was not seen is fetched again
    ],
)
def test_cache_intact(gb10_facts, kw, intact):
    assert cache_intact(with_cache(gb10_facts("spark-1"), **kw), MANIFEST) is intact


def test_cache_intact_without_facts():
    assert cache_intact(None, MANIFEST) is False


def test_fresh_triggers_never_repeat():
    assert rerun.fresh_trigger() != rerun.fresh_trigger()


@pytest.fixture
def registered(mocks, monkeypatch, gb10_facts, config_raw, ignored_changes):
    """build(nodes, wiped=set of node names) -> (handles, ignore_changes per resource name)."""
    ignored = ignored_changes
    tokens = iter(f"repair-{i}" for i in range(100))
    monkeypatch.setattr(rerun, "fresh_trigger", lambda: next(tokens))

    def build(nodes: int, wiped: set[str]):
        cfg = validate_config(config_raw(nodes, model={"repo": REPO}))
        facts = {}
        for i, n in enumerate(cfg.nodes):
            f = gb10_facts(n.name, index=i + 1)
            facts[n.name] = f if n.name in wiped else with_cache(f)
        h = stack.build_stack(cfg, facts, Plan(), secrets(), manifest=MANIFEST)
        return h, ignored

    return build


def _triggers(mocks, name):
    return mocks.named(name).inputs.get("triggers")


@pulumi.runtime.test
def test_intact_caches_keep_the_state_token(registered, mocks):
    h, ignored = registered(3, wiped=set())

    def check(_):
        names = [*MODEL_STEPS, "model-sync-spark-2", "model-sync-spark-3",
                 *(f"model-verify-spark-{i}" for i in (1, 2, 3)),
                 *(f"model-drop-cache-spark-{i}" for i in (1, 2, 3))]
        for name in names:
            assert _triggers(mocks, name) == ["intact"], name
            assert ignored[name] == ["triggers"], f"{name}: an intact cache must not diff"

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_wiped_worker_reruns_its_sync_verify_and_the_seeder_only(registered, mocks):
    h, ignored = registered(3, wiped={"spark-2"})

    def check(_):
        token = _triggers(mocks, "model-sync-spark-2")
        assert token and token[0].startswith("repair-") and ignored["model-sync-spark-2"] == []
        assert _triggers(mocks, "model-verify-spark-2") == token
        # the page cache is dropped where the model moved, and only there
        assert _triggers(mocks, "model-drop-cache-spark-2") == token
        assert ignored["model-drop-cache-spark-2"] == []
        for n in ("spark-1", "spark-3"):
            assert _triggers(mocks, f"model-drop-cache-{n}") == ["intact"]
            assert ignored[f"model-drop-cache-{n}"] == ["triggers"]
        # the seeder must be up for the sync, and stopped again after it
        assert _triggers(mocks, "model-seed") == token == _triggers(mocks, "model-seed-stop")
        assert ignored["model-seed"] == [] and ignored["model-seed-stop"] == []
        # nothing else runs: the head's fetch and the intact worker keep their tokens
        for name in ("model-fetch", "model-verify-spark-1", "model-sync-spark-3",
                     "model-verify-spark-3"):
            assert _triggers(mocks, name) == ["intact"] and ignored[name] == ["triggers"], name
        assert h.model.repairs == {"spark-1": None, "spark-2": token[0], "spark-3": None}

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_wiped_head_refetches_without_touching_the_workers(registered, mocks):
    h, ignored = registered(2, wiped={"spark-1"})

    def check(_):
        token = _triggers(mocks, "model-fetch")
        assert token and token[0].startswith("repair-") and ignored["model-fetch"] == []
        assert _triggers(mocks, "model-verify-spark-1") == token
        for name in ("model-seed", "model-seed-stop", "model-sync-spark-2", "model-verify-spark-2"):
            assert _triggers(mocks, name) == ["intact"] and ignored[name] == ["triggers"], name

    return settled(h).apply(check)
