"""Issue 7 through the real engine: the CrossGuard pack reviews the dev stack's preview on the lab.

The pack is a standard CrossGuard pack (policies/PulumiPolicy.yaml, `runtime: python` with its own
virtualenv) given as `--policy-pack policies`: the CLI runs it through the Python language host,
against the resources the project's program registers after a live recon of the lab.

  (a) the dev stack, with the dev pack config, previews with no mandatory violation;
  (b) the stack config of tests/policies/stack_breaking_rules_1_7.yaml, applied with
      `d.set(...)` over the lab's dev config, passes the program's own validation and preflight,
      and the preview fails on exactly the pack's memory-fit (rule 7, ray-not-exposed, has no
      accepted config that breaks it since preflight refuses a fabric interface on the
      management address: the data file says why, tests/e2e/test_fabric.py shows the refusal);
  (c) rule 8 (vllm-api-key) has no config the program accepts that breaks it: a key in
      plaintext in the stack file is refused by the program's own validation, before the pack
      sees any resource.

Previews only, of the session's shared stack (tests/e2e/conftest.py: converged): nothing
changes on the hosts (asserted), and each test puts the stack file back as it found it, so the
stack is exactly as converged afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pulumi.automation as auto
import pytest
import yaml

from lab.deployments import ROOT

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
PACK = ROOT / "policies"
DEV_PACK_CONFIG = ROOT / "policies" / "config.dev.json"
BREAKING = ROOT / "tests" / "policies" / "stack_breaking_rules_1_7.yaml"
# keys the lab owns (its host keys and image): never taken from the data file
LAB_OWNED = {"nodes[0].hostKey", "nodes[1].hostKey", "image.ref", "image.plainHttpRegistry",
             "ssh.knownHostsFile"}
MANDATORY = {"memory-fit", "same-image-everywhere", "parallelism-matches-gpus",
             "nccl-rdma-interfaces", "fabric-mtu", "no-privileged-containers", "ray-not-exposed",
             "vllm-api-key", "hf-token-secret", "prod-pinned", "mp-rendezvous-fabric-only",
             "vllm-behind-gateway", "fabric-config", "fabric-addresses-unique",
             "monitoring-not-exposed"}


@pytest.fixture
def deployment(stack):
    """The shared stack; its stack file is restored after the test (the config the breaking
    cases set is never applied, only previewed)."""
    path = stack.workdir / f"Pulumi.{stack.stack.name}.yaml"
    text = path.read_text()
    yield stack
    path.write_text(text)


@pytest.fixture(scope="module")
def pack_venv():
    """policies/venv (the pack's own pins), created like `make venv` when missing."""
    py = ROOT / "policies" / "venv" / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ROOT / "policies" / "venv")], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "-r",
                        str(ROOT / "policies" / "requirements.txt")], check=True)
    subprocess.run([str(py), "-c", "import pulumi_policy"], check=True)
    return py


def _preview_with_pack(d, pack_config=None):
    """Preview with the pack; returns (ok, all engine output, policy events)."""
    lines: list[str] = []
    kwargs = {"policy_packs": [str(PACK)],
              "on_output": lambda line: (lines.append(line), print(line))}
    if pack_config is not None:
        kwargs["policy_pack_configs"] = [str(pack_config)]
    t0 = time.monotonic()
    try:
        d.run("preview", **kwargs)
        ok, text = True, "\n".join(lines)
    except auto.CommandError as e:
        ok, text = False, "\n".join(lines) + "\n" + str(e)
    print(f"preview with the pack: {time.monotonic() - t0:.1f} s")
    policy = [e.policy_event for e in d.events if getattr(e, "policy_event", None) is not None]
    return ok, text, policy


def _violations(policy_events) -> dict[str, list[str]]:
    """policy name -> messages of its mandatory violations."""
    out: dict[str, list[str]] = {}
    for p in policy_events:
        if str(getattr(p.enforcement_level, "value", p.enforcement_level)) == "mandatory":
            out.setdefault(p.policy_name, []).append(p.message)
    return out


def _leaves(value, path=""):
    """(config path, leaf value) pairs in Pulumi's --path syntax: a.b[0].c."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def _lookup(value, path):
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        try:
            value = value[int(part[1:-1])] if part.startswith("[") else value[part]
        except (KeyError, IndexError, TypeError):
            return KeyError
    return value


def apply_stack_config(d, config: dict) -> list[str]:
    """Set every leaf of a `spark-vllm:` stack config that differs from the deployment's file."""
    current = yaml.safe_load((d.workdir / "Pulumi.dev.yaml").read_text())["config"]
    changed = []
    for key, value in config.items():
        short = key.split(":", 1)[1]
        for path, leaf in _leaves(value, short):
            if path in LAB_OWNED or _lookup({short: current.get(key)}, path) == leaf:
                continue
            d.set(path, leaf if isinstance(leaf, str) else json.dumps(leaf))
            changed.append(f"{path}={leaf}")
    return changed


def test_dev_stack_previews_with_the_pack(deployment, pack_venv):
    d = deployment
    before = d.snapshot()
    ok, text, policy = _preview_with_pack(d, DEV_PACK_CONFIG if DEV_PACK_CONFIG.exists() else None)
    assert ok, text[-3000:]
    assert _violations(policy) == {}, _violations(policy)
    assert d.snapshot() == before


_BREAKING: dict = {}


def test_config_breaking_rules_1_7_fails_naming_them(deployment, pack_venv, tmp_path):
    d = deployment
    data = yaml.safe_load(BREAKING.read_text())
    pack_config = tmp_path / "pack-config.json"
    pack_config.write_text(json.dumps(data["policyPackConfig"]))
    changed = apply_stack_config(d, data["stackConfig"]["config"])
    print("applied:", changed)
    before = d.snapshot()

    ok, text, policy = _preview_with_pack(d, pack_config)
    violations = _violations(policy)
    _BREAKING.update(data=data, text=text, violations=violations)
    assert not ok, "the preview passed with a config breaking rule 1"
    # the program's own validation and preflight accepted the config: the pack refused it
    assert "preflight failed" not in text and "reconnaissance failed" not in text, text[-3000:]
    assert not re.search(r"spark-vllm:[\w.\[\]]+: got ", text), text[-3000:]
    expected = set(data["expectViolations"])
    assert set(violations) == expected, violations
    for name in expected:
        fragment = data["expectViolations"][name]
        assert name in text, f"{name} not named in the output"
        assert any(fragment in m for m in violations[name]), (name, violations[name])
    assert d.snapshot() == before


def test_rule_8_a_plaintext_api_key_is_refused_by_the_program_before_the_pack(deployment,
                                                                              pack_venv):
    d = deployment
    before = d.snapshot()
    d.set("vllmApiKey", "sk-lab-plaintext-key-in-the-stack-file")
    try:
        ok, text, policy = _preview_with_pack(d, DEV_PACK_CONFIG)
    finally:
        d.stack.remove_config("spark-vllm:vllmApiKey")
    assert not ok
    assert ("spark-vllm:vllmApiKey: set in plaintext; expected a secret (pulumi config set "
            "--secret vllmApiKey ...)") in text, text[-3000:]
    assert _violations(policy) == {}  # no resource registered: nothing for the pack to judge
    assert d.snapshot() == before
