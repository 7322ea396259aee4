"""The stand-in engine + OpenAI-compatible server. No GPU work happens here."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import sys
import time
import uuid

from vllm import __version__
from vllm import snapshot

PID = os.getpid()
WORDS = ("spark lab fabric ray node cache model token expert router tensor pipeline bundle worker "
         "head memory unified grace blackwell link mtu jumbo frame registry digest image layer "
         "snapshot revision commit blob header shard stream chunk answer hello world quick brown "
         "fox jumps over lazy dog alpha beta gamma delta epsilon zeta theta lambda sigma omega").split()


def log(msg: str, level: str = "INFO") -> None:
    ts = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={PID}) {level} {ts} [standin] {msg}", flush=True)


def fatal(msg: str, code: int = 1) -> int:
    log(msg, "ERROR")
    print(f"ValueError: {msg}", file=sys.stderr, flush=True)
    return code


# --------------------------------------------------------------------------- Ray engine
def _worker_class():
    import ray

    @ray.remote(num_cpus=0, num_gpus=1)
    class RayWorkerWrapper:
        def info(self) -> dict:
            import ray as _ray
            return {"hostname": socket.gethostname(), "node_ip": _ray.util.get_node_ip_address(),
                    "node_id": _ray.get_runtime_context().get_node_id(), "gpu_ids": _ray.get_gpu_ids(),
                    "pid": os.getpid()}

        def verify(self, model: str, revision):
            return snapshot.verify(model, revision)

        def execute_model(self, n: int) -> int:
            return n

    return RayWorkerWrapper


class Engine:
    def __init__(self, args):
        self.args = args
        self.workers = []
        self.infos = []
        self.commit = None
        self.dead = None

    def start(self) -> int:
        a = self.args
        ws = a.tensor_parallel_size * a.pipeline_parallel_size
        backend = a.distributed_executor_backend or ("ray" if ws > 1 else "uni")
        log(f"vLLM STAND-IN {__version__} (no GPU engine) model={a.model} revision={a.revision or 'main'} "
            f"tp={a.tensor_parallel_size} pp={a.pipeline_parallel_size} backend={backend}")
        log(f"non-default args: gpu_memory_utilization={a.gpu_memory_utilization} max_model_len={a.max_model_len} "
            f"max_num_seqs={a.max_num_seqs} kv_cache_dtype={a.kv_cache_dtype} "
            f"enable_prefix_caching={a.enable_prefix_caching} load_format={a.load_format} "
            f"speculative_config={json.dumps(a.speculative_config)} enforce_eager={a.enforce_eager}")
        if backend != "ray":
            if ws > 1:
                return fatal(f"world size {ws} with backend {backend!r} needs {ws} GPUs on this node; "
                             "the lab stand-in supports multi-node only through Ray")
            res = snapshot.verify(a.model, a.revision)
            return self._check_results([res])
        return self._start_ray(ws)

    def _start_ray(self, ws: int) -> int:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        addr = os.environ.get("RAY_ADDRESS", "auto")
        try:
            ray.init(address=addr, logging_level=logging.WARNING, log_to_driver=True)
        except Exception as e:  # noqa: BLE001
            return fatal(f"cannot attach to a running Ray cluster (address={addr}): {e}. "
                         "Start `ray start --head` first (the Ray executor needs an existing cluster).")
        res = ray.cluster_resources()
        gpus = int(res.get("GPU", 0))
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        log(f"attached to Ray cluster: {len(nodes)} node(s), {gpus} GPU(s), "
            f"{int(res.get('CPU', 0))} CPU(s)")
        bundles = [{"GPU": 1.0} for _ in range(ws)]
        pg = placement_group(bundles, strategy="PACK", name=f"vllm-standin-{PID}")
        timeout = float(os.environ.get("VLLM_STANDIN_PG_TIMEOUT", "60"))
        t0 = time.time()
        while True:
            if pg.wait(10 if timeout - (time.time() - t0) > 10 else max(0.1, timeout - (time.time() - t0))):
                break
            if time.time() - t0 >= timeout:
                have = int(ray.cluster_resources().get("GPU", 0))
                ray.util.remove_placement_group(pg)
                return fatal(f"Cannot provide a placement group of {ws} GPU bundle(s) "
                             f"(tensor_parallel_size={self.args.tensor_parallel_size} x "
                             f"pipeline_parallel_size={self.args.pipeline_parallel_size}) within {timeout:.0f}s: "
                             f"the Ray cluster has {have} GPU(s) on {len([n for n in ray.nodes() if n.get('Alive')])} "
                             "node(s). Add GPU nodes (ray start --num-gpus 1 on each Spark) or reduce tp/pp.")
            log(f"Waiting for creating a placement group of specs for {time.time() - t0:.0f} seconds. "
                f"specs={bundles}. Check `ray status` to see if you have enough resources.", "WARNING")
        W = _worker_class()
        self.workers = [W.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote() for i in range(ws)]
        self.infos = ray.get([w.info.remote() for w in self.workers], timeout=120)
        driver_node = ray.get_runtime_context().get_node_id()
        for i, inf in enumerate(self.infos):
            log(f"worker rank {i}: node {inf['hostname']} ip {inf['node_ip']} gpu_ids {inf['gpu_ids']}")
        if driver_node not in {inf["node_id"] for inf in self.infos}:
            return fatal("Ray does not allocate any GPUs on the driver node. Consider adjusting the Ray "
                         "placement group or running the driver on a GPU node.")
        results = ray.get([w.verify.remote(self.args.model, self.args.revision) for w in self.workers],
                          timeout=600)
        return self._check_results(results)

    def _check_results(self, results: list) -> int:
        bad = []
        for r in results:
            for w in r.get("warnings", []):
                log(f"{r['node']}: {w}", "WARNING")
            if r["ok"]:
                log(f"model snapshot verified on {r['node']}: commit {r['commit']}, {len(r['files'])} files, "
                    f"{r['bytes']} bytes, weights {r['weights']}")
            else:
                bad.append(f"{r['node']}: " + "; ".join(r["problems"]))
        if not bad:
            ref = results[0]
            for r in results[1:]:
                if r["files"] != ref["files"] or r["commit"] != ref["commit"]:
                    bad.append(f"{r['node']}: snapshot differs from {ref['node']} "
                               f"(commit {r['commit']} vs {ref['commit']}, "
                               f"files {sorted(set(r['files']) ^ set(ref['files'])) or 'same names, other blobs'})")
        if bad:
            return fatal("model snapshot check failed on " + " | ".join(bad))
        self.commit = results[0]["commit"]
        log(f"Model loading took 0.00 GiB (stand-in: nothing loaded onto a GPU)")
        return 0

    async def ping(self, timeout: float = 10.0) -> None:
        if not self.workers:
            return
        await asyncio.wait_for(asyncio.gather(*[w.execute_model.remote(1) for w in self.workers]), timeout)


# --------------------------------------------------------------------------- text generation
def count_tokens(text: str) -> int:
    return len(text.split())


def generate(commit: str, prompt: str, n: int) -> list:
    out, counter = [], 0
    while len(out) < n:
        h = hashlib.sha256(f"{commit}\0{prompt}\0{counter}".encode()).digest()
        for i in range(0, len(h), 2):
            out.append(WORDS[int.from_bytes(h[i:i + 2], "big") % len(WORDS)])
            if len(out) == n:
                break
        counter += 1
    return [(" " if i else "") + w for i, w in enumerate(out)]


def chat_prompt(messages) -> str:
    parts = []
    for m in messages or []:
        c = m.get("content")
        if isinstance(c, list):
            c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        parts.append(f"{m.get('role', 'user')}: {c}")
    return "\n".join(parts) + "\nassistant:"


# --------------------------------------------------------------------------- HTTP server
class Metrics:
    def __init__(self):
        self.prompt_tokens = 0
        self.gen_tokens = 0
        self.success = {"length": 0, "stop": 0}
        self.running = 0
        self.errors = 0

    def render(self, name: str) -> str:
        lab = f'model_name="{name}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {self.running}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} 0",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{lab}}} 0.0",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{lab}}} {self.prompt_tokens}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{lab}}} {self.gen_tokens}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter"]
        for k, v in self.success.items():
            lines.append(f'vllm:request_success_total{{finished_reason="{k}",{lab}}} {v}')
        lines += ["# HELP vllm_standin_info The lab stand-in engine (no GPU).", "# TYPE vllm_standin_info gauge",
                  f'vllm_standin_info{{version="{__version__}",{lab}}} 1']
        return "\n".join(lines) + "\n"


def make_app(args, engine: Engine):
    from aiohttp import web

    names = args.served_model_name or [args.model]
    served = names[0]
    max_len = args.max_model_len or 4096
    metrics = Metrics()
    created = int(time.time())

    def err(status: int, message: str, typ: str):
        return web.json_response({"error": {"message": message, "type": typ, "param": None, "code": status}},
                                 status=status)

    @web.middleware
    async def auth(request, handler):
        if args.api_key and request.path.startswith("/v1"):
            if request.headers.get("Authorization", "") != f"Bearer {args.api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(_r):
        if engine.dead:
            return web.Response(status=503, text=engine.dead)
        return web.Response(status=200)

    async def version(_r):
        return web.json_response({"version": __version__})

    async def models(_r):
        return web.json_response({"object": "list", "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "vllm", "root": args.model,
             "parent": None, "max_model_len": max_len,
             "permission": [{"id": "modelperm-standin", "object": "model_permission", "created": created,
                             "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                             "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                             "organization": "*", "group": None, "is_blocking": False}]} for n in names]})

    async def prom(_r):
        return web.Response(text=metrics.render(served), content_type="text/plain")

    async def _parse(request):
        try:
            body = await request.json()
        except (json.JSONDecodeError, ValueError):
            return None, err(400, "request body is not valid JSON", "BadRequestError")
        if body.get("model") not in names:
            return None, err(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        return body, None

    async def complete(request, chat: bool):
        body, e = await _parse(request)
        if e:
            return e
        if chat:
            prompt = chat_prompt(body.get("messages"))
        else:
            prompt = body.get("prompt", "")
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
        n = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        ptoks = count_tokens(prompt)
        if ptoks + n > max_len:
            return err(400, f"This model's maximum context length is {max_len} tokens. However, you requested "
                            f"{ptoks + n} tokens ({ptoks} in the messages, {n} in the completion).",
                       "BadRequestError")
        if engine.dead:
            return err(500, engine.dead, "InternalServerError")
        try:
            await engine.ping()
        except Exception as ex:  # noqa: BLE001
            engine.dead = f"engine dead: a Ray worker is unreachable ({type(ex).__name__})"
            return err(500, engine.dead, "InternalServerError")
        toks = generate(engine.commit or "", prompt, int(n))
        metrics.prompt_tokens += ptoks
        metrics.gen_tokens += len(toks)
        metrics.success["length"] += 1
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": ptoks, "completion_tokens": len(toks), "total_tokens": ptoks + len(toks)}
        if not body.get("stream"):
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": "".join(toks), "tool_calls": []},
                          "logprobs": None, "finish_reason": "length", "stop_reason": None}
            else:
                choice = {"index": 0, "text": "".join(toks), "logprobs": None, "finish_reason": "length",
                          "stop_reason": None}
            return web.json_response({"id": rid, "object": obj, "created": int(time.time()), "model": body["model"],
                                      "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        async def send(choice, extra=None):
            d = {"id": rid, "object": obj, "created": int(time.time()), "model": body["model"], "choices": [choice]}
            if extra:
                d.update(extra)
            await resp.write(f"data: {json.dumps(d)}\n\n".encode())

        if chat:
            await send({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                        "finish_reason": None})
        for i, t in enumerate(toks):
            last = i == len(toks) - 1
            if chat:
                await send({"index": 0, "delta": {"content": t}, "logprobs": None,
                            "finish_reason": "length" if last else None})
            else:
                await send({"index": 0, "text": t, "logprobs": None, "finish_reason": "length" if last else None})
            await asyncio.sleep(0)
        if (body.get("stream_options") or {}).get("include_usage"):
            d = {"id": rid, "object": obj, "created": int(time.time()), "model": body["model"], "choices": [],
                 "usage": usage}
            await resp.write(f"data: {json.dumps(d)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def completions(r):
        return await complete(r, chat=False)

    async def chat_completions(r):
        return await complete(r, chat=True)

    app = web.Application(middlewares=[auth])
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)
    app.router.add_get("/version", version)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", prom)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


async def _serve(args, engine: Engine) -> int:
    from aiohttp import web
    app = make_app(args, engine)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host = args.host or "0.0.0.0"
    site = web.TCPSite(runner, host, args.port)
    await site.start()
    log(f"Starting vLLM API server 0 on http://{host}:{args.port}")
    log("Available routes are: /health, /ping, /version, /v1/models, /v1/completions, /v1/chat/completions, /metrics")
    log("Application startup complete.")
    interval = float(os.environ.get("VLLM_STANDIN_MONITOR_INTERVAL", "5"))
    while True:
        await asyncio.sleep(interval)
        try:
            await engine.ping(timeout=30)
        except Exception as e:  # noqa: BLE001
            engine.dead = f"a Ray worker died or is unreachable ({type(e).__name__}: {e})"
            log(f"EngineCore encountered a fatal error: {engine.dead}", "ERROR")
            log("Engine is dead; shutting down the API server.", "ERROR")
            await runner.cleanup()
            return 1


def run(args) -> int:
    engine = Engine(args)
    rc = engine.start()
    if rc:
        return rc
    try:
        return asyncio.run(_serve(args, engine))
    except KeyboardInterrupt:
        return 0
