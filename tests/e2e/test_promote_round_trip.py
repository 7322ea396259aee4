"""The promotion round trip on the lab, with the real program, engine, plugins and hosts:

the session's shared stack `dev` (tests/e2e/conftest.py: converged and verified, on vLLM's mp
executor by now) -> promote dev -> staging (`tools/promote.py`, the code `make promote` runs) ->
staging `up` from empty on the same lab hosts, beside dev (its own ports: an environment's own
settings are never promoted) -> it serves what dev verified (same image ID, same model commit,
the same serve flags) behind its own API key -> a preview of staging wants nothing -> staging is
destroyed and dev serves on, untouched.

It is also the suite's case of two stacks side by side (test_two_stacks proves what would
collide is refused): every container and host file a stack owns is named by its stack
(`spark-vllm-<stack>-*`, `/var/lib/spark-vllm/stacks/<stack>/`), so staging's up keeps every
container of dev (same IDs and start times), each stack's key is in its own folder, both serve,
and destroying staging removes its containers and folder and leaves dev's.

dev runs with serve keys staging does not set, among those promotion once dropped (issue 29):
`executor: mp`, `reasoningParser` and `maxNumBatchedTokens` (test_executor_mp's switch sets the
last two with the executor, so reaching here costs no extra vLLM restart; run alone, this module
sets them first); staging serves with each of them. The parser is `granite`, which finds its
reasoning by text markers: vLLM 0.32 checks a reasoning parser against the model's tokenizer at
start-up (vllm/parser/parser_manager.py validate_parser_tokenizer), and `qwen3` (the 122B
recipe's) needs `<think>` tokens the lab's tiny tokenizer does not have (lab/tinymodel.py).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pulumi.automation as auto
import pytest
import yaml

from config.serve import PROMOTED_KEYS
from lab.deployments import complete, http
from tools import promote

pytestmark = [pytest.mark.lab, pytest.mark.engine]

STAGING_KEY = "sk-lab-staging-round-trip"
NS = "spark-vllm:"
# staging's own place on the shared hosts: another API port and rendezvous port than dev's
STAGING_PORT, STAGING_MASTER_PORT = 8020, 29521
STAGING_GATEWAY_PORT = 8081  # staging's gateway beside dev's (8080) on the same head
# serve keys dev verifies and staging does not set: promotion must carry each one
VERIFIED = {"executor": "mp", "reasoningParser": "granite", "maxNumBatchedTokens": 2048}
NODES = ("spark-1", "spark-2")
KEY = "/var/lib/spark-vllm/stacks/{stack}/vllm/api-key"


def _containers(dev, node: str, stack: str) -> set[str]:
    """The running containers of a stack on a node, by their labels."""
    out = dev.ssh(node, "docker ps --filter label=spark-vllm.managed=true --filter "
                        f"label=spark-vllm.stack=spark-vllm/{stack} --format '{{{{.Names}}}}'")
    return set(out.split())


def _get(url: str, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_dev_to_staging_round_trip_on_the_lab(stack, lab_cfg, capsys):
    dev = stack
    work = dev.workdir
    current = yaml.safe_load((work / "Pulumi.dev.yaml").read_text())["config"][NS + "vllm"]
    missing = {k: v for k, v in VERIFIED.items() if current.get(k) != v}
    if missing:  # run without test_executor_mp before it
        for key, value in missing.items():
            dev.set(f"vllm.{key}", value)
        assert dev.run("up").summary.result == "succeeded"
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
    conf[NS + "gateway"]["port"] = STAGING_GATEWAY_PORT  # the environment's own, not promoted
    for key in VERIFIED:
        vllm.pop(key, None)
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
        # dev's image: by digest after test_change_image_and_nodes (its second image), kept as
        # is; run without it, the lab's tag, pinned to the digest the nodes pulled when the state
        # records one, else kept (staging accepts a tag; prod refuses it: the promote tier)
        dev_ref = dev_conf[NS + "image"]["ref"]
        allowed = {dev_ref} if "@sha256:" in dev_ref else {dev_ref, lab_cfg["image"]["ref"]}
        assert written[NS + "image"]["ref"] in allowed, (written[NS + "image"], allowed)
        assert written[NS + "model"]["revision"] == commit
        for key in PROMOTED_KEYS:  # every promoted serve key is dev's
            assert written[NS + "vllm"].get(key) == dev_conf[NS + "vllm"].get(key), key
        for key, value in VERIFIED.items():
            assert written[NS + "vllm"][key] == value, key
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
        endpoint = out["endpoint"].value  # staging's gateway, in front of its vLLM
        assert f":{STAGING_GATEWAY_PORT}/" in endpoint + "/"
        status, _ = _get(endpoint + "/models")
        assert status == 401, "staging must require its API key"
        status, body = _get(endpoint + "/models", STAGING_KEY)
        assert status == 200 and "tiny-moe" in body, body
        assert dev.snapshot() == dev_before, "staging's up touched dev's containers"
        # staging's own containers, named by its stack; each stack's key in its own folder
        assert {n: _containers(dev, n, "staging") for n in NODES} == {
            "spark-1": {"spark-vllm-staging-serve", "spark-vllm-staging-gateway"},
            "spark-2": {"spark-vllm-staging-serve"}}
        keys = {s: dev.ssh("spark-1", f"cat {KEY.format(stack=s)}").strip()
                for s in ("dev", "staging")}
        assert keys == {"dev": dev.api_key(), "staging": STAGING_KEY}
        _, body = http(endpoint + "/completions", {"model": "tiny-moe", "prompt": "Say hello",
                                                   "max_tokens": 8}, key=STAGING_KEY)
        assert json.loads(body)["choices"][0]["text"], body
        assert complete(dev)
        # staging's vLLM runs with what dev verified: mp (no Ray container), the parser, the
        # batch size
        resources = staging.export_stack().deployment["resources"]
        names = [r["urn"].split("::")[-1] for r in resources]
        assert "vllm-serve" in names and "ray-head" not in names, names
        (serve,) = [r for r in resources if r["urn"].endswith("::vllm-serve")]
        command = serve["inputs"]["command"]
        for flags in (["--distributed-executor-backend", "mp"],
                      ["--reasoning-parser", "granite"], ["--max-num-batched-tokens", "2048"]):
            assert any(command[i:i + 2] == flags for i in range(len(command))), (flags, command)

        t0 = time.monotonic()
        staging.preview(expect_no_changes=True, on_output=print)
        t["staging preview (no changes)"] = time.monotonic() - t0
    finally:
        t0 = time.monotonic()
        staging.destroy(on_output=print)
        t["staging destroy"] = time.monotonic() - t0
        print("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in t.items()))
    assert dev.snapshot() == dev_before, "destroying staging touched dev's containers"
    assert {n: _containers(dev, n, "staging") for n in NODES} == {n: set() for n in NODES}
    assert dev.ssh("spark-1", f"ls {KEY.format(stack='staging')} 2>/dev/null || true") == ""
    assert dev.ssh("spark-1", f"test -s {KEY.format(stack='dev')} && echo ok").strip() == "ok"
    assert complete(dev)
    dev.run("preview", expect_no_changes=True)
