"""The promotion round trip on the lab, with the real program, engine, plugins and hosts:

the session's shared stack `dev` (tests/e2e/conftest.py: converged and verified, on vLLM's mp
executor by now) -> promote dev -> staging (`tools/promote.py`, the code `make promote` runs) ->
staging `up` from empty on the same lab hosts, beside dev (its own ports: an environment's own
settings are never promoted) -> it serves what dev verified (same image ID, same model commit,
the same serve flags) behind its own API key -> a preview of staging wants nothing -> staging is
destroyed and dev serves on, untouched.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pulumi.automation as auto
import pytest
import yaml

from lab.deployments import complete
from tools import promote

pytestmark = [pytest.mark.lab, pytest.mark.engine]

STAGING_KEY = "sk-lab-staging-round-trip"
NS = "spark-vllm:"
# staging's own place on the shared hosts: another API port and rendezvous port than dev's
STAGING_PORT, STAGING_MASTER_PORT = 8020, 29521


def _get(url: str, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_dev_to_staging_round_trip_on_the_lab(stack, lab_cfg, capsys):
    dev = stack
    work = dev.workdir
    env = dict(dev.stack.workspace.env_vars)
    t: dict[str, float] = {}
    dev_conf = yaml.safe_load((work / "Pulumi.dev.yaml").read_text())["config"]
    dev_out = dev.stack.outputs()
    commit, dev_ids = dev_out["modelCommit"].value, dev_out["imageIds"].value
    dev_before = dev.snapshot()

    # staging: the same lab hosts, its own environment, ports and API key, stale artifacts and
    # a serve flag of its own, all of which promotion must overwrite with dev's
    conf = {k: v for k, v in json.loads(json.dumps(dev_conf)).items()
            if not isinstance(v, dict) or "secure" not in v}
    conf[NS + "environment"] = "staging"
    conf[NS + "image"]["ref"] = "10.77.0.1:5000/spark-lab/vllm-spark:stale-tag"
    conf[NS + "model"]["revision"] = "main"
    vllm = conf[NS + "vllm"]
    vllm["maxNumSeqs"] = int(vllm.get("maxNumSeqs", 4)) + 1
    vllm["port"], vllm["masterPort"] = STAGING_PORT, STAGING_MASTER_PORT
    (work / "Pulumi.staging.yaml").write_text(
        "# staging on the lab: a second stack on dev's hosts, beside it\n"
        + yaml.safe_dump({"config": conf}, sort_keys=False))
    staging = auto.create_or_select_stack(
        stack_name="staging", work_dir=str(work), opts=auto.LocalWorkspaceOptions(env_vars=env))
    staging.set_config(NS + "vllmApiKey", auto.ConfigValue(STAGING_KEY, secret=True))
    try:
        lines: list[str] = []
        t0 = time.monotonic()
        code = promote.run(promote.Options(
            source="dev", target="staging", yes=True, work_dir=work, env=env, out=lines.append))
        t["promote"] = time.monotonic() - t0
        print("\n".join(lines))
        assert code == 0, capsys.readouterr().err
        written = yaml.safe_load((work / "Pulumi.staging.yaml").read_text())["config"]
        # pinned by digest: dev's ref when it was one (the image module's second image), else
        # the digest of the lab's tag that dev pulled
        dev_ref = dev_conf[NS + "image"]["ref"]
        pinned = dev_ref if "@sha256:" in dev_ref else lab_cfg["image"]["ref"]
        assert written[NS + "image"]["ref"] == pinned, (written[NS + "image"], pinned)
        assert written[NS + "model"]["revision"] == commit
        for key in promote.PROMOTED_VLLM_KEYS:  # every promoted serve key is dev's
            assert written[NS + "vllm"].get(key) == dev_conf[NS + "vllm"].get(key), key
        assert written[NS + "vllm"]["port"] == STAGING_PORT  # the environment's own
        assert written[NS + "environment"] == "staging"
        assert "secure" in written[NS + "vllmApiKey"]

        t0 = time.monotonic()
        r = staging.up(on_output=print)
        t["staging up from empty, beside dev"] = time.monotonic() - t0
        assert r.summary.result == "succeeded"
        out = staging.outputs()
        assert out["modelCommit"].value == commit
        assert out["imageIds"].value == dev_ids
        endpoint = out["endpoint"].value
        assert f":{STAGING_PORT}/" in endpoint + "/"
        status, _ = _get(endpoint + "/models")
        assert status == 401, "staging must require its API key"
        status, body = _get(endpoint + "/models", STAGING_KEY)
        assert status == 200 and "tiny-moe" in body, body
        assert dev.snapshot() == dev_before, "staging's up touched dev's containers"

        t0 = time.monotonic()
        staging.preview(expect_no_changes=True, on_output=print)
        t["staging preview (no changes)"] = time.monotonic() - t0
    finally:
        t0 = time.monotonic()
        staging.destroy(on_output=print)
        t["staging destroy"] = time.monotonic() - t0
        print("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in t.items()))
    assert dev.snapshot() == dev_before, "destroying staging touched dev's containers"
    assert complete(dev)
    dev.run("preview", expect_no_changes=True)
