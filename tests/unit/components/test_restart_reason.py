"""The health gate looks at vLLM again when recon finds the stack's vLLM or Ray containers not
running, and only then."""

from __future__ import annotations

import pulumi
import pytest

from components.stack import vllm_restart_reason
from hostscripts import vllm
from hostscripts.deployment import GateRestore, Held, NodeDeployment
from inspection.facts import ContainerFacts
from tests.conftest import gb10_facts
from tests.unit.conftest import settled

STACK = "spark-vllm/dev"


def box(name: str, role: str, state: str, stack: str = STACK) -> ContainerFacts:
    labels = {"spark-vllm.managed": "true", "spark-vllm.stack": stack, "spark-vllm.role": role}
    return ContainerFacts(id=name + "-id", name=name, image="img", state=state, labels=labels)


def _cluster(vllm_state: str, worker_state: str):
    head = gb10_facts("spark-1", containers=[box("spark-vllm-dev-ray-head", "ray-head", "running"),
                                             box("spark-vllm-dev-serve", "vllm-serve", vllm_state)])
    worker = gb10_facts("spark-2", index=2,
                        containers=[box("spark-vllm-dev-ray-worker", "ray-worker", worker_state)])
    return head, worker


def test_healthy_cluster_needs_no_restart():
    head, worker = _cluster("running", "running")
    assert vllm_restart_reason({"spark-1": head, "spark-2": worker}, STACK) is None


def test_first_up_on_empty_hosts_needs_no_restart():
    assert vllm_restart_reason({"spark-1": gb10_facts("spark-1")}, STACK) is None


def test_stopped_worker_or_vllm_container_asks_for_a_look():
    head, worker = _cluster("restarting", "exited")
    reason = vllm_restart_reason({"spark-1": head, "spark-2": worker}, STACK)
    assert "spark-2: spark-vllm-dev-ray-worker is exited" in reason
    assert "spark-1: spark-vllm-dev-serve is restarting" in reason


def test_other_stacks_containers_do_not_count():
    other = gb10_facts("spark-2", containers=[box("x", "ray-worker", "exited", stack="p/other"),
                                              box("y", "vllm-serve", "exited", stack="p/other")])
    assert vllm_restart_reason({"spark-2": other}, STACK) is None


def test_gate_starts_a_stopped_container_and_carries_no_recon_state():
    """The reason is not in the script: the script would change back once vLLM runs again."""
    keep = GateRestore(NodeDeployment("/d", (Held("c"),)), api="c", shape={"spark-1": ["c"]},
                       on_failure="keep")
    text = vllm.vllm_health_gate("c", "head", "ab" * 32, "http://127.0.0.1:8000", "m", "hi", 60,
                                 key_file="/k", deployment=keep)
    assert "docker start c" in text and "restart" not in text.split("docker exec")[0]


@pytest.fixture
def serve_registration(build, ignored_changes):
    """build the 2-node stack with the given head/worker facts -> (handles, ignore_changes)."""

    def run(head, worker):
        h = build(2, facts={"spark-1": head, "spark-2": worker})
        return h, ignored_changes

    return run


@pulumi.runtime.test
def test_healthy_cluster_keeps_the_state_marker(serve_registration, mocks):
    h, ignored = serve_registration(*_cluster("running", "running"))

    def check(_):
        gate = mocks.named("vllm-health").inputs
        assert gate["triggers"] == ["none"]
        assert "environment" not in gate, "sshd may refuse it (pulumi-command then fails)"
        assert ignored["vllm-health"] == ["triggers"], "a healthy cluster must not diff"

    return settled(h).apply(check)


@pulumi.runtime.test
def test_broken_cluster_sets_a_new_marker_so_the_gate_runs_again(serve_registration, mocks):
    h, ignored = serve_registration(*_cluster("exited", "exited"))

    def check(_):
        [marker] = mocks.named("vllm-health").inputs["triggers"]
        assert "spark-2: spark-vllm-dev-ray-worker is exited" in marker and " @" in marker
        assert "spark-1: spark-vllm-dev-serve is exited" in marker
        assert ignored["vllm-health"] == []
        # the gate's script is the healthy one: only the marker differs
        assert "restart" not in mocks.named("vllm-health").inputs["create"].split("docker exec")[0]

    return settled(h).apply(check)


@pytest.mark.parametrize("stopped", ["headless", "head", "none"])
@pulumi.runtime.test
def test_mp_rank_found_stopped_restarts_every_rank(build, ignored_changes, mocks, stopped):
    """vllm.executor mp: a rank found stopped restarts the head's vLLM (the headless follow it),
    through an update of `vllm-ranks-restart` (its stdin is the reason); a healthy cluster
    keeps the state's stdin, so nothing diffs."""
    head = gb10_facts("spark-1", containers=[
        box("spark-vllm-dev-serve", "vllm-serve", "exited" if stopped == "head" else "running")])
    worker = gb10_facts("spark-2", index=2, containers=[
        box("spark-vllm-dev-serve", "vllm-serve", "exited" if stopped == "headless" else "running")])
    h = build(2, facts={"spark-1": head, "spark-2": worker}, vllm={"executor": "mp"})

    def check(_):
        restart = mocks.named("vllm-ranks-restart")
        gate = mocks.named("vllm-health")
        if stopped == "none":
            assert restart.inputs["stdin"] == "none"
            assert ignored_changes["vllm-ranks-restart"] == ["stdin"]
            return
        node = "spark-2" if stopped == "headless" else "spark-1"
        assert restart.inputs["stdin"].startswith(f"{node}: spark-vllm-dev-serve is exited @")
        assert ignored_changes["vllm-ranks-restart"] == []
        assert restart.inputs["stdin"] == gate.inputs["triggers"][0]  # the gate runs after it
        assert "docker restart -t 60 spark-vllm-dev-serve" in restart.inputs["update"]

    return settled(h).apply(check)


# --- Again.because: recon's reason as a gate's marker (components/rerun.py) -------------------


def test_no_reason_keeps_the_states_marker():
    from components.rerun import Again
    again = Again.because(None, now=lambda: 1 / 0)  # the clock is not read
    assert (again.triggers, again.ignore_changes, again.marker) == (["none"], ["triggers"], "none")


def test_a_reason_is_a_marker_never_seen_before():
    from components.rerun import Again
    ticks = iter([1, 2])
    first = Again.because("spark-vllm-t-gateway is exited", now=lambda: next(ticks))
    second = Again.because("spark-vllm-t-gateway is exited", now=lambda: next(ticks))
    assert first.triggers == ["spark-vllm-t-gateway is exited @1"] and first.ignore_changes is None
    assert first.marker == "spark-vllm-t-gateway is exited @1" and second.marker.endswith(" @2")
    # the real clock: nanoseconds since the epoch
    marker = Again.because("x").marker
    assert marker.startswith("x @") and int(marker[3:]) > 1_700_000_000 * 10**9
