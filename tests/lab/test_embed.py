"""Real vLLM serving the lab's tiny embedding model `spark-lab/tiny-embed` (TP 1, one node).

The repo's sentence-transformers files (modules.json, 1_Pooling/config.json) make vLLM 0.32 pick
`--runner pooling --convert embed` with LAST pooling and normalized vectors without any flag;
/v1/embeddings answers hidden_size-long unit vectors, and the first revision (other q_norm
weights, the only file that differs) gives other vectors. The container uses port 8100, so it
runs next to a stack on the node.
"""
import json
import math

import pytest

pytestmark = pytest.mark.lab
REPO = "spark-lab/tiny-embed"
NODE = "spark-1"
NAME = "lab-embed-probe"
PORT = 8100
HF_CACHE = "/root/.cache/huggingface"
MODEL_CACHE = f"{HF_CACHE}/hub/models--spark-lab--tiny-embed"
SERVE = ("vllm serve {repo} --revision {rev} --served-model-name tiny-embed --enforce-eager"
         " --kv-cache-memory-bytes 67108864 --max-model-len 512 --host 0.0.0.0 --port {port}")


@pytest.fixture(scope="module")
def embed(lab):
    if NODE not in lab.nodes:
        pytest.skip(f"needs {NODE}")
    commits = lab.cfg.get("models", {}).get(REPO, {}).get("commits")
    if not commits:
        pytest.skip(f"stack.json lists no {REPO} (lab made before it existed: run lab.py up)")
    code = ("from huggingface_hub import snapshot_download as d; "
            + "; ".join(f"d({REPO!r}, revision={c!r})" for c in (commits["main"], commits["first"])))
    lab.ssh(NODE, f"docker rm -f {NAME} >/dev/null 2>&1; rm -rf {MODEL_CACHE}; "
                  f"docker run --rm --network host -e HF_ENDPOINT={lab.cfg['hfEndpoint']} "
                  f"-v {HF_CACHE}:{HF_CACHE} {lab.image} python3 -c \"{code}\"", timeout=600)
    yield commits
    lab.ssh(NODE, f"docker rm -f {NAME}", check=False)


def _serve(lab, rev: str) -> str:
    lab.ssh(NODE, f"docker rm -f {NAME} >/dev/null 2>&1; docker run -d --name {NAME} "
                  f"--network host --ipc host -v {HF_CACHE}:{HF_CACHE} -e HF_HUB_OFFLINE=1 "
                  f"{lab.image} " + SERVE.format(repo=REPO, rev=rev, port=PORT))
    url = f"http://127.0.0.1:{PORT}"
    lab.wait_until(lambda: lab.ssh(NODE, f"curl -sf {url}/health", check=False).returncode == 0,
                   300, 2, "vllm /health")
    return lab.ssh(NODE, f"docker logs {NAME} 2>&1", check=False).stdout


def _post(lab, path: str, body: dict) -> dict:
    out = lab.ssh(NODE, f"curl -sf -H Content-Type:application/json -d '{json.dumps(body)}' "
                        f"http://127.0.0.1:{PORT}{path}").stdout
    return json.loads(out)


def test_embeddings_are_unit_vectors_of_hidden_size_and_follow_the_revision(lab, embed):
    hidden = json.loads(lab.ssh(NODE, f"cat {MODEL_CACHE}/snapshots/{embed['main']}/config.json")
                        .stdout)["hidden_size"]
    log = _serve(lab, embed["main"])
    assert "Resolved `--runner auto` to `--runner pooling`" in log, log
    assert "Resolved `--convert auto` to `--convert embed`" in log, log
    assert "pooling_type=LAST(source=sentence_transformers)" in log, log
    models = json.loads(lab.ssh(NODE, f"curl -sf http://127.0.0.1:{PORT}/v1/models").stdout)
    assert [(m["id"], m["root"]) for m in models["data"]] == [("tiny-embed", REPO)]

    req = {"model": "tiny-embed", "input": ["hello world"]}
    vec = _post(lab, "/v1/embeddings", req)["data"][0]["embedding"]
    assert len(vec) == hidden == 128
    assert abs(math.sqrt(sum(x * x for x in vec)) - 1) < 1e-3  # Normalize module
    assert _post(lab, "/v1/embeddings", req)["data"][0]["embedding"] == vec  # deterministic
    # an embedding model also answers /score (bi-encoder: cosine similarity)
    scores = _post(lab, "/score", {"model": "tiny-embed", "text_1": "hello world",
                                   "text_2": ["hello world", "spark node"]})["data"]
    assert abs(scores[0]["score"] - 1) < 1e-3 and scores[1]["score"] < 0.99

    _serve(lab, embed["first"])
    first = _post(lab, "/v1/embeddings", req)["data"][0]["embedding"]
    assert len(first) == hidden and first != vec
