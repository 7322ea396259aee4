"""`make recon` / `spark-vllm-recon`: survey every node of a stack, print the side-by-side
table, run preflight.

    spark-vllm-recon [--stack dev] [--key PATH] [--model-bytes N] [--json] [--no-last-up]

Reads Pulumi.<stack>.yaml in the current folder directly (no Pulumi CLI, no engine): the
`spark-vllm:*` keys are validated by the config package like the program does. Secrets are not
decrypted here: when the stack keeps its key in the secret `sshPrivateKey`, pass the key file
with --key.
Below the table, what the last `pulumi up` of the stack proved (`pulumi stack output --json`,
no secrets): the fabric pairs pinged at the MTU, each node's image probe, NCCL's transport;
skipped with a note when the CLI or the stack is not there.
Exit codes: 0 preflight passed, 1 preflight failed (findings printed), 2 config/usage problem.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from config import NAMESPACE, SECRET_KEYS, ConfigError, StackConfig, pin_host_keys, validate_config
from hostscripts.paths import StackNames
from inspection import preflight, recon, report
from tools.terminal import sanitize_lines


def load_stack_config(stack: str, root: Path | None = None) -> StackConfig:
    root = root or Path.cwd()
    path = root / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise ConfigError([f"{path.name}: no such stack file in {root}"])
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path.name}: not valid YAML ({exc})"]) from None
    raw = {}
    prefix = f"{NAMESPACE}:"
    for key, value in (data.get("config") or {}).items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if name in SECRET_KEYS:
            continue
        if isinstance(value, str) and name != "environment":
            # as the program reads it (config/load.py, Config.get_object): a value the CLI
            # stored as a JSON string (`pulumi config set` of a list, the Automation API) is
            # the object it encodes
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        raw[name] = value
    return pin_host_keys(validate_config(raw))


def last_up_outputs(stack: str) -> tuple[dict[str, Any] | None, str]:
    """`pulumi stack output --json` of the stack (secrets stay hidden), or None and why."""
    try:
        done = subprocess.run(["pulumi", "stack", "output", "--json", "--stack", stack],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"pulumi stack output did not run ({exc})"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"pulumi stack output failed: {why}"
    try:
        data = json.loads(done.stdout or "{}")
    except ValueError:
        return None, "pulumi stack output printed no JSON"
    return (data, "") if isinstance(data, dict) else (None, "unexpected stack output")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", "-s", default="dev", help="stack name: reads Pulumi.<stack>.yaml")
    ap.add_argument("--key", help="ssh private key file (overrides spark-vllm:ssh.privateKeyPath)")
    ap.add_argument("--model-bytes", type=int, default=None,
                    help="model size in bytes, for the memory and disk checks")
    ap.add_argument("--json", action="store_true", help="print the JSON summary, not the table")
    ap.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    ap.add_argument("--no-last-up", action="store_true",
                    help="do not read the stack's outputs (fabric check, image probe, transport)")
    args = ap.parse_args(argv)

    try:
        cfg = load_stack_config(args.stack)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2

    results = recon.survey_all(cfg, names=StackNames(args.stack), key_path=args.key)
    plan = None
    failure: preflight.PreflightError | None = None
    try:
        plan = preflight.check(cfg, results, model_bytes=args.model_bytes)
    except preflight.PreflightError as exc:
        failure = exc

    if args.json:
        out = report.summary(results, plan)
        if failure is not None:
            out["preflight"] = {"failed": [str(f) for f in failure.findings],
                                "warnings": [str(w) for w in failure.warnings]}
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        print(report.render_table(results, color=color), end="")
        if not args.no_last_up:
            outputs, why = last_up_outputs(args.stack)
            if outputs is None:
                print(sanitize_lines(f"last up: {why}"))
            else:
                print(report.render_last_up([n.name for n in cfg.nodes], outputs), end="")
        warnings = plan.warnings if plan is not None else (failure.warnings if failure else [])
        for w in warnings:
            print(sanitize_lines(f"warning: {w}"))
        if plan is not None:
            for node, containers in plan.stop_containers.items():
                for c in containers:
                    print(sanitize_lines(
                        f"plan: stop {c.name} on {node} (image {c.image}, "
                        f"{c.memory_bytes / 1024**3:.1f} GiB); destroy starts it again"))
    if failure is not None:
        print(sanitize_lines(str(failure)), file=sys.stderr)
        return 1
    if not args.json:
        print("preflight passed")
    return 0


def cli() -> int:
    """The console entry point (`spark-vllm-recon`)."""
    try:
        return main()
    except BrokenPipeError:  # e.g. piped into `head`
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(cli())
