"""Runs INSIDE the lab's serving image (python3 of its venv): vLLM's own `vllm serve` parser on
each argv of a JSON list read from stdin; prints one JSON line per argv: {"ok": true, "values":
{...}} (the parsed host, port, api_key and trust_remote_code) or {"ok": false, "error": "<the
parser's last stderr line>"}. Nothing is started.

The parser is the one `vllm serve` builds (vllm.entrypoints.launchers.cli_args in vLLM 0.32.0),
followed by the same validation `vllm serve` runs on the parsed arguments.
"""

import contextlib
import io
import json
import sys

from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser


def check(argv):
    parser = make_arg_parser(
        FlexibleArgumentParser(prog="vllm serve", usage="vllm serve [model_tag] [options]"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
            if args.model_tag is not None:
                args.model = args.model_tag
            validate_parsed_serve_args(args)
    except SystemExit:
        lines = [line for line in err.getvalue().strip().splitlines() if line.strip()]
        return {"ok": False, "error": lines[-1] if lines else "exit"}
    except Exception as exc:  # a validation error: the message is the answer
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    values = {k: getattr(args, k, None) for k in ("host", "port", "api_key", "trust_remote_code")}
    return {"ok": True, "values": values}


for argv in json.load(sys.stdin):
    print(json.dumps(check(argv)), flush=True)
