# vLLM health gate (python3 inside the head Ray container, on the host network): waits for
# /health, checks that /v1/models lists the served name and runs one smoke completion.
# argv = url name prompt timeout; the API key on stdin (possibly empty). Prints one JSON line.
# Built by hostscripts/vllm.py; the lines above are not sent to the node.

import json, sys, time, urllib.request
url, name, prompt, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
key = sys.stdin.read().strip()
hdr = {"Content-Type": "application/json"}
if key:
    hdr["Authorization"] = "Bearer " + key
def call(path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=hdr)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read()
end, last = time.time() + timeout, ""
while True:
    try:
        if call("/health")[0] == 200:
            break
    except Exception as e:
        last = repr(e)
    if time.time() > end:
        sys.exit("vllm serve not healthy after %ds: %s" % (timeout, last))
    time.sleep(3)
ids = [m["id"] for m in json.loads(call("/v1/models")[1])["data"]]
if name not in ids:
    sys.exit("/v1/models lists %s, not %s" % (ids, name))
out = json.loads(call("/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 8})[1])
print(json.dumps({"health": "ok", "models": ids, "smoke": out["choices"][0]["text"]}))
