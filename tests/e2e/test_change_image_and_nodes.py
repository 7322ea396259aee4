"""The last two rows of the change table (image, add a node), and a node leaving, on a 3-node lab.

| change        | allowed to happen                                    | must not happen          |
| image         | pull/copy, all containers restart                    | model transfer           |
| add a node    | the new node is prepared; serving restarts, new size | re-download from the hub |
| remove a node | its containers go; serving restarts, new size        | anything on the others but Ray and vLLM |

On the session's shared stack (tests/e2e/conftest.py: converged, 2 nodes). The module grows the
lab to 3 nodes (the lab lock is re-entrant in this process) and shrinks it back to 2 at the end,
even on failure. Ordered on purpose:
1. the stack grows to spark-3 (TP 3): spark-3 is new (the lab creates it empty), so its image
   is pulled and its model copy must come over the fabric from the head, not from the hub;
2. image.ref moves first to an image whose vLLM fails while it loads the model: the `up` fails
   and puts the last verified deployment back on all three nodes (issue 49, the time without
   service measured); then to a second image (the lab image plus a label: another image ID,
   the same layers) on all three nodes. In this order spark-3 pulls the lab image itself first, which
   the lab keeps on it across runs (lab/hosts.py scrub_docker), so a later run's add-node pulls
   nothing and the second image's pull is a manifest;
3. the stack shrinks back to spark-1 and spark-2 (TP 2), for the modules after this one.
(A 3-node stack from empty is `make bench`'s scaling section.) Every `up` prints its wall time.

Known gap, asserted harmless rather than hidden: the image change re-runs model-fetch, model-seed,
model-sync and model-seed-stop (their scripts name the image ID); the test asserts they move no
model bytes (hub `/resolve/` bytes unchanged, the sync reports bytesMoved 0) and that the seeder
is stopped again afterwards (it was not, before 48a1327).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from lab.deployments import (
    LAB_CACHE,
    Deployment,
    Outage,
    complete,
    faulty_image,
    hf_file_bytes,
    lab,
    second_image,
    set_nodes,
    sync_bytes_moved,
)
from tests import reporting

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER, NEW = "spark-1", "spark-2", "spark-3"
SERVE = "spark-vllm-dev-serve"  # vLLM's own container on the head (a Ray driver)
MODEL_DIR = "/root/.cache/huggingface/hub/models--spark-lab--tiny-moe"
V2_REPO = "10.77.0.1:5000/spark-lab/vllm-spark-e2e"
FABRIC_IF = "enp1s0f1np1"


# ------------------------------------------------------------------ fixtures and helpers
@pytest.fixture(scope="module")
def lab3(lab_cfg):
    """The lab with 3 nodes for this module; back to 2 nodes afterwards, whatever happened."""
    t0 = time.monotonic()
    try:
        lab("up", "--nodes", "3")
        print(f"lab up --nodes 3: {time.monotonic() - t0:.1f} s")
        cfg = json.loads((LAB_CACHE / "stack.json").read_text())
        assert [n["name"] for n in cfg["nodes"]] == [HEAD, WORKER, NEW], cfg["nodes"]
        yield cfg
    finally:
        t0 = time.monotonic()
        lab("up", "--nodes", os.environ.get("E2E_NODES", "2"))
        n = os.environ.get("E2E_NODES", "2")
        print(f"lab back to {n} nodes: {time.monotonic() - t0:.1f} s")


@pytest.fixture(scope="module", autouse=True)
def _converged_without_spark3_before_it_goes(shared, stack, lab3, request):
    """Whatever failed in this module (a faulty image left in the stack file, spark-3 still in
    it): the stack file the module began with is converged while spark-3 still runs, before the
    lab drops it (torn down after this); a stack naming a node that is gone cannot converge."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        shared.put_back("test_change_image_and_nodes.py, at its end (spark-3 still up)")


def _timed_up(d: Deployment, what: str):
    t0 = time.monotonic()
    r = d.run("up")
    print(f"WALL {what}: {time.monotonic() - t0:.1f} s")
    assert r.summary.result == "succeeded"
    return r


def _vllm(d) -> tuple[str, str, str]:
    """vLLM's container: its ID, start time and image ID."""
    cid, started, image = d.ssh(
        HEAD, f"docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}} {{{{.Image}}}}' {SERVE}"
    ).split()
    return cid, started, image


def _vllm_argv(d) -> list[str]:
    """The argv of the running vLLM: its container's main process, read on the head (the node
    shares the machine's PID space)."""
    return d.ssh(HEAD, f"pid=$(docker inspect -f '{{{{.State.Pid}}}}' {SERVE}) && "
                       f"test \"$pid\" -gt 0 && tr '\\000' '\\n' < /proc/$pid/cmdline").split()


def _ray_status(d) -> str:
    return d.ssh(HEAD, "docker exec spark-vllm-dev-ray-head ray status")


def _image_ids(d, node: str) -> set[str]:
    return set(d.ssh(node, "docker images -q --no-trunc").split())


def _fabric_rx(d, node: str) -> int:
    """Bytes received on the node's primary fabric interface (its own netns's /proc/net/dev)."""
    for line in d.ssh(node, "cat /proc/net/dev").splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == FABRIC_IF:
            return int(rest.split()[0])
    raise AssertionError(f"{node}: no {FABRIC_IF} in /proc/net/dev")


def _ray(snapshot: dict) -> dict:
    """Only the Ray containers of a snapshot (helpers come and go)."""
    return {
        node: {n: v for n, v in cs.items() if n.startswith("spark-vllm-dev-ray-")}
        for node, cs in snapshot.items()
    }


def _no_seeder_left(d) -> None:
    left = d.ssh(HEAD, "docker ps -q --filter name=spark-vllm-dev-model-seeder")
    assert not left.strip(), "the model seeder is still running on the head after the up"


# ------------------------------------------------------------------ tests


def test_add_node_prepares_it_and_serves_with_tp3(stack, lab3):
    d = stack
    before = _ray(d.snapshot())
    bytes_before = hf_file_bytes()
    rx_before = _fabric_rx(d, NEW)
    assert d.ssh(NEW, f"ls {MODEL_DIR}/snapshots 2>/dev/null || true").strip() == "", (
        "spark-3 must start without the model (the lab creates it empty)"
    )
    image_id = d.stack.outputs()["imageIds"].value[HEAD]

    set_nodes(d, lab3["nodes"][:3])
    _timed_up(d, "add spark-3 (TP 2 -> 3)")
    ops = d.ops()
    print(f"add-node ops: {ops}")

    # spark-3 prepared: image pulled, model fanned out from the head over the fabric
    for name in (f"image-{NEW}", f"model-sync-{NEW}", f"model-verify-{NEW}", f"ray-worker-{NEW}"):
        assert ops.get(name) == "create", (name, ops)
    assert image_id in _image_ids(d, NEW)
    assert hf_file_bytes() == bytes_before, "adding a node re-downloaded model files from the hub"
    commit = d.stack.outputs()["modelCommit"].value
    assert commit in d.ssh(NEW, f"ls {MODEL_DIR}/snapshots").split()
    rx = _fabric_rx(d, NEW) - rx_before
    assert rx >= 530_000, f"spark-3 received {rx} bytes on {FABRIC_IF}: model not over the fabric"
    print(f"spark-3 fabric rx during the add: {rx} bytes")

    # serving restarted with TP 3 on 3 GPUs: vLLM's container replaced (its command and the
    # Ray containers' IDs changed)
    assert ops.get("vllm-serve") == "replace", ops
    status = _ray_status(d)
    assert re.search(r"/3(\.0)? GPU", status), status
    argv = _vllm_argv(d)
    flags = ("--tensor-parallel-size", "-tp")
    tp = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in flags), None)
    assert tp == "3", argv
    assert complete(d)

    _no_seeder_left(d)
    moved = sync_bytes_moved(d, NEW)
    print(f"model-sync-{NEW} moved {moved} bytes")
    assert moved and moved >= 530_000, moved
    # What happened to the existing Ray containers (reported; the table allows a restart). Seen:
    # both kept, the node count is not in their env, so NCCL env forced no replacement.
    after = _ray(d.snapshot())
    for node in (HEAD, WORKER):
        kept = {n: after[node].get(n) == v for n, v in before[node].items()}
        res = "ray-head" if node == HEAD else f"ray-worker-{node}"
        print(f"{node}: containers kept {kept}; engine op {ops.get(res, 'same')}")
    d.run("preview", expect_no_changes=True)


def test_image_change_restarts_everything_moves_no_model(stack, lab3):
    d = stack
    nodes = (HEAD, WORKER, NEW)  # the stack has grown to spark-3 (the test before this one)
    assert tuple(n["name"] for n in d.cfg["nodes"]) == nodes, d.cfg["nodes"]
    assert complete(d)

    base = lab3["image"]["ref"]
    v2_ref, v2_id = second_image(d, HEAD, base, V2_REPO)
    old_id = d.stack.outputs()["imageIds"].value[HEAD]
    assert v2_id != old_id, "the second image must have another ID"
    print(f"second image: {v2_ref} ({v2_id})")

    _an_image_that_fails_at_model_load_is_put_back_on_every_node(d, base, old_id, nodes)

    before, vllm_before = _ray(d.snapshot()), _vllm(d)
    bytes_before = hf_file_bytes()
    d.set("image.ref", v2_ref)
    _timed_up(d, "image change")
    ops = d.ops()
    print(f"image change ops: {ops}")

    # pulled on every node, and every node now runs the one new ID
    for node in nodes:
        assert f"image-{node}" in ops, ops
        assert v2_id in _image_ids(d, node), f"{node}: {v2_id} not pulled"
    assert set(d.stack.outputs()["imageIds"].value.values()) == {v2_id}
    # every container restarted: Ray head and worker replaced, vLLM's container too
    assert ops.get("ray-head") == "replace", ops
    assert all(ops.get(f"ray-worker-{n}") == "replace" for n in (WORKER, NEW)), ops
    assert ops.get("vllm-serve") == "replace", ops
    after = _ray(d.snapshot())
    for node in nodes:
        assert after[node].keys() == before[node].keys(), (before, after)
        for name, (cid, _) in after[node].items():
            assert cid != before[node][name][0], f"{node}: {name} kept its container"
            image = d.ssh(node, f"docker inspect -f '{{{{.Image}}}}' {name}").strip()
            assert image == v2_id, f"{node}: {name} runs {image}"
    vllm_id, _, vllm_image = _vllm(d)
    assert vllm_id != vllm_before[0], "the vLLM container was kept"
    assert vllm_image == v2_id, f"vLLM runs {vllm_image}"
    argv = _vllm_argv(d)
    assert "serve" in argv and lab3["model"]["repo"] in argv, f"vLLM's container runs {argv}"
    # no model transfer: not one byte of model files from the hub
    assert hf_file_bytes() == bytes_before, "an image change fetched model files from the hub"
    # Known gap (reported, not hidden): the fetch/seed/sync scripts name the image ID, so they
    # re-run on an image change; they must find everything in place and move nothing.
    reran = sorted(k for k in ops if k.startswith("model-"))
    print(f"model steps re-run by the image change: {reran or 'none'}")
    for node in (WORKER, NEW):
        if f"model-sync-{node}" in ops:
            moved = sync_bytes_moved(d, node)
            print(f"model-sync-{node} re-ran and moved {moved} bytes")
            assert moved == 0, f"the re-run sync moved {moved} bytes over the fabric"
    _no_seeder_left(d)  # the re-run seeder must be stopped again (fixed in 48a1327)
    assert not any(f"model-verify-{n}" in ops for n in nodes), ops
    assert complete(d)
    d.run("preview", expect_no_changes=True)


def _an_image_that_fails_at_model_load_is_put_back_on_every_node(d, base: str, old_id: str,
                                                                  nodes: tuple[str, ...]):
    """Issue 49, on the way to the second image: first an image whose vLLM fails while it loads
    the model (lab/deployments.faulty_image: the serve check and the image probe pass, every
    rank fails building the model). The plain `up` pulls it and replaces every container (Ray's
    on the three nodes, vLLM's), the gate fails, and the last verified deployment is put back
    on every node in the same `up` (the Ray head and vLLM by the gate on the head, each worker's
    Ray container by vllm-deployment-<node>); a completion is served again with no human. The
    time without service is measured (the failing image's own start, then the restore); the
    restore's goal is the restored deployment's own start plus under 30 s."""
    import pulumi.automation as auto

    bad_ref, bad_id = faulty_image(d, HEAD, base, V2_REPO)
    print(f"image that fails at model load: {bad_ref} ({bad_id})")
    verified = d.stack.outputs()["deployment"].value
    assert verified["image"]["id"] == old_id, verified
    d.set("image.ref", bad_ref)
    t0 = time.monotonic()
    with Outage(d) as outage, pytest.raises(auto.CommandError) as info:
        d.run("up")
    print(f"WALL image that fails at model load (restored, fails): {time.monotonic() - t0:.1f} s")
    text = str(info.value)
    assert "the new version failed its health gate" in text, text[-3000:]
    assert "this image's vLLM fails while it loads the model" in text, text[-3000:]
    m = re.search(r"serving the last verified deployment again \([^\n]*", text)
    assert m and verified["deployment"] in m.group(0), text[-3000:]
    assert "spark-2: restored" in m.group(0) and "spark-3: restored" in m.group(0), m.group(0)
    print(f"[observed] {m.group(0)}")
    # every container of the model runs the verified image again, on every node
    for node in nodes:
        for name in (*_ray(d.snapshot())[node], *([SERVE] if node == HEAD else [])):
            image = d.ssh(node, f"docker inspect -f '{{{{.Image}}}}' {name}").strip()
            assert image == old_id, f"{node}: {name} runs {image}, not the verified {old_id}"
    assert complete(d)
    assert outage.answered_at_the_end, outage.samples[-5:]
    # Without service: the new image's own start until it failed (every container of the model
    # was replaced by it: no blue/green on two Sparks), then the restore. The goal is the
    # restore's: answering within the restored deployment's own start plus under 30 s.
    start = verified["gate"]["seconds"]
    took = float(re.search(r"answering ([0-9.]+) s after the restore began", m.group(0)).group(1))
    reporting.record("image: without service, an image that fails at model load (restored on "
                     "3 nodes in the up)", outage.longest,
                     f"of which the restore: {took:.1f} s; the restored deployment's own start: "
                     f"{start:.1f} s")
    assert took < start + 30, (took, start)


def test_a_node_leaves_and_serving_restarts_at_tp2(stack, lab3):
    d = stack
    before = _ray(d.snapshot())
    bytes_before = hf_file_bytes()
    set_nodes(d, lab3["nodes"][:2])
    _timed_up(d, "remove spark-3 (TP 3 -> 2)")
    ops = d.ops()
    print(f"remove-node ops: {ops}")
    # spark-3's resources go; nothing of the others but Ray's cluster view and vLLM
    for name in (f"image-{NEW}", f"model-sync-{NEW}", f"ray-worker-{NEW}"):
        assert ops.get(name) == "delete", (name, ops)
    assert ops.get("vllm-serve") == "replace", ops
    assert not any(k.startswith(("image-spark-1", "image-spark-2", "model-fetch")) for k in ops)
    assert d.containers(NEW) == {}, "spark-3 still runs a container of the stack"
    assert hf_file_bytes() == bytes_before
    after = _ray(d.snapshot())
    for node in (HEAD, WORKER):
        assert after[node] == before[node], f"{node}: its Ray container restarted"
    argv = _vllm_argv(d)
    tp = next((argv[i + 1] for i, a in enumerate(argv[:-1])
               if a in ("--tensor-parallel-size", "-tp")), None)
    assert tp == "2", argv
    # Pulumi deletes last: spark-3's Ray worker went at the end of the up, and Ray's head drops a
    # node whose raylet is gone once its health checks fail (about 30 s with Ray's defaults)
    deadline, status = time.monotonic() + 120, ""
    while time.monotonic() < deadline:
        status = _ray_status(d)
        if re.search(r"/2(\.0)? GPU", status):
            break
        time.sleep(5)
    assert re.search(r"/2(\.0)? GPU", status), status
    assert complete(d)
    d.run("preview", expect_no_changes=True)
