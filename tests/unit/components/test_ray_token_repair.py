"""The Ray token file is written again when recon finds it gone from a node.

The file lives on the node (hostscripts/paths.StackNames.ray_token_file) and commands have no
Read, so a file removed behind the stack (another stack's destroy on shared nodes, when the
file was at a fixed path, or a reinstalled node) was invisible: the Ray container's bind mount
then failed (`bind source path does not exist: /var/lib/spark-vllm/ray/auth-token`, seen running
`make demo` after the promote tier). Recon
reports present/absent; an absent file gets a fresh trigger on that node only, a present one
keeps whatever the state holds (no diff), and the command is deleted before it is replaced
(its delete removes the file the replacement writes).
"""

from __future__ import annotations

import pulumi
import pytest

from components import rerun, stack
from config import validate_config
from inspection.parsers import ParseError, parse_presence
from inspection.preflight import Plan
from tests.unit.conftest import fake_manifest, secrets, settled


@pytest.mark.parametrize("text,want", [("present\n", True), ("absent", False)])
def test_presence_is_present_or_absent(text, want):
    assert parse_presence(text) is want


@pytest.mark.parametrize("text", ["", "yes", "present\nabsent", "-rw------- auth-token"])
def test_anything_else_is_refused(text):
    with pytest.raises(ParseError):
        parse_presence(text)


@pytest.fixture
def registered(mocks, monkeypatch, gb10_facts, config_raw, ignored_changes,
               deleted_before_replace):
    tokens = iter(f"repair-{i}" for i in range(100))
    monkeypatch.setattr(rerun, "fresh_trigger", lambda: next(tokens))
    dbr = deleted_before_replace

    def build(present: dict[str, bool | None]):
        cfg = validate_config(config_raw(len(present)))
        facts = {n.name: gb10_facts(n.name, index=i + 1).model_copy(
            update={"ray_token_present": present[n.name]}) for i, n in enumerate(cfg.nodes)}
        h = stack.build_stack(cfg, facts, Plan(), secrets(), manifest=fake_manifest(cfg.model.repo, cfg.model.revision))
        return h, ignored_changes, dbr

    return build


@pulumi.runtime.test
def test_a_node_without_the_token_file_writes_it_again(registered, mocks):
    h, ignored, dbr = registered({"spark-1": True, "spark-2": False, "spark-3": None})

    def check(_):
        worker = mocks.named("ray-token-spark-2").inputs
        (token,) = worker["triggers"]  # a fresh one (the model's commands take others)
        assert token.startswith("repair-") and ignored["ray-token-spark-2"] == []
        for n in ("spark-1", "spark-3"):  # present, or not surveyed: no diff
            assert mocks.named(f"ray-token-{n}").inputs["triggers"] == ["intact"]
            assert ignored[f"ray-token-{n}"] == ["triggers"]
        assert all(dbr[f"ray-token-spark-{i}"] for i in (1, 2, 3))

    return settled(h).apply(check)


@pytest.fixture
def registered_key(mocks, monkeypatch, gb10_facts, config_raw, ignored_changes,
                   deleted_before_replace):
    """The same for the head's vLLM API key file (StackNames.vllm_key_file): seen
    missing in a fresh clone's `make demo` after `make test`, whose e2e stacks' destroys remove
    it from the shared lab nodes (`bind source path does not exist: .../vllm/api-key`)."""
    monkeypatch.setattr(rerun, "fresh_trigger", lambda: "repair-key")

    def build(present: bool | None):
        cfg = validate_config(config_raw(2))
        facts = {n.name: gb10_facts(n.name, index=i + 1).model_copy(
            update={"vllm_key_present": present}) for i, n in enumerate(cfg.nodes)}
        h = stack.build_stack(cfg, facts, Plan(), secrets(),
                              manifest=fake_manifest(cfg.model.repo, cfg.model.revision))
        return h, ignored_changes, deleted_before_replace

    return build


@pytest.mark.parametrize("present", [True, None])
@pulumi.runtime.test
def test_a_present_or_unsurveyed_api_key_file_does_not_diff(registered_key, mocks, present):
    h, ignored, dbr = registered_key(present)

    def check(_):
        assert mocks.named("vllm-api-key").inputs["triggers"] == ["intact"]
        assert ignored["vllm-api-key"] == ["triggers"] and dbr["vllm-api-key"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_head_without_the_api_key_file_writes_it_again(registered_key, mocks):
    h, ignored, _ = registered_key(False)

    def check(_):
        assert mocks.named("vllm-api-key").inputs["triggers"] == ["repair-key"]
        assert ignored["vllm-api-key"] == []

    return settled(h).apply(check)


@pytest.fixture
def registered_cache(mocks, monkeypatch, gb10_facts, config_raw, ignored_changes):
    """The same for each node's compile-cache folder (StackNames.compile_cache_dir, in the
    stack's folder since issue 31): seen missing by `make demo` after the lab's nodes were
    wiped (`bind source path does not exist: /var/lib/spark-vllm/stacks/dev/compile-cache`,
    the Ray head's container could not be created)."""
    tokens = iter(f"repair-{i}" for i in range(100))
    monkeypatch.setattr(rerun, "fresh_trigger", lambda: next(tokens))

    def build(present: dict[str, bool | None], **overrides):
        cfg = validate_config(config_raw(len(present), **overrides))
        facts = {n.name: gb10_facts(n.name, index=i + 1).model_copy(
            update={"compile_cache_present": present[n.name]}) for i, n in enumerate(cfg.nodes)}
        h = stack.build_stack(cfg, facts, Plan(), secrets(),
                              manifest=fake_manifest(cfg.model.repo, cfg.model.revision))
        return h, ignored_changes

    return build


@pulumi.runtime.test
def test_a_node_without_its_compile_cache_folder_makes_it_again(registered_cache, mocks):
    h, ignored = registered_cache({"spark-1": True, "spark-2": False, "spark-3": None})

    def check(_):
        (token,) = mocks.named("ray-compile-cache-spark-2").inputs["triggers"]
        assert token.startswith("repair-") and ignored["ray-compile-cache-spark-2"] == []
        for n in ("spark-1", "spark-3"):  # present, or not surveyed: no diff
            assert mocks.named(f"ray-compile-cache-{n}").inputs["triggers"] == ["intact"]
            assert ignored[f"ray-compile-cache-{n}"] == ["triggers"]

    return settled(h).apply(check)
