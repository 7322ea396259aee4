"""Two Ray containers (head on spark-1, worker on spark-2) form a cluster; the vLLM stand-in on the
head places one worker per GPU, verifies each node's HF cache, and answers the OpenAI API."""
import base64
import json
import urllib.request

import pytest

pytestmark = pytest.mark.lab
REPO = "spark-lab/tiny-moe"
KEY = "lab-test-key"
HEAD, WORKER = "spark-1", "spark-2"
HF_CACHE = "/root/.cache/huggingface"
MODEL_CACHE = f"{HF_CACHE}/hub/models--spark-lab--tiny-moe"
RUN = ("docker run -d --name {name} --network host --ipc host --gpus all "
       "-v /root/.cache/huggingface:/root/.cache/huggingface {image} ")


def _http(url, body=None, key=KEY, timeout=30):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {key}"} if key else {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


@pytest.fixture(scope="module")
def cluster(lab):
    if HEAD not in lab.nodes or WORKER not in lab.nodes:
        pytest.skip("needs spark-1 and spark-2")
    code = f"from huggingface_hub import snapshot_download; snapshot_download({REPO!r})"
    h = lab.nodes[HEAD]["fabric"][0]["ip"]
    w = lab.nodes[WORKER]["fabric"][0]["ip"]
    for n in (HEAD, WORKER):
        lab.ssh(n, "docker rm -f lab-ray-head lab-ray-worker >/dev/null 2>&1; "
                   f"rm -rf {MODEL_CACHE}; "
                   f"docker run --rm --network host -e HF_ENDPOINT={lab.cfg['hfEndpoint']} "
                   f"-v {HF_CACHE}:{HF_CACHE} {lab.image} python3 -c \"{code}\"",
                timeout=900)
    common = "--num-gpus 1 --object-store-memory 100000000 --block"
    lab.ssh(HEAD, RUN.format(name="lab-ray-head", image=lab.image) +
            f"ray start --head --node-ip-address {h} --port 6379 --include-dashboard false "
            f"{common}")
    lab.ssh(WORKER, RUN.format(name="lab-ray-worker", image=lab.image) +
            f"ray start --address {h}:6379 --node-ip-address {w} {common}")
    status = "docker exec lab-ray-head ray status"
    lab.wait_until(lambda: "0.0/2.0 GPU" in lab.ssh(HEAD, status, check=False).stdout,
                   120, 2, "a 2-node Ray cluster with 2 GPUs")
    yield h
    lab.ssh(HEAD, "docker rm -f lab-ray-head", check=False)
    lab.ssh(WORKER, "docker rm -f lab-ray-worker", check=False)


def test_standin_fails_clearly_without_enough_gpus(lab, cluster):
    p = lab.ssh(HEAD, "docker exec -e VLLM_STANDIN_PG_TIMEOUT=5 lab-ray-head "
                      f"vllm serve {REPO} -tp 3 --distributed-executor-backend ray",
                check=False, timeout=300)
    assert p.returncode == 1
    assert "Cannot provide a placement group of 3 GPU bundle(s)" in p.stdout + p.stderr
    assert "has 2 GPU(s)" in p.stdout + p.stderr


def test_standin_fails_when_a_node_lacks_the_revision(lab, cluster):
    first = lab.cfg["model"]["commits"]["first"]
    lab.ssh(WORKER, f"rm -rf {MODEL_CACHE}/snapshots/" + first)
    p = lab.ssh(HEAD, f"docker exec lab-ray-head vllm serve {REPO} --revision {first} -tp 2 "
                      "--distributed-executor-backend ray", check=False, timeout=300)
    assert p.returncode == 1
    out = p.stdout + p.stderr
    assert "model snapshot check failed" in out and "spark-" in out and first in out, out


def test_vllm_serve_across_two_sparks(lab, cluster):
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": 1})
    cmd = (f"vllm serve {REPO} --served-model-name tiny -tp 2 -pp 1"
           " --distributed-executor-backend ray"
           " --gpu-memory-utilization 0.8 --max-model-len 4096 --max-num-seqs 4"
           " --kv-cache-dtype fp8 --enable-prefix-caching --load-format fastsafetensors"
           " --enforce-eager --host 0.0.0.0 --port 8000"
           f" --speculative-config '{spec}' --api-key {KEY} > /tmp/vllm.log 2>&1")
    b64 = base64.b64encode(cmd.encode()).decode()
    lab.ssh(HEAD, f"docker exec -d lab-ray-head sh -c 'echo {b64} | base64 -d | sh'")
    base = f"http://{lab.nodes[HEAD]['host']}:8000"
    try:
        lab.wait_until(lambda: _http(base + "/health", key=None, timeout=3)[0] == 200, 180, 2,
                       "vllm /health")
    except AssertionError:
        print(lab.ssh(HEAD, "docker exec lab-ray-head cat /tmp/vllm.log", check=False).stdout)
        raise
    log = lab.ssh(HEAD, "docker exec lab-ray-head cat /tmp/vllm.log").stdout
    assert "model snapshot verified on spark-1" in log, log
    assert "model snapshot verified on spark-2" in log, log
    with pytest.raises(urllib.error.HTTPError) as e:
        _http(base + "/v1/models", key=None)
    assert e.value.code == 401
    _, body = _http(base + "/v1/models")
    assert [m["id"] for m in json.loads(body)["data"]] == ["tiny"]
    req = {"model": "tiny", "prompt": "Say hello", "max_tokens": 8}
    a = json.loads(_http(base + "/v1/completions", req)[1])
    b = json.loads(_http(base + "/v1/completions", req)[1])
    text = a["choices"][0]["text"]
    assert text == b["choices"][0]["text"] and len(text.split()) == 8
    assert a["usage"]["completion_tokens"] == 8
    chat = {"model": "tiny", "stream": True, "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]}
    _, stream = _http(base + "/v1/chat/completions", chat)
    events = [line[6:] for line in stream.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 5
    metrics = _http(base + "/metrics", key=None)[1]
    assert 'vllm:generation_tokens_total{model_name="tiny"} 19' in metrics
