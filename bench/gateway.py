"""The gateway's own cost: HAProxy with the stack's exact configuration against a stub upstream
that answers in constant time, measured by a real load generator, side by side with the stub
reached directly, in one run. Part of `make bench` (section `gateway`); runs alone too:

    venv/bin/python bench/gateway.py [--seconds 10] [--reps 3] [--delay-ms 20] [--json OUT]

Why a stub and not the lab's vLLM: the CPU build's run-to-run noise (0.93 to 1.11 of direct in
docs/serving-bench.md) is larger than the figure wanted (a fraction of a millisecond). What runs:

- the stub upstream: a second HAProxy (Debian's, the same binary) whose Lua service answers
  `POST /v1/completions` after a constant `--delay-ms` with an OpenAI completion, or, when the
  body asks for `"stream": true`, with server-sent events spread over the same time and
  `data: [DONE]`; `GET /health` at once (the gateway's health check);
- the gateway: `hostscripts.gateway.render` of a one-route spec (the stack's own files, key
  map and all), plain and with TLS (a self-signed P-256 certificate made here);
- the load: Debian's `wrk` (one thread, `-c` connections kept alive, POST bodies and the
  `Authorization` header from a Lua script; its latency percentiles read in microseconds).

For each concurrency (1, 16, 64) and body (plain, stream) the runs alternate direct, gateway
and gateway with TLS `--reps` times (so drift hits all alike); the figures are medians over
the reps: p50 and p99 added (the gateway's percentile minus direct's, in ms) and throughput as
a ratio of direct's. The goal (issue 43): p50 added <= 0.3 ms, throughput >= 0.98 of direct.
The load generator runs on CPU 0 and both HAProxys on CPU 1 (taskset) when the machine has two
or more, so the gateway competes with the stub, not with wrk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from hostscripts.gateway import LIVE_PATH, GatewaySpec, Route, Server, key_map, render  # noqa: E402

KEY = "sk-bench-gateway-key-0000000000000000"
MODEL = "stub"
CONCURRENCY = (1, 16, 64)
BODIES = ("plain", "stream")
GOAL_P50_ADDED_MS = 0.3
GOAL_THROUGHPUT = 0.98

STUB_LUA = r"""
-- A constant-time OpenAI completion server (bench/gateway.py): no model, no work.
local delay = tonumber(os.getenv("STUB_DELAY_MS"))
local events = 8
local body = '{"id":"cmpl-stub","object":"text_completion","created":0,"model":"stub",' ..
  '"choices":[{"index":0,"text":" hello","finish_reason":"length","logprobs":null}],' ..
  '"usage":{"prompt_tokens":4,"completion_tokens":16,"total_tokens":20}}'
local chunk = 'data: {"id":"cmpl-stub","object":"text_completion","created":0,' ..
  '"model":"stub","choices":[{"index":0,"text":" hi","finish_reason":null}]}\n\n'

core.register_service("stub", "http", function(applet)
  if applet.path == "/health" then
    applet:set_status(200)
    applet:add_header("content-length", "0")
    applet:start_response()
    return
  end
  local req = applet:receive() or ""
  if string.find(req, '"stream": *true') then
    applet:set_status(200)
    applet:add_header("content-type", "text/event-stream")
    applet:add_header("cache-control", "no-cache")
    applet:start_response()
    for _ = 1, events do
      core.msleep(delay // events)
      applet:send(chunk)
    end
    applet:send("data: [DONE]\n\n")
  else
    core.msleep(delay)
    applet:set_status(200)
    applet:add_header("content-type", "application/json")
    applet:add_header("content-length", tostring(#body))
    applet:start_response()
    applet:send(body)
  end
end)
"""

STUB_CFG = """global
    lua-load {lua}
    maxconn 4096
    nbthread 1
defaults
    mode http
    timeout client 60s
    timeout server 60s
    timeout connect 5s
frontend stub
    bind 127.0.0.1:{port}
    http-request use-service lua.stub
"""

WRK_LUA = """-- bench/gateway.py: the request and the percentiles in microseconds
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
done = function(summary, latency, requests)
  io.write(string.format("SVLBENCH %d %d %d %d %d %d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


@dataclass
class Run:
    target: str  # direct | gateway | gateway-tls
    body: str
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def need(binary: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if os.path.exists(
        f"/usr/sbin/{binary}") else None)
    if path is None:
        raise SystemExit(f"bench gateway: `{binary}` is missing (Debian's package {binary}: "
                         "`make setup` as root installs it, scripts/host_packages.sh)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, tls: bool = False, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench gateway: nothing answered on 127.0.0.1:{port}")


def pinned(cpu: int) -> list[str]:
    """taskset onto `cpu` when the machine has more than one (else nothing)."""
    if (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(cpu)]


def start(stack: ExitStack, argv: list[str], env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})})

    def stop() -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stack.callback(stop)
    return proc


def self_signed(folder: Path) -> str:
    key, crt = folder / "tls.key", folder / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=spark-vllm-bench", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    return crt.read_text() + key.read_text()


def gateway(stack: ExitStack, haproxy: str, root: Path, upstream: int, tls: bool) -> int:
    """The stack's gateway files under `root`, HAProxy on them; -> its port."""
    port = free_port()
    spec = GatewaySpec(port=port, tls=tls, max_body_bytes=2 * 1024 * 1024, routes=(
        Route(MODEL, "generate", "bench/stub", (Server("bench", "127.0.0.1", upstream),)),))
    for path, text in render(spec, root=str(root), user=None).items():
        (root / "conf" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "conf" / path).write_text(text)
    (root / "secrets").mkdir(parents=True, exist_ok=True)
    (root / "secrets" / "api-key.map").write_text(key_map(KEY))
    if tls:
        (root / "secrets" / "tls.pem").write_text(self_signed(root))
    cfg = root / "conf" / "haproxy.cfg"
    check = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"bench gateway: haproxy -c refused the gateway's files:\n"
                         f"{check.stdout}{check.stderr}")
    start(stack, [*pinned(1), haproxy, "-W", "-db", "-f", str(cfg)])
    wait_port(port)
    # the server is up for HAProxy only after its first health check
    scheme = "https" if tls else "http"
    end = time.monotonic() + 30
    while time.monotonic() < end:
        done = subprocess.run(["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}",
                               "-H", f"Authorization: Bearer {KEY}", "-H",
                               "Content-Type: application/json", "-d",
                               json.dumps({"model": MODEL, "prompt": "x"}),
                               f"{scheme}://127.0.0.1:{port}/v1/completions"],
                              capture_output=True, text=True)
        if done.stdout == "200":
            return port
        time.sleep(0.2)
    raise SystemExit(f"bench gateway: the gateway never answered 200 ({LIVE_PATH} aside)")


def wrk(wrk_bin: str, script: Path, url: str, concurrency: int, seconds: int) -> tuple[int, float,
                                                                                       float, float,
                                                                                       int]:
    done = subprocess.run([*pinned(0), wrk_bin, "-t1", f"-c{concurrency}", f"-d{seconds}s",
                           "--timeout", "10s", "-s", str(script), url],
                          capture_output=True, text=True, timeout=seconds + 60)
    m = re.search(r"^SVLBENCH (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)$", done.stdout, re.M)
    if done.returncode != 0 or m is None:
        raise SystemExit(f"bench gateway: wrk failed ({done.returncode}):\n{done.stdout}"
                         f"{done.stderr}")
    requests, micros, p50, p99, status_errors, io_errors = (int(g) for g in m.groups())
    return requests, micros / 1e6, p50 / 1000, p99 / 1000, status_errors + io_errors


def measure(seconds: int, reps: int, delay_ms: int, concurrency: tuple[int, ...] = CONCURRENCY,
            say: Callable[[str], object] = print) -> dict[str, Any]:
    haproxy, wrk_bin = need("haproxy"), need("wrk")
    need("openssl")
    need("curl")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="svl-bench-gw-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        (root / "stub.lua").write_text(STUB_LUA)
        stub_port = free_port()
        (root / "stub.cfg").write_text(STUB_CFG.format(lua=root / "stub.lua", port=stub_port))
        start(stack, [*pinned(1), haproxy, "-db", "-f", str(root / "stub.cfg")],
              env={"STUB_DELAY_MS": str(delay_ms)})
        wait_port(stub_port)
        urls = {"direct": f"http://127.0.0.1:{stub_port}/v1/completions",
                "gateway": "http://127.0.0.1:{}/v1/completions".format(
                    gateway(stack, haproxy, root / "gw", stub_port, tls=False)),
                "gateway-tls": "https://127.0.0.1:{}/v1/completions".format(
                    gateway(stack, haproxy, root / "gw-tls", stub_port, tls=True))}
        scripts = {}
        for body in BODIES:
            text = json.dumps({"model": MODEL, "prompt": "Say hello", "max_tokens": 16,
                               **({"stream": True} if body == "stream" else {})})
            scripts[body] = root / f"wrk-{body}.lua"
            scripts[body].write_text(WRK_LUA.format(body=text, key=KEY))
        for c in concurrency:
            for body in BODIES:
                for rep in range(reps):
                    for target, url in urls.items():
                        n, secs, p50, p99, errors = wrk(wrk_bin, scripts[body], url, c, seconds)
                        runs.append(Run(target, body, c, n, secs, p50, p99, errors))
                        say(f"gateway bench: c={c} {body} rep {rep + 1}/{reps} {target}: "
                            f"{n / secs:.0f} req/s, p50 {p50:.2f} ms, p99 {p99:.2f} ms"
                            + (f", {errors} errors" if errors else ""))
    return summarize(runs, seconds=seconds, reps=reps, delay_ms=delay_ms)


def summarize(runs: list[Run], *, seconds: int, reps: int, delay_ms: int) -> dict[str, Any]:
    """Medians over the reps of each (concurrency, body, target); the gateway's rows as added
    latency and a throughput ratio against direct's of the same concurrency and body."""
    rows: list[dict[str, Any]] = []
    keys = sorted({(r.concurrency, r.body) for r in runs}, key=lambda k: (k[0], BODIES.index(k[1])))
    for c, body in keys:
        def med(target: str, attr: str, c: int = c, body: str = body) -> float:
            return statistics.median(float(getattr(r, attr)) for r in runs
                                     if (r.concurrency, r.body, r.target) == (c, body, target))
        for target in ("gateway", "gateway-tls"):
            rows.append({
                "concurrency": c, "body": body, "target": target,
                "direct_rps": round(med("direct", "rps"), 1),
                "rps": round(med(target, "rps"), 1),
                "throughput_ratio": round(med(target, "rps") / med("direct", "rps"), 4),
                "direct_p50_ms": round(med("direct", "p50_ms"), 3),
                "p50_added_ms": round(med(target, "p50_ms") - med("direct", "p50_ms"), 3),
                "p99_added_ms": round(med(target, "p99_ms") - med("direct", "p99_ms"), 3),
                "errors": sum(r.errors for r in runs
                              if (r.concurrency, r.body, r.target) == (c, body, target)),
            })
    for row in rows:
        row["meets_goal"] = (row["p50_added_ms"] <= GOAL_P50_ADDED_MS
                             and row["throughput_ratio"] >= GOAL_THROUGHPUT
                             and row["errors"] == 0)
    return {"seconds": seconds, "reps": reps, "delay_ms": delay_ms,
            "goal": {"p50_added_ms": GOAL_P50_ADDED_MS, "throughput_ratio": GOAL_THROUGHPUT},
            "rows": rows, "runs": [{**asdict(r), "rps": round(r.rps, 1)} for r in runs]}


def table(result: dict[str, Any]) -> str:
    """The markdown table of docs/benchmarks.md's gateway section."""
    lines = ["| concurrency | body | gateway | direct req/s | req/s | throughput vs direct | "
             "p50 direct | p50 added | p99 added | errors | goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(
            f"| {r['concurrency']} | {r['body']} | {'TLS' if r['target'] == 'gateway-tls' else 'plain'} "
            f"| {r['direct_rps']:.0f} | {r['rps']:.0f} | {r['throughput_ratio']:.3f} "
            f"| {r['direct_p50_ms']:.2f} ms | {r['p50_added_ms']:+.3f} ms "
            f"| {r['p99_added_ms']:+.3f} ms | {r['errors']} | {'met' if r['meets_goal'] else 'NOT met'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=10, help="each wrk run's length")
    ap.add_argument("--reps", type=int, default=3, help="runs of each target, alternated")
    ap.add_argument("--delay-ms", type=int, default=20, help="the stub's answer time")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args(argv)
    result = measure(args.seconds, args.reps, args.delay_ms,
                     tuple(int(c) for c in args.concurrency.split(",")))
    print(table(result), end="")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["meets_goal"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
