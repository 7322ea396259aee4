# vLLM health gate (python3 in a container on the host network): waits for /health, checks that
# /v1/models lists the served name and runs one smoke request on the endpoint the task uses.
# argv = url name prompt timeout [task [dim]]: task generate (the default: one completion), embed
# (one embedding, of dim values when dim > 0) or score (the prompt scored against two texts).
# The API key on stdin (possibly empty). Prints one JSON line, with the gate's figures: `seconds`
# until /health answered, `smokeSeconds` the smoke request took.
# Built by hostscripts/vllm.py; the lines above are not sent to the node.

import json, sys, time, urllib.request
url, name, prompt, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
task = sys.argv[5] if len(sys.argv) > 5 else "generate"
dim = int(sys.argv[6]) if len(sys.argv) > 6 else 0
key = sys.stdin.read().strip()
hdr = {"Content-Type": "application/json"}
if key:
    hdr["Authorization"] = "Bearer " + key
def call(path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=hdr)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read()
t0 = time.time()
end, last = t0 + timeout, ""
while True:
    try:
        if call("/health")[0] == 200:
            break
    except Exception as e:
        last = repr(e)
    if time.time() > end:
        sys.exit("vllm serve not healthy after %ds: %s" % (timeout, last))
    time.sleep(1)
healthy = time.time() - t0
ids = [m["id"] for m in json.loads(call("/v1/models")[1])["data"]]
if name not in ids:
    sys.exit("/v1/models lists %s, not %s" % (ids, name))
if task == "embed":
    out = json.loads(call("/v1/embeddings", {"model": name, "input": [prompt]})[1])
    vec = out["data"][0]["embedding"]
    if not vec or (dim and len(vec) != dim):
        sys.exit("/v1/embeddings gave a vector of %d values, expected %s" % (len(vec), dim or "some"))
    smoke = {"dimension": len(vec)}
elif task == "score":
    out = json.loads(call("/score", {"model": name, "text_1": prompt,
                                      "text_2": [prompt, "an unrelated text"]})[1])
    scores = [d["score"] for d in out["data"]]
    if len(scores) != 2 or not all(isinstance(s, (int, float)) for s in scores):
        sys.exit("/score gave %r, expected two scores" % (out["data"],))
    smoke = {"scores": scores}
else:
    out = json.loads(call("/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 8})[1])
    smoke = out["choices"][0]["text"]
print(json.dumps({"health": "ok", "models": ids, "smoke": smoke, "seconds": round(healthy, 1),
                  "smokeSeconds": round(time.time() - t0 - healthy, 2)}))
