"""Promotion over the whole serve model, without an engine: a staging stack whose last update
set every promoted `vllm.*` key (config/serve.py PROMOTED_KEYS) promotes each one into prod,
keeps prod's environment-owned keys, and the result passes the config schema.

tools/promote.py's collect_artifacts and apply run against stand-ins for the Automation API's
Stack (what they call: the last update's config, the current config, the outputs, the state,
set_all_config_json). tests/promote/ does the same through the engine; the lab round trip
(tests/e2e/test_promote_round_trip.py) serves the result."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from config import validate_config
from config.serve import ENVIRONMENT_KEYS, PROMOTED_KEYS, SERVE_KEYS
from tests.conftest import ROOT
from tests.serve_samples import SAMPLES, recipes_with_template, sample_vllm
from tools import promote

NS = "spark-vllm:"
DIGEST = "registry.example:5000/vllm-spark@sha256:" + "5f" * 32
COMMIT = "add2c58d0d80ee871e783594fc58821944c498e0"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPromoteTestHostKey"


@dataclass
class Value:  # auto.ConfigValue / auto.OutputValue as promote reads them
    value: Any
    secret: bool = False


@dataclass
class Update:  # auto.UpdateSummary: the config the update ran with
    config: dict[str, Value]
    kind: str = "update"
    result: str = "succeeded"


@dataclass
class Deployment:
    deployment: dict[str, Any]


@dataclass
class FakeStack:
    name: str
    config: dict[str, Value]
    outputs_: dict[str, Value] = field(default_factory=dict)

    def get_all_config(self) -> dict[str, Value]:
        return dict(self.config)

    def set_all_config_json(self, text: str) -> None:
        for key, v in json.loads(text).items():
            assert v["secret"] is False and json.loads(v["value"]) == v["objectValue"]
            self.config[key] = Value(v["value"])

    def outputs(self) -> dict[str, Value]:
        return self.outputs_

    def export_stack(self) -> Deployment:
        return Deployment({"resources": []})

    def raw(self) -> dict[str, Any]:
        """The config as validate_config takes it (what Pulumi.<stack>.yaml would hold)."""
        return {k[len(NS):]: promote.config_value(self.config, k[len(NS):]) for k in self.config
                if not self.config[k].secret}


def _stack_file(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / f"Pulumi.{name}.yaml").read_text())["config"]
    raw = {k[len(NS):]: copy.deepcopy(v) for k, v in data.items() if not isinstance(v, dict)
           or "secure" not in v}
    for n in raw["nodes"]:
        n["hostKey"] = HOST_KEY  # what the operator fills in with ssh-keyscan
    return raw


def _as_config(raw: dict[str, Any]) -> dict[str, Value]:
    return {NS + k: Value(v if isinstance(v, str) else json.dumps(v)) for k, v in raw.items()}


@pytest.fixture
def staging(tmp_path, monkeypatch) -> FakeStack:
    """Staging as verified: its last update ran with every promoted serve key set."""
    recipes_with_template(tmp_path, monkeypatch)  # chatTemplate names a shipped template
    raw = _stack_file("staging")
    raw["image"]["ref"] = DIGEST
    raw["model"] = {**raw["model"], "revision": COMMIT}  # trustRemoteCode wants a commit
    raw["vllm"] = {**raw["vllm"], **sample_vllm(PROMOTED_KEYS)}
    validate_config(raw)  # the source is a valid stack
    config = _as_config(raw)
    # its health gate verified that deployment (the stack output `deployment`, issue 49)
    image_id = "sha256:" + "e" * 64
    verified = {"deployment": "d" * 16, "image": {"ref": DIGEST, "id": image_id},
                "model": {"repo": raw["model"]["repo"], "commit": COMMIT}}
    return FakeStack("staging", config, {"modelCommit": Value(COMMIT), "services": Value({}),
                                         "imageIds": Value({"spark-a": image_id}),
                                         "deployment": Value(verified)})


def test_promoting_staging_writes_every_promoted_serve_key_into_prod(staging):
    art = promote.collect_artifacts(staging, Update(staging.get_all_config()))
    assert art.serve_flags == sample_vllm(PROMOTED_KEYS)
    assert len(art.serve_flags) == len(PROMOTED_KEYS) == 22

    prod_raw = _stack_file("prod")
    before = copy.deepcopy(prod_raw["vllm"])
    prod = FakeStack("prod", _as_config(prod_raw))
    promote.apply(prod, art)
    after = prod.raw()

    for key in PROMOTED_KEYS:
        assert after["vllm"][key] == SAMPLES[key][0], key
    for key in ENVIRONMENT_KEYS:  # prod's own, untouched (or still unset)
        assert after["vllm"].get(key) == before.get(key), key
    assert after["image"]["ref"] == DIGEST and after["model"]["revision"] == COMMIT

    # prod serves exactly that: every key's value as the config reads it
    prod_cfg = dict(after)
    prod_cfg["services"] = [{**s, "revision": COMMIT} for s in after["services"]]
    # the gateway's image is prod's own (never promoted): its placeholder pinned here
    assert after["gateway"] == prod_raw["gateway"]
    prod_cfg["gateway"] = {**after["gateway"],
                           "image": {"ref": "docker.io/library/haproxy@sha256:" + "e" * 64}}
    v = validate_config(prod_cfg).vllm
    for k in SERVE_KEYS:
        if not k.flag.environment:
            assert getattr(v, k.name) == SAMPLES[k.key][0], k.key


def test_a_serve_key_spelled_in_snake_case_is_promoted_and_compared_too(staging):
    update = Update(staging.get_all_config())
    vllm = json.loads(staging.config[NS + "vllm"].value)
    vllm["max_num_batched_tokens"] = vllm.pop("maxNumBatchedTokens")
    staging.config[NS + "vllm"] = Value(json.dumps(vllm))
    # the file says the same as the update ran with, in the other spelling: no refusal
    art = promote.collect_artifacts(staging, update)
    assert art.serve_flags["maxNumBatchedTokens"] == SAMPLES["maxNumBatchedTokens"][0]
    # a changed value in the snake_case spelling is seen as a change of the file
    vllm["max_num_batched_tokens"] = 1024
    staging.config[NS + "vllm"] = Value(json.dumps(vllm))
    with pytest.raises(promote.Refusal, match=r"vllm.maxNumBatchedTokens: 4096 -> 1024"):
        promote.collect_artifacts(staging, update)


def test_a_promoted_key_the_source_does_not_set_is_removed_from_the_target(staging):
    vllm = json.loads(staging.config[NS + "vllm"].value)
    del vllm["reasoningParser"], vllm["executor"]
    staging.config[NS + "vllm"] = Value(json.dumps(vllm))
    art = promote.collect_artifacts(staging, Update(staging.get_all_config()))
    target = FakeStack("prod", _as_config(_stack_file("prod")))
    target_vllm = json.loads(target.config[NS + "vllm"].value)
    target.config[NS + "vllm"] = Value(json.dumps({**target_vllm, "executor": "mp",
                                                   "reasoning_parser": "qwen3"}))
    promote.apply(target, art)
    after = target.raw()["vllm"]
    assert "executor" not in after and "reasoningParser" not in after
    assert "reasoning_parser" not in after  # the snake_case spelling is the same key


# Issue 31, item 10: promote only refused problems at the promoted keys themselves; a target
# whose `services` became invalid through a promoted value (here the main model's servedModelName
# taking a service's name) was written with a warning. Now every problem the promotion brings
# is refused; what the target already had stays a warning.
def _plan(target: str, art: promote.Artifacts) -> tuple[str, str]:
    """(before, after) text of Pulumi.<target>.yaml as plan_in_scratch makes them, through the
    stand-in stack: the promoted objects written back into the file's config."""
    text = (ROOT / f"Pulumi.{target}.yaml").read_text()
    data = yaml.safe_load(text)
    stack = FakeStack(target, _as_config({k[len(NS):]: v for k, v in data["config"].items()
                                          if not (isinstance(v, dict) and "secure" in v)}))
    promote.apply(stack, art)
    after = copy.deepcopy(data)
    for key, value in stack.config.items():
        after["config"][key] = json.loads(value.value) if value.value[:1] in "[{" else value.value
    return text, yaml.safe_dump(after, sort_keys=False)


def test_a_promotion_that_makes_a_service_invalid_is_refused():
    art = promote.Artifacts(image_ref=DIGEST, model_repo="Qwen/Qwen3.5-122B-A10B-FP8",
                            model_commit=COMMIT, serve_flags={"servedModelName": "embed"})
    before, after = _plan("staging", art)
    mine, others = promote.check_target_config(after, before)
    assert any(p.startswith("spark-vllm:services[0].servedModelName: got 'embed'")
               for p in mine), (mine, others)
    assert not others


def test_what_the_target_already_had_stays_a_warning():
    """A problem of the target before the promotion is not the promotion's (prod's services
    with a placeholder revision, say): a warning, as before."""
    art = promote.Artifacts(image_ref=DIGEST, model_repo="Qwen/Qwen3.5-122B-A10B-FP8",
                            model_commit=COMMIT, serve_flags={"servedModelName": "qwen3.5-122b"})
    before, after = _plan("staging", art)
    broken = before.replace("port: 8001", "port: 18472")  # a seeder's port: the target's own
    assert broken != before
    after = after.replace("port: 8001", "port: 18472")
    mine, others = promote.check_target_config(after, broken)
    assert not mine and any("services[0].port" in p for p in others), (mine, others)


# --------------------------------------------------------- model.drafter (issue 44, item 4)
DRAFTER = "z-lab/Qwen3.5-122B-DFlash"
DRAFTER_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def _verified(repo: str) -> dict[str, Value]:
    """The outputs of a source whose health gate verified its deployment (issue 49)."""
    image_id = "sha256:" + "e" * 64
    return {"imageIds": Value({"spark-a": image_id}), "deployment": Value({
        "deployment": "d" * 16, "image": {"ref": DIGEST, "id": image_id},
        "model": {"repo": repo, "commit": COMMIT}})}


def _with_drafter() -> FakeStack:
    raw = _stack_file("staging")
    raw["image"]["ref"] = DIGEST
    raw["model"] = {**raw["model"], "drafter": {"repo": DRAFTER}}
    raw["vllm"] = {**raw["vllm"], "speculativeConfig": {
        "method": "dflash", "model": DRAFTER, "num_speculative_tokens": 15}}
    validate_config(raw)
    return FakeStack("staging", _as_config(raw), {
        "modelCommit": Value(COMMIT), "services": Value({}), **_verified(raw["model"]["repo"]),
        "drafter": Value({"repo": DRAFTER, "commit": DRAFTER_COMMIT, "verified": {}})})


def test_the_drafter_is_promoted_with_the_model_pinned_to_the_commit_the_source_served():
    staging = _with_drafter()
    art = promote.collect_artifacts(staging, Update(staging.get_all_config()))
    assert art.drafter == (DRAFTER, DRAFTER_COMMIT) and promote.check_pinned(art, "prod") == []
    prod = FakeStack("prod", _as_config(_stack_file("prod")))
    promote.apply(prod, art)
    after = prod.raw()
    assert after["model"]["drafter"] == {"repo": DRAFTER, "revision": DRAFTER_COMMIT}
    assert after["vllm"]["speculativeConfig"]["model"] == DRAFTER
    # and a source without one takes the target's away (the serve keys no longer name it)
    plain_raw = {**_stack_file("staging"), "image": {"ref": DIGEST}}
    plain = FakeStack("staging", _as_config(plain_raw),
                      {"modelCommit": Value(COMMIT), "services": Value({}),
                       **_verified(plain_raw["model"]["repo"])})
    art = promote.collect_artifacts(plain, Update(plain.get_all_config()))
    promote.apply(prod, art)
    assert "drafter" not in prod.raw()["model"]


def test_a_source_that_declares_a_drafter_but_exports_none_is_refused():
    staging = _with_drafter()
    staging.outputs_.pop("drafter")
    with pytest.raises(promote.Refusal, match=r"declares model\.drafter but exports no "
                                              r"drafter commit"):
        promote.collect_artifacts(staging, Update(staging.get_all_config()))
