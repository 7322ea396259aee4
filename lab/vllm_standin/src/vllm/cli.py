"""`vllm` command line of the lab stand-in (argument handling modelled on vLLM's CLI)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from vllm import __version__


def _json_arg(value: str):
    try:
        v = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {value!r}: {e}")
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return v


def _normalize(argv: list) -> list:
    """vLLM's FlexibleArgumentParser accepts --flag_name as --flag-name."""
    res = []
    for a in argv:
        if a.startswith("--") and "_" in a.split("=", 1)[0]:
            k, *rest = a.split("=", 1)
            a = k.replace("_", "-") + ("=" + rest[0] if rest else "")
        res.append(a)
    return res


def serve_parser(sp) -> argparse.ArgumentParser:
    s = sp.add_parser("serve", help="Start the (stand-in) OpenAI-compatible server",
                      usage="vllm serve [model_tag] [options]")
    s.add_argument("model_tag", nargs="?", help="model name or path")
    s.add_argument("--model", default=None)
    s.add_argument("--served-model-name", nargs="+", default=None)
    s.add_argument("--revision", default=None)
    s.add_argument("--code-revision", default=None)
    s.add_argument("--tokenizer", default=None)
    s.add_argument("--tokenizer-revision", default=None)
    s.add_argument("--download-dir", default=None)
    s.add_argument("--trust-remote-code", action="store_true")
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    s.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    s.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"], default=None)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    s.add_argument("--max-model-len", type=int, default=None)
    s.add_argument("--max-num-seqs", type=int, default=256)
    s.add_argument("--max-num-batched-tokens", type=int, default=None)
    s.add_argument("--kv-cache-dtype", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16"], default="auto")
    s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    s.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    s.add_argument("--load-format", default="auto",
                   choices=["auto", "pt", "safetensors", "npcache", "dummy", "tensorizer", "sharded_state",
                            "gguf", "bitsandbytes", "mistral", "runai_streamer", "fastsafetensors"])
    s.add_argument("--speculative-config", type=_json_arg, default=None)
    s.add_argument("--enforce-eager", action="store_true")
    s.add_argument("--dtype", default="auto")
    s.add_argument("--quantization", "-q", default=None)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--swap-space", type=float, default=4)
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None)
    s.add_argument("--uvicorn-log-level", default="info")
    s.add_argument("--disable-log-requests", action="store_true")
    s.add_argument("--disable-log-stats", action="store_true")
    s.add_argument("--enable-log-requests", action="store_true")
    s.add_argument("--generation-config", default="auto")
    s.add_argument("--max-log-len", type=int, default=None)
    return s


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm", description="vLLM CLI (spark-vllm lab STAND-IN: no GPU engine)")
    p.add_argument("-v", "--version", action="version", version=__version__)
    sp = p.add_subparsers(dest="subcommand")
    serve_parser(sp)
    return p


def main(argv=None) -> None:
    argv = _normalize(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)          # unknown flags: "unrecognized arguments", exit 2
    if args.subcommand != "serve":
        parser.print_help()
        sys.exit(0 if not argv else 2)
    model = args.model or args.model_tag
    if not model:
        parser.error("the following arguments are required: model_tag")
    args.model = model
    if args.api_key is None:
        args.api_key = os.environ.get("VLLM_API_KEY") or None
    from vllm import server
    sys.exit(server.run(args))


if __name__ == "__main__":
    main()
