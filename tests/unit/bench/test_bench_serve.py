"""bench/serve.py without a lab: the script it runs on the head and the page it writes."""

from __future__ import annotations

import shlex

from bench.serve import (
    GOAL_LATENCY_MS,
    bench_script,
    compare,
    direct_url,
    gateway_url,
    render,
    summarize,
)
from config import validate_config
from hostscripts.paths import StackNames
from tests.conftest import config_raw

RAW = {"completed": 16, "failed": 0, "duration": 2.5, "output_throughput": 134.4,
       "request_throughput": 6.4, "p50_ttft_ms": 79.2, "p99_ttft_ms": 127.1, "p50_itl_ms": 20.7,
       "p99_itl_ms": 256.3, "p50_e2el_ms": 394.0, "p99_e2el_ms": 600.0, "max_concurrency": 4,
       "num_prompts": 16, "latencies": [0.1] * 16}


def test_the_key_is_read_inside_the_container_never_passed():
    script = bench_script(StackNames("dev"), "tiny-moe",
                          "/root/.cache/huggingface/hub/x/snapshots/c", "http://127.0.0.1:8000",
                          4, 32)
    inner = shlex.split(script.splitlines()[1])
    assert inner[:3] == ["docker", "exec", "spark-vllm-dev-serve"]
    body = inner[-1]
    assert body.startswith("OPENAI_API_KEY=$(cat /run/spark-vllm/api-key); export OPENAI_API_KEY;")
    assert "--max-concurrency 4" in body and "--num-prompts 32" in body and "--seed 0" in body
    assert "--base-url http://127.0.0.1:8000" in body and "--metric-percentiles 50,99" in body
    assert "sk-" not in script


def test_the_page_has_a_row_per_level_and_labels_a_cpu_build():
    res = {"stack": "dev", "model": "spark-lab/tiny-moe", "commit": "c" * 40,
           "served": "tiny-moe", "image": "sha256:" + "a" * 64, "recipe": None,
           "image_probe": "python 3.11.2, vllm 0.32.0+cpu", "cpu_build": True,
           "date": "2026-12-01 12:00 UTC",
           "runs": [{"concurrency": c, "summary": summarize({**RAW, "max_concurrency": c})}
                    for c in (1, 4, 16)]}
    page = render(res)
    rows = [ln for ln in page.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 4", "| 16"]
    assert rows[1] == "| 4 | 16 / 0 | 134.4 | 79.2 / 127.1 | 20.7 / 256.3 |"
    assert "**CPU build of vLLM**" in page and "not measured here" in page
    assert "latencies" not in summarize(RAW)
    # what was run, per level, from the runs themselves
    assert "prompts per concurrency level: 16, 16, 16 (8 per concurrent request" in page


def test_direct_and_gateway_targets_are_where_the_stack_listens():
    cfg = validate_config(config_raw(2))
    assert direct_url(cfg) == "http://127.0.0.1:8000"  # Ray: vLLM on the head's loopback
    assert gateway_url(cfg) == "http://127.0.0.1:8080"  # the gateway on every address
    mp = validate_config(config_raw(2, vllm={"executor": "mp"}))
    assert direct_url(mp) == "http://192.168.177.11:8000"  # mp: the head's fabric address
    tls = validate_config(config_raw(2, gateway={"certificate": "-----BEGIN CERTIFICATE-----\n"
                                                                "MIIB\n-----END CERTIFICATE-----\n"}))
    assert gateway_url(tls) is None  # not compared: the benchmark cannot check 127.0.0.1
    script = bench_script(StackNames("dev"), "m", "/t", "http://127.0.0.1:8080", 16, 128, seed=1)
    assert "--base-url http://127.0.0.1:8080" in script and "--seed 1" in script


def test_compare_gives_the_ratio_the_deltas_and_the_verdict():
    direct = summarize(RAW)
    same = compare(direct, summarize({**RAW, "output_throughput": 134.4 * 0.99,
                                      "p50_ttft_ms": 79.2 + 0.6, "p50_itl_ms": 20.7 + 0.2}))
    assert round(same["throughput_ratio"], 3) == 0.99
    assert round(same["ttft_p50_delta_ms"], 2) == 0.6 and round(same["itl_p50_delta_ms"], 2) == 0.2
    assert same["meets_goal"] == {"throughput": True, "ttft_p50": True, "itl_p50": True}
    slow = compare(direct, summarize({**RAW, "output_throughput": 120.0,
                                      "p50_ttft_ms": 79.2 + GOAL_LATENCY_MS + 0.1}))
    assert slow["meets_goal"] == {"throughput": False, "ttft_p50": False, "itl_p50": True}
    # faster through the gateway (noise) meets the goal too; a missing number does not
    assert compare(direct, summarize({**RAW, "p50_itl_ms": 19.0}))["meets_goal"]["itl_p50"]
    assert not compare(direct, summarize({**RAW, "p50_itl_ms": None}))["meets_goal"]["itl_p50"]


def test_the_page_shows_the_gateway_against_direct_per_level():
    runs = [{"concurrency": c, "summary": summarize({**RAW, "max_concurrency": c})}
            for c in (1, 4, 16)]
    gateway = [{"concurrency": c, "summary": summarize({**RAW, "output_throughput": 133.0}),
                "compare": compare(r["summary"], summarize({**RAW, "output_throughput": 133.0}))}
               for c, r in zip((1, 4, 16), runs, strict=True)]
    res = {"stack": "dev", "model": "spark-lab/tiny-moe", "commit": "c" * 40,
           "served": "tiny-moe", "image": "sha256:" + "a" * 64, "recipe": None,
           "image_probe": "vllm 0.32.0", "cpu_build": False, "date": "2026-12-01 12:00 UTC",
           "runs": runs, "gateway": {"url": "http://127.0.0.1:8080", "runs": gateway}}
    page = render(res)
    assert "## Through the gateway" in page and "http://127.0.0.1:8080" in page
    rows = [ln for ln in page.split("## Through the gateway")[1].splitlines()
            if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == 3
    assert rows[0] == "| 1 | 133.0 | 0.990 | 79.2 / 79.2 (+0.00) | 20.7 / 20.7 (+0.00) | met |"
    assert "Goal met at every level." in page
    res["gateway"]["runs"][2]["compare"]["meets_goal"]["throughput"] = False
    assert "| missed: throughput |" in render(res)
    del res["gateway"]
    assert "Not measured in this run (`--no-gateway`)." in render(res)


def test_the_servers_view_is_asked_of_prometheus_and_summed_per_run():
    """server_script run for real against a stand-in Prometheus (its query_range API on this
    machine's loopback): each series asked for the main model over the run's span at the scrape
    step; then each run's window summarized (the most running and waiting, the fullest KV
    cache), and the page's section."""
    import json
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from bench.serve import SERVER_SERIES, server_script, server_summary

    asked: list[dict[str, list[str]]] = []
    values = {"running": "3", "waiting": "2", "kv_cache": "0.25"}

    class Prom(BaseHTTPRequestHandler):
        def do_GET(self):
            u = urlparse(self.path)
            q = parse_qs(u.query)
            asked.append({"path": [u.path], **q})
            name = next(k for k, v in SERVER_SERIES.items()
                        if v.format(m="tiny-moe") == q["query"][0])
            body = {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {}, "values": [[100, "0"], [105, values[name]], [130, "1"]]}]}}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Prom)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        script = server_script(url, "tiny-moe", 99.6, 131.2, 5)
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    finally:
        srv.shutdown()
    assert out.returncode == 0, out.stderr
    series = json.loads(out.stdout)
    assert series["waiting"] == [[100.0, 0.0], [105.0, 2.0], [130.0, 1.0]]
    assert {a["path"][0] for a in asked} == {"/api/v1/query_range"}
    assert [(a["start"], a["end"], a["step"]) for a in asked] == [(["100"], ["131"], ["5"])] * 3
    assert {a["query"][0] for a in asked} == {
        'sum(vllm:num_requests_running{job="vllm",model="tiny-moe"})',
        'sum(vllm:num_requests_waiting{job="vllm",model="tiny-moe"})',
        'max(vllm:kv_cache_usage_perc{job="vllm",model="tiny-moe"})'}
    windows = [{"target": "direct", "concurrency": 4, "start": 101, "end": 110},
               {"target": "gateway", "concurrency": 4, "start": 111, "end": 120}]
    summary = server_summary(series, windows)
    assert summary[0] == {"target": "direct", "concurrency": 4, "max_running": 3.0,
                          "max_waiting": 2.0, "max_kv_cache": 0.25}
    assert summary[1]["max_waiting"] is None  # no sample inside that window
    res = {"stack": "dev", "model": "m", "commit": "c", "served": "tiny-moe", "image": "i",
           "date": "d", "runs": [{"concurrency": 4, "summary": summarize(RAW)}],
           "server": {"url": url, "step": 5, "windows": windows, "series": series,
                      "summary": summary}}
    page = render(res)
    assert "## The server's view (Prometheus)" in page
    assert "| direct | 4 | 3 | 2 | 25.0 % |" in page and "| gateway | 4 | - | - | - |" in page
    # a Prometheus that could not be read: the page says why
    res["server"] = {"url": url, "step": 5, "error": "connection refused"}
    assert "Not read: connection refused" in render(res)
