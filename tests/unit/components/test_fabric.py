"""Issue 17: the fabric between nodes is pinged at the MTU before anything travels on it."""

from __future__ import annotations

import pulumi

from hostscripts.fabric import FabricPair, fabric_check
from tests.unit.conftest import settled


@pulumi.runtime.test
def test_every_node_pings_every_other_node_on_each_twin(build, mocks):
    h = build(3)

    def check(_):
        pairs = h.nccl.pairs
        assert pairs["spark-2"] == [
            FabricPair("enp1s0f1np1", "spark-1", "192.168.177.11"),
            FabricPair("enp1s0f1np1", "spark-3", "192.168.177.13"),
            FabricPair("enP2p1s0f1np1", "spark-1", "192.168.178.11"),
            FabricPair("enP2p1s0f1np1", "spark-3", "192.168.178.13"),
        ]
        # each direction is its own node's command
        for n in ("spark-1", "spark-2", "spark-3"):
            cmd = mocks.named(f"nccl-fabric-{n}").inputs["create"]
            assert cmd == fabric_check(n, pairs[n], 9000)
            assert "ping -n -q -M do -c 3" in cmd and "size=8972" in cmd
        assert "check enP2p1s0f1np1 spark-2 192.168.178.12" in \
            mocks.named("nccl-fabric-spark-3").inputs["create"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_twin_without_carrier_is_no_pair(build, mocks, gb10_facts):
    facts = {f"spark-{i}": gb10_facts(f"spark-{i}", index=i) for i in (1, 2)}
    down = facts["spark-2"]
    down = down.model_copy(update={"interfaces": [
        i.model_copy(update={"carrier": False}) if i.name == "enP2p1s0f1np1" else i
        for i in down.interfaces]})
    h = build(2, facts={**facts, "spark-2": down})

    def check(_):
        assert h.nccl.pairs["spark-1"] == [FabricPair("enp1s0f1np1", "spark-2", "192.168.177.12")]
        assert h.nccl.pairs["spark-2"] == [FabricPair("enp1s0f1np1", "spark-1", "192.168.177.11")]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_image_and_model_wait_for_the_fabric_check(build, mocks, dependencies):
    h = build(2, image={"source": "head"})

    def check(_):
        fabric = {"nccl-fabric-spark-1", "nccl-fabric-spark-2"}
        for leaf in ("image-spark-1", "image-spark-2", "image-seed", "image-copy-spark-2"):
            assert fabric <= dependencies[leaf], leaf
        # the model fan-out runs the image (its ID is an input), so it comes after both
        assert "image-spark-1" in dependencies["model-fetch"]
        assert "image-spark-2" in dependencies["model-sync-spark-2"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_fabric_check_text_changes_only_with_nodes_fabric_or_mtu(build, mocks):
    """Its text is its only input, so an unchanged fabric re-runs nothing on a no-op `up`."""
    a = fabric_check("spark-1", [FabricPair("enp1s0f1np1", "spark-2", "192.168.177.12")], 9000)
    assert a == fabric_check("spark-1", [FabricPair("enp1s0f1np1", "spark-2", "192.168.177.12")],
                             9000)
    assert a != fabric_check("spark-1", [FabricPair("enp1s0f1np1", "spark-2", "192.168.177.12")],
                             8000)
    h = build(2, nccl={"minMtu": 4000})

    def check(_):
        assert "mtu=4000; size=3972" in mocks.named("nccl-fabric-spark-1").inputs["create"]

    return settled(h).apply(check)

