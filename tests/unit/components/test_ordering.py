"""Ordering on the hosts: image and model before containers, head before workers, vLLM last.

The dependencies are read from what the engine receives: the `dependencies` of each
RegisterResource request the mock monitor gets (tests/unit/conftest.py). A component in
`depends_on` reaches the engine as its children, so the sets below name leaf resources.
"""

from __future__ import annotations

import pulumi
import pytest

from inspection.facts import ContainerFacts
from inspection.preflight import Plan
from tests.unit.conftest import settled


def _model_steps(n: int) -> set[str]:
    workers = [f"spark-{i}" for i in range(2, n + 1)]
    return {"model-fetch", "model-seed", "model-seed-stop", "model-verify-spark-1",
            *(f"model-sync-{w}" for w in workers), *(f"model-verify-{w}" for w in workers)}


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_ray_containers_wait_for_image_model_and_head(build, mocks, dependencies, n):
    h = build(n)

    def check(_):
        images = {f"image-spark-{i}" for i in range(1, n + 1)}
        assert images | _model_steps(n) <= dependencies["ray-head"]
        for w in h.ray.workers:
            deps = dependencies[f"ray-worker-{w}"]
            assert "ray-head" in deps, "worker must start after the head"
            assert images | _model_steps(n) <= deps
        assert dependencies["ray-ready"] == {"ray-head", *(f"ray-worker-{w}" for w in h.ray.workers)}

    return settled(h).apply(check)


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_vllm_waits_for_every_worker_and_readiness(build, mocks, dependencies, n):
    h = build(n)

    def check(_):
        deps = dependencies["vllm-serve"]
        assert {"ray-ready", "ray-head"} <= deps
        assert {f"ray-worker-{w}" for w in h.ray.workers} <= deps
        assert len(h.ray.workers) == n - 1

    return settled(h).apply(check)


@pulumi.runtime.test
def test_model_steps_are_chained(build, mocks, dependencies):
    h = build(3)

    def check(_):
        # the head fetches, the seeder starts after the fetch, each worker syncs after the seeder,
        # the seeder stops after every sync, and verify follows the node's own fetch/sync
        # (the image-* entries come from the image IDs the commands' scripts are built from)
        d = dependencies
        assert d["model-seed"] - {"image-spark-1"} == {"model-fetch"}
        for w in ("spark-2", "spark-3"):
            assert d[f"model-sync-{w}"] - {f"image-{w}"} == {"model-seed"}
            assert d[f"model-verify-{w}"] == {f"model-sync-{w}"}
        assert d["model-seed-stop"] - {"image-spark-1"} == {"model-sync-spark-2",
                                                            "model-sync-spark-3"}
        assert d["model-verify-spark-1"] == {"model-fetch"}

    return settled(h).apply(check)


@pulumi.runtime.test
def test_stopped_foreign_containers_come_before_ray(build, mocks, dependencies, gb10_facts):
    vllm_node = ContainerFacts(id="abc123", name="vllm_node", image="vllm:old", state="running",
                               memory_bytes=98 * 1024**3)
    facts = {
        "spark-1": gb10_facts("spark-1", index=1, containers=[vllm_node]),
        "spark-2": gb10_facts("spark-2", index=2),
    }
    h = build(2, facts=facts, plan=Plan(stop_containers={"spark-1": [vllm_node]}))

    def check(_):
        stop = h.nodes["spark-1"].stopped
        assert len(stop) == 1
        for container in ("ray-head", "ray-worker-spark-2"):
            assert "spark-1-stop-vllm_node" in dependencies[container]
        cmd = mocks.named("spark-1-stop-vllm_node").inputs
        assert "docker stop vllm_node" in cmd["create"]
        assert "docker start vllm_node" in cmd["delete"]  # destroy gives it back
        assert "/var/lib/spark-vllm/stopped/vllm_node" in cmd["create"]

    return settled(h).apply(check)
