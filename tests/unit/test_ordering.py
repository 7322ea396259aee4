"""Ordering on the hosts: image and model before containers, head before workers, vLLM last.

Pulumi mocks do not record dependencies, so the components expose the `depends_on` list they
pass to each child (`RayCluster.depends_on`, `VllmServer.depends_on`), and these tests check
those lists hold the right resource objects; the lists are what the engine receives.
"""

from __future__ import annotations

import pulumi
import pytest

from tests.unit.conftest import settled


def _ids(resources):
    return {id(r) for r in resources}


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_ray_containers_wait_for_image_model_and_head(build, mocks, n):
    h = build(n)

    def check(_):
        head_deps = _ids(h.ray.depends_on["ray-head"])
        assert id(h.image) in head_deps and id(h.model) in head_deps
        for w in h.ray.workers:
            deps = _ids(h.ray.depends_on[f"ray-worker-{w}"])
            assert id(h.ray.head) in deps, "worker must start after the head"
            assert id(h.image) in deps and id(h.model) in deps
        assert _ids(h.ray.depends_on["ray-ready"]) == _ids([h.ray.head, *h.ray.workers.values()])

    return settled(h).apply(check)


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_vllm_waits_for_every_worker_and_readiness(build, mocks, n):
    h = build(n)

    def check(_):
        deps = _ids(h.vllm.depends_on["vllm-serve"])
        assert id(h.ray.ready) in deps
        assert id(h.ray.head) in deps
        assert _ids(h.ray.workers.values()) <= deps
        assert len(h.ray.workers) == n - 1

    return settled(h).apply(check)


@pulumi.runtime.test
def test_model_steps_are_chained(build, mocks):
    h = build(3)

    def check(_):
        # the head fetches, the seeder starts after the fetch, each worker syncs after the seeder,
        # the seeder stops after every sync, and verify follows the node's own fetch/sync
        d = h.model.depends_on
        assert d["model-seed"] == [h.model.fetch]
        for w in ("spark-2", "spark-3"):
            assert d[f"model-sync-{w}"] == [h.model.seeder[0]]
            assert d[f"model-verify-{w}"] == [h.model.syncs[w]]
        assert _ids(d["model-seed-stop"]) == _ids(h.model.syncs.values())
        assert d["model-verify-spark-1"] == [h.model.fetch]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_stopped_foreign_containers_come_before_ray(build, mocks, gb10_facts):
    from components.facts import ContainerFacts

    vllm_node = ContainerFacts(id="abc123", name="vllm_node", image="vllm:old", state="running",
                               memory_bytes=98 * 1024**3)
    facts = {
        "spark-1": gb10_facts("spark-1", index=1, containers=[vllm_node]),
        "spark-2": gb10_facts("spark-2", index=2),
    }

    class Plan:
        stop_containers = {"spark-1": [vllm_node]}

    h = build(2, facts=facts, plan=Plan())

    def check(_):
        stop = h.nodes["spark-1"].stopped
        assert len(stop) == 1
        for deps in (h.ray.depends_on["ray-head"], h.ray.depends_on["ray-worker-spark-2"]):
            assert id(stop[0]) in _ids(deps)
        cmd = mocks.named("spark-1-stop-vllm_node").inputs
        assert "docker stop vllm_node" in cmd["create"]
        assert "docker start vllm_node" in cmd["delete"]  # destroy gives it back
        assert "/var/lib/spark-vllm/stopped/vllm_node" in cmd["create"]

    return settled(h).apply(check)
