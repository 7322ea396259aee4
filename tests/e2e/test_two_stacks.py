"""Two stacks side by side on the lab's two nodes, with the real vLLM: `dev` (Ray, TP=2, vLLM on
port 8000, its gateway on 8080) and `side` (vLLM's own multi-node executor, TP=2, vLLM on port
8010, its own master port, its gateway on 8090). Every
container and host file a stack owns is named by its stack (`spark-vllm-<stack>-*`,
`/var/lib/spark-vllm/stacks/<stack>/`), so neither touches the other: bringing `side` up keeps
every container of `dev` (same IDs and start times), both serve, and destroying `side` leaves
`dev` serving. What would collide is refused by preflight before any change, naming the other
stack: a port the other stack listens on, and a second Ray cluster on the same nodes (Ray's
fixed default ports). Ordered on purpose; both stacks are destroyed at the end.
"""

from __future__ import annotations

import pulumi.automation as auto
import pytest

from lab.deployments import complete, destroy_unless_kept, new_deployment

pytestmark = [pytest.mark.lab, pytest.mark.engine]

NODES = ("spark-1", "spark-2")
KEY = "/var/lib/spark-vllm/stacks/{stack}/vllm/api-key"


@pytest.fixture(scope="module")
def pair(stack, lab_cfg, tmp_path_factory):
    side = new_deployment(tmp_path_factory.mktemp("e2e-side"), lab_cfg, stack_name="side")
    side.set("vllm.executor", "mp")
    side.set("vllm.port", 8010)
    side.set("vllm.masterPort", 29511)
    side.set("gateway.port", 8090)
    yield stack, side
    destroy_unless_kept(side)


def test_a_second_stack_comes_up_beside_the_first_and_touches_nothing_of_it(pair):
    dev, side = pair
    before = dev.snapshot()
    assert set(before["spark-1"]) == {"spark-vllm-dev-serve", "spark-vllm-dev-ray-head",
                                      "spark-vllm-dev-gateway"}
    assert set(before["spark-2"]) == {"spark-vllm-dev-ray-worker"}

    side.timed_up("two stacks side (mp) beside it")
    assert dev.snapshot() == before  # dev's containers: same IDs, same start times
    assert set(side.containers("spark-1")) == {"spark-vllm-side-serve", "spark-vllm-side-gateway"}
    assert set(side.containers("spark-2")) == {"spark-vllm-side-serve"}
    # each stack's clients use its own gateway
    assert ":8090/" in side.endpoint() + "/" and ":8080/" in dev.endpoint() + "/"
    assert complete(dev) and complete(side)
    # each stack's key in its own folder; neither stack's recon sees a change to make
    keys = {s: dev.ssh("spark-1", f"cat {KEY.format(stack=s)}").strip() for s in ("dev", "side")}
    assert keys == {"dev": dev.api_key(), "side": side.api_key()} and keys["dev"] != keys["side"]
    dev.run("preview", expect_no_changes=True)
    side.run("preview", expect_no_changes=True)


def test_what_would_collide_is_refused_before_any_change(pair):
    dev, side = pair
    before = {**dev.snapshot(), **{f"side/{n}": side.containers(n) for n in NODES}}
    side.set("vllm.port", 8000)  # dev's vLLM listens there
    with pytest.raises(auto.CommandError) as port:
        side.run("preview")
    assert "port 8000 is taken by spark-vllm-dev-serve of the stack spark-vllm/dev" in str(
        port.value)
    side.set("vllm.port", 8010)
    side.set("gateway.port", 8080)  # dev's gateway listens there, on every address of the head
    with pytest.raises(auto.CommandError) as gateway:
        side.run("preview")
    assert "port 8080 is taken by spark-vllm-dev-gateway of the stack spark-vllm/dev" in str(
        gateway.value)
    side.set("gateway.port", 8090)
    side.set("vllm.executor", "ray")  # a second Ray cluster on dev's nodes
    side.set("ray.port", 6389)
    with pytest.raises(auto.CommandError) as ray:
        side.run("preview")
    assert "spark-vllm/dev" in str(ray.value) and "Ray" in str(ray.value)
    side.set("vllm.executor", "mp")
    assert {**dev.snapshot(), **{f"side/{n}": side.containers(n) for n in NODES}} == before
    side.run("preview", expect_no_changes=True)


def test_destroying_one_stack_leaves_the_other_serving(pair):
    dev, side = pair
    before = dev.snapshot()
    side.run("destroy")
    for n in NODES:
        assert side.containers(n) == {}
    assert dev.snapshot() == before
    assert dev.ssh("spark-1", f"test -s {KEY.format(stack='dev')} && echo ok").strip() == "ok"
    assert dev.ssh("spark-1", f"ls {KEY.format(stack='side')} 2>/dev/null || true") == ""
    assert complete(dev)
    dev.run("preview", expect_no_changes=True)
