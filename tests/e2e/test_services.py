"""`spark-vllm:services` on the lab with the real vLLM: the lab's tiny embedding model
(spark-lab/tiny-embed, lab/tinymodel.py --arch qwen3embed: 128-dim, last-token pooling,
normalized) served as an `embed` service beside the TP=2 main model, from one stack.

Ordered on purpose, on the session's shared stack (tests/e2e/conftest.py: converged, the main
model serving); the service added at the hub's first revision (only the service's resources are
created and the gateway's routing is updated; the main model's containers and the gateway's keep
running, same IDs and start times); one of its flags changed (only its container and gate are replaced, and the gateway's gate runs again);
its revision moved to `main` (only its files move: the one file that differs). The service stays:
test_gateway, next on this stack, serves it through the gateway and then removes it while a
stream runs (only its resources and key folder go), which leaves the stack as this module found
it. Every `up` prints its wall time (`WALL ...`).
"""

from __future__ import annotations

import json
import math

import pytest

from lab.deployments import (
    EMBED_CONTAINER,
    EMBED_REPO,
    changed_bytes,
    complete,
    embed_service,
    hf_file_bytes,
    http,
)

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD = "spark-1"
NAME, REPO = EMBED_CONTAINER, EMBED_REPO
MODEL_DIR = "/root/.cache/huggingface/hub/models--spark-lab--tiny-embed"  # on the head


@pytest.fixture(scope="module")
def svc(stack, lab_cfg):
    commits = lab_cfg.get("models", {}).get(REPO, {}).get("commits")
    assert commits, f"the lab's stack.json lists no {REPO} (a lab made before it: lab.py up)"
    stack.commits = commits
    # from an empty cache on the head, whatever an earlier run left (destroy keeps a model):
    # the revision case counts the bytes the hub serves
    stack.ssh(HEAD, f"rm -rf {MODEL_DIR}")
    return stack


def _split(ops: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the service's steps, every other step)."""
    mine = {k: v for k, v in ops.items() if k.startswith("svc-embed")}
    return mine, {k: v for k, v in ops.items() if k not in mine}


# What a service added or removed may change beside its own resources: the VllmServer
# component's props (its node's memory shares, for the policy pack), the gateway's routing
# (its configuration, rewritten and reloaded; its gate; its component's props) and the
# firewall of its nodes (its port in their tables, updated in place: issue 45). Never the
# gateway's container or image (components/gateway.py).
ROUTING = {"vllm": "update", "gateway": "update", "gateway-config": "update",
           "gateway-health": "update",
           **{f"firewall-{n}{t}": "update" for n in ("spark-1", "spark-2")
              for t in ("", "-table")}}


# A new container behind a route runs the gateway's gate again (an update: its script names
# the backends' IDs), so the up ends when the gateway itself routes to it
REGATE = {"gateway-health": "update"}


def _untouched(before: dict, after: dict) -> None:
    """Every container but the service's kept its ID and start time."""
    for node, containers in before.items():
        assert {k: v for k, v in after[node].items() if k != NAME} == \
            {k: v for k, v in containers.items() if k != NAME}, node


def _embed(d, text: str = "hello world") -> list[float]:
    """An embedding through the stack's gateway, routed by the model's served name."""
    _, body = http(d.endpoint() + "/embeddings",
                   {"model": "tiny-embed", "input": [text]}, key=d.api_key())
    return json.loads(body)["data"][0]["embedding"]


def _hidden_size(d, commit: str) -> int:
    path = f"{MODEL_DIR}/snapshots/{commit}"
    return json.loads(d.ssh(HEAD, f"cat {path}/config.json"))["hidden_size"]


def test_main_model_alone(svc):
    assert complete(svc)
    out = svc.stack.outputs().get("services")
    assert out is None or not out.value, out  # the main model alone


def test_adding_an_embedding_service_creates_only_it(svc):
    d = svc
    before = d.snapshot()
    d.set("services", [embed_service(d.commits["first"])])
    mine, other = _split(d.timed_up("services add an embedding service"))
    # the VllmServer component's props carry the nodes' service shares (for the policy pack);
    # the gateway learns the new model (a new configuration, reloaded)
    assert set(other.items()) <= set(ROUTING.items()) and "gateway-config" in other, other
    assert mine and set(mine.values()) == {"create"}, mine
    after = d.snapshot()
    assert set(after[HEAD]) - set(before[HEAD]) == {NAME}
    _untouched(before, after)

    out = d.stack.outputs()["services"].value["embed"]
    assert out["task"] == "embed" and out["modelCommit"] == d.commits["first"]
    hidden = _hidden_size(d, d.commits["first"])
    assert hidden == 128
    assert json.loads(out["health"][HEAD])["smoke"] == {"dimension": hidden}
    vec = _embed(d)
    assert len(vec) == hidden
    assert abs(math.sqrt(sum(x * x for x in vec)) - 1) < 1e-3  # the Normalize module
    assert _embed(d, "spark node") != vec
    argv = json.loads(d.ssh(HEAD, f"docker inspect -f '{{{{json .Config.Cmd}}}}' {NAME}"))
    assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
    assert argv[argv.index("--runner") + 1] == "pooling"
    # vLLM's --convert auto read the sentence-transformers files: embed, last-token pooling
    log = d.ssh(HEAD, f"docker logs {NAME} 2>&1")
    assert "Resolved `--convert auto` to `--convert embed`" in log
    assert "pooling_type=LAST(source=sentence_transformers)" in log
    with pytest.raises(Exception, match="401"):  # the stack's API key guards the service too
        http(d.endpoint() + "/embeddings", {"model": "tiny-embed", "input": ["x"]})
    models = json.loads(http(d.endpoint() + "/models", key=d.api_key())[1])
    assert [m["id"] for m in models["data"]] == ["tiny-moe", "tiny-embed"]
    assert complete(d)  # the main model kept serving
    d.run("preview", expect_no_changes=True)


def test_a_flag_of_the_service_restarts_only_it(svc):
    d = svc
    before = d.snapshot()
    vec = _embed(d)
    d.set("services", [embed_service(d.commits["first"], maxNumSeqs=4)])
    mine, other = _split(d.timed_up("services change a flag of the service"))
    assert other == REGATE, other
    assert "replace" in mine.values() and not any(k.startswith("svc-embed-model") for k in mine)
    after = d.snapshot()
    assert after[HEAD][NAME] != before[HEAD][NAME]
    _untouched(before, after)
    argv = json.loads(d.ssh(HEAD, f"docker inspect -f '{{{{json .Config.Cmd}}}}' {NAME}"))
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert _embed(d) == vec  # same weights, same vectors
    assert complete(d)


def test_a_new_revision_of_the_service_moves_only_its_changed_files(svc):
    d = svc
    before = d.snapshot()
    vec = _embed(d)
    first, main = d.commits["first"], d.commits["main"]
    changed, _ = changed_bytes(d.cfg["hfEndpoint"], REPO, first, main)
    assert 0 < changed < 4096  # the lab's main revision changes one small shard
    served = hf_file_bytes()
    d.set("services", [embed_service(main, maxNumSeqs=4)])
    mine, other = _split(d.timed_up("services move the service to another revision"))
    # the main model's cache, containers and gates: untouched
    assert set(other.items()) <= set(REGATE.items()), other
    assert any(k.startswith("svc-embed-model") for k in mine)
    assert hf_file_bytes() - served == changed
    _untouched(before, d.snapshot())
    assert d.stack.outputs()["services"].value["embed"]["modelCommit"] == main
    new = _embed(d)
    assert len(new) == len(vec) and new != vec
    assert complete(d)


def test_status_shows_every_model_serving_with_its_figures(svc):
    """`spark-vllm status` (issue 34) on the converged stack with its service: every model
    serving with vLLM's own figures, every node's memory per container, exit code 0; the table
    says the same."""
    d = svc
    assert complete(d) and _embed(d)
    code, data = d.status()
    assert code == 0 and data["serving"] is True, data
    models = {m["name"]: m for m in data["models"]}
    assert set(models) == {"tiny-moe", "tiny-embed"}, models  # by served name
    for m in models.values():
        assert m["state"] == "serving", m
        assert m["restarts"] is not None and m["since"].startswith("20"), m
        for figure in ("running", "waiting", "kv_cache", "tokens_per_second"):
            assert isinstance(m[figure], float), (figure, m)
        assert 0 <= m["kv_cache"] <= 1
    assert models["tiny-embed"]["kind"] == "embed" and models["tiny-moe"]["kind"] == "main"
    assert all(s == "running" for s in models["tiny-moe"]["ranks"].values())
    head = data["nodes"][HEAD]["containers"]
    assert head["spark-vllm-dev-serve"] > 0 and head[NAME] > 0, head
    assert all(n["memoryAvailable"] and not n["error"] and not n["problems"]
               for n in data["nodes"].values()), data["nodes"]
    table = d.cli("status", "-s", "dev")
    assert table.returncode == 0, table.stdout + table.stderr
    rows = [ln for ln in table.stdout.splitlines() if "serving" in ln]
    assert len(rows) == 2, table.stdout
    print(table.stdout)
