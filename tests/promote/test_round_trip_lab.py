"""The promotion round trip on the lab, with the real program, engine, plugins and hosts:

dev `up` on the lab -> promote dev -> staging (a second stack on the same lab hosts) -> destroy
dev (container names are fixed per host, two stacks cannot run there at once) -> staging `up`
converges and serves what dev verified (same image ID, same model commit, the same serve keys)
behind its own API key -> a preview of staging wants nothing -> destroy.

dev runs with serve keys staging does not set, among those promotion once dropped (issue 29):
`executor: mp`, `reasoningParser` and `maxNumBatchedTokens`; staging serves with each of them.
The parser is `granite`, which finds its reasoning by text markers: vLLM 0.32 checks a reasoning
parser against the model's tokenizer at start-up (vllm/parser/parser_manager.py
validate_parser_tokenizer), and `qwen3` (the 122B recipe's) needs `<think>` tokens the lab's
tiny tokenizer does not have (lab/tinymodel.py SPECIALS).

Holds the lab lock for the whole test. Costs three `up`/`destroy` cycles (a few minutes).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request

import pytest
import yaml

from lab.deployments import (
    LAB_CACHE,
    ROOT,
    _plugin_installed,
    lab,
    lock_lab,
    project_dir,
    remove_leftover_stack_containers,
)
from tools import promote

pytestmark = [pytest.mark.lab, pytest.mark.engine]

STAGING_KEY = "sk-lab-staging-round-trip"
# serve keys dev verifies and staging does not set: promotion must carry each one
VERIFIED = {"executor": "mp", "reasoningParser": "granite", "maxNumBatchedTokens": 2048}


def _need_lab() -> None:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    if shutil.which("pulumi") is None:
        pytest.skip("the Pulumi CLI is not on PATH: run `make setup`")
    for name in ("command", "docker"):
        if not _plugin_installed(name):
            pytest.skip(f"resource plugin {name} is not installed (see toolchain status.json)")


def _stack(name, work, env):
    import pulumi.automation as auto

    return auto.create_or_select_stack(
        stack_name=name, work_dir=str(work), opts=auto.LocalWorkspaceOptions(env_vars=env)
    )


def _get(url: str, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_dev_to_staging_round_trip_on_the_lab(tmp_path, capsys):
    import pulumi.automation as auto

    _need_lab()
    held = lock_lab()
    stacks: dict[str, object] = {}
    t = {}
    try:
        t0 = time.monotonic()
        lab("up", "--nodes", "2")
        t["lab up"] = time.monotonic() - t0
        remove_leftover_stack_containers(json.loads((LAB_CACHE / "stack.json").read_text()))

        work = project_dir(tmp_path)  # the checkout's program, stack files here
        dev_doc = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
        dev_doc.pop("encryptionsalt", None)  # its own passphrase: not the committed salt
        dev_doc["config"]["spark-vllm:vllm"].update(VERIFIED)
        (work / "Pulumi.dev.yaml").write_text(yaml.safe_dump(dev_doc, sort_keys=False))
        lab_ref = json.loads((LAB_CACHE / "stack.json").read_text())["image"]["ref"]
        (work / "state").mkdir()
        env = {
            "PULUMI_BACKEND_URL": f"file://{work / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": "spark-vllm-promote-lab",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        }

        # staging: the same lab hosts (and dev's lab-sized ray.nofile etc.), its own environment,
        # API key and (stale) artifacts, none of the VERIFIED serve keys
        conf = dev_doc["config"]
        dev_ref = conf["spark-vllm:image"]["ref"]
        assert "@" not in dev_ref, "dev names the lab's tag; promotion must pin its digest"
        conf = json.loads(json.dumps(conf))
        conf["spark-vllm:environment"] = "staging"
        conf["spark-vllm:image"]["ref"] = dev_ref.rsplit(":", 1)[0] + ":stale-tag"
        conf["spark-vllm:model"]["revision"] = "main"
        conf["spark-vllm:vllm"]["maxNumSeqs"] = 8
        for key in VERIFIED:
            conf["spark-vllm:vllm"].pop(key)
        (work / "Pulumi.staging.yaml").write_text(
            "# staging on the lab: a second stack on dev's hosts (never both at once)\n"
            + yaml.safe_dump({"config": conf}, sort_keys=False)
        )

        dev = stacks["dev"] = _stack("dev", work, env)
        t0 = time.monotonic()
        assert dev.up(on_output=print).summary.result == "succeeded"
        t["dev up"] = time.monotonic() - t0
        dev_out = dev.outputs()
        commit = dev_out["modelCommit"].value
        dev_ids = dev_out["imageIds"].value

        staging = stacks["staging"] = _stack("staging", work, env)
        staging.set_config("spark-vllm:vllmApiKey", auto.ConfigValue(STAGING_KEY, secret=True))

        lines: list[str] = []
        t0 = time.monotonic()
        code = promote.run(promote.Options(
            source="dev", target="staging", yes=True, work_dir=work, env=env, out=lines.append,
        ))
        t["promote"] = time.monotonic() - t0
        print("\n".join(lines))
        assert code == 0, capsys.readouterr().err
        written = yaml.safe_load((work / "Pulumi.staging.yaml").read_text())["config"]
        assert written["spark-vllm:image"]["ref"] == lab_ref  # the tag's digest, pinned
        assert written["spark-vllm:model"]["revision"] == commit
        assert written["spark-vllm:vllm"]["maxNumSeqs"] == 4
        for key, value in VERIFIED.items():
            assert written["spark-vllm:vllm"][key] == value, key
        assert written["spark-vllm:environment"] == "staging"
        assert "secure" in written["spark-vllm:vllmApiKey"]

        t0 = time.monotonic()
        dev.destroy(on_output=print)
        stacks.pop("dev")
        t["dev destroy"] = time.monotonic() - t0

        t0 = time.monotonic()
        r = staging.up(on_output=print)
        t["staging up"] = time.monotonic() - t0
        assert r.summary.result == "succeeded"
        out = staging.outputs()
        assert out["modelCommit"].value == commit
        assert out["imageIds"].value == dev_ids
        endpoint = out["endpoint"].value
        status, _ = _get(endpoint + "/models")
        assert status == 401, "staging must require its API key"
        status, body = _get(endpoint + "/models", STAGING_KEY)
        assert status == 200 and "tiny-moe" in body, body
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
        for name, st in list(stacks.items()):
            try:
                t0 = time.monotonic()
                st.destroy(on_output=print)
                t[f"{name} destroy"] = time.monotonic() - t0
            except auto.CommandError as e:
                print(f"cleanup destroy of {name} failed: {e}")
        held.close()
        print("timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in t.items()))
