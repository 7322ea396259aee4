"""`make recon` / `spark-vllm-recon`: survey every node of a stack, print the side-by-side
table, run preflight.

    spark-vllm-recon [--stack dev] [--key PATH] [--model-bytes N | --no-hub] [--json]
                     [--no-last-up]

Reads Pulumi.<stack>.yaml in the current folder directly (no Pulumi CLI, no engine): the
`spark-vllm:*` keys are validated by the config package like the program does. Secrets are not
decrypted here: when the stack keeps its key in the secret `sshPrivateKey`, pass the key file
with --key.
Below the table, what the last `pulumi up` of the stack proved (`pulumi stack output --json`,
no secrets): the fabric pairs pinged at the MTU, each node's image probe, NCCL's transport;
skipped with a note when the CLI or the stack is not there.
Preflight runs the checks `pulumi preview` runs, with the same inputs where this tool can get
them: the stack's label (`<project>/<stack>`, from Pulumi.yaml here), so another stack's
containers, ports and Ray on the same nodes are found; the model's and each service's size and
shape from the hub (asked while the nodes are surveyed, as the program does; the token from
HF_TOKEN only, since secrets are not decrypted here), for the memory fit and the disk. What it
could not check is named after the verdict ("skipped: ..."), never passed in silence.
Exit codes: 0 preflight passed, 1 preflight failed (findings printed), 2 config/usage problem.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from config import (
    NAMESPACE,
    SECRET_KEYS,
    ConfigError,
    StackConfig,
    pin_host_keys,
    plain_value,
    validate_config,
)
from hostscripts.paths import StackNames
from inspection import hub, preflight, recon, report
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
        raw[name] = plain_value(value, name)  # as the program reads it
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


def stack_label(stack: str, root: Path | None = None) -> str:
    """`<project>/<stack>`, the label the program's containers carry: the project's name from
    Pulumi.yaml in `root` (the folder the stack files are in)."""
    path = (root or Path.cwd()) / "Pulumi.yaml"
    try:
        name = (yaml.safe_load(path.read_text()) or {}).get("name")
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError([f"{path}: cannot read the project's name ({exc})"]) from None
    if not isinstance(name, str) or not name:
        raise ConfigError([f"{path}: no project name"])
    return f"{name}/{stack}"


def ask_hub(cfg: StackConfig) -> tuple[dict[str, Any], list[str]]:
    """The model's and each service's manifest at the hub, as __main__ asks for them. -> (the
    keyword arguments of preflight.check, what could not be asked: one line each)."""
    token = os.environ.get("HF_TOKEN") or None
    skipped: list[str] = []
    kwargs: dict[str, Any] = {}
    try:
        m = hub.resolve_model(cfg.model.repo, cfg.model.revision, cfg.model.endpoint, token)
        kwargs.update(model_bytes=m.total_bytes, shape=m.shape)
    except hub.ModelResolutionError as exc:
        skipped.append(f"the memory fit and the disk ({exc})")
    services: dict[str, tuple[int | None, Any]] = {}
    for s in cfg.services:
        try:
            sm = hub.resolve_model(s.repo, s.revision, cfg.model.endpoint, token)
            services[s.name] = (sm.total_bytes, sm.shape)
        except hub.ModelResolutionError as exc:
            skipped.append(f"service {s.name}'s memory share ({exc})")
    kwargs["services"] = services
    return kwargs, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", "-s", default="dev", help="stack name: reads Pulumi.<stack>.yaml")
    ap.add_argument("--key", help="ssh private key file (overrides spark-vllm:ssh.privateKeyPath)")
    ap.add_argument("--model-bytes", type=int, default=None,
                    help="model size in bytes, for the memory and disk checks (instead of "
                         "asking the hub)")
    ap.add_argument("--no-hub", action="store_true",
                    help="do not ask the hub: the memory fit and disk checks are skipped")
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

    try:
        label = stack_label(args.stack)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    skipped: list[str] = []
    hub_args: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hub") as pool:
        lookup = None if args.no_hub or args.model_bytes else pool.submit(ask_hub, cfg)
        results = recon.survey_all(cfg, names=StackNames(args.stack), key_path=args.key)
        if lookup is not None:
            hub_args, skipped = lookup.result()
    if args.model_bytes:
        hub_args = {"model_bytes": args.model_bytes}
        if cfg.services:
            skipped.append("the services' memory shares (--model-bytes names the main model's "
                           "size only)")
    elif args.no_hub:
        skipped.append("the memory fit and the disk (--no-hub)")
    plan = None
    failure: preflight.PreflightError | None = None
    try:
        plan = preflight.check(cfg, results, stack_label=label, **hub_args)
    except preflight.PreflightError as exc:
        failure = exc

    if args.json:
        out = report.summary(results, plan, stack_label=label)
        out["skipped"] = skipped
        if failure is not None:
            out["preflight"] = {"failed": [str(f) for f in failure.findings],
                                "warnings": [str(w) for w in failure.warnings]}
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        print(report.render_table(results, color=color, stack_label=label), end="")
        if plan is not None:  # which NCCL runs on each node, in full (the table clips it)
            for node, line in plan.nccl.items():
                print(f"nccl {node}: {line}")
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
        for line in skipped:
            print(sanitize_lines(f"skipped: {line}"), file=sys.stderr)
        return 1
    if not args.json:
        print("preflight passed" + ("" if skipped else " (every check `pulumi preview` runs)"))
        for line in skipped:
            print(f"skipped: {line}")
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
