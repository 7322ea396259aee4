#!/usr/bin/env python3
"""`make bench-serve STACK=dev`: what the deployed stack serves, measured with vLLM's own benchmark.

Runs `vllm bench serve` (it ships in the serving image) inside vLLM's own container on the head
(spark-vllm-<stack>-serve, host network) at concurrencies 1, 4 and 16 (--concurrency to change),
twice per level in one run: directly against the stack's vLLM (where it listens on the head:
loopback, or the fabric address with mp) and through the stack's gateway (HAProxy on the head,
127.0.0.1:<gateway.port>), on fixed random datasets (seed 0 direct, seed 1 through the gateway:
distinct prompts, so neither run reuses the other's prefix cache; the order alternates per
level), and writes:

  docs/serving-bench.md    a table per concurrency: output tok/s, TTFT and ITL p50/p99, with the
                           stack's model commit, image and recipe; the gateway against direct
                           (throughput ratio, p50 TTFT and ITL differences) judged against the
                           goal (GOAL: >= 0.98 of direct, within 1 ms); the community's published
                           figures for the 122B model on two Sparks next to it, as references
  docs/serving-bench.json  the same numbers (and vLLM's raw result per run)
  docs/serving-bench.png   throughput and latency against concurrency, and, with the stack's
                           Prometheus (monitoring.enabled), the server's view of the same run:
                           requests running and waiting and the KV cache over time, each run's
                           window marked (Prometheus's query_range, asked on the head)

The API key never leaves the head: the benchmark reads it from the root-only file the stack
mounts into that container (hostscripts/paths.py VLLM_KEY; the Ray containers do not have it)
into its own environment (OPENAI_API_KEY, which vLLM's benchmark sends as the Bearer token; the
gateway checks the same key). A gateway with TLS is not compared (the benchmark would have to
accept a certificate for 127.0.0.1): `--no-gateway` runs direct only.
The node is reached with the stack's pinned host key, like recon (config/ssh.py). Stack outputs
are read with `pulumi stack output --json` (no secrets).

Exit codes: 0 written, 1 a run failed (its output printed), 2 config/usage problem.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from config import ConfigError, StackConfig  # noqa: E402
from config.listen import vllm_host  # noqa: E402
from config.ssh import known_hosts_line  # noqa: E402
from hostscripts.common import repo_dir  # noqa: E402
from hostscripts.paths import HF_MOUNT, VLLM_KEY, StackNames  # noqa: E402
from inspection.recon import ssh_argv  # noqa: E402
from tools.recon_report import last_up_outputs, load_stack_config  # noqa: E402

CONCURRENCIES = (1, 4, 16)
INPUT_LEN, OUTPUT_LEN = 128, 64
# issue 30: what the gateway may cost against vLLM directly, per concurrency level
GOAL_THROUGHPUT_RATIO = 0.98  # gateway output tok/s >= this x direct
GOAL_LATENCY_MS = 1.0  # p50 TTFT and p50 ITL within this of direct
SEEDS = {"direct": 0, "gateway": 1}
# Published figures next to ours, quoted from their sources, not measured here. No public
# measurement of Qwen3.5-122B-A10B-FP8 at TP 2 on two Sparks was found (2026-12); the closest:
REFERENCES: list[dict[str, str]] = [
    {"what": "Qwen3.5-122B-A10B NVFP4, 2x Spark, expert parallel 2 (Atlas runtime), batch 1",
     "figure": "~51 tok/s decode (max_model_len 4096)",
     "url": "https://github.com/spark-arena/sparkrun (registry: official-recipes/qwen3.5/atlas/"
            "qwen3.5-122b-a10b-nvfp4-ep2-atlas.yaml)"},
    {"what": "Qwen3.8-Flash-Next FP8, vLLM TP 2 over RoCE, 2x Spark",
     "figure": "30.17 output tok/s single stream, 140.3 at concurrency 16; TTFT p50 481 ms "
               "(256 tokens in)",
     "url": "https://github.com/0xBakeer/inference-atlas/pull/112"},
    {"what": "Qwen3-235B-A22B GPTQ-Int4, vLLM Ray TP 2 EP 2, 2x Spark",
     "figure": "17.0 tok/s single stream, 36.4 aggregate at 4",
     "url": "https://conselara.dev/notes/dgx-spark-benchmarks/"},
]
def say(msg: str) -> None:
    print(f"== {msg}", flush=True)


def bench_script(names: StackNames, served: str, tokenizer: str, base_url: str,
                 concurrency: int, prompts: int, seed: int = 0) -> str:
    """On the head: one `vllm bench serve` run inside the stack's vLLM container (the one
    container on the head with the main API key, mounted read-only) against `base_url` (vLLM
    itself, or the gateway); prints its JSON."""
    inner = " ".join(
        [
            f"OPENAI_API_KEY=$(cat {VLLM_KEY}); export OPENAI_API_KEY;",
            "out=$(mktemp -d);",
            "vllm bench serve --backend openai",
            f"--base-url {shlex.quote(base_url)} --endpoint /v1/completions",
            f"--model {shlex.quote(served)} --tokenizer {shlex.quote(tokenizer)}",
            f"--dataset-name random --random-input-len {INPUT_LEN} "
            f"--random-output-len {OUTPUT_LEN}",
            f"--num-prompts {prompts} --max-concurrency {concurrency} --seed {int(seed)}",
            "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99",
            "--save-result --result-dir \"$out\" --result-filename r.json >&2",
            "&& cat \"$out/r.json\"; rc=$?; rm -rf \"$out\"; exit $rc",
        ]
    )
    return f"set -eu\ndocker exec {names.serve} sh -c {shlex.quote(inner)}\n"


def run_on_head(cfg: StackConfig, key: str, script: str, timeout: float) -> str:
    head = cfg.nodes[0]
    with tempfile.TemporaryDirectory(prefix="spark-vllm-bench-") as tmp:
        known = os.path.join(tmp, "known_hosts")
        Path(known).write_text(known_hosts_line(head))
        argv = ssh_argv(cfg, head, key_path=key, known_hosts=known)
        done = subprocess.run(argv, input=script, capture_output=True, text=True,
                              timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the benchmark failed on {head.name} (rc {done.returncode}):\n"
                           f"{done.stderr[-4000:]}")
    return done.stdout


# the server's view of the run, from the stack's Prometheus (monitoring.enabled): each series
# for the main model, summed over its ranks (KV cache: the fullest)
SERVER_SERIES = {
    "running": 'sum(vllm:num_requests_running{{job="vllm",model="{m}"}})',
    "waiting": 'sum(vllm:num_requests_waiting{{job="vllm",model="{m}"}})',
    "kv_cache": 'max(vllm:kv_cache_usage_perc{{job="vllm",model="{m}"}})',
}
_SERVER_PY = """import json, sys, urllib.parse, urllib.request
url, start, end, step = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
out = {}
for name, expr in json.loads(sys.argv[5]).items():
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    body = json.load(urllib.request.urlopen(url + "/api/v1/query_range?" + q, timeout=30))
    if body.get("status") != "success":
        raise SystemExit("prometheus: %s: %s" % (name, body.get("error")))
    res = body["data"]["result"]
    out[name] = [[float(t), float(v)] for t, v in res[0]["values"]] if res else []
print(json.dumps(out))
"""


def server_script(url: str, served: str, start: float, end: float, step: int) -> str:
    """On the head: Prometheus's range queries over the run (python3 of the head, Prometheus on
    its loopback or fabric address); prints {series: [[t, value], ...]}."""
    exprs = json.dumps({k: v.format(m=served) for k, v in SERVER_SERIES.items()})
    args = " ".join(shlex.quote(a) for a in (url, f"{start:.0f}", f"{end:.0f}", str(step),
                                             exprs))
    return f"set -eu\npython3 -c {shlex.quote(_SERVER_PY)} {args}\n"


def server_summary(series: dict[str, list[list[float]]],
                   windows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run (its window): the most requests running and waiting and the fullest KV cache
    Prometheus saw during it (None: no sample inside the window)."""
    out = []
    for w in windows:
        row: dict[str, Any] = {"target": w["target"], "concurrency": w["concurrency"]}
        for name in SERVER_SERIES:
            inside = [v for t, v in series.get(name, []) if w["start"] <= t <= w["end"]]
            row[f"max_{name}"] = max(inside) if inside else None
        out.append(row)
    return out


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    keys = ("completed", "failed", "duration", "output_throughput", "request_throughput",
            "p50_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p99_itl_ms", "p50_e2el_ms",
            "p99_e2el_ms", "max_concurrency", "num_prompts")
    return {k: raw.get(k) for k in keys}


def compare(direct: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """The gateway's run against the direct one at one level: throughput ratio, p50 TTFT and ITL
    differences (gateway minus direct, ms), and whether each meets the goal."""
    def num(d: dict[str, Any], k: str) -> float | None:
        v = d.get(k)
        return float(v) if isinstance(v, int | float) else None

    out: dict[str, Any] = {}
    d_tp, g_tp = num(direct, "output_throughput"), num(gateway, "output_throughput")
    out["throughput_ratio"] = g_tp / d_tp if d_tp and g_tp is not None else None
    for key, name in (("p50_ttft_ms", "ttft_p50_delta_ms"), ("p50_itl_ms", "itl_p50_delta_ms")):
        d, g = num(direct, key), num(gateway, key)
        out[name] = g - d if d is not None and g is not None else None
    ratio = out["throughput_ratio"]
    out["meets_goal"] = {
        "throughput": ratio is not None and ratio >= GOAL_THROUGHPUT_RATIO,
        "ttft_p50": out["ttft_p50_delta_ms"] is not None
        and out["ttft_p50_delta_ms"] <= GOAL_LATENCY_MS,
        "itl_p50": out["itl_p50_delta_ms"] is not None
        and out["itl_p50_delta_ms"] <= GOAL_LATENCY_MS,
    }
    return out


def gateway_url(cfg: StackConfig) -> str | None:
    """Where the benchmark reaches the gateway from the head (its host network): every address
    of the head, so loopback; None with TLS (not compared, see the module docstring)."""
    return None if cfg.gateway.tls else f"http://127.0.0.1:{cfg.gateway.port}"


def direct_url(cfg: StackConfig) -> str:
    """Where vLLM listens on the head (config/listen.py): loopback, or the fabric with mp."""
    return f"http://{vllm_host(cfg)}:{cfg.vllm.port}"


def render(res: dict[str, Any]) -> str:
    lines = [
        "# Serving benchmark (`make bench-serve`)",
        "",
        "Written by bench/serve.py from one run: vLLM's own `vllm bench serve` inside the head's "
        "container directly against the stack's vLLM (and through its gateway: below), random "
        "prompts of "
        f"{INPUT_LEN} tokens in and {OUTPUT_LEN} out, seed 0; prompts per concurrency level: "
        + ", ".join(str(r["summary"].get("num_prompts", "?")) for r in res["runs"])
        + " (8 per concurrent request, at least 16).",
        "",
        f"- stack `{res['stack']}`, model `{res['model']}` at commit `{res['commit']}`, "
        f"served as `{res['served']}`",
        f"- image `{res['image']}`",
        f"- recipe `{res.get('recipe') or '-'}`; measured {res['date']}",
    ]
    if res.get("cpu_build"):
        lines += ["", f"**CPU build of vLLM** (the image reports `{res['image_probe']}`): these "
                  "figures show the benchmark working end to end (the lab's tiny model, tensor "
                  "parallel across simulated nodes on 2 shared CPU cores), not what a Spark does. On real "
                  "Sparks the same command gives the headline."]
    lines += ["", "| concurrency | completed / failed | output tok/s | TTFT p50 / p99 ms | "
              "ITL p50 / p99 ms |", "|---|---|---|---|---|"]
    for r in res["runs"]:
        s = r["summary"]

        def ms(a: Any, b: Any) -> str:
            return f"{a:.1f} / {b:.1f}" if isinstance(a, int | float) and isinstance(
                b, int | float) else "-"
        lines.append(f"| {r['concurrency']} | {s['completed']} / {s['failed']} | "
                     f"{s['output_throughput']:.1f} | {ms(s['p50_ttft_ms'], s['p99_ttft_ms'])} | "
                     f"{ms(s['p50_itl_ms'], s['p99_itl_ms'])} |")
    lines += _gateway_lines(res)
    lines += _server_lines(res)
    lines += ["", "![throughput and latency against concurrency](serving-bench.png)", "",
              "## References (published, not measured here)", ""]
    lines += ["No public measurement of this exact model at TP 2 on two Sparks was found; the "
              "closest published figures:", "", "| setup | figure | source |", "|---|---|---|"]
    for ref in REFERENCES:
        lines.append(f"| {ref['what']} | {ref['figure']} | {ref['url']} |")
    lines += ["", "Raw numbers: [serving-bench.json](serving-bench.json). Rerun: "
              f"`make bench-serve STACK={res['stack']}`.", ""]
    return "\n".join(lines)


def _server_lines(res: dict[str, Any]) -> list[str]:
    """The server's side of the run, from the stack's Prometheus."""
    server = res.get("server")
    if not server:
        return []
    lines = ["", "## The server's view (Prometheus)", ""]
    if server.get("error"):
        return [*lines, f"Not read: {server['error']}"]
    lines += [f"The stack's Prometheus ({server['url']}, scraping vLLM's /metrics through the "
              f"gateway every {server['step']} s) over the same run: the most requests running "
              "and waiting, and the fullest KV cache, in each run's window (the plot's right "
              "panel shows them over time).", "",
              "| run | concurrency | running (max) | waiting (max) | KV cache (max) |",
              "|---|---|---|---|---|"]

    def f(v: Any, pct: bool = False) -> str:
        if not isinstance(v, int | float):
            return "-"
        return f"{100 * v:.1f} %" if pct else f"{v:g}"

    for row in server["summary"]:
        lines.append(f"| {row['target']} | {row['concurrency']} | {f(row['max_running'])} | "
                     f"{f(row['max_waiting'])} | {f(row['max_kv_cache'], pct=True)} |")
    return lines


def _gateway_lines(res: dict[str, Any]) -> list[str]:
    """The section comparing the runs through the gateway with the direct ones."""
    gateway = res.get("gateway")
    if not gateway:
        return ["", "## Through the gateway", "", res.get("gateway_skipped")
                or "Not measured in this run (`--no-gateway`)."]
    lines = ["", "## Through the gateway", "",
             f"The same load through the stack's gateway ({gateway['url']}, HAProxy on the head: "
             "the key checked, the body's `model` read, the response streamed) in the same run, "
             f"seed {SEEDS['gateway']} (direct: seed {SEEDS['direct']}). Goal (issue 30): "
             f"throughput at least {GOAL_THROUGHPUT_RATIO} of direct, p50 TTFT and ITL within "
             f"{GOAL_LATENCY_MS:g} ms of direct.", "",
             "| concurrency | gateway tok/s | ratio to direct | TTFT p50 ms (direct / gateway, "
             "Δ) | ITL p50 ms (direct / gateway, Δ) | goal |", "|---|---|---|---|---|---|"]

    def f(v: Any, fmt: str = ".1f") -> str:
        return format(v, fmt) if isinstance(v, int | float) else "-"

    met_all = True
    for d, g in zip(res["runs"], gateway["runs"], strict=True):
        c, ds, gs = g["compare"], d["summary"], g["summary"]
        met = all(c["meets_goal"].values())
        met_all = met_all and met
        lines.append(
            f"| {g['concurrency']} | {f(gs['output_throughput'])} | "
            f"{f(c['throughput_ratio'], '.3f')} | {f(ds['p50_ttft_ms'])} / "
            f"{f(gs['p50_ttft_ms'])} ({f(c['ttft_p50_delta_ms'], '+.2f')}) | "
            f"{f(ds['p50_itl_ms'])} / {f(gs['p50_itl_ms'])} ({f(c['itl_p50_delta_ms'], '+.2f')}) "
            f"| {'met' if met else 'missed: ' + ', '.join(k for k, v in c['meets_goal'].items() if not v)} |")
    lines += ["", "Goal met at every level." if met_all else
              "Goal missed where the table says so (the lab's CPU build on 2 shared cores "
              "measures noise of the same order as the goal: repeat before concluding)."]
    return lines


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conc = [r["concurrency"] for r in res["runs"]]
    s = [r["summary"] for r in res["runs"]]
    server = res.get("server") or {}
    series = server.get("series") if not server.get("error") else None
    fig, axes = plt.subplots(1, 3 if series else 2, figsize=(14 if series else 9, 3.5))
    a, b = axes[0], axes[1]
    a.plot(conc, [x["output_throughput"] for x in s], marker="o", label="direct")
    g = [r["summary"] for r in (res.get("gateway") or {}).get("runs", [])]
    if g:
        a.plot(conc, [x["output_throughput"] for x in g], marker="x", linestyle="--",
               label="gateway")
        a.legend(fontsize=8)
    a.set(xscale="log", xlabel="concurrency", ylabel="output tok/s", title="throughput")
    for key, label in (("p50_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
                       ("p50_itl_ms", "ITL p50"), ("p99_itl_ms", "ITL p99")):
        b.plot(conc, [x[key] or 0 for x in s], marker="o", label=label)
        if g and key.startswith("p50"):
            b.plot(conc, [x[key] or 0 for x in g], marker="x", linestyle="--",
                   label=f"{label} (gateway)")
    b.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="ms", title="latency")
    b.legend(fontsize=8)
    if series:
        _plot_server(axes[2], series, server["windows"])
    fig.suptitle(f"{res['served']} ({'CPU build' if res.get('cpu_build') else res['stack']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _plot_server(ax: Any, series: dict[str, list[list[float]]],
                 windows: list[dict[str, Any]]) -> None:
    """Requests running and waiting (left axis) and the KV cache (right axis) over the run, in
    seconds from its start, each run's window shaded and labelled."""
    t0 = min(w["start"] for w in windows)
    for name, style in (("running", "-"), ("waiting", "--")):
        pts = series.get(name, [])
        ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], style, label=f"requests {name}")
    for i, w in enumerate(windows):
        ax.axvspan(w["start"] - t0, w["end"] - t0, alpha=0.08 if i % 2 else 0.16, color="grey")
        ax.annotate(f"{w['concurrency']}{'g' if w['target'] == 'gateway' else ''}",
                    ((w["start"] + w["end"]) / 2 - t0, 0), fontsize=7, ha="center",
                    va="bottom")
    ax.set(xlabel="s from the first run (shaded: a run; g: through the gateway)",
           ylabel="requests", title="server side (Prometheus)")
    kv = series.get("kv_cache", [])
    twin = ax.twinx()
    twin.plot([t - t0 for t, _ in kv], [100 * v for _, v in kv], ":", color="tab:red",
              label="KV cache %")
    twin.set(ylabel="KV cache %", ylim=(0, 100))
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")


def read_server(cfg: StackConfig, key: str, outputs: dict[str, Any],
                windows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The server's view from the stack's Prometheus, or None without monitoring. A Prometheus
    that cannot be read gives `error` (the page says why; the client's figures stand)."""
    mon = outputs.get("monitoring")
    if not cfg.monitoring.enabled or not isinstance(mon, dict) or not windows:
        return None
    url, step = str(mon.get("url")), cfg.monitoring.scrape_interval_seconds
    start = min(w["start"] for w in windows) - step
    end = max(w["end"] for w in windows) + 2 * step
    # the last samples of the run are scraped up to one interval after it
    time.sleep(max(0.0, end - time.time()))
    try:
        out = run_on_head(cfg, key, server_script(url, cfg.vllm.served_model_name, start, end,
                                                  step), 120)
        series = json.loads(out.strip().splitlines()[-1])
    except (RuntimeError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        return {"url": url, "step": step, "error": str(exc)[-500:]}
    return {"url": url, "step": step, "windows": windows, "series": series,
            "summary": server_summary(series, windows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default="dev")
    ap.add_argument("--key", help="ssh private key file (default spark-vllm:ssh.privateKeyPath)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES))
    ap.add_argument("--prompts", type=int, default=0,
                    help="prompts per level (default 8 x concurrency, at least 16)")
    ap.add_argument("--out", default=str(ROOT / "docs"), help="folder for the page, JSON, PNG")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per level")
    ap.add_argument("--no-gateway", action="store_true",
                    help="only directly against vLLM, not also through the gateway")
    args = ap.parse_args(argv)
    try:
        cfg = load_stack_config(args.stack, ROOT)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    outputs, why = last_up_outputs(args.stack)
    if outputs is None:
        print(f"bench-serve: the stack has no outputs to benchmark ({why}); run `pulumi up` "
              "first", file=sys.stderr)
        return 2
    key = os.path.expanduser(args.key or cfg.ssh.private_key_path)
    commit = str(outputs.get("modelCommit", ""))
    tokenizer = f"{HF_MOUNT}/hub/{repo_dir(cfg.model.repo)}/snapshots/{commit}"
    image = (outputs.get("imageIds") or {}).get(cfg.nodes[0].name, "?")
    res: dict[str, Any] = {
        "stack": args.stack, "model": cfg.model.repo, "commit": commit,
        "served": cfg.vllm.served_model_name, "image": image,
        "recipe": getattr(cfg.vllm, "recipe", None),
        "image_probe": (outputs.get("imageProbe") or {}).get(cfg.nodes[0].name, ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": [],
    }
    res["cpu_build"] = "+cpu" in res["image_probe"]
    targets = {"direct": direct_url(cfg)}
    if not args.no_gateway:
        url = gateway_url(cfg)
        if url is None:
            res["gateway_skipped"] = ("Not measured: the gateway terminates TLS, which the "
                                      "benchmark would have to accept for 127.0.0.1.")
        else:
            targets["gateway"] = url
            res["gateway"] = {"url": url, "runs": []}
    names = StackNames(args.stack)
    windows: list[dict[str, Any]] = []  # each run's span, for the server's view
    for i, c in enumerate(sorted(set(args.concurrency))):
        prompts = args.prompts or max(16, 8 * c)
        # alternate which goes first, so a level's warm-up does not favour one of them
        order = list(targets) if i % 2 == 0 else list(reversed(targets))
        summaries: dict[str, dict[str, Any]] = {}
        for target in order:
            say(f"vllm bench serve, concurrency {c}, {prompts} prompts, {target} "
                f"({targets[target]})")
            try:
                script = bench_script(names, cfg.vllm.served_model_name, tokenizer,
                                      targets[target], c, prompts, SEEDS[target])
                start = time.time()
                out = run_on_head(cfg, key, script, args.timeout)
                windows.append({"target": target, "concurrency": c, "start": start,
                                "end": time.time()})
                raw = json.loads(out.strip().splitlines()[-1] if out.strip() else "{}")
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
                print(f"bench-serve: {exc}", file=sys.stderr)
                return 1
            summary = summarize(raw)
            if not summary.get("completed") or summary.get("failed"):
                print(f"bench-serve: {summary.get('failed')} of {prompts} requests failed at "
                      f"concurrency {c} ({target})", file=sys.stderr)
                return 1
            print(json.dumps({"target": target, **summary}), flush=True)
            raw.pop("latencies", None)
            raw.pop("queue_times", None)
            summaries[target] = summary
            run = {"concurrency": c, "summary": summary, "raw": raw}
            if target == "direct":
                res["runs"].append(run)
            else:
                res["gateway"]["runs"].append(run)
        if "gateway" in summaries:
            res["gateway"]["runs"][-1]["compare"] = compare(summaries["direct"],
                                                            summaries["gateway"])
            print(json.dumps({"concurrency": c, **res["gateway"]["runs"][-1]["compare"]}),
                  flush=True)
    server = read_server(cfg, key, outputs, windows)
    if server is not None:
        res["server"] = server
        if server.get("error"):
            print(f"bench-serve: the server's view was not read: {server['error']}",
                  file=sys.stderr)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "serving-bench.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    (out_dir / "serving-bench.md").write_text(render(res))
    plot(res, out_dir / "serving-bench.png")
    say(f"wrote {out_dir}/serving-bench.md, .json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
