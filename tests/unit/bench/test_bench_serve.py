"""bench/serve.py without a lab: the script it runs on the head and the page it writes."""

from __future__ import annotations

import shlex

from bench.serve import bench_script, render, summarize
from hostscripts.paths import StackNames

RAW = {"completed": 16, "failed": 0, "duration": 2.5, "output_throughput": 134.4,
       "request_throughput": 6.4, "p50_ttft_ms": 79.2, "p99_ttft_ms": 127.1, "p50_itl_ms": 20.7,
       "p99_itl_ms": 256.3, "p50_e2el_ms": 394.0, "p99_e2el_ms": 600.0, "max_concurrency": 4,
       "num_prompts": 16, "latencies": [0.1] * 16}


def test_the_key_is_read_inside_the_container_never_passed():
    script = bench_script(StackNames("dev"), "tiny-moe",
                          "/root/.cache/huggingface/hub/x/snapshots/c", 8000, 4, 32)
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
