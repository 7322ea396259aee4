"""vLLM restarts when recon finds the cluster under it broken, and only then."""

from __future__ import annotations

from components import scripts
from components.facts import ContainerFacts
from components.stack import vllm_restart_reason
from tests.conftest import gb10_facts

STACK = "spark-vllm/dev"


def ray(name: str, role: str, state: str, stack: str = STACK) -> ContainerFacts:
    labels = {"spark-vllm.managed": "true", "spark-vllm.stack": stack, "spark-vllm.role": role}
    return ContainerFacts(id=name + "-id", name=name, image="img", state=state, labels=labels)


def test_healthy_cluster_needs_no_restart():
    head = gb10_facts("spark-1", containers=[ray("spark-vllm-ray-head", "ray-head", "running")])
    head = head.model_copy(update={"vllm_serve": {"spark-vllm-ray-head": True}})
    worker = gb10_facts("spark-2", index=2,
                        containers=[ray("spark-vllm-ray-worker", "ray-worker", "running")])
    assert vllm_restart_reason({"spark-1": head, "spark-2": worker}, STACK) == "none"


def test_first_up_on_empty_hosts_needs_no_restart():
    assert vllm_restart_reason({"spark-1": gb10_facts("spark-1")}, STACK) == "none"


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
    assert vllm_restart_reason({"spark-2": other}, STACK) == "none"


def test_reason_is_part_of_the_start_script_and_the_script_is_idempotent():
    text = scripts.vllm_start("c", ["vllm", "serve", "m"], "http://127.0.0.1:8000", "m", "hi",
                              60, "ids", "spark-2: w is exited")
    assert "# restart requested by recon: spark-2: w is exited" in text
    # a running vLLM with the same argv hash and API key is kept, not restarted
    assert "not restarted" in text and "kill -0" in text and "cmp -s" in text
    same = scripts.vllm_start("c", ["vllm", "serve", "m"], "http://127.0.0.1:8000", "m", "hi",
                              60, "ids")
    assert "# restart requested by recon: none" in same
