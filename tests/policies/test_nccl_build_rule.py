"""Rule 18 nccl-build-advisory (policies/rules/advisories.py, issue 51), on the CollectiveGate
component's props (components/collective.py `ncclBuilds`: per node, the libnccl the image probe
found vLLM loads and the host's). The lab image's real probe (tests/fixtures/collective) is the
build that is fine; the known-bad one is pip's nvidia-nccl-cu13 2.28.9 (vLLM issues 42354 and
41725), here the lab's answer with that version, as the probe would report it."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from pulumi_policy import EnforcementLevel
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_testkit import rargs, run

import rules

ROOT = Path(__file__).resolve().parents[2]

GATE = "spark-vllm:collective:CollectiveGate"
PROBE = json.loads((ROOT / "tests" / "fixtures" / "collective" / "image-probe-lab-spark-1.txt")
                   .read_text().split("\n", 1)[1])["nccl"]
SYSTEM_2289 = {"path": "/lib/aarch64-linux-gnu/libnccl.so.2",
               "realPath": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9",
               "build": "c0db9360" + "2" * 32, "version": "2.28.9", "source": "system",
               "package": "libnccl2", "packageVersion": "2.28.9-1+cuda13.0"}


def props(vllm: dict | None, host: list | None = None) -> dict:
    return {"ncclBuilds": {n: {"vllm": vllm, "host": host or []} for n in ("spark-1", "spark-2")}}


def test_an_advisory_that_names_the_known_bad_pip_build_and_the_fix():
    policy = rules.BY_NAME["nccl-build-advisory"]
    assert policy.enforcement_level == EnforcementLevel.ADVISORY
    bad = copy.deepcopy(PROBE["vllm"])
    bad["version"] = bad["packageVersion"] = "2.28.9"
    msgs = run(policy, rargs(GATE, props(bad, [SYSTEM_2289])))
    assert len(msgs) == 2
    assert msgs[1].startswith("spark-2: vLLM loads NCCL 2.28.9 from pip (/opt/venv/lib/"
                              "python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2, build ")
    assert "https://github.com/vllm-project/vllm/issues/42354" in msgs[1]
    assert "https://github.com/vllm-project/vllm/issues/41725" in msgs[1]
    assert "Fix: load the system's build instead: VLLM_NCCL_SO_PATH=" in msgs[1]
    assert msgs[1].endswith("; the host has 2.28.9 as libnccl2 at /usr/lib/aarch64-linux-gnu/"
                            "libnccl.so.2.28.9 (build c0db93602222)")


def test_the_labs_build_and_the_systems_own_2289_are_fine():
    policy = rules.BY_NAME["nccl-build-advisory"]
    assert run(policy, rargs(GATE, props(PROBE["vllm"]))) == []
    assert run(policy, rargs(GATE, props(SYSTEM_2289))) == []  # the fix itself
    assert run(policy, rargs(GATE, props(None))) == []  # not probed (yet)
    assert run(policy, rargs("spark-vllm:vllm_image:VllmImage", props(SYSTEM_2289))) == []


def test_unknown_props_in_a_preview_are_not_judged():
    policy = rules.BY_NAME["nccl-build-advisory"]
    assert run(policy, rargs(GATE, {"ncclBuilds": UNKNOWN_STRING_VALUE})) == []
    assert run(policy, rargs(GATE, {"ncclBuilds": {"spark-1": UNKNOWN_STRING_VALUE}})) == []
    assert run(policy, rargs(GATE, props({"version": UNKNOWN_STRING_VALUE, "source": "pip"})))\
        == []
