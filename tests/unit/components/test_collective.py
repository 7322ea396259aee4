"""CollectiveGate (components/collective.py, issue 51): a rank per node in the serving image after
the fabric check and the image check, the verdict on the head before the model, Ray and vLLM,
when it runs again, and what it stops where. The ranks' stdout is the lab's real Gloo run
(tests/fixtures/collective/INDEX.md) handed to the mocks."""

from __future__ import annotations

import json

import pulumi
import pytest

from components import collective as collective_component
from components import rerun
from hostscripts.common import payload
from tests.conftest import ROOT, fake_image_id
from tests.unit.conftest import settled

LAB = ROOT / "tests" / "fixtures" / "collective"
HEAD, WORKER = "spark-1", "spark-2"


def lab(name: str) -> str:
    return (LAB / name).read_text().split("\n", 1)[1]


def measured(mocks, throttled: bool = False) -> None:
    kind = "gloo-lab-throttled-rank" if throttled else "gloo-lab-rank"
    for n in (HEAD, WORKER):
        mocks.stdouts[f"collective-rank-{n}"] = lab(f"{kind}-{n}.txt")


def request_of(create: str) -> dict:
    """The payload's argv[1] in a rank's script (the word after the payload's text)."""
    import shlex

    after = create.split(shlex.quote(payload("collective_bench.py")), 1)[1]
    return json.loads(shlex.split(after.splitlines()[0])[0])


@pulumi.runtime.test
def test_a_rank_per_node_after_the_fabric_and_image_checks_before_the_model(build, mocks,
                                                                             dependencies):
    measured(mocks)
    h = build(2)

    def check(_):
        image = fake_image_id(f"10.77.0.1:5000/spark-lab/vllm-spark@"
                              f"{fake_image_id('10.77.0.1:5000/spark-lab/vllm-spark:lab')}")
        for rank, n in enumerate((HEAD, WORKER)):
            create = mocks.named(f"collective-rank-{n}").inputs["create"]
            assert f" --entrypoint python3 {image} -c " in create
            assert "--label spark-vllm.role=collective-gate" in create
            # the node's own NCCL environment (its fabric interface), the gate's INFO lines
            assert "-e GLOO_SOCKET_IFNAME=enp1s0f1np1" in create
            assert "-e NCCL_DEBUG=INFO" in create
            assert request_of(create) == {
                "rank": rank, "world": 2, "localRank": 0, "master": "192.168.177.11",
                "port": 29517, "sizes": [65536, 262144, 1048576, 4194304],
                "ops": ["all_gather", "all_reduce"], "deadline": 300, "connectTimeout": 120}
            # after every fabric check and the image check
            assert {"nccl-fabric-spark-1", "nccl-fabric-spark-2", "image-check"} <= \
                dependencies[f"collective-rank-{n}"], dependencies[f"collective-rank-{n}"]
        assert {"collective-rank-spark-1", "collective-rank-spark-2"} <= \
            dependencies["collective-check"]
        # the model, and so Ray and vLLM, wait for the verdict
        assert "collective-check" in dependencies["model-fetch"]
        check_text = mocks.named("collective-check").inputs["create"]
        assert "collective gate passed: all_gather 0.410 GB/s against 0.05 GB/s" in check_text
        assert "exit 1" not in check_text
        assert "/var/lib/spark-vllm/stacks/dev/collective-gate.json" in check_text

    return settled(h, h.gate.summary).apply(lambda v: (check(v), _passed(v[-1]))[0])


def _passed(summary: dict) -> None:
    assert summary["verdict"] == "passed" and summary["backend"] == "gloo"
    assert summary["enforced"] is True  # Pulumi.dev.yaml: the lab enforces
    assert summary["allGatherBusGBps"] == pytest.approx(0.4095, abs=1e-3)


@pulumi.runtime.test
def test_every_rank_runs_again_together_when_one_of_them_changes(build, mocks, ignored_changes):
    measured(mocks)
    h = build(2)

    def check(_):
        triggers = {n: mocks.named(f"collective-rank-{n}").inputs["triggers"]
                    for n in (HEAD, WORKER)}
        # the same digest of every rank's script on every rank, then each fabric interface's
        # command ID and stdout (a configured interface that ran makes them measure again)
        assert triggers[HEAD] == triggers[WORKER]
        assert len(triggers[HEAD][0]) == 64
        assert "fabric-spark-2-enP2p1s0f1np1-id" in triggers[HEAD]
        # the last one is the rerun marker, ignored by its path when no rerun is asked: the up
        # after one that measured again (a list of another length) sees no diff (the lab's
        # second up replaced every rank once more before)
        assert triggers[HEAD][-1] == "intact"
        assert ignored_changes[f"collective-rank-{HEAD}"] == [
            f"triggers[{len(triggers[HEAD]) - 1}]"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_gate_that_stopped_the_last_up_measures_again(build, mocks, gb10_facts, monkeypatch,
                                                        ignored_changes):
    """Recon read the head's record: the last verdict stopped an up, so the ranks get a value
    never seen before (components/rerun) and measure again instead of the old figures being
    judged again."""
    measured(mocks)
    monkeypatch.setattr(rerun, "fresh_trigger", lambda now=None: "repair-collective")
    facts = {f"spark-{i}": gb10_facts(f"spark-{i}", index=i) for i in (1, 2)}
    facts[HEAD] = facts[HEAD].model_copy(update={"collective_record_present": True,
                                                 "collective_stopped": True})
    h = build(2, facts=facts)

    def check(_):
        for n in (HEAD, WORKER):
            assert mocks.named(f"collective-rank-{n}").inputs["triggers"][-1] == \
                "repair-collective"
        assert ignored_changes[f"collective-rank-{HEAD}"] == []

    return settled(h).apply(check)


def test_why_the_gate_measures_again():
    assert collective_component.rerun_reason(True, False) is None
    assert collective_component.rerun_reason(None, None) is None  # not surveyed
    assert collective_component.rerun_reason(True, True) == "the gate stopped the last up"
    assert collective_component.rerun_reason(False, None).startswith(
        "the head holds no record of the gate")


@pulumi.runtime.test
def test_a_throttled_fabric_fails_the_check_where_enforced(build, mocks):
    measured(mocks, throttled=True)
    h = build(2)

    def check(_):
        text = mocks.named("collective-check").inputs["create"]
        assert text.rstrip().endswith("exit 1")
        assert "collective gate failed: all_gather bus bandwidth 0.006" in text
        assert "is below the threshold 0.05 GB/s" in text

    return settled(h).apply(check)


@pulumi.runtime.test
def test_in_dev_without_enforce_a_slow_fabric_is_a_warning(build, mocks):
    measured(mocks, throttled=True)
    h = build(2, fabric={"collective": {"enforce": None, "minBusGBps": 0.05}})

    def check(_):
        text = mocks.named("collective-check").inputs["create"]
        assert "exit 1" not in text
        assert "collective gate warning: all_gather bus bandwidth 0.006" in text

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_rank_without_an_answer_fails_closed_in_staging(build, mocks):
    mocks.stdouts["collective-rank-spark-1"] = lab("gloo-lab-rank-spark-1.txt")
    mocks.stdouts["collective-rank-spark-2"] = "collective rank failed: exit 125\nstderr: no gpu\n"
    h = build(2, fabric={"collective": {"enforce": None}}, environment="staging")

    def check(_):
        text = mocks.named("collective-check").inputs["create"]
        assert "collective gate failed: the collective bandwidth could not be measured" in text
        assert "spark-2: collective rank failed: exit 125 | stderr: no gpu" in text
        assert text.rstrip().endswith("exit 1")

    return settled(h).apply(check)


@pulumi.runtime.test
def test_no_gate_on_one_node_or_when_disabled(build, mocks):
    h = build(2, fabric={"collective": {"enabled": False}})

    def check(summary):
        assert not [r for r in mocks.resources if r.name.startswith("collective-")]
        assert summary == {"verdict": "not run: disabled (fabric.collective.enabled)"}
        assert h.gate.done == []

    return settled(h, h.gate.summary).apply(lambda v: check(v[-1]))


@pulumi.runtime.test
def test_the_gates_props_carry_each_nodes_nccl_build_for_the_policy_pack(build, mocks):
    probe = (LAB / "image-probe-lab-spark-1.txt").read_text().split("\n", 1)[1]
    for n in (HEAD, WORKER):
        mocks.stdouts[f"image-probe-{n}"] = probe
    measured(mocks)
    h = build(2)

    def check(_):
        props = mocks.named("collective").inputs
        assert props["thresholdGBps"] == 0.05 and props["enforce"] is True
        assert props["sizes"] == [65536, 262144, 1048576, 4194304]
        builds = props["ncclBuilds"]
        assert builds[WORKER]["vllm"]["package"] == "nvidia-nccl-cu13"
        assert builds[WORKER]["vllm"]["version"] == "2.29.7"
        assert builds[WORKER]["host"] == []  # the facts' host: none surveyed here

    return settled(h).apply(check)
