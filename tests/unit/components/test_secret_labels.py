"""The API key's label and the committed passphrase (issue 31, item 11).

* A vLLM container (the main one, each service's) carries `spark-vllm.api-key`, so a new key
  replaces it. It was the unsalted sha256 of the key, readable by anyone who may run
  `docker inspect` on the node, who could then try guesses offline. Now it is an HMAC-SHA256 of
  the key under a random key of the stack's own (StackSecrets.label_key, kept as a secret):
  still the same for the same key (no container is replaced for nothing), useless to guess with.
* The dev stack's passphrase is committed (lab/dev.passphrase): a real secret set on a stack
  encrypted with it is readable by anyone with the repository. The program warns.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pulumi
import pytest

from components.stack_secrets import secret_label
from config import load
from tests.conftest import ROOT, config_raw, reveal
from tests.unit.conftest import API_KEY


def _labels(container) -> dict[str, str]:
    return {d["label"]: d["value"] for d in reveal(container.inputs["labels"])}


LABEL_KEY = "5a17" * 16  # what the stack's generator printed (mocks.stdouts)


@pulumi.runtime.test
def test_the_api_key_label_is_an_hmac_under_a_key_of_the_stacks_own(build, mocks):
    raw = config_raw(2)
    raw["services"] = [{"name": "embed", "repo": "org/e", "task": "embed", "port": 8001,
                        "gpuMemoryUtilization": 0.05}]

    mocks.stdouts["secrets-label-key"] = LABEL_KEY + "\n"

    def check(_):
        want = hmac.new(LABEL_KEY.encode(), API_KEY.encode(), hashlib.sha256).hexdigest()
        for name in ("vllm-serve", "svc-embed-serve-spark-1"):
            label = _labels(mocks.named(name))["spark-vllm.api-key"]
            assert label == want, name
            assert label != hashlib.sha256(API_KEY.encode()).hexdigest()
        # made once and kept: no trigger, its stdout secret and never logged
        made = mocks.named("secrets-label-key")
        assert "triggers" not in made.inputs and made.inputs.get("logging") == "none"

    return build(raw=raw).vllm.health.id.apply(check)


def test_secret_label_is_the_same_for_the_same_key_and_differs_by_stack_key():
    a = secret_label("k1", "sk-x")
    assert a == secret_label("k1", "sk-x") and a != secret_label("k2", "sk-x")
    assert a != secret_label("k1", "sk-y") and len(a) == 64


# ------------------------------------------------------------------ the committed passphrase

COMMITTED = (ROOT / "lab" / "dev.passphrase").read_text()


@pytest.mark.parametrize("how", ["file", "value"])
def test_real_secrets_on_a_stack_with_the_committed_passphrase_are_warned_about(how, monkeypatch):
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    if how == "file":
        monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE_FILE", str(ROOT / "lab" / "dev.passphrase"))
    else:
        monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", COMMITTED)
    (hf, key) = load.committed_passphrase_warnings({"hfToken", "vllmApiKey"}, "dev")
    assert hf.startswith("spark-vllm:hfToken is set on stack dev, whose passphrase is "
                         "committed in this repository (lab/dev.passphrase)")
    assert "vllmApiKey" in key
    assert load.committed_passphrase_warnings(set(), "dev") == []


def test_a_passphrase_of_the_stacks_own_is_not_warned_about(monkeypatch, tmp_path):
    own = tmp_path / "passphrase"
    own.write_text("a passphrase nobody committed")
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE_FILE", str(own))
    assert load.committed_passphrase_warnings({"hfToken", "sshPrivateKey"}, "dev") == []
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "another")
    assert load.committed_passphrase_warnings({"hfToken"}, "staging") == []


def test_a_passphrase_file_inside_the_repository_counts_as_committed(monkeypatch):
    inside = Path(load.__file__).resolve().parents[1] / "Pulumi.yaml"  # any tracked file
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE_FILE", str(inside))
    (warning,) = load.committed_passphrase_warnings({"sshPrivateKey"}, "staging")
    assert "spark-vllm:sshPrivateKey is set on stack staging" in warning


@pulumi.runtime.test
def test_load_secrets_warns_through_pulumi(set_config, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: warned.append(msg))
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE_FILE", str(ROOT / "lab" / "dev.passphrase"))
    raw = config_raw(2)
    set_config(raw, secrets={"sshPrivateKey": "KEY", "hfToken": "hf_" + "x" * 34})
    from config import validate_config

    load.load_secrets(validate_config(raw))
    assert [w.split(" is set")[0] for w in warned] == ["spark-vllm:hfToken",
                                                        "spark-vllm:sshPrivateKey"]
