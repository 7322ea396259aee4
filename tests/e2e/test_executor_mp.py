"""`vllm.executor: mp` on the lab with the real vLLM: vLLM's own multi-node executor, no Ray.

One vLLM container per node (`spark-vllm-serve`): the head's serves the API, the others run
`--headless`. Ordered on purpose, one deployment for the 2-node tests (brought up by the first,
destroyed by the last); the last test grows the lab to 3 nodes for a TP 3 stack from empty and
shrinks it back to 2, even on failure. Every `up` prints its wall time (`WALL ...`).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from lab.deployments import LAB_CACHE, complete, hf_file_bytes, lab, new_deployment, set_nodes

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER, NEW = "spark-1", "spark-2", "spark-3"
SERVE = "spark-vllm-serve"


@pytest.fixture(scope="module")
def mp(lab_cfg, tmp_path_factory):
    import pulumi.automation as auto

    d = new_deployment(tmp_path_factory.mktemp("e2e-mp"), lab_cfg)
    d.set("vllm.executor", "mp")
    yield d
    if os.environ.get("E2E_KEEP") != "1":
        try:
            d.stack.destroy(on_output=print)
        except auto.CommandError as e:
            print(f"cleanup destroy failed: {e}")


def _up(d, what: str):
    t0 = time.monotonic()
    r = d.run("up")
    print(f"WALL mp {what}: {time.monotonic() - t0:.1f} s")
    assert r.summary.result == "succeeded"
    return d.ops()


def _argv(d, node: str) -> list[str]:
    return json.loads(d.ssh(node, f"docker inspect -f '{{{{json .Config.Cmd}}}}' {SERVE}"))


def _running(d, nodes) -> dict[str, set[str]]:
    return {n: set(d.containers(n)) for n in nodes}


def test_mp_up_from_empty_serves(mp):
    d = mp
    ops = _up(d, "up from empty")
    assert {"vllm-serve", f"vllm-serve-{WORKER}", "vllm-health"} <= set(ops), ops
    assert not any(k.startswith("ray-") for k in ops), ops
    # nothing of Ray's on either node: one vLLM container each
    assert _running(d, (HEAD, WORKER)) == {HEAD: {SERVE}, WORKER: {SERVE}}
    head, worker = _argv(d, HEAD), _argv(d, WORKER)
    assert head[head.index("--distributed-executor-backend") + 1] == "mp"
    assert head[head.index("--node-rank") + 1] == "0" and "--headless" not in head
    assert worker[worker.index("--node-rank") + 1] == "1" and "--headless" in worker
    assert complete(d)


def test_mp_second_up_changes_nothing(mp):
    d = mp
    snap = d.snapshot()
    d.run("preview", expect_no_changes=True)
    ops = _up(d, "no-op")
    assert ops == {}, ops
    assert d.snapshot() == snap, "a no-op up restarted something"


def test_mp_serve_flag_replaces_only_the_vllm_containers(mp):
    d = mp
    before = d.snapshot()
    d.set("vllm.maxNumSeqs", 6)
    ops = _up(d, "serve flag")
    assert ops.get("vllm-serve") == "replace" and ops.get(f"vllm-serve-{WORKER}") == "replace", ops
    assert all(k.startswith("vllm") for k in ops), ops
    after = d.snapshot()
    assert all(after[n][SERVE][0] != before[n][SERVE][0] for n in (HEAD, WORKER))
    assert _argv(d, WORKER)[_argv(d, WORKER).index("--max-num-seqs") + 1] == "6"
    assert complete(d)


def test_mp_drift_headless_stopped_is_found_and_repaired(mp):
    """`docker kill` is a manual stop (Docker does not restart it): refresh finds the headless
    vLLM gone; the `up` recreates it and replaces the head's vLLM (which would otherwise serve on
    with a dead rank until its next request fails)."""
    d = mp
    lab("kill", WORKER, SERVE)
    assert d.run("refresh").summary.result == "succeeded"
    d.run("preview")
    assert f"vllm-serve-{WORKER}" in d.ops(), d.ops()
    ops = _up(d, "drift repair")
    assert f"vllm-serve-{WORKER}" in ops and ops.get("vllm-serve") == "replace", ops
    assert all(k.startswith("vllm") for k in ops), ops
    assert complete(d)
    d.run("preview", expect_no_changes=True)


def test_mp_switch_to_ray_and_back_moves_neither_image_nor_model(mp):
    """The change table's executor row: Ray's containers come (or go) and the vLLM containers
    are replaced; no image pull, no model transfer."""
    d = mp
    images = d.stack.outputs()["imageIds"].value
    hub = hf_file_bytes()
    d.set("vllm.executor", "ray")
    ops = _up(d, "mp -> ray")
    assert {"ray-head", f"ray-worker-{WORKER}", "ray-ready"} <= set(ops), ops
    assert ops.get(f"vllm-serve-{WORKER}") == "delete" and ops.get("vllm-serve") == "replace", ops
    assert not any(k.startswith(("image-", "model-")) for k in ops), ops
    assert complete(d)
    d.set("vllm.executor", "mp")
    ops = _up(d, "ray -> mp")
    assert ops.get("ray-head") == "delete" and ops.get(f"vllm-serve-{WORKER}") == "create", ops
    assert not any(k.startswith(("image-", "model-")) for k in ops), ops
    assert _running(d, (HEAD, WORKER)) == {HEAD: {SERVE}, WORKER: {SERVE}}
    assert complete(d)
    assert d.stack.outputs()["imageIds"].value == images and hf_file_bytes() == hub


def test_mp_destroy_keeps_the_model(mp):
    d = mp
    d.run("destroy")
    for n in (HEAD, WORKER):
        assert d.containers(n) == {}, f"{n}: managed containers left after destroy"
        assert "models--spark-lab--tiny-moe" in d.ssh(n, "ls /root/.cache/huggingface/hub")


def test_mp_three_nodes_from_empty_serves_with_tp3(lab_cfg, tmp_path_factory):
    import pulumi.automation as auto

    try:
        lab("up", "--nodes", "3")
        cfg = json.loads((LAB_CACHE / "stack.json").read_text())
        d = new_deployment(tmp_path_factory.mktemp("e2e-mp3"), cfg)
        set_nodes(d, cfg["nodes"][:3])
        d.set("vllm.executor", "mp")
        try:
            ops = _up(d, "3 nodes from empty")
            assert {"vllm-serve", f"vllm-serve-{WORKER}", f"vllm-serve-{NEW}"} <= set(ops), ops
            assert not any(k.startswith("ray-") for k in ops), ops
            argv = _argv(d, NEW)
            assert argv[argv.index("--nnodes") + 1] == "3"
            assert argv[argv.index("--node-rank") + 1] == "2" and "--headless" in argv
            assert argv[argv.index("--tensor-parallel-size") + 1] == "3"
            assert complete(d)
            d.run("preview", expect_no_changes=True)
        finally:
            try:
                d.run("destroy")
            except auto.CommandError as e:
                print(f"cleanup destroy failed: {e}")
    finally:
        lab("up", "--nodes", os.environ.get("E2E_NODES", "2"))
