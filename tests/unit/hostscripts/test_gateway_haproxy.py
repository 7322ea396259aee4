"""The gateway's configuration, run: the real HAProxy (Debian's `haproxy` package, bookworm's
2.6 LTS, what the lab's gateway image is built from) with the exact files hostscripts/gateway.py
renders, in front of two fake vLLM servers (tests/fake_vllm.py: they run no model).

Everything on loopback, in this process's network: the key, routing by the body's `model`, the
answers the gateway gives itself, streaming, cancellation, a reload that keeps an open stream,
TLS. Needs the `haproxy` binary (`make setup` as root installs it: scripts/host_packages.sh);
without it this module fails saying how to install it, it does not skip (make test fails on
skips anyway).
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostscripts.gateway import (
    LIVE_PATH,
    GatewaySpec,
    Route,
    Server,
    config_write,
    key_map,
    maxconn,
    render,
)
from hostscripts.paths import StackNames
from tests.conftest import haproxy_binary
from tests.fake_vllm import FakeVllm
from tests.unit.hostscripts.daemons import no_network  # noqa: F401

KEY = "sk-gateway-functional-test-key-0001"
MAX_BODY = 64 * 1024
# Paths vLLM registers (its /openapi.json; tests/e2e/test_gateway.py reads the live list) and
# some it does not: without the key every one is 401, whatever the method
PATHS = ["/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/score",
         "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/pooling", "/classify",
         "/invocations", "/tokenize", "/detokenize", "/metrics", "/metrics?model=embed",
         "/load", "/version", "/health", "/ping", "/openapi.json", "/docs", "/v1/responses",
         "/v1/audio/transcriptions", "/no/such/path", "/gateway/livez", "/gateway/live/x", "/"]


def _haproxy() -> str:
    return haproxy_binary()


def _catches_usr2(pid: int) -> bool:
    """What config_write's loop reads: the process catches SIGUSR2 (SigCgt, bit 12)."""
    with open(f"/proc/{pid}/status") as f:
        cgt = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    return bool(int(cgt, 16) & (1 << (signal.SIGUSR2 - 1)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """HAProxy with the rendered files under `root` (conf/ and secrets/, as on the head)."""

    def __init__(self, root: Path, spec: GatewaySpec, cert: str | None = None) -> None:
        self.root, self.spec, self.cert = root, spec, cert
        self.proc: subprocess.Popen[bytes] | None = None
        self.write(spec)
        (root / "secrets").mkdir(parents=True, exist_ok=True)
        (root / "secrets" / "api-key.map").write_text(key_map(KEY))
        if cert is not None:
            (root / "secrets" / "tls.pem").write_text(cert)

    def write(self, spec: GatewaySpec) -> None:
        self.spec = spec
        # the stats socket's folder: short (a socket's path has at most 107 bytes), the
        # container's is /run/spark-vllm-gateway
        if not hasattr(self, "run"):
            self.run = Path(tempfile.mkdtemp(prefix="svl-gw-", dir="/tmp"))
        for path, text in render(spec, root=str(self.root), run=str(self.run),
                                 user=None).items():
            (self.root / "conf" / path).parent.mkdir(parents=True, exist_ok=True)
            (self.root / "conf" / path).write_text(text)

    @property
    def cfg(self) -> Path:
        return self.root / "conf" / "haproxy.cfg"

    def start(self) -> Gateway:
        check = subprocess.run([_haproxy(), "-c", "-f", str(self.cfg)], capture_output=True,
                               text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.proc = subprocess.Popen([_haproxy(), "-W", "-db", "-f", str(self.cfg)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                if self.request("GET", LIVE_PATH, key=None)[0] == 200:
                    return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError("HAProxy did not answer its liveness path")

    def reload(self, spec: GatewaySpec) -> None:
        """What the stack does on the head (hostscripts/gateway.config_write): new files, then
        SIGUSR2 to the master once it catches that signal (it ignores it while it starts: a
        reload sent then is lost, measured under load)."""
        self.write(spec)
        assert self.proc is not None
        end = time.monotonic() + 30
        while not _catches_usr2(self.proc.pid):
            assert time.monotonic() < end, "HAProxy's master never caught SIGUSR2"
            time.sleep(0.05)
        self.proc.send_signal(signal.SIGUSR2)

    def stop(self) -> str:
        if self.proc is None:
            return ""
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out.decode(errors="replace")

    def connection(self, timeout: float = 10) -> http.client.HTTPConnection:
        if self.cert is None:
            return http.client.HTTPConnection("127.0.0.1", self.spec.port, timeout=timeout)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection("127.0.0.1", self.spec.port, timeout=timeout,
                                           context=ctx)

    def request(self, method: str, path: str, body: dict | bytes | None = None,
                key: str | None = KEY, headers: dict | None = None) -> tuple[int, dict, bytes]:
        hdr = {"Content-Type": "application/json", **(headers or {})}
        if key is not None:
            hdr["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        c = self.connection()
        try:
            c.request(method, path, body=data, headers=hdr)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()


def _spec(port: int, main: FakeVllm, embed: FakeVllm | None, tls: bool = False) -> GatewaySpec:
    routes = [Route("tiny-moe", "generate", "spark-lab/tiny-moe",
                    (Server("spark-1", "127.0.0.1", main.port),))]
    if embed is not None:
        routes.append(Route("tiny-embed", "embed", "spark-lab/tiny-embed",
                            (Server("spark-1", "127.0.0.1", embed.port),)))
    # the functional tests send hundreds of requests without the key from one address: its
    # 401 rate is the per-source tests' (below), not theirs
    return GatewaySpec(port=port, tls=tls, max_body_bytes=MAX_BODY, routes=tuple(routes),
                       unauthorized_per_minute=100_000)


@pytest.fixture
def fakes() -> Iterator[tuple[FakeVllm, FakeVllm]]:
    main, embed = FakeVllm("main").start(), FakeVllm("embed").start()
    yield main, embed
    main.stop()
    embed.stop()


@pytest.fixture
def gw(tmp_path, fakes) -> Iterator[Gateway]:
    main, embed = fakes
    g = Gateway(tmp_path / "gateway", _spec(_free_port(), main, embed)).start()
    yield g
    log = g.stop()
    assert KEY not in log  # HAProxy's log lines never carry the key


def test_every_path_without_the_key_or_with_a_wrong_one_is_401_and_reaches_no_vllm(gw, fakes):
    wrong = [None, "sk-wrong", KEY + "x", KEY[:-1], "", f"{KEY} {KEY}"]
    for path in PATHS:
        for method in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS"):
            for key in wrong:
                body = {"model": "tiny-moe", "prompt": "x"} if method == "POST" else None
                status, headers, data = gw.request(method, path, body, key=key)
                assert status == 401, (method, path, key, status, data)
                if method != "HEAD":
                    assert json.loads(data)["error"]["code"] == 401
                assert headers.get("www-authenticate") == 'Bearer realm="spark-vllm"'
    # other schemes and spellings of the right key are refused too
    for header in (f"Basic {KEY}", f"Token {KEY}", KEY, f"Bearer  {KEY}x"):
        status, _, _ = gw.request("GET", "/v1/models", key=None,
                                  headers={"Authorization": header})
        assert status == 401, header
    assert fakes[0].seen == [] and fakes[1].seen == []


def test_the_liveness_path_needs_no_key_and_says_nothing_about_the_models(gw, fakes):
    status, headers, data = gw.request("GET", LIVE_PATH, key=None)
    assert (status, data) == (200, b"ok")
    assert "tiny" not in data.decode() + json.dumps(headers)
    assert fakes[0].seen == []


def test_v1_models_lists_every_served_model_from_the_gateway_itself(gw, fakes):
    status, _, data = gw.request("GET", "/v1/models")
    assert status == 200
    doc = json.loads(data)
    assert [m["id"] for m in doc["data"]] == ["tiny-moe", "tiny-embed"]
    assert doc["data"][1]["root"] == "spark-lab/tiny-embed" and doc["object"] == "list"
    assert fakes[0].seen == [] and fakes[1].seen == []


def test_routes_by_the_bodys_model_and_passes_the_key_on(gw, fakes):
    main, embed = fakes
    for model, fake, path in (("tiny-moe", main, "/v1/completions"),
                              ("tiny-embed", embed, "/v1/embeddings"),
                              ("tiny-embed", embed, "/tokenize")):
        status, headers, data = gw.request("POST", path, {"model": model, "input": "hi"})
        assert status == 200, data
        assert headers["x-fake-vllm"] == fake.name and json.loads(data)["model"] == model
        assert fake.seen[-1].path == path
        assert fake.seen[-1].authorization == f"Bearer {KEY}"  # vLLM checks it again
    # no `model`: vLLM's default, the main model's server; GETs too
    n = len(main.seen)
    assert gw.request("POST", "/tokenize", {"prompt": "hi"})[1]["x-fake-vllm"] == "main"
    assert gw.request("GET", "/version")[1]["x-fake-vllm"] == "main"
    assert gw.request("GET", "/openapi.json")[1]["x-fake-vllm"] == "main"
    assert len(main.seen) == n + 3
    # the model first or last in the body, spaces or not
    body = b'{"prompt": "x", "max_tokens": 1,   "model" :"tiny-embed"}'
    assert gw.request("POST", "/v1/embeddings", body)[1]["x-fake-vllm"] == "embed"


def test_an_unknown_model_is_404_naming_the_served_ones(gw, fakes):
    for model in ("gpt-4", "tiny-moe ", "TINY-MOE", "", "tiny"):
        status, _, data = gw.request("POST", "/v1/chat/completions", {"model": model})
        assert status == 404, model
        error = json.loads(data)["error"]
        assert error["code"] == 404 and error["param"] == "model"
        assert error["served_models"] == ["tiny-moe", "tiny-embed"]
        assert "tiny-moe, tiny-embed" in error["message"]
    assert gw.request("GET", "/metrics?model=nope")[0] == 404
    assert fakes[0].seen == [] and fakes[1].seen == []


def test_metrics_only_behind_the_key_from_the_model_asked(gw, fakes):
    assert gw.request("GET", "/metrics", key=None)[0] == 401
    assert gw.request("GET", "/metrics")[1]["x-fake-vllm"] == "main"
    assert gw.request("GET", "/metrics?model=tiny-embed")[1]["x-fake-vllm"] == "embed"
    # the name URL-encoded, as Prometheus sends a `__param_model` (a served name with a `/`,
    # `org/model`, arrives as org%2Fmodel): decoded before the lookup
    assert gw.request("GET", "/metrics?model=tiny%2Dembed")[1]["x-fake-vllm"] == "embed"


def test_a_body_too_large_to_find_its_model_is_413_and_one_with_the_model_first_is_routed(gw):
    pad = "x" * (2 * MAX_BODY)
    status, _, data = gw.request("POST", "/v1/completions", {"prompt": pad, "model": "tiny-moe"})
    assert status == 413 and "maxBodyBytes" in json.loads(data)["error"]["message"]
    body = json.dumps({"model": "tiny-embed", "prompt": pad}).encode()
    status, headers, _ = gw.request("POST", "/v1/embeddings", body)
    assert status == 200 and headers["x-fake-vllm"] == "embed"


def _open_stream(gw: Gateway, model: str = "tiny-moe") -> tuple[http.client.HTTPConnection,
                                                                  http.client.HTTPResponse]:
    c = gw.connection(timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": model, "prompt": "x", "stream": True}).encode(),
              headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    return c, r


def _events(r: http.client.HTTPResponse) -> Iterator[tuple[float, bytes]]:
    """(arrival time, event) for each SSE event as it arrives."""
    buf = b""
    while True:
        data = r.read1(65536)
        if not data:
            return
        buf += data
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            yield time.monotonic(), event


def test_server_sent_events_arrive_as_they_are_sent_not_at_the_end(gw, fakes):
    main = fakes[0]
    c, r = _open_stream(gw)
    got = list(_events(r))
    c.close()
    assert [e for _, e in got][-1] == b"data: [DONE]"
    arrived = [t for t, _ in got][: main.chunks]
    assert len(arrived) == len(main.sent_at) == main.chunks
    # each event reached the client within a fraction of the gap after the server sent it,
    # long before the response ended
    lags = [a - s for a, s in zip(arrived, main.sent_at, strict=True)]
    assert max(lags) < main.gap / 2, lags
    assert got[-1][0] - arrived[0] > (main.chunks - 1) * main.gap * 0.9


def test_a_client_that_goes_away_mid_stream_cancels_at_the_server(gw, fakes):
    main = fakes[0]
    main.chunks, main.gap = 50, 0.2
    c, r = _open_stream(gw)
    next(_events(r))  # one event, then the client leaves
    c.close()
    assert main.disconnected.wait(5), "the fake vLLM kept streaming to a client that left"


def test_a_client_that_goes_away_before_an_answer_cancels_at_the_server(gw, fakes):
    main = fakes[0]
    c = gw.connection()
    c.request("POST", "/fake/slow", body=b'{"model": "tiny-moe"}',
              headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    time.sleep(0.5)  # the request reached the server, which has not answered
    assert main.seen and main.seen[-1].path == "/fake/slow"
    c.close()
    assert main.disconnected.wait(5), "the fake vLLM never saw the client leave"


def test_a_reload_changes_the_routing_and_keeps_an_open_stream(gw, fakes):
    """Removing a service is new files and SIGUSR2 to HAProxy's master: the open stream (served
    by the old worker) finishes whole, new requests see the new routing at once."""
    main, _embed = fakes
    main.chunks, main.gap = 8, 0.25
    c, r = _open_stream(gw)
    events = _events(r)
    next(events)
    gw.reload(_spec(gw.spec.port, main, None))
    end, new = time.monotonic() + 15, 0
    while time.monotonic() < end and new < 3:  # the new worker has taken the listener
        _, _, data = gw.request("GET", "/v1/models")
        new = new + 1 if [m["id"] for m in json.loads(data)["data"]] == ["tiny-moe"] else 0
        time.sleep(0.1)
    assert new == 3, f"the reload did not take; HAProxy said: {gw.stop()[-3000:]}"
    assert gw.request("POST", "/v1/embeddings", {"model": "tiny-embed"})[0] == 404
    rest = [e for _, e in events]
    c.close()
    assert rest[-1] == b"data: [DONE]" and len(rest) == main.chunks  # nothing dropped
    assert not main.disconnected.is_set()


def test_config_write_checks_with_haproxy_and_swaps_the_folder(tmp_path, fakes):
    """The script the head runs (hostscripts/gateway.config_write), with `docker` replaced by a
    stand-in that runs the local haproxy on the mounted folders: a good config becomes the one
    in use; a bad one fails the script and leaves the one in use alone."""
    names = StackNames("t")
    root = tmp_path / "node"
    d = root / names.gateway_dir.lstrip("/")
    (d / "secrets").mkdir(parents=True)
    (d / "secrets" / "api-key.map").write_text(key_map(KEY))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # docker run ... -v <new>:<mount>/conf:ro -v <secrets>:<mount>/secrets:ro --entrypoint
    # haproxy <image> -c -f <mount>/conf/haproxy.cfg: the stand-in checks a copy of the new
    # folder with its paths pointed at the copy (what the mount does), and answers `inspect`
    # as "not running"
    (bin_dir / "docker").write_text(f"""#!/bin/sh
case "$1" in
  run) for a in "$@"; do case "$a" in *:/etc/spark-vllm/gateway/conf:ro) new=${{a%%:*}};;
       esac; done
       tmp=$(mktemp -d); cp -r "$new"/. "$tmp"/
       sed -i "s#{d}/conf/#$tmp/#g" "$tmp/haproxy.cfg"
       {_haproxy()} -c -f "$tmp/haproxy.cfg"; rc=$?; rm -rf "$tmp"; exit $rc ;;
  inspect) echo false ;;
esac
""")
    (bin_dir / "docker").chmod(0o755)
    main, embed = fakes
    spec = _spec(_free_port(), main, embed)

    def script(s: GatewaySpec) -> str:
        files = render(s, root=names.gateway_dir, user=None)
        # the node's absolute paths (the files' too), under this test's folder
        text = config_write(names, files, "sha256:" + "a" * 64, {"spark-vllm.managed": "true"})
        return text.replace(names.gateway_dir, str(d))

    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", script(spec)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("gateway config ")
    conf = d / "conf"
    assert conf.is_symlink() and (conf / "haproxy.cfg").is_file()
    first = os.readlink(conf)
    assert oct((d / first).stat().st_mode & 0o777) == "0o700"
    # a broken config: the check fails the script, `conf` still names the good one
    bad = script(_spec(_free_port(), main, None)).replace("balance leastconn", "balance nope")
    done = subprocess.run(["sh", "-c", bad], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "balance only supports" in done.stderr
    assert os.readlink(conf) == first and (conf / "haproxy.cfg").is_file()


def _self_signed(tmp_path: Path) -> str:
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=spark-vllm-test", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    return crt.read_text() + key.read_text()


def test_tls_terminates_at_the_gateway_with_the_key_still_required(tmp_path, fakes):
    main, embed = fakes
    g = Gateway(tmp_path / "gw", _spec(_free_port(), main, embed, tls=True),
                cert=_self_signed(tmp_path)).start()
    try:
        assert g.request("GET", "/v1/models", key=None)[0] == 401
        status, headers, _ = g.request("POST", "/v1/embeddings", {"model": "tiny-embed"})
        assert status == 200 and headers["x-fake-vllm"] == "embed"
        # plain HTTP on the TLS port gets nothing
        c = http.client.HTTPConnection("127.0.0.1", g.spec.port, timeout=5)
        with pytest.raises((OSError, http.client.HTTPException)):
            c.request("GET", LIVE_PATH)
            c.getresponse().read()
        c.close()
    finally:
        g.stop()


def test_the_rendered_config_drops_to_the_haproxy_user_and_checks(tmp_path, fakes):
    """What the image runs: `user haproxy` / `group haproxy` (the master stays root to read the
    root-only files on every reload). Checked, not run."""
    main, embed = fakes
    root = tmp_path / "gw"
    files = render(_spec(_free_port(), main, embed), root=str(root))
    assert "    user haproxy\n    group haproxy\n" in files["haproxy.cfg"]
    for path, text in files.items():
        (root / "conf" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "conf" / path).write_text(text)
    (root / "secrets").mkdir()
    (root / "secrets" / "api-key.map").write_text(key_map(KEY))
    check = subprocess.run([_haproxy(), "-c", "-f", str(root / "conf" / "haproxy.cfg")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_config_write_reloads_a_running_gateway_once_it_takes_the_signal(tmp_path, fakes):
    """config_write against a running HAProxy (`docker` a stand-in that names its pid): the
    loop waits until the master catches SIGUSR2, the script signals that pid itself, the reload
    takes, the new routing answers. `docker kill` fails here: Docker records a signal sent
    through its kill API as a manual stop, and `unless-stopped` then leaves the gateway down
    after a restart of dockerd."""
    names = StackNames("t")
    d = tmp_path / "node" / names.gateway_dir.lstrip("/")
    main, embed = fakes
    spec = _spec(_free_port(), main, embed)
    g = Gateway(d, spec).start()  # conf/ as render() writes it, secrets/ beside it
    try:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "docker").write_text(f"""#!/bin/sh
case "$1" in
  run) exit 0 ;;
  inspect) case "$*" in *Running*) echo true ;; *Pid*) echo {g.proc.pid} ;; esac ;;
  kill) echo "docker kill would mark the gateway manually stopped" >&2; exit 1 ;;
esac
""")
        (bin_dir / "docker").chmod(0o755)
        files = render(_spec(spec.port, main, None), root=names.gateway_dir, run=str(g.run),
                       user=None)
        # `conf` here is a folder of the test's Gateway: the script's link goes beside it
        shutil.rmtree(d / "conf")
        script = config_write(names, files, "sha256:" + "a" * 64, {}).replace(
            names.gateway_dir, str(d))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == "gateway reloaded"
        end = time.monotonic() + 15
        while time.monotonic() < end:
            _, _, data = g.request("GET", "/v1/models")
            if [m["id"] for m in json.loads(data)["data"]] == ["tiny-moe"]:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the reload config_write sent did not take")
    finally:
        g.stop()


def test_a_client_that_waits_for_100_continue_gets_it_and_is_routed(gw, fakes):
    """curl and other clients send `Expect: 100-continue` before a large body and wait: the
    gateway, which must read the body to route it, answers 100 itself."""
    body = json.dumps({"input": "x" * 5000, "model": "tiny-embed"}).encode()
    with socket.create_connection(("127.0.0.1", gw.spec.port), timeout=10) as s:
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                  + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n".encode()
                  + b"Expect: 100-continue\r\n\r\n")
        interim = s.recv(4096)
        assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
        s.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"x-fake-vllm: embed" in answer.lower()
    assert fakes[1].seen[-1].body == body


# ------------------------------------------------------------------ unauthenticated clients
# Issue 46, item 5: a client without the key held the gateway's connections (512 at the
# default body size): a 401 kept its connection alive for 60 s, a slow header held a slot 30 s,
# and nothing limited one address. Now a 401 closes, the headers must come within
# gateway.headerTimeoutSeconds, and per address (a stick table) connections beyond
# gateway.maxConnectionsPerSource, or from an address past gateway.unauthorizedPerMinute, are
# closed as they arrive, before they take a slot.

def _from(source: str, port: int, timeout: float = 10) -> socket.socket:
    """A connection to the gateway from another loopback address (another client)."""
    s = socket.socket()
    s.settimeout(timeout)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def _refused(source: str, port: int, within: float = 2) -> bool:
    """Whether a new connection from `source` is closed as it arrives (reset at once, or
    closed before it sends anything)."""
    try:
        s = _from(source, port)
    except ConnectionResetError:
        return True
    try:
        return _closed(s, within)
    finally:
        s.close()


def _closed(s: socket.socket, within: float) -> bool:
    """Whether the gateway closes (or resets) `s` within `within` seconds, reading what it
    sends first."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _ask(g: Gateway, source: str, key: str | None) -> bytes:
    """GET /v1/models from `source`: the status line, or b"reset" when the connection is
    refused."""
    try:
        s = _from(source, g.spec.port)
    except ConnectionResetError:
        return b"reset"
    auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
    try:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n" + auth + b"\r\n")
        return s.recv(65536).split(b"\r\n", 1)[0]
    except ConnectionResetError:
        return b"reset"
    finally:
        s.close()


def _limited(tmp_path, fakes, **limits) -> Gateway:
    main, _ = fakes
    spec = dataclasses.replace(_spec(_free_port(), main, None), **limits)
    return Gateway(tmp_path / "gw", spec).start()


def test_a_401_closes_its_connection(gw):
    with socket.create_connection(("127.0.0.1", gw.spec.port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n")
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 401") and b"\r\nconnection: close\r\n" in head.lower()
        assert _closed(s, 2), "the connection stayed open after the 401"
    # with the key, the connection stays for the next request
    c = gw.connection()
    for _ in range(2):
        c.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert c.getresponse().read() and c.sock is not None
    c.close()


def test_a_slow_header_holds_its_slot_only_for_the_header_timeout(tmp_path, fakes):
    g = _limited(tmp_path, fakes, header_timeout_seconds=1)
    try:
        for sent in (b"", b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n"):  # idle, or never done
            s = _from("127.0.0.1", g.spec.port)
            s.sendall(sent)
            t0 = time.monotonic()
            assert _closed(s, 5)
            assert time.monotonic() - t0 < 2.5, time.monotonic() - t0
            s.close()
    finally:
        g.stop()


def test_connections_beyond_the_per_source_limit_are_closed_as_they_arrive(tmp_path, fakes):
    g = _limited(tmp_path, fakes, max_connections_per_source=4, header_timeout_seconds=30)
    try:
        held = [_from("127.0.0.2", g.spec.port) for _ in range(4)]
        time.sleep(0.3)  # HAProxy has taken them (the kernel completes a connect before)
        assert _refused("127.0.0.2", g.spec.port), "the fifth connection of one address was kept"
        assert not any(_closed(s, 0.2) for s in held)  # the first four are still open
        # another address is not limited by the first one's connections
        status, _, _ = g.request("GET", "/v1/models")
        assert status == 200
        for s in held:
            s.close()
    finally:
        g.stop()


def test_an_address_past_its_401_rate_is_refused_and_others_are_not(tmp_path, fakes):
    g = _limited(tmp_path, fakes, unauthorized_per_minute=3)
    try:
        def ask(source: str, key: str | None) -> bytes:
            return _ask(g, source, key)

        assert [ask("127.0.0.2", "sk-guess") for _ in range(4)] == [
            b"HTTP/1.1 401 Unauthorized"] * 4
        # past 3 a minute: its next connections are closed, even with the key
        assert ask("127.0.0.2", None) in (b"reset", b"")
        assert ask("127.0.0.2", KEY) in (b"reset", b"")
        # another client keeps its gateway
        assert ask("127.0.0.3", KEY) == b"HTTP/1.1 200 OK"
    finally:
        g.stop()


def test_600_idle_unauthenticated_connections_leave_an_authenticated_client_served(
        tmp_path, fakes):
    """The measure the issue asks for, at the defaults (2 MiB bodies: 512 slots; 64 per
    address; 5 s for the headers): 600 idle connections from one address, and meanwhile an
    authenticated client on another one gets its answers at once."""
    main, _ = fakes
    spec = dataclasses.replace(_spec(_free_port(), main, None), max_body_bytes=2 * 1024 * 1024,
                               max_connections_per_source=64, unauthorized_per_minute=30,
                               header_timeout_seconds=5)
    assert maxconn(spec.max_body_bytes) == 512
    g = Gateway(tmp_path / "gw", spec).start()
    idle: list[socket.socket] = []
    try:
        refused_at_connect = 0
        for _ in range(600):
            try:
                idle.append(_from("127.0.0.2", spec.port))
            except ConnectionResetError:
                refused_at_connect += 1
        time.sleep(0.5)  # HAProxy has taken (or closed) them all
        times = []
        for _ in range(10):
            t0 = time.monotonic()
            status, _, _ = g.request("POST", "/v1/completions", {"model": "tiny-moe",
                                                                 "prompt": "x"})
            times.append(time.monotonic() - t0)
            assert status == 200
        kept = sum(not _closed(s, 0.01) for s in idle)
        print(f"[measured] 600 idle connections from one address: {kept} held, "
              f"completions {max(times) * 1000:.0f} ms at most")
        assert kept <= 64 and max(times) < 1.0, (kept, times)
        stats = _stats(g)
        assert stats.refused >= 600 - 64, stats
    finally:
        for s in idle:
            s.close()
        g.stop()


def _stats(g: Gateway):
    """The gateway's counters as `spark-vllm status` reads them: payloads/gateway_stats.py
    against the running HAProxy's stats socket, parsed by inspection.status.parse_gateway."""
    from hostscripts.common import payload
    from inspection.status import parse_gateway

    out = subprocess.run(["python3", "-c", payload("gateway_stats.py"),
                          str(g.run / "stats.sock")], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return parse_gateway(out.stdout, 64, 3)


def test_the_counters_status_shows_come_from_the_stats_socket(tmp_path, fakes):
    g = _limited(tmp_path, fakes, unauthorized_per_minute=3, max_connections_per_source=64)
    try:
        seen = [_ask(g, "127.0.0.2", "sk-guess") for _ in range(5)]
        assert seen[:4] == [b"HTTP/1.1 401 Unauthorized"] * 4 and seen[4] in (b"reset", b"")
        assert _ask(g, "127.0.0.3", KEY) == b"HTTP/1.1 200 OK"
        stats = _stats(g)
        # 127.0.0.1 (the harness's liveness probes), .2 and .3
        assert stats.unauthorized == 4 and stats.sources == 3, stats
        assert stats.refused == 1 and stats.over_limit == ("127.0.0.2",), stats
        assert stats.connection_limit == maxconn(MAX_BODY) and stats.connections_total >= 6
        sock = g.run / "stats.sock"
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
    finally:
        g.stop()
def test_each_replicas_metrics_come_from_that_replica_only(tmp_path):
    """Issue 50: a model served by several replicas is scraped per replica
    (`/metrics?model=<name>&replica=<node>`): every scrape of a replica reaches that replica's
    server, never another (the model's balancing hands a plain `?model=` to any); a replica
    down answers 503 (its target down) instead of another's metrics; one the model does not
    have is 404 naming the replicas; the key is still required."""
    main, one, two = (FakeVllm(n).start() for n in ("main", "embed-1", "embed-2"))
    routes = (Route("tiny-moe", "generate", "spark-lab/tiny-moe",
                    (Server("spark-1", "127.0.0.1", main.port),)),
              Route("org/tiny-embed", "embed", "spark-lab/tiny-embed",
                    (Server("spark-1", "127.0.0.1", one.port),
                     Server("spark-2", "127.0.0.1", two.port))))
    g = Gateway(tmp_path / "gateway", GatewaySpec(port=_free_port(), tls=False,
                                                  max_body_bytes=MAX_BODY, routes=routes))
    g.start()
    try:
        for _ in range(6):  # balancing would alternate; a replica's path never does
            assert g.request("GET", "/metrics?model=org%2Ftiny-embed&replica=spark-2")[1][
                "x-fake-vllm"] == "embed-2"
            assert g.request("GET", "/metrics?model=org%2Ftiny-embed&replica=spark-1")[1][
                "x-fake-vllm"] == "embed-1"
        # the plain model path is still balanced over both
        seen = {g.request("GET", "/metrics?model=org%2Ftiny-embed")[1]["x-fake-vllm"]
                for _ in range(8)}
        assert seen == {"embed-1", "embed-2"}
        # the main model's replica, with or without its name
        assert g.request("GET", "/metrics?replica=spark-1")[1]["x-fake-vllm"] == "main"
        assert g.request("GET", "/metrics?model=tiny-moe&replica=spark-1")[1][
            "x-fake-vllm"] == "main"
        for path in ("/metrics?model=tiny-moe&replica=spark-2",
                     "/metrics?model=org%2Ftiny-embed&replica=spark-3",
                     "/metrics?replica=spark-2"):
            status, _, data = g.request("GET", path)
            assert status == 404, path
            error = json.loads(data)["error"]
            assert error["param"] == "replica"
            assert error["replicas"] == ["tiny-moe@spark-1", "org/tiny-embed@spark-1",
                                         "org/tiny-embed@spark-2"]
        assert g.request("GET", "/metrics?model=nope&replica=spark-1")[0] == 404
        assert g.request("GET", "/metrics?model=org%2Ftiny-embed&replica=spark-2",
                         key=None)[0] == 401
        n = len(one.seen)
        two.stop()
        status, _, _ = g.request("GET", "/metrics?model=org%2Ftiny-embed&replica=spark-2")
        assert status == 503
        assert len(one.seen) == n  # never handed to the other replica
    finally:
        g.stop()
        for f in (main, one, two):
            f.stop()
