# `spark-vllm status`: one serving vLLM as its own container sees it (run there with
# `docker exec -i <container> python3 -c <this> <url>`, the API key on stdin from the node's
# root-only key file; never on a command line). Read-only: /health, /v1/models and two samples
# of /metrics a second apart (for tokens/s), every call within 5 s. Prints one JSON object:
#   {"health": 200 | "<error>", "models": [...] | "<error>",
#    "samples": [{"t": <time>, "m": {<metric>: <sum over its label sets>}} | "<error>", ...]}
# Only vLLM's own serving metrics are kept (METRICS below), summed over their labels.
# Built by inspection/status.py; the lines above are not sent to the node.

import json, re, sys, time, urllib.request
url = sys.argv[1]
key = sys.stdin.read().strip()
METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
           "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
           "vllm:request_success_total", "vllm:num_preemptions_total")
LINE = re.compile(r"^(vllm:[a-z_:]+)(\{[^}]*\})? ([-+0-9.eE]+|NaN)$", re.M)
def call(path):
    req = urllib.request.Request(url + path, headers={"Authorization": "Bearer " + key} if key else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.status, r.read().decode("utf-8", "replace")
def guarded(fn):
    try:
        return fn()
    except Exception as e:
        return "%s: %s" % (type(e).__name__, str(e)[:200])
def sample():
    text = call("/metrics")[1]
    m = {}
    for name, _labels, value in LINE.findall(text):
        if name in METRICS and value != "NaN":
            m[name] = m.get(name, 0.0) + float(value)
    return {"t": time.time(), "m": m}
out = {"health": guarded(lambda: call("/health")[0])}
out["models"] = guarded(lambda: [d["id"] for d in json.loads(call("/v1/models")[1])["data"]])
out["samples"] = [guarded(sample)]
time.sleep(1)
out["samples"].append(guarded(sample))
print(json.dumps(out))
