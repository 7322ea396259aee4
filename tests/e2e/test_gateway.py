"""The gateway on the lab with the real vLLM (issue 30: the API key did not protect the model).

On the session's shared stack (tests/e2e/conftest.py), which test_executor_mp leaves on vLLM's
own multi-node executor (no Ray: see MODULE_ORDER for why this module runs there; run alone it
switches the stack to mp first). In order:

1. the stack's endpoint is the gateway's, and vLLM listens on no management address;
2. every route the running vLLM registers (its own /openapi.json, fetched through the gateway
   with the key) answers 401 through the gateway without the key and with a wrong one;
3. a TCP scan of every port of every node's management address from the lab host finds the
   gateway (on the head) and sshd, nothing else: vLLM, the services and mp's rendezvous port
   (the nodes' firewalls, issue 45: hostscripts/firewall.py) are not there; and with the
   embedding service running, the lab's outsider (a fabric address that is no node's) reaches
   nothing listening on any node but the gateway;
4. the lab's embedding model as a service: test_services (run just before, on this stack)
   adds it and leaves it in place, checking that only its resources were created and that the
   gateway's routing changed (reloaded: its container keeps its ID and start time); run alone,
   this module adds it. Then completions, chat, embeddings and streaming work through the
   gateway with the key, a model it does not serve gets a 404 naming the served ones, vLLM's
   metrics answer only with the key;
5. a client that goes away mid-stream stops the generation at vLLM;
6. the service removed while a stream runs through the gateway: the stream finishes whole (the
   reload drops no connection; HAProxy's own log dates the reload), only the service's
   resources and key folder go and the gateway's routing changes, the model is 404 afterwards;
   the stack is left as test_executor_mp left it.

Every `up` prints its wall time (`WALL ...`).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from http.client import HTTPResponse

import pytest

from lab.deployments import EMBED_CONTAINER, complete, embed_service
from tests.e2e.ports import from_outsider, outsider_finds, scan_expecting

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
GATEWAY = "spark-vllm-dev-gateway"
SSHD = 22
MAIN, EMBED = "tiny-moe", "tiny-embed"
# what a service added or removed may change beside its own resources (tests/e2e/test_services.py)
ROUTING = {"vllm": "update", "gateway": "update", "gateway-config": "update",
           "gateway-health": "update",
           # the service's port in the firewall of its nodes (issue 45: the table updated)
           **{f"firewall-{n}{t}": "update" for n in (HEAD, WORKER) for t in ("", "-table")}}


def _call(url: str, body: dict | None = None, key: str | None = None, method: str | None = None,
          timeout: float = 60) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def _base(d) -> str:
    return d.endpoint().rsplit("/v1", 1)[0]


def _stream(d, body: dict, path: str = "/v1/chat/completions") -> HTTPResponse:
    req = urllib.request.Request(
        _base(d) + path, data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {d.api_key()}"})
    r = urllib.request.urlopen(req, timeout=120)
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    return r


def _events(r: HTTPResponse):
    """(arrival time, event text) of each server-sent event as it arrives."""
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            yield time.monotonic(), event.decode()


def _listeners(d, node: str) -> str:
    """`ss -ltnp` on a node: what listens where, with its process."""
    return d.ssh(node, "ss -Hltnp")


@pytest.fixture(scope="module")
def gw(stack):
    """The shared stack on mp (what test_executor_mp leaves; switched here when run alone)."""
    conf = stack.stack.get_all_config()
    if json.loads(conf["spark-vllm:vllm"].value).get("executor") != "mp":
        stack.set("vllm.executor", "mp")
        stack.timed_up("gateway: the shared stack to executor mp (run without test_executor_mp)")
    return stack


def _gateway_port(d) -> int:
    return int(d.endpoint().rsplit(":", 1)[1].split("/")[0])


def test_the_endpoint_is_the_gateway_and_vllm_listens_on_no_management_address(gw, lab_cfg):
    d = gw
    head = lab_cfg["nodes"][0]["host"]
    assert d.endpoint() == f"http://{head}:8080/v1", d.endpoint()
    assert complete(d)  # through the gateway, with the key
    backends = d.stack.outputs()["backends"].value
    print(f"[observed] backends: {backends}")
    main = backends[MAIN]
    assert main == ["spark-1 http://192.168.177.11:8000"], main  # mp: the head's fabric address
    # what listens on the head: the gateway on every address, vLLM only where it reaches it
    listening = _listeners(d, HEAD)
    print(listening)
    gateway_port = _gateway_port(d)
    assert re.search(rf"\s(0\.0\.0\.0|\*):{gateway_port}\s", listening), listening
    api = [line for line in listening.splitlines() if re.search(r":8000\s", line)]
    assert api and all("192.168.177.11:8000" in line for line in api), api


def test_every_route_vllm_registers_is_401_without_the_key(gw):
    d = gw
    key = d.api_key()
    status, _, body = _call(_base(d) + "/openapi.json", key=key)
    assert status == 200, body[:300]
    paths = json.loads(body)["paths"]
    routes = sorted((p, m.upper()) for p, ops in paths.items() for m in ops
                    if m in ("get", "post", "put", "delete", "patch"))
    # the paths vLLM serves outside its OpenAPI document (its metrics app, the docs) too
    routes += [("/metrics", "GET"), ("/docs", "GET"), ("/openapi.json", "GET")]
    print(f"[observed] {len(routes)} routes from vLLM's /openapi.json: "
          f"{sorted({p for p, _ in routes})}")
    for must in ("/invocations", "/tokenize", "/detokenize", "/version", "/v1/completions",
                 "/v1/chat/completions", "/v1/models", "/health"):
        assert any(p == must for p, _ in routes), must  # the paths issue 30 found open
    open_ = []
    for path, method in routes:
        url = _base(d) + re.sub(r"\{[^}]+\}", "x", path)
        body = {"model": MAIN, "prompt": "x", "max_tokens": 1} if method != "GET" else None
        for presented in (None, "sk-not-the-key", key + "x"):
            status, headers, text = _call(url, body, key=presented, method=method)
            if status != 401:
                open_.append((method, path, presented is not None, status, text[:120]))
            elif headers.get("www-authenticate") != 'Bearer realm="spark-vllm"':
                open_.append((method, path, "no WWW-Authenticate", status, text[:120]))
    assert not open_, open_
    # the one path without the key answers alone and says nothing about the models
    status, _, text = _call(_base(d) + "/gateway/live")
    assert (status, text) == (200, b"ok")


def test_a_port_scan_of_the_management_addresses_finds_only_the_gateway_and_sshd(gw, lab_cfg):
    d = gw
    gateway_port = _gateway_port(d)
    t0 = time.monotonic()
    found = {n["name"]: scan_expecting(n["host"], [SSHD, gateway_port] if n["name"] == HEAD
                                       else [SSHD])
             for n in lab_cfg["nodes"]}
    print(f"[observed] open TCP ports on the management addresses ({time.monotonic() - t0:.0f} "
          f"s for {len(found)} x 65535): {found}")
    want = {n["name"]: [SSHD] for n in lab_cfg["nodes"]}
    want[HEAD] = sorted([SSHD, gateway_port])
    if found != want:
        who = {n: _listeners(d, n) for n in found if found[n] != want[n]}
        raise AssertionError(f"management addresses answer on {found}, expected {want}; what "
                             f"listens there: {who}")
    # and from the fabric the rendezvous port is open to the stack's nodes (the ranks' way in):
    # the filter is not a wall around the node
    master = d.ssh(WORKER, "python3 -c \"import socket; socket.create_connection("
                           "('192.168.177.11', 29501), timeout=3).close(); print('open')\"")
    assert master.strip() == "open", master
    assert from_outsider([("192.168.177.11", 29501)]) == ["blocked"]


@pytest.fixture(scope="module")
def with_embed(gw, lab_cfg):
    """The lab's embedding model as a service beside the main model: the one test_services
    leaves (its adding is proven there), else added here at the hub's main."""
    d = gw
    value = d.stack.get_all_config().get("spark-vllm:services")
    if not any(s.get("name") == "embed" for s in (json.loads(value.value) if value else [])):
        commits = lab_cfg["models"]["spark-lab/tiny-embed"]["commits"]
        d.set("services", [embed_service(commits["main"])])
        mine, other = _split(d.timed_up("gateway: a service added (run without test_services)"))
        assert mine and set(mine.values()) == {"create"}, mine
        assert set(other.items()) <= set(ROUTING.items()) and "gateway-config" in other, other
    config = d.ssh(HEAD, "cat /var/lib/spark-vllm/stacks/dev/gateway/conf/models.map")
    assert config.split() == [MAIN, "model0-tiny-moe", EMBED, "model1-tiny-embed"], config
    d.run("preview", expect_no_changes=True)
    return d


def test_with_the_service_the_outsider_reaches_only_the_gateway(with_embed, lab_cfg):
    """Issue 45 on mp with the embedding service: every socket listening on every node, tried
    from the lab's outsider at the node's fabric addresses, is dropped but the gateway's."""
    found = outsider_finds(with_embed, lab_cfg["nodes"])
    print(f"[observed] what the outsider reaches: {found}")
    head_fabric = [f["ip"] for f in lab_cfg["nodes"][0]["fabric"]]
    assert found == {HEAD: [(ip, _gateway_port(with_embed), "haproxy") for ip in head_fabric],
                     WORKER: []}, found


def _split(ops: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    mine = {k: v for k, v in ops.items() if k.startswith("svc-embed")}
    return mine, {k: v for k, v in ops.items() if k not in mine}


def test_completions_chat_embeddings_and_streaming_through_the_gateway(with_embed):
    d = with_embed
    key, base = d.api_key(), _base(d)
    status, _, body = _call(base + "/v1/models", key=key)
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [MAIN, EMBED]
    status, _, body = _call(base + "/v1/completions", {"model": MAIN, "prompt": "Say hello",
                                                        "max_tokens": 8}, key=key)
    assert status == 200 and json.loads(body)["choices"][0]["text"], body[:300]
    status, _, body = _call(base + "/v1/chat/completions", {
        "model": MAIN, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}, key=key)
    assert status == 200 and json.loads(body)["choices"][0]["message"], body[:300]
    status, _, body = _call(base + "/v1/embeddings", {"model": EMBED, "input": ["hello"]},
                            key=key)
    vec = json.loads(body)["data"][0]["embedding"]
    assert status == 200 and len(vec) == 128  # the lab's tiny embedding model
    # streamed: the events arrive while vLLM generates, not all at the end
    t0 = time.monotonic()
    r = _stream(d, {"model": MAIN, "max_tokens": 48,
                    "messages": [{"role": "user", "content": "Count"}]})
    events = list(_events(r))
    r.close()
    assert events[-1][1] == "data: [DONE]" and len(events) > 10, [e for _, e in events][-3:]
    first, last = events[0][0] - t0, events[-1][0] - t0
    print(f"[observed] stream: {len(events)} events, first after {first * 1000:.0f} ms, last "
          f"after {last * 1000:.0f} ms")
    # the first event came long before the last (a buffering proxy delivers them together)
    assert last - first > 0.25 * last, (first, last)
    assert len({round(t, 2) for t, _ in events}) > len(events) // 4  # spread, not one burst
    # a model the stack does not serve
    status, _, body = _call(base + "/v1/chat/completions", {"model": "gpt-4", "messages": []},
                            key=key)
    error = json.loads(body)["error"]
    assert status == 404 and error["served_models"] == [MAIN, EMBED], body
    assert f"{MAIN}, {EMBED}" in error["message"]
    # vLLM's metrics: only with the key, the main model's or a service's
    assert _call(base + "/metrics")[0] == 401
    status, _, body = _call(base + "/metrics", key=key)
    assert status == 200 and b"vllm:" in body
    status, _, body = _call(base + "/metrics?model=tiny-embed", key=key)
    assert status == 200 and b"vllm:" in body


def _running(d) -> float:
    """vLLM's running requests (its Prometheus gauge), read through the gateway with the key."""
    status, _, text = _call(_base(d) + "/metrics", key=d.api_key())
    assert status == 200, f"vLLM's metrics through the gateway: {status} {text[:300]!r}"
    values = re.findall(rb"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", text, re.M)
    assert values, "vLLM's metrics hold no vllm:num_requests_running"
    return sum(float(v) for v in values)


def _chunks(events, n: int) -> list[str]:
    """The next n server-sent events, each a generated chunk (an error event fails here)."""
    got = []
    for _, event in events:
        assert event.startswith("data: {") and '"choices"' in event, event[:300]
        got.append(event)
        if len(got) == n:
            return got
    raise AssertionError(f"the stream ended after {len(got)} events")


# long enough that vLLM cannot finish it within the waits below on any machine that runs the
# suite (the lab model's context is 2048 tokens; the prompt takes ~10)
LONG = {"model": MAIN, "max_tokens": 2000, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Go on"}]}


def test_a_client_gone_mid_stream_stops_the_generation_at_vllm(with_embed):
    d = with_embed
    r = _stream(d, LONG)
    events = _events(r)
    _chunks(events, 2)
    # vLLM counts the request as running while it generates (the gauge follows each step)
    t0 = time.monotonic()
    while (running := _running(d)) < 1:
        assert time.monotonic() - t0 < 30, "vLLM's metrics never showed the stream's request"
        _chunks(events, 1)
    t0 = time.monotonic()
    r.close()  # the client leaves; 2000 tokens would take vLLM far longer than this wait
    while _running(d) > 0:
        assert time.monotonic() - t0 < 15, "vLLM kept generating for a client that left"
        time.sleep(0.5)
    print(f"[observed] {running:.0f} running; vLLM stopped {time.monotonic() - t0:.1f} s after "
          "the client left")


def _last_reload(d) -> float:
    """When the gateway's HAProxy last started a worker (its master logs `New worker (<pid>)
    forked` at its start and at every reload), as a Unix time from Docker's log timestamps
    (the lab's nodes share this machine's clock)."""
    lines = [line for line in d.ssh(HEAD, f"docker logs --timestamps {GATEWAY} 2>&1")
             .splitlines() if "New worker" in line]
    assert lines, f"{GATEWAY}'s log shows no HAProxy worker start"
    stamp = lines[-1].split()[0]  # 2026-12-02T15:48:01.133399482Z
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return (datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
            .timestamp() + float("0." + (frac or "0")))


def test_removing_the_service_keeps_a_running_stream_and_changes_only_the_routing(with_embed):
    """A stream open across the `up` that removes the service (and reloads the gateway): it
    goes on delivering tokens after HAProxy's master started the new configuration's worker,
    then the client closes it (the stream itself would run for minutes: LONG)."""
    d = with_embed
    before = d.snapshot()
    started = _last_reload(d)
    events: list[tuple[float, str]] = []  # (Unix time of arrival, event)
    enough = threading.Event()

    def read() -> None:
        r = _stream(d, LONG)
        try:
            for t, e in _events(r):
                events.append((t - time.monotonic() + time.time(), e))
                if enough.is_set():
                    return
        finally:
            r.close()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(2)
    assert reader.is_alive(), "the stream ended before the reload: make it longer"
    d.set("services", [])
    mine, other = _split(d.timed_up("gateway: the service removed, a stream running"))
    assert mine and set(mine.values()) == {"delete"}, mine
    assert set(other.items()) <= set(ROUTING.items()) and "gateway-config" in other, other
    reloaded = _last_reload(d)
    assert reloaded > started, "the up did not reload the gateway"
    # tokens keep arriving on the open stream after the reload (5 s of them), then it is closed
    end = time.monotonic() + 120
    while reader.is_alive() and not (events and events[-1][0] > reloaded + 5):
        assert time.monotonic() < end, "no token on the open stream 5 s after the reload"
        time.sleep(0.5)
    assert reader.is_alive(), f"the stream ended across the reload: {events[-3:]}"
    enough.set()
    reader.join(60)
    assert not reader.is_alive()
    after_reload = [e for t, e in events if t > reloaded]
    assert after_reload and all(e.startswith("data: {") and '"choices"' in e for _, e in events), \
        [e for _, e in events[-3:]]
    print(f"[observed] the stream ran across the reload: {len(events)} events, "
          f"{len(after_reload)} after it")
    after = d.snapshot()
    assert EMBED_CONTAINER not in after[HEAD]
    for node, containers in before.items():
        assert {k: v for k, v in after[node].items()} == \
            {k: v for k, v in containers.items() if k != EMBED_CONTAINER}, node
    status, _, body = _call(_base(d) + "/v1/embeddings", {"model": EMBED, "input": ["x"]},
                            key=d.api_key())
    assert status == 404 and json.loads(body)["error"]["served_models"] == [MAIN]
    # the service's key folder went with it; the main model's key file stays
    assert d.ssh(HEAD, "ls /var/lib/spark-vllm/stacks/dev/services 2>/dev/null || true") == ""
    key = "/var/lib/spark-vllm/stacks/dev/vllm/api-key"
    assert d.ssh(HEAD, f"test -s {key} && echo ok").strip() == "ok"
    assert complete(d)
    d.run("preview", expect_no_changes=True)
