"""`spark-vllm:services` on the lab with the real vLLM: a second vLLM served beside the TP=2
main model from one stack. The lab's hub has one model so far (spark-lab/tiny-moe), so the
service serves it again, tensor parallel 1 on the head, as a `generate` service under its own
name and port; the embed and score gates are unit-tested (tests/unit/hostscripts).

Ordered on purpose, one deployment: the main model alone, then the service added (only the
service's resources are created; the main model's containers keep running, same IDs and start
times), then removed (only its resources are deleted), then destroy. Every `up` prints its wall
time (`WALL ...`).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from lab.deployments import complete, http, new_deployment

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD = "spark-1"
PORT = 8100
SECOND = {"name": "second", "repo": "spark-lab/tiny-moe", "task": "generate", "port": PORT,
         "servedModelName": "tiny-one", "gpuMemoryUtilization": 0.05,
         "kvCacheMemoryBytes": 67108864, "maxNumSeqs": 2, "maxModelLen": 1024,
         "enforceEager": True}


@pytest.fixture(scope="module")
def svc(lab_cfg, tmp_path_factory):
    import pulumi.automation as auto

    d = new_deployment(tmp_path_factory.mktemp("e2e-services"), lab_cfg)
    yield d
    if os.environ.get("E2E_KEEP") != "1":
        try:
            d.stack.destroy(on_output=print)
        except auto.CommandError as e:
            print(f"cleanup destroy failed: {e}")


def _up(d, what: str) -> dict[str, str]:
    t0 = time.monotonic()
    r = d.run("up")
    print(f"WALL services {what}: {time.monotonic() - t0:.1f} s")
    assert r.summary.result == "succeeded"
    return d.ops()


def _main_only(ops: dict[str, str], verb: str) -> None:
    """Every step is the service's, except the VllmServer component whose props carry the
    nodes' service shares for the policy pack (a component: nothing runs on a host)."""
    other = {k: v for k, v in ops.items() if not k.startswith("svc-second")}
    assert other in ({}, {"vllm": "update"}), other
    mine = {k: v for k, v in ops.items() if k.startswith("svc-second")}
    assert mine and set(mine.values()) == {verb}, mine


def test_main_model_alone(svc):
    _up(svc, "main model from empty")
    assert complete(svc)


def test_adding_a_service_creates_only_it(svc):
    d = svc
    before = d.snapshot()
    d.set("services", [SECOND])
    ops = _up(d, "add a service")
    _main_only(ops, "create")
    after = d.snapshot()
    name = "spark-vllm-dev-second"
    assert set(after[HEAD]) - set(before[HEAD]) == {name}
    for node, containers in before.items():  # the main model's containers were not touched
        assert {k: v for k, v in after[node].items() if k != name} == containers, node
    out = d.stack.outputs()["services"].value["second"]
    assert out["task"] == "generate" and out["servedModelName"] == "tiny-one"
    assert json.loads(out["health"][HEAD])["models"] == ["tiny-one"]
    _, body = http(out["endpoints"][HEAD] + "/completions",
                   {"model": "tiny-one", "prompt": "Say hello", "max_tokens": 4}, key=d.api_key())
    assert json.loads(body)["choices"][0]["text"]
    argv = json.loads(d.ssh(HEAD, f"docker inspect -f '{{{{json .Config.Cmd}}}}' {name}"))
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--port") + 1] == str(PORT)
    # unauthenticated requests are refused: the stack's API key guards the service too
    with pytest.raises(Exception, match="401"):
        http(out["endpoints"][HEAD] + "/models")
    assert complete(d)  # the main model kept serving
    d.run("preview", expect_no_changes=True)


def test_removing_the_service_deletes_only_it(svc):
    d = svc
    before = d.snapshot()
    d.set("services", [])
    ops = _up(d, "remove the service")
    _main_only(ops, "delete")
    after = d.snapshot()
    assert "spark-vllm-dev-second" not in after[HEAD]
    assert {n: {k: v for k, v in c.items() if k != "spark-vllm-dev-second"}
            for n, c in before.items()} == after
    # its key folder went with it; the main model's key file stays
    assert d.ssh(HEAD, "ls /var/lib/spark-vllm/stacks/dev/services 2>/dev/null || true") == ""
    key = "/var/lib/spark-vllm/stacks/dev/vllm/api-key"
    assert d.ssh(HEAD, f"test -s {key} && echo ok").strip() == "ok"
    assert complete(d)
