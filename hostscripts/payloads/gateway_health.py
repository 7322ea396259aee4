# Gateway gate (the head's python3): proves the stack's gateway from the head. argv = base url
# (http(s)://127.0.0.1:<port>), a JSON spec {"models": [{"name", "task"}], "live": path},
# timeout. The API key on stdin. Checks: liveness without the key; 401 without and with a wrong
# key; /v1/models lists exactly the served names; a name not served gets 404 naming them; one
# request per model through the gateway on its task's endpoint. Prints one JSON line.
# The certificate is not verified: the probe talks to the head's own gateway over loopback.
# Built by hostscripts/gateway.py; the lines above are not sent to the node.

import json, ssl, sys, time, urllib.error, urllib.request
url, spec, timeout = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
key = sys.stdin.read().strip()
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
def call(path, body=None, token=None):
    hdr = {"Content-Type": "application/json"}
    if token is not None:
        hdr["Authorization"] = "Bearer " + token
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=hdr)
    try:
        with urllib.request.urlopen(req, timeout=60, context=ctx) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
end, last = time.time() + timeout, ""
while True:
    try:
        if call(spec["live"])[0] == 200:
            break
        last = "liveness answered non-200"
    except Exception as e:
        last = repr(e)
    if time.time() > end:
        sys.exit("the gateway did not answer %s within %ds: %s" % (spec["live"], timeout, last))
    time.sleep(1)
for token in (None, "spark-vllm-gate-wrong-key"):
    status, _ = call("/v1/models", token=token)
    if status != 401:
        sys.exit("the gateway answered %d to /v1/models %s, not 401"
                 % (status, "without a key" if token is None else "with a wrong key"))
names = [m["name"] for m in spec["models"]]
status, body = call("/v1/models", token=key)
listed = [m["id"] for m in json.loads(body)["data"]] if status == 200 else None
if listed != names:
    sys.exit("/v1/models through the gateway: %d %r, expected %r" % (status, listed, names))
status, body = call("/v1/completions", {"model": "spark-vllm-gate-no-such-model",
                                        "prompt": "x", "max_tokens": 1}, token=key)
if status != 404 or not all(n in body.decode() for n in names):
    sys.exit("a model not served got %d %r, expected 404 naming %r" % (status, body[:200], names))
smoke = {}
for m in spec["models"]:
    name, task = m["name"], m["task"]
    if task == "embed":
        path, req = "/v1/embeddings", {"model": name, "input": ["hello"]}
    elif task == "score":
        path, req = "/score", {"model": name, "text_1": "hello", "text_2": ["hello", "other"]}
    else:
        path, req = "/v1/completions", {"model": name, "prompt": "hello", "max_tokens": 1}
    deadline = time.time() + timeout
    while True:
        status, body = call(path, req, token=key)
        if status == 200 or status not in (502, 503) or time.time() > deadline:
            break
        time.sleep(2)  # a server the gateway has not yet seen healthy
    if status != 200:
        sys.exit("%s through the gateway to %s: %d %r" % (path, name, status, body[:300]))
    smoke[name] = path
print(json.dumps({"live": "ok", "unauthenticated": 401, "models": listed, "unknownModel": 404,
                  "smoke": smoke}, sort_keys=True))
