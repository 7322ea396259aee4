"""A model's verified deployment in the graph (issue 49): the steps after each gate and what they
wait for, what the gate may put back, and the label that keeps the state truthful after a
restore (components/deployment.py, components/vllm_server.py, components/vllm_service.py)."""

from __future__ import annotations

import json
import shlex

import pulumi
import pytest

from config import ConfigError, validate_config
from hostscripts.deployment import (
    AFTER_RESTORE_LABEL,
    DEPLOYMENT_PY,
    PAYLOAD_FN,
    RESTORED_LABEL,
)
from inspection.facts import ContainerFacts
from tests.conftest import config_raw, gb10_facts
from tests.unit.conftest import COMMIT, settled

STACK = "spark-vllm/dev"
EMBED = {"name": "embed", "repo": "org/embed", "task": "embed", "port": 8100,
         "gpuMemoryUtilization": 0.05}


def box(name: str, role: str, stack: str = STACK, **labels: str) -> ContainerFacts:
    return ContainerFacts(id="f" * 64, name=name, image="img", state="running",
                          labels={"spark-vllm.managed": "true", "spark-vllm.stack": stack,
                                  "spark-vllm.role": role, **labels})


def ray_facts(head_extra: dict | None = None, worker_extra: dict | None = None,
              worker: bool = True):
    """The facts of a converged 2-node Ray stack (recon before this up)."""
    head = gb10_facts("spark-1", containers=[
        box("spark-vllm-dev-ray-head", "ray-head"),
        box("spark-vllm-dev-serve", "vllm-serve", **(head_extra or {}))])
    work = gb10_facts("spark-2", index=2, containers=[
        box("spark-vllm-dev-ray-worker", "ray-worker", **(worker_extra or {}))] if worker else [])
    return {"spark-1": head, "spark-2": work}


def _args(mocks, name: str) -> dict:
    """The JSON arguments of the (first) payloads/deployment.py call in a command's create
    text."""
    words = shlex.split(mocks.named(name).inputs["create"])
    assert DEPLOYMENT_PY in words and PAYLOAD_FN in words, \
        f"{name} does not call payloads/deployment.py"
    return json.loads(words[words.index(PAYLOAD_FN) + 2])


def _labels(mocks, name: str) -> dict[str, str]:
    return {lab["label"]: lab["value"] for lab in mocks.named(name).inputs.get("labels") or []}


@pulumi.runtime.test
def test_after_the_gate_every_other_node_records_then_the_head_and_then_the_rest(
        build, mocks, dependencies):
    h = build(2, facts=ray_facts())

    def check(_):
        assert dependencies["vllm-deployment-spark-2"] >= {"vllm-health"}
        assert dependencies["vllm-deployment-spark-1"] >= {"vllm-health",
                                                           "vllm-deployment-spark-2"}
        # NCCL's transport and the gateway's gate only after a verified deployment
        assert "vllm-deployment-spark-1" in dependencies["vllm-nccl-log"]
        assert "vllm-deployment-spark-1" in dependencies["gateway-health"]
        worker = _args(mocks, "vllm-deployment-spark-2")
        head = _args(mocks, "vllm-deployment-spark-1")
        assert worker["containers"] == [{"name": "spark-vllm-dev-ray-worker", "files": []}]
        assert head["mode"] == "ok" and head["deployment"] == worker["deployment"]
        assert head["containers"] == [
            {"name": "spark-vllm-dev-ray-head", "files": []},
            {"name": "spark-vllm-dev-serve",
             "files": ["/etc/spark-vllm/vllm-config/ray_non_carry_over_env_vars.json"]}]
        assert head["facts"]["model"] == {"repo": "spark-lab/tiny-moe", "commit": COMMIT}
        assert head["facts"]["image"] == "10.77.0.1:5000/spark-lab/vllm-spark:lab"
        assert head["facts"]["nodes"] == ["spark-1", "spark-2"]
        for node in ("spark-1", "spark-2"):  # the record goes with the model (destroy, a node)
            assert "/var/lib/spark-vllm/stacks/dev/vllm/deployment/containers.json" in \
                mocks.named(f"vllm-deployment-{node}").inputs["delete"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_with_mp_every_rank_is_recorded_on_its_node(build, mocks):
    h = build(2, vllm={**config_raw(2)["vllm"], "executor": "mp"})

    def check(_):
        assert _args(mocks, "vllm-deployment-spark-2")["containers"] == [
            {"name": "spark-vllm-dev-serve", "files": []}]
        assert [c["name"] for c in _args(mocks, "vllm-deployment-spark-1")["containers"]] == [
            "spark-vllm-dev-serve"]

    return settled(h).apply(check)


RAY_SHAPE = {"spark-1": ["spark-vllm-dev-ray-head", "spark-vllm-dev-serve"],
             "spark-2": ["spark-vllm-dev-ray-worker"]}


@pytest.mark.parametrize(("facts", "raw", "restore"), [
    # the gate puts back what its record holds only when it had this up's shape, the
    # containers per node the config declares: the same text whatever recon found (a no-op
    # up must not run the gate again)
    (ray_facts(), {}, {"shape": RAY_SHAPE}),
    ({"spark-1": gb10_facts("spark-1"), "spark-2": gb10_facts("spark-2", index=2)}, {},
     {"shape": RAY_SHAPE}),
    (ray_facts(), {"vllm": {**config_raw(2)["vllm"], "executor": "mp"}},
     {"shape": {"spark-1": ["spark-vllm-dev-serve"], "spark-2": ["spark-vllm-dev-serve"]}}),
    # health.onFailure: keep
    (ray_facts(), {"health": {"onFailure": "keep"}}, None),
])
@pulumi.runtime.test
def test_the_gate_puts_back_only_a_deployment_of_this_ups_shape(build, mocks, facts, raw,
                                                                 restore):
    h = build(2, facts=facts, **raw)

    def check(_):
        args = _args(mocks, "vllm-health")
        assert args["restore"] == restore
        assert args["api"] == "spark-vllm-dev-serve"
        if restore is not None and "executor" not in json.dumps(raw):
            # the head's record keeps the shape the next gate compares
            assert _args(mocks, "vllm-deployment-spark-1")["facts"]["shape"] == RAY_SHAPE

    return settled(h).apply(check)


@pulumi.runtime.test
def test_after_a_restore_the_containers_it_put_back_are_replaced_by_the_next_up(build, mocks):
    h = build(2, facts=ray_facts(head_extra={RESTORED_LABEL: "a" * 16},
                                 worker_extra={RESTORED_LABEL: "b" * 16}))

    def check(_):
        assert _labels(mocks, "vllm-serve")[AFTER_RESTORE_LABEL] == "a" * 16
        assert _labels(mocks, "ray-worker-spark-2")[AFTER_RESTORE_LABEL] == "b" * 16
        assert AFTER_RESTORE_LABEL not in _labels(mocks, "ray-head")  # it was kept

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_container_made_after_a_restore_keeps_its_label_so_nothing_diffs(build, mocks):
    h = build(2, facts=ray_facts(head_extra={AFTER_RESTORE_LABEL: "c" * 16}))

    def check(_):
        assert _labels(mocks, "vllm-serve")[AFTER_RESTORE_LABEL] == "c" * 16

    return settled(h).apply(check)


@pytest.mark.parametrize("head", [
    box("spark-vllm-dev-serve", "vllm-serve", **{RESTORED_LABEL: "x; reboot"}),
    box("spark-vllm-dev-serve", "vllm-serve", stack="spark-vllm/other",
        **{RESTORED_LABEL: "a" * 16}),
    box("spark-vllm-dev-serve", "vllm-serve"),
])
@pulumi.runtime.test
def test_no_restore_label_from_a_value_not_of_its_form_or_another_stack(build, mocks, head):
    facts = ray_facts()
    facts["spark-1"] = gb10_facts("spark-1", containers=[
        box("spark-vllm-dev-ray-head", "ray-head"), head])
    h = build(2, facts=facts)

    def check(_):
        assert AFTER_RESTORE_LABEL not in _labels(mocks, "vllm-serve")

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_failed_gate_that_put_it_back_drives_the_other_nodes_and_the_heads_failure(
        build, mocks):
    mocks.stdouts["vllm-health"] = json.dumps({
        "health": "failed", "why": "vllm serve exited",
        "restore": {"deployment": "d" * 16, "restore": "e" * 16,
                    "restored": ["spark-vllm-dev-serve"], "kept": []}})
    mocks.stdouts["vllm-deployment-spark-2"] = '{"result": "restored"}'
    h = build(2, facts=ray_facts())

    def check(_):
        worker = _args(mocks, "vllm-deployment-spark-2")
        assert " restore " in mocks.named("vllm-deployment-spark-2").inputs["create"]
        assert worker["expect"] == "d" * 16 and worker["restore"] == "e" * 16
        head_text = mocks.named("vllm-deployment-spark-1").inputs["create"]
        head = _args(mocks, "vllm-deployment-spark-1")
        assert head["mode"] == "failed" and head["nodes"] == {"spark-2": "restored"}
        assert " restored " in head_text and head_text.rstrip().endswith("exit 1")

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_service_records_and_puts_back_its_own_container_on_its_node(build, mocks,
                                                                       dependencies):
    head = gb10_facts("spark-1", containers=[
        box("spark-vllm-dev-ray-head", "ray-head"), box("spark-vllm-dev-serve", "vllm-serve"),
        box("spark-vllm-dev-embed", "vllm-service", **{"spark-vllm.service": "embed",
                                                      RESTORED_LABEL: "a" * 16})])
    facts = {**ray_facts(), "spark-1": head}
    h = build(2, facts=facts, services=[EMBED])

    def check(_):
        gate = _args(mocks, "svc-embed-health-spark-1")
        assert gate["restore"] == {"shape": {"spark-1": ["spark-vllm-dev-embed"]}}
        assert gate["dir"] == "/var/lib/spark-vllm/stacks/dev/services/embed/deployment"
        assert dependencies["svc-embed-deployment-spark-1"] >= {"svc-embed-health-spark-1"}
        assert "svc-embed-deployment-spark-1" in dependencies["gateway-health"]
        done = _args(mocks, "svc-embed-deployment-spark-1")
        assert done["containers"] == [{"name": "spark-vllm-dev-embed", "files": []}]
        assert done["facts"]["model"]["repo"] == "org/embed"
        assert _labels(mocks, "svc-embed-serve-spark-1")[AFTER_RESTORE_LABEL] == "a" * 16

    return settled(h).apply(check)


def test_on_failure_is_restore_by_default_keep_on_request_and_nothing_else():
    assert validate_config(config_raw(2)).health.on_failure == "restore"
    assert validate_config(config_raw(2, health={"onFailure": "keep"})).health.on_failure == \
        "keep"
    with pytest.raises(ConfigError, match=r"spark-vllm:health\.onFailure: got 'rollback'"):
        validate_config(config_raw(2, health={"onFailure": "rollback"}))


@pulumi.runtime.test
def test_a_container_a_restore_put_back_is_removed_right_before_the_stack_makes_its_own(
        build, mocks, dependencies):
    """Its name is the stack's container's: the docker provider's create would fail on it."""
    h = build(2, facts=ray_facts(head_extra={RESTORED_LABEL: "a" * 16}))

    def check(_):
        text = mocks.named("vllm-serve-restored").inputs["create"]
        assert "# restore " + "a" * 16 in text and "docker rm -f spark-vllm-dev-serve" in text
        assert "vllm-serve-restored" in dependencies["vllm-serve"]
        # as late as it can be: after what vLLM's container waits for (the deployment put back
        # serves until then)
        assert {"vllm-serve-check-spark-1", "ray-ready"} <= dependencies["vllm-serve-restored"]
        names = {r.name for r in mocks.resources}
        assert not {"ray-head-restored", "ray-worker-spark-2-restored"} & names

    return settled(h).apply(check)
