"""A real community recipe, imported, served by the lab (issue 44, item 6), and a speculative
drafter from another repository on every node (item 4), on the session's shared stack
(tests/e2e/conftest.py).

1. `spark-vllm recipes import` turns a real file (scitrera/oss-spark-run's Qwen3-1.7B vLLM
   recipe, tests/fixtures/community_recipes/real: `--trust-remote-code`, `--reasoning-parser
   deepseek_r1`, its memory share) into a recipe the stack names; the lab's tiny model stands in
   for its model, pinned to a commit (trustRemoteCode wants one). The `up` replaces only vLLM:
   its flags go through the serve check in the image (vLLM's own parser) and vLLM serves them.
2. `model.drafter` names the lab's spark-lab/tiny-drafter (a dense Qwen3 with tiny-moe's
   tokenizer: a draft model of it) and the speculative config uses it (`draft_model`): the
   `up` fetches it once from the hub, fans it out and verifies it on every node with the
   model's own machinery, pins vLLM's speculative config to its commit, and `status` names it
   on both nodes; vLLM serves with it.

The module leaves the stack as it found it (every key it sets is put back as it was, or removed
where it was not set) and removes the recipe it wrote. Every `up` prints its wall time
(`WALL ...`).
"""

from __future__ import annotations

import json

import pytest

from lab.deployments import ROOT, complete, http

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
REAL = ROOT / "tests" / "fixtures" / "community_recipes" / "real"
FILE = "scitrera-oss-spark-run/recipes/qwen3/qwen3-1.7b-vllm.yaml"
RECIPE = "e2e-imported-qwen3-1.7b"
RECIPES = ROOT / "config" / "recipes_data"  # where the program run by the CLI reads recipes
MODEL, DRAFTER = "spark-lab/tiny-moe", "spark-lab/tiny-drafter"
DRAFTER_DIR = "/root/.cache/huggingface/hub/models--spark-lab--tiny-drafter"
SERVE = "spark-vllm-dev-serve"
# the stack file's keys the module sets, put back as they were afterwards
KEYS = ("model.revision", "model.drafter", "vllm.recipe", "vllm.speculativeConfig",
        "vllm.maxModelLen", "nccl.extraEnv")


def _put(d, key: str, value) -> None:
    """Set `key` of the stack file to `value`, an object leaf by leaf (a path set stores a JSON
    text as a string)."""
    if _get(d, key) is not None:
        d.stack.remove_config(f"spark-vllm:{key}", path=True)
    if isinstance(value, dict):
        for k, v in value.items():
            _put(d, f"{key}.{k}", v)
    elif value is not None:
        d.set(key, value)


def _get(d, key: str):
    """A key of the stack file as JSON, or None when it is not set."""
    try:
        value = d.stack.get_config(f"spark-vllm:{key}", path=True).value
    except Exception:  # the Automation API raises when the key is not set
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


@pytest.fixture(scope="module")
def served(stack, lab_cfg):
    models = lab_cfg.get("models", {})
    for repo in (MODEL, DRAFTER):
        assert models.get(repo, {}).get("commits"), \
            f"the lab's stack.json lists no {repo} (a lab made before it: lab.py up)"
    stack.commits = {repo: models[repo]["commits"] for repo in (MODEL, DRAFTER)}
    found = {key: _get(stack, key) for key in KEYS}
    # the drafter from an empty cache on every node, whatever an earlier run left
    for node in (HEAD, WORKER):
        stack.ssh(node, f"rm -rf {DRAFTER_DIR}")
    yield stack
    try:  # the stack as the module found it
        for key, value in found.items():
            _put(stack, key, value)
        stack.timed_up("recipe: the stack as the module found it")
        stack.run("preview", expect_no_changes=True)
    finally:
        (RECIPES / f"{RECIPE}.yaml").unlink(missing_ok=True)


def _argv(d) -> list[str]:
    return json.loads(d.ssh(HEAD, f"docker inspect -f '{{{{json .Config.Cmd}}}}' {SERVE}"))


def test_an_imported_real_recipe_serves_the_lab_model(served):
    d = served
    r = d.cli("recipes", "import", str(REAL / FILE), "--name", RECIPE, "--out", str(RECIPES),
              timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trustRemoteCode: true  <- command: --trust-remote-code" in r.stderr
    assert "qwen3-1.7b-vllm.yaml" in r.stderr and "imported" in r.stderr
    # the lab's tiny model in place of the recipe's (Qwen/Qwen3-1.7B), pinned: trustRemoteCode
    # runs only a commit's code (a stack already pinned keeps its commit); the lab recipe's
    # length and env kept in the stack file
    revision = _get(d, "model.revision")
    if revision not in (d.commits[MODEL]["first"], d.commits[MODEL]["main"]):
        revision = d.commits[MODEL]["main"]
        d.set("model.revision", revision)
    d.served_commit = revision
    d.set("vllm.recipe", RECIPE)
    d.set("vllm.maxModelLen", 2048)
    _put(d, "nccl.extraEnv", {"VLLM_LOGGING_LEVEL": "INFO"})
    before = d.snapshot()
    ops = d.timed_up("recipe: serve an imported real recipe")
    assert ops.get("vllm-serve") == "replace", ops
    after = d.snapshot()
    for node, containers in before.items():  # Ray kept: only vLLM's flags changed
        kept = {k: v for k, v in containers.items() if "ray" in k}
        assert kept and {k: after[node][k] for k in kept} == kept, node
    argv = _argv(d)
    assert "--trust-remote-code" in argv
    assert argv[argv.index("--reasoning-parser") + 1] == "deepseek_r1"
    assert argv[argv.index("--revision") + 1] == d.served_commit
    assert complete(d)
    _, body = http(d.endpoint() + "/chat/completions",
                   {"model": "tiny-moe", "max_tokens": 8,
                    "messages": [{"role": "user", "content": "hello"}]}, key=d.api_key())
    assert json.loads(body)["choices"][0]["message"] is not None
    code, status = d.status()
    assert code == 0 and status["serving"] is True, status
    assert status["drafter"] is None


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_a_drafter_from_another_repo_is_fetched_verified_and_served(served):
    d = served
    commit = d.commits[DRAFTER]["main"]
    _put(d, "model.drafter", {"repo": DRAFTER, "revision": commit})
    _put(d, "vllm.speculativeConfig", {"method": "draft_model", "model": DRAFTER,
                                       "num_speculative_tokens": 2})
    ops = d.timed_up("recipe: a drafter of another repo")
    drafter_ops = {k: v for k, v in ops.items() if k.startswith("drafter")}
    assert {"drafter-fetch", "drafter-seed", f"drafter-sync-{WORKER}", "drafter-seed-stop",
            f"drafter-verify-{HEAD}", f"drafter-verify-{WORKER}"} <= set(drafter_ops), ops
    assert set(drafter_ops.values()) == {"create"}, drafter_ops
    assert ops.get("vllm-serve") == "replace", ops
    # on every node, verified: the commit's snapshot, every file the hub lists
    for node in (HEAD, WORKER):
        files = d.ssh(node, f"ls {DRAFTER_DIR}/snapshots/{commit}")
        assert "config.json" in files and "model.safetensors.index.json" in files, (node, files)
    exported = d.stack.outputs()["drafter"].value
    assert exported["repo"] == DRAFTER and exported["commit"] == commit
    assert set(exported["verified"]) == {HEAD, WORKER}
    spec = json.loads((a := _argv(d))[a.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": DRAFTER, "num_speculative_tokens": 2,
                    "revision": commit}
    code, status = d.status()
    assert status["drafter"]["repo"] == DRAFTER
    for node in (HEAD, WORKER):
        got = status["drafter"]["nodes"][node]
        assert got["state"] == "present" and got["commit"] == commit, status["drafter"]
    # vLLM serves with the drafter (its CPU build runs draft models: vllm/v1/worker/
    # cpu_model_runner.py): a completion, and the drafter in its log
    assert code == 0, status
    assert complete(d)
    log = d.ssh(HEAD, f"docker logs {SERVE} 2>&1 | grep -i -m3 'draft' || true")
    print(f"REPORT drafter in vLLM's log: {log.strip()[:400]}", flush=True)
