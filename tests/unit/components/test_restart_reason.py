"""vLLM restarts when recon finds the cluster under it broken, and only then."""

from __future__ import annotations

import pulumi
import pytest

from components.stack import vllm_restart_reason
from hostscripts import vllm
from inspection.facts import ContainerFacts
from tests.conftest import gb10_facts
from tests.unit.conftest import settled

STACK = "spark-vllm/dev"


def ray(name: str, role: str, state: str, stack: str = STACK) -> ContainerFacts:
    labels = {"spark-vllm.managed": "true", "spark-vllm.stack": stack, "spark-vllm.role": role}
    return ContainerFacts(id=name + "-id", name=name, image="img", state=state, labels=labels)


def test_healthy_cluster_needs_no_restart():
    head = gb10_facts("spark-1", containers=[ray("spark-vllm-ray-head", "ray-head", "running")])
    head = head.model_copy(update={"vllm_serve": {"spark-vllm-ray-head": True}})
    worker = gb10_facts("spark-2", index=2,
                        containers=[ray("spark-vllm-ray-worker", "ray-worker", "running")])
    assert vllm_restart_reason({"spark-1": head, "spark-2": worker}, STACK) is None


def test_first_up_on_empty_hosts_needs_no_restart():
    assert vllm_restart_reason({"spark-1": gb10_facts("spark-1")}, STACK) is None


def test_stopped_worker_or_dead_vllm_asks_for_a_restart():
    head = gb10_facts("spark-1", containers=[ray("spark-vllm-ray-head", "ray-head", "running")])
    head = head.model_copy(update={"vllm_serve": {"spark-vllm-ray-head": False}})
    worker = gb10_facts("spark-2", index=2,
                        containers=[ray("spark-vllm-ray-worker", "ray-worker", "exited")])
    reason = vllm_restart_reason({"spark-1": head, "spark-2": worker}, STACK)
    assert "spark-2: spark-vllm-ray-worker is exited" in reason
    assert "spark-1: vllm serve is not running in spark-vllm-ray-head" in reason


def test_other_stacks_containers_do_not_count():
    other = gb10_facts("spark-2", containers=[ray("x", "ray-worker", "exited", stack="p/other")])
    assert vllm_restart_reason({"spark-2": other}, STACK) is None


def test_start_script_is_idempotent_and_carries_no_recon_state():
    """The reason is not in the script: the script would change back once vLLM runs again."""
    text = vllm.vllm_start("c", ["vllm", "serve", "m"], "http://127.0.0.1:8000", "m", "hi",
                              60, "ab" * 32)
    # a running vLLM with the same argv hash and API key is kept, not restarted
    assert "not restarted" in text and "kill -0" in text and "cmp -s" in text
    assert "restart" not in text.split("docker exec")[0]


@pytest.fixture
def serve_registration(build, ignored_changes):
    """build the 2-node stack with the given head/worker facts -> (handles, ignore_changes)."""

    def run(head, worker):
        h = build(2, facts={"spark-1": head, "spark-2": worker})
        return h, ignored_changes

    return run


def _cluster(vllm_alive: bool, worker_state: str):
    head = gb10_facts("spark-1", containers=[ray("spark-vllm-ray-head", "ray-head", "running")])
    head = head.model_copy(update={"vllm_serve": {"spark-vllm-ray-head": vllm_alive}})
    worker = gb10_facts("spark-2", index=2,
                        containers=[ray("spark-vllm-ray-worker", "ray-worker", worker_state)])
    return head, worker


@pulumi.runtime.test
def test_healthy_cluster_keeps_the_state_marker(serve_registration, mocks):
    h, ignored = serve_registration(*_cluster(True, "running"))

    def check(_):
        serve = mocks.named("vllm-serve").inputs
        assert serve["triggers"] == ["none"]
        assert "environment" not in serve, "sshd may refuse it (pulumi-command then fails)"
        assert ignored["vllm-serve"] == ["triggers"], "a healthy cluster must not diff"

    return settled(h).apply(check)


@pulumi.runtime.test
def test_broken_cluster_sets_a_new_marker_so_vllm_starts_again(serve_registration, mocks):
    h, ignored = serve_registration(*_cluster(False, "exited"))

    def check(_):
        [marker] = mocks.named("vllm-serve").inputs["triggers"]
        assert "spark-2: spark-vllm-ray-worker is exited" in marker and " @" in marker
        assert ignored["vllm-serve"] == []
        # and the start script is the healthy one: only the marker differs
        assert "restart" not in mocks.named("vllm-serve").inputs["create"].split("docker exec")[0]

    return settled(h).apply(check)
