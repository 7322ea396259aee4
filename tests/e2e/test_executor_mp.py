"""`vllm.executor: mp` on the lab with the real vLLM: vLLM's own multi-node executor, no Ray.

One vLLM container per node (`spark-vllm-serve`): the head's serves the API, the others run
`--headless`. Ordered on purpose, one deployment (brought up by the first test, destroyed by the
last). Every `up` prints its wall time (`WALL ...`).

Not here yet, and why: a headless vLLM stopped behind the stack and started again in place (what
`up --refresh` does after a `docker kill`: the same container, `mustRun`) leaves the head's vLLM
with a dead rank; the gate's smoke completion then fails with HTTP 500 (seen on the lab), so
the drift case, a switch to Ray and back, and 3 nodes wait for that to be fixed (issue 15).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from lab.deployments import complete, new_deployment

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


def test_mp_destroy_keeps_the_model(mp):
    d = mp
    d.run("destroy")
    for n in (HEAD, WORKER):
        assert d.containers(n) == {}, f"{n}: managed containers left after destroy"
        assert "models--spark-lab--tiny-moe" in d.ssh(n, "ls /root/.cache/huggingface/hub")
