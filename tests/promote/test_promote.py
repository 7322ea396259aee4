"""tools/promote.py against stacks on a file backend (the fake program, see fakestack.py).

Each refusal has a test; a successful promotion writes exactly the verified artifacts, keeps
every environment-owned key and secret of the target, and a prod target passes the config
schema and the policy pack's `prod-pinned` rule only when pinned.
"""

from __future__ import annotations

import copy
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from config import ConfigError, validate_config
from tests.policies.policy_testkit import res, sargs, spark_node, vllm_server
from tests.policies.policy_testkit import run as run_policy
from tests.promote.conftest import DEV_SERVICES, ROOT
from tests.promote.fakestack import COMMIT, DIGEST, HOST_KEY, SOURCE_SECRETS, dev_config
from tests.serve_samples import SAMPLES, recipes_with_template, sample_vllm
from tools import promote

# isort: split
import rules  # policies/rules/ (policy_testkit puts policies/ on sys.path)

pytestmark = pytest.mark.engine

STAGING_KEY = "sk-staging-only-api-key"
PROD_KEY = "sk-prod-only-api-key"


def _config(path) -> dict:
    data = yaml.safe_load(path.read_text())["config"]
    return {k.split(":", 1)[1]: v for k, v in data.items()}


def _target(project, name: str, secrets: dict[str, str]):
    """A fresh Pulumi.<name>.yaml (the repository's file) with its own secrets."""
    project.file(name).write_text((ROOT / f"Pulumi.{name}.yaml").read_text())
    st = project.stack(name)
    project.set_secrets(st, secrets)
    return st


def _prod_resources(cfg: dict, env="prod") -> list:
    """What prod-pinned sees for a config: the component props the program registers."""
    return [
        res(rules.VLLM_SERVER, vllm_server(environment=env), "vllm"),
        res(rules.VLLM_IMAGE, {"ref": cfg["image"]["ref"], "source": "registry",
                               "nodes": [n["name"] for n in cfg["nodes"]]}, "image"),
        res(rules.MODEL_CACHE, {"repo": cfg["model"]["repo"],
                                "revision": cfg["model"]["revision"]}, "model"),
        *[res(rules.SPARK_NODE, spark_node(n["name"], n["host"], key=n["hostKey"]), n["name"])
          for n in cfg["nodes"]],
    ]


def _with_real_host_keys(cfg: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    for n in cfg["nodes"]:
        n["hostKey"] = HOST_KEY  # what an operator fills in with ssh-keyscan
    # and the gateway's image, pinned by the operator (environment-owned: never promoted)
    cfg["gateway"] = {**cfg["gateway"],
                      "image": {"ref": "docker.io/library/haproxy@sha256:" + "e" * 64}}
    return cfg


# ------------------------------------------------------------------------------ pure helpers
def test_pin_image_from_state_repo_digest():
    digest = "10.77.0.1:5000/spark-vllm-lab@sha256:" + "ab" * 32
    state = {"resources": [
        {"type": promote.REMOTE_IMAGE, "urn": "urn:...::image-spark-1",
         "outputs": {"repoDigest": digest}},
        {"type": promote.REMOTE_IMAGE, "urn": "urn:...::image-spark-2",
         "outputs": {"repoDigest": digest}},
    ]}
    ref, note = promote.pin_image("10.77.0.1:5000/spark-vllm-lab:latest", state)
    assert ref == digest and "pinned to" in note
    assert promote.pin_image(digest, {}) == (digest, None)
    ref, note = promote.pin_image("10.77.0.1:5000/spark-vllm-lab:latest", {"resources": []})
    assert ref.endswith(":latest") and "records no repo digest" in note
    state["resources"][1]["outputs"]["repoDigest"] = digest.replace("ab", "cd")
    ref, note = promote.pin_image("10.77.0.1:5000/spark-vllm-lab:latest", state)
    assert ref.endswith(":latest") and "different repo digests" in note
    assert promote._repository("10.77.0.1:5000/a/b:tag") == "10.77.0.1:5000/a/b"
    assert promote._repository("10.77.0.1:5000/a/b") == "10.77.0.1:5000/a/b"


def test_merge_and_raw_config_never_carry_secrets():
    merged = promote.merge_object({"host": "0.0.0.0", "speculativeConfig": {"method": "mtp"},
                                   "maxModelLen": 65536},
                                  {"maxModelLen": 2048}, promote.PROMOTED_VLLM_KEYS)
    assert merged == {"host": "0.0.0.0", "maxModelLen": 2048}
    text = ("config:\n  spark-vllm:environment: prod\n"
            "  spark-vllm:vllmApiKey:\n    secure: v1:abc\n  spark-vllm:hfToken: hf_plain\n")
    assert promote.raw_config(text) == {"environment": "prod"}


# ------------------------------------------------------------------------------ promotion
def test_dev_to_staging_writes_the_verified_artifacts_and_keeps_secrets(project, verified_dev,
                                                                         run_promote):
    staging = _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    before_text = project.file("staging").read_text()
    before = _config(project.file("staging"))

    r = run_promote("dev", "staging")
    assert r.code == 0, r.err
    after_text = project.file("staging").read_text()
    after = _config(project.file("staging"))
    dev = dev_config(ROOT)

    # the artifacts
    assert after["image"] == {**before["image"], "ref": DIGEST}
    assert after["model"] == {**before["model"], "repo": dev["model"]["repo"], "revision": COMMIT}
    for k in promote.PROMOTED_VLLM_KEYS:
        assert after["vllm"].get(k) == dev["vllm"].get(k), k
    assert "speculativeConfig" not in after["vllm"]  # dev verified without it
    assert isinstance(after["vllm"]["gpuMemoryUtilization"], float)
    # environment-owned keys are untouched
    for k in promote.ENV_VLLM_KEYS:  # set or not (masterPort), the target's own
        assert after["vllm"].get(k) == before["vllm"].get(k), k
    for k in ("environment", "nodes", "ssh", "nccl", "ray", "preflight", "health"):
        assert after[k] == before[k], k
    assert after["model"]["cacheDir"] == before["model"]["cacheDir"]
    assert "endpoint" not in after["model"]  # the lab mirror stays in dev

    # secrets: the target's own stay byte for byte, nothing of the source's arrives
    assert after["vllmApiKey"] == before["vllmApiKey"] and "secure" in after["vllmApiKey"]
    assert "hfToken" not in after and "sshPrivateKey" not in after
    for value in SOURCE_SECRETS.values():
        assert value not in after_text and value not in r.out and value not in r.err
    assert staging.get_config("spark-vllm:vllmApiKey").value == STAGING_KEY
    src = yaml.safe_load(project.file("dev").read_text())["config"]
    for k in SOURCE_SECRETS:
        assert src[f"spark-vllm:{k}"]["secure"] not in after_text

    # the diff shown is the file's change; comments survive
    assert "--- a/Pulumi.staging.yaml" in r.out and f"+    ref: {DIGEST}" in r.out
    assert f'+    revision: {COMMIT}' in r.out or f"+    revision: '{COMMIT}'" in r.out
    assert "# PLACEHOLDER registry and digest" in after_text
    assert before_text != after_text

    again = run_promote("dev", "staging")
    assert again.code == 0 and "nothing to do" in again.out
    assert project.file("staging").read_text() == after_text


def test_dry_run_and_unconfirmed_write_nothing(project, verified_dev, run_promote):
    _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    before = project.file("staging").read_text()
    r = run_promote("dev", "staging", dry_run=True)
    assert r.code == 0 and "dry run: nothing written" in r.out
    assert f"+    ref: {DIGEST}" in r.out
    assert project.file("staging").read_text() == before

    asked = []
    r = run_promote("dev", "staging", yes=False, confirm=lambda q: asked.append(q) or False)
    assert r.code == promote.EXIT_NOT_CONFIRMED and "not confirmed" in r.err
    assert asked and project.file("staging").read_text() == before


def test_prod_with_pinned_artifacts_passes_schema_and_policy(project, verified_dev, run_promote):
    _target(project, "prod", {"vllmApiKey": PROD_KEY})
    r = run_promote("dev", "prod")
    assert r.code == 0, r.err
    # the placeholders prod keeps (host keys) are the operator's, reported, not touched
    assert "nodes[0].hostKey" in r.out
    cfg = _config(project.file("prod"))
    assert cfg["image"]["ref"] == DIGEST and cfg["model"]["revision"] == COMMIT
    raw = _with_real_host_keys(promote.raw_config(project.file("prod").read_text()))
    parsed = validate_config(raw)
    assert parsed.environment == "prod" and parsed.image.by_digest and parsed.model.pinned
    # each service is pinned to the commit the source resolved for it (fakestack: sha1 of the
    # name); everything else of it (port, share, flags) is prod's own
    assert [(s.name, s.revision, s.port) for s in parsed.services] == [
        ("embed", hashlib.sha1(b"embed").hexdigest(), 8001),
        ("rerank", hashlib.sha1(b"rerank").hexdigest(), 8002)]
    assert parsed.services[1].extra_args and parsed.services[0].kv_cache_memory_bytes
    assert run_policy(rules.prod_pinned, sargs(_prod_resources(raw))) == []
    assert "vllmApiKey" in cfg and PROD_KEY not in project.file("prod").read_text()


def test_prod_refuses_unpinned_artifacts(project, run_promote):
    """A source that ran a tag with no recorded repo digest and a branch as its 'commit'."""
    tag = "10.77.0.1:5000/spark-vllm-lab:latest"
    project.write_config("devtag", dev_config(ROOT, image={"ref": tag}))
    st = project.stack("devtag", commit="main")
    project.set_secrets(st, {"vllmApiKey": "sk-devtag"})
    assert st.up().summary.result == "succeeded"

    _target(project, "prod", {"vllmApiKey": PROD_KEY})
    before = project.file("prod").read_text()
    r = run_promote("devtag", "prod")
    assert r.code == promote.EXIT_UNPINNED
    assert "refusing to promote into prod" in r.err
    assert "not pinned by digest" in r.err and "'main' is not a 40-hex commit" in r.err
    assert "Traceback" not in r.err
    assert project.file("prod").read_text() == before

    # staging accepts it with warnings; the same values in prod fail schema and policy
    _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    r = run_promote("devtag", "staging")
    assert r.code == 0 and "warning: image" in r.out and "refused for prod" in r.out
    staged = promote.raw_config(project.file("staging").read_text())
    prod_raw = _with_real_host_keys(promote.raw_config(before))
    prod_raw["image"]["ref"] = staged["image"]["ref"]
    prod_raw["model"]["revision"] = staged["model"]["revision"]
    with pytest.raises(ConfigError) as err:
        validate_config(prod_raw)
    keys = {p.split(":")[1] for p in err.value.problems}
    # devtag served no services: prod's stay at their placeholders, refused too
    assert keys == {"image.ref", "model.revision", "services[0].revision",
                    "services[1].revision"}, err.value.problems
    msgs = run_policy(rules.prod_pinned, sargs(_prod_resources(prod_raw)))
    assert any("is not pinned by digest" in m for m in msgs), msgs
    assert any("revision 'main' is not a 40-hex commit" in m for m in msgs), msgs


def test_every_promoted_serve_key_travels_from_staging_into_prod(project, run_promote, tmp_path,
                                                                  monkeypatch):
    """A staging stack whose last update set every promoted `vllm.*` key (config/serve.py
    PROMOTED_KEYS, one sample each: tests/serve_samples.py) writes each one into prod, typed
    as it was (floats, booleans, objects, lists), and nothing of prod's own."""
    recipes_with_template(tmp_path / "recipes", monkeypatch)  # chatTemplate names a template
    project.write_config("every", dev_config(ROOT, environment="staging",
                                             vllm=sample_vllm(promote.PROMOTED_VLLM_KEYS),
                                             # trustRemoteCode wants the model pinned
                                             model={"revision": COMMIT}))
    st = project.stack("every")
    project.set_secrets(st, {"vllmApiKey": "sk-every-key"})
    assert st.up().summary.result == "succeeded"
    _target(project, "prod", {"vllmApiKey": PROD_KEY})
    before = _config(project.file("prod"))

    r = run_promote("every", "prod")
    assert r.code == 0, r.err
    after = _config(project.file("prod"))
    assert len(promote.PROMOTED_VLLM_KEYS) == 22
    for key in promote.PROMOTED_VLLM_KEYS:
        assert after["vllm"][key] == SAMPLES[key][0], key
        assert type(after["vllm"][key]) is type(SAMPLES[key][0]), key
    for key in promote.ENV_VLLM_KEYS:
        assert after["vllm"].get(key) == before["vllm"].get(key), key
    raw = _with_real_host_keys(promote.raw_config(project.file("prod").read_text()))
    raw["services"] = [{**s, "revision": COMMIT} for s in raw["services"]]
    v = validate_config(raw).vllm
    assert (v.executor, v.reasoning_parser, v.max_num_batched_tokens) == ("mp", "deepseek_r1",
                                                                          4096)


# ------------------------------------------------------------------------------ refusals
def test_refuses_when_the_last_update_failed(project, run_promote):
    project.write_config("devfail", dev_config(ROOT))
    st = project.stack("devfail")
    assert st.up().summary.result == "succeeded"
    (project.folder("devfail") / "FAIL").write_text("")
    import pulumi.automation as auto

    with pytest.raises(auto.CommandError):
        st.up()
    _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    before = project.file("staging").read_text()
    r = run_promote("devfail", "staging")
    assert r.code == promote.EXIT_UNVERIFIED
    assert "the last operation (update at " in r.err and ") failed; fix it" in r.err, r.err
    assert project.file("staging").read_text() == before


def test_refuses_a_deployment_its_health_gates_did_not_verify(project, run_promote):
    """Issue 49: an update that succeeded but left no verified deployment (no stack output
    `deployment`, the summary the head's deployment step prints once the gate passed) is not
    promoted; nor is one whose verified deployment served another commit than it promotes."""
    project.write_config("devunverified", dev_config(ROOT))
    st = project.stack("devunverified")
    (project.folder("devunverified") / "UNVERIFIED").write_text("")
    assert st.up().summary.result == "succeeded"
    _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    before = project.file("staging").read_text()
    r = run_promote("devunverified", "staging")
    assert r.code == promote.EXIT_UNVERIFIED, r.err
    assert "records no verified deployment (the stack output `deployment`" in r.err, r.err
    assert project.file("staging").read_text() == before
    with pytest.raises(promote.Refusal, match="served commit 'x', not the modelCommit"):
        promote.check_verified("dev", {"modelCommit": "c" * 40, "imageIds": {"a": "i"},
                                       "deployment": {"deployment": "d" * 16,
                                                      "model": {"commit": "x"},
                                                      "image": {"id": "i"}}})
    with pytest.raises(promote.Refusal, match="ran image 'j', not the one its nodes hold"):
        promote.check_verified("dev", {"modelCommit": "c" * 40, "imageIds": {"a": "i"},
                                       "deployment": {"deployment": "d" * 16,
                                                      "model": {"commit": "c" * 40},
                                                      "image": {"id": "j"}}})


def test_refuses_a_stack_never_deployed_missing_or_destroyed(project, run_promote):
    _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    project.write_config("devnew", dev_config(ROOT))
    project.stack("devnew")
    r = run_promote("devnew", "staging")
    assert r.code == promote.EXIT_UNVERIFIED and "has no recorded update" in r.err

    r = run_promote("nosuchstack", "staging")
    assert r.code == promote.EXIT_UNVERIFIED and "does not exist on the backend" in r.err

    project.write_config("devgone", dev_config(ROOT))
    st = project.stack("devgone")
    st.up()
    st.destroy()
    r = run_promote("devgone", "staging")
    assert r.code == promote.EXIT_UNVERIFIED and "was destroyed" in r.err


@pytest.fixture(scope="module")
def drift_stack(project):
    project.write_config("devdrift", dev_config(ROOT))
    st = project.stack("devdrift")
    assert st.up().summary.result == "succeeded"
    return st


def test_refuses_drift_seen_by_refresh(project, drift_stack, run_promote):
    _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    before = project.file("staging").read_text()
    marker = project.folder("devdrift") / "marker.txt"
    try:
        marker.write_text("changed by hand")  # a value changed outside Pulumi
        r = run_promote("devdrift", "staging")
        assert r.code == promote.EXIT_DRIFT, r.err
        assert "has drifted" in r.err and "update marker" in r.err
        marker.unlink()  # a resource removed outside Pulumi
        r = run_promote("devdrift", "staging")
        assert r.code == promote.EXIT_DRIFT and "delete marker" in r.err
    finally:
        marker.write_text("v1")
    assert project.file("staging").read_text() == before
    assert run_promote("devdrift", "staging", dry_run=True).code == 0  # back in line


def test_refuses_config_not_deployed(project, drift_stack, run_promote):
    _target(project, "staging", {"vllmApiKey": STAGING_KEY})
    path = project.file("devdrift")
    original = path.read_text()
    try:
        cfg = _config(path)
        cfg["vllm"]["port"] = 8001  # not promoted, but the program would change
        project.write_config("devdrift", cfg)
        r = run_promote("devdrift", "staging")
        assert r.code == promote.EXIT_DRIFT and "`preview` wants changes" in r.err, r.err
        assert "update serve" in r.err

        cfg["vllm"]["port"] = 8000
        cfg["vllm"]["maxNumSeqs"] = 16  # promoted: the file is not what was verified
        project.write_config("devdrift", cfg)
        r = run_promote("devdrift", "staging", refresh_only=True)
        assert r.code == promote.EXIT_DRIFT
        assert "changed since the last update (vllm.maxNumSeqs: 4 -> 16)" in r.err, r.err

        cfg["vllm"]["maxNumSeqs"] = 4
        cfg["services"] = DEV_SERVICES[:1]  # a service is promoted too: its repo and revision
        project.write_config("devdrift", cfg)
        r = run_promote("devdrift", "staging", refresh_only=True)
        assert r.code == promote.EXIT_DRIFT
        assert ("changed since the last update (services.embed.repo: None -> "
                "'Qwen/Qwen3-Embedding-0.6B', services.embed.revision: None -> 'main')") in r.err, \
            r.err
    finally:
        path.write_text(original)


# ------------------------------------------------------------------------------ the CLI
def test_cli_usage_errors_and_exit_codes(project, tmp_path):
    env = {**os.environ, **project.env}
    script = str(Path(sys.executable).parent / "spark-vllm-promote")  # the console entry point

    def cli(*args, env=env):
        return subprocess.run([script, *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=120, check=False)

    r = cli("--from", "dev", "--to", "dev")
    assert r.returncode == 2 and "name the same stack" in r.stderr
    r = cli("--from", "dev", "--to", "nosuch")
    assert r.returncode == 2 and "Pulumi.nosuch.yaml does not exist" in r.stderr
    bare = {k: v for k, v in env.items() if not k.startswith("PULUMI_CONFIG_PASSPHRASE")}
    bare["HOME"] = str(tmp_path)  # no ~/.spark-vllm/passphrase to default to
    r = cli("--from", "dev", "--to", "staging", env=bare)
    assert r.returncode == 2 and "PULUMI_CONFIG_PASSPHRASE" in r.stderr
    r = cli("--from", "dev", "--to", "staging",
            env={**env, "PULUMI_BACKEND_URL": f"file://{tmp_path}/no-such-state"})
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = cli("--to", "staging")
    assert r.returncode == 2 and "--from" in r.stderr
    assert "Traceback" not in r.stderr


def test_promoted_services_pin_only_the_services_the_source_served():
    art = promote.Artifacts(image_ref=DIGEST, model_repo=None, model_commit=COMMIT,
                            serve_flags={}, services={"embed": ("org/e", "e" * 40)})
    target = [{"name": "embed", "repo": "org/old", "revision": "PLACEHOLDER", "port": 1},
              {"name": "rerank", "repo": "org/r", "revision": "PLACEHOLDER"}]
    assert promote.promoted_services(target, art) == [
        {"name": "embed", "repo": "org/e", "revision": "e" * 40, "port": 1},
        {"name": "rerank", "repo": "org/r", "revision": "PLACEHOLDER"}]
    assert promote.promoted_services(None, art) is None


def test_refuses_a_promotion_that_makes_a_service_invalid(project, verified_dev, run_promote):
    """Issue 31, item 10: the target's service `tiny-moe` is valid until the promoted
    vllm.servedModelName (dev's, tiny-moe) takes its name. Before, promote wrote the file with a
    warning and the target's next preview failed; now it refuses (exit 7) and writes nothing."""
    text = (ROOT / "Pulumi.staging.yaml").read_text().replace("- name: embed", "- name: tiny-moe")
    assert "- name: tiny-moe" in text
    project.file("staging-svc").write_text(text)
    st = project.stack("staging-svc")
    project.set_secrets(st, {"vllmApiKey": STAGING_KEY})
    before = project.file("staging-svc").read_text()
    r = run_promote("dev", "staging-svc")
    assert r.code == promote.EXIT_INVALID, (r.out, r.err)
    assert "services[0].servedModelName: got 'tiny-moe'" in r.err
    assert project.file("staging-svc").read_text() == before
