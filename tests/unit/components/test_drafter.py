"""model.drafter (issue 44, item 4): a speculative drafter from another repository is an artifact
like the model: resolved at the hub at its pinned commit, fetched once on the head, fanned out
and verified on every node with ModelCache's own commands (the same machinery, `drafter-*`),
after the model's copy (one seeder at a time); vLLM's speculative config is pinned to the
drafter's commit, the serve checks and vLLM wait for it on every node, the memory fit counts its
bytes, the policy pack sees its code with trustRemoteCode, recon looks at its cache."""

from __future__ import annotations

import json

import pulumi

from inspection import recon
from tests.conftest import config_raw, reveal
from tests.unit.conftest import COMMIT, MODEL_FILES, settled

DRAFTER = "z-lab/Qwen3.6-27B-DFlash"
SPEC = {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": 15}


def with_drafter(nodes: int = 2, **model) -> dict:
    raw = config_raw(nodes)
    raw["model"] = {**raw["model"], "drafter": {"repo": DRAFTER}, **model}
    raw["vllm"] = {**raw["vllm"], "speculativeConfig": SPEC}
    return raw


@pulumi.runtime.test
def test_the_drafter_is_fetched_fanned_out_and_verified_like_the_model(build, mocks,
                                                                        dependencies):
    h = build(raw=with_drafter(3))

    def check(values):
        (argv,) = values
        fetch = mocks.named("drafter-fetch").inputs
        assert f"{DRAFTER} {COMMIT}" in fetch["create"] and "snapshot_download" in fetch["create"]
        assert reveal(fetch["connection"])["host"] == "10.77.0.11"  # once, on the head
        # after the model's own copy: the stack runs one seeder at a time (the component waits
        # for every command of the model's; its commands are registered under it)
        assert {"model-seed-stop", "model-verify-spark-3"} <= dependencies["drafter"]
        for w in ("spark-2", "spark-3"):
            manifest = json.loads(reveal(mocks.named(f"drafter-sync-{w}").inputs["stdin"]))
            assert manifest["repoDir"] == "models--z-lab--Qwen3.6-27B-DFlash"
            assert manifest["commit"] == COMMIT
            assert len(manifest["files"]) == len(MODEL_FILES)
        for n in ("spark-1", "spark-2", "spark-3"):
            verify = mocks.named(f"drafter-verify-{n}").inputs["create"]
            assert "models--z-lab--Qwen3.6-27B-DFlash" in verify
            # the serve check (and so vLLM) waits for the drafter on every node
            assert {"drafter-verify-spark-1", "drafter-verify-spark-2",
                    "drafter-verify-spark-3"} <= dependencies[f"vllm-serve-check-{n}"]
        assert {"drafter-verify-spark-2"} <= dependencies["ray-worker-spark-2"]
        # vLLM reads the drafter at its own commit, offline
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec == {**SPEC, "revision": COMMIT}
        # the memory fit counts the drafter's weights with the model's
        fit = mocks.named("vllm").inputs["memoryFit"]
        assert abs(fit["weightsBytesPerRank"] * 3 - 2 * sum(f.size for f in MODEL_FILES)) < 3

    return settled(h, h.vllm.argv).apply(check)


@pulumi.runtime.test
def test_with_remote_code_the_policy_pack_sees_the_drafters_commit_too(build, mocks):
    raw = with_drafter(2, revision=COMMIT)
    raw["model"]["drafter"]["revision"] = "89abcdef0123456789abcdef0123456789abcdef"
    raw["vllm"]["trustRemoteCode"] = True
    h = build(raw=raw)

    def check(_):
        assert mocks.named("vllm").inputs["remoteCode"] == [
            {"repo": "spark-lab/tiny-moe", "commit": COMMIT},
            {"repo": DRAFTER, "commit": COMMIT}]  # the fake hub resolves every repo to COMMIT

    return settled(h).apply(check)


def test_recon_looks_at_the_drafters_cache_too():
    from config import validate_config
    cfg = validate_config(with_drafter(2))
    assert recon.stack_repos(cfg) == ["spark-lab/tiny-moe", DRAFTER]
