"""Two stacks on the lab's two nodes: what would collide with the shared stack `dev` (Ray, TP=2,
vLLM on port 8000, its gateway on 8080) is refused by preflight before any change, naming the
other stack. `side` is a second stack on the same nodes (vLLM's own multi-node executor, vLLM on
port 8010, its own master port, its gateway on 8090) that is only ever previewed: a port dev
listens on (vLLM's, the gateway's) and a second Ray cluster on dev's nodes (Ray's fixed default
ports) each fail its preview, dev's containers untouched; its own ports pass.

A second stack brought up beside dev, serving with its own containers, host files and API key,
touching nothing of dev, and destroyed without touching dev is the promotion round trip's
staging (tests/e2e/test_promote_round_trip.py): it is that case with promotion on top, so the
suite converges one second stack from empty, not two.
"""

from __future__ import annotations

import pulumi.automation as auto
import pytest

from lab.deployments import new_deployment

pytestmark = [pytest.mark.lab, pytest.mark.engine]

NODES = ("spark-1", "spark-2")


@pytest.fixture(scope="module")
def pair(stack, lab_cfg, tmp_path_factory):
    side = new_deployment(tmp_path_factory.mktemp("e2e-side"), lab_cfg, stack_name="side")
    side.set("vllm.executor", "mp")
    side.set("vllm.port", 8010)
    side.set("vllm.masterPort", 29511)
    side.set("gateway.port", 8090)
    return stack, side  # only previewed: nothing to destroy


def test_what_would_collide_is_refused_before_any_change(pair):
    dev, side = pair
    before = dev.snapshot()
    assert set(before["spark-1"]) == {"spark-vllm-dev-serve", "spark-vllm-dev-ray-head",
                                      "spark-vllm-dev-gateway"}
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
    # its own ports: the preview passes and would create the whole stack beside dev
    r = side.run("preview")
    assert r.change_summary.get("create", 0) > 10, r.change_summary
    assert dev.snapshot() == before
    assert all(side.containers(n) == {} for n in NODES)
    dev.run("preview", expect_no_changes=True)
