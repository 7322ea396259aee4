#!/usr/bin/env python3
"""Drive a spark-vllm stack through the Pulumi Automation API.

The project's `__main__.py` runs as an *inline* program in this process, so the engine needs only
the `pulumi` CLI and the resource plugins, not the Python language host binary (which cannot be
built offline, see docs/toolchain.md). With the language host installed, `pulumi up -s <stack>`
does exactly the same thing; this script exists so every machine has one way that works.

    stackctl.py preview --stack dev [--policy] [--expect-no-changes] [--diff]
    stackctl.py up      --stack dev [--policy] [--refresh]
    stackctl.py refresh --stack dev
    stackctl.py destroy --stack dev
    stackctl.py outputs --stack dev [--json]
"""

from __future__ import annotations

import argparse
import json
import runpy
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICY_PACK = ROOT / "policies" / "run-pack"


def _program() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")


def select_stack(stack: str, env: dict[str, str] | None = None):
    import pulumi.automation as auto

    return auto.create_or_select_stack(
        stack_name=stack,
        project_name="spark-vllm",
        program=_program,
        opts=auto.LocalWorkspaceOptions(work_dir=str(ROOT), env_vars=env or {}),
    )


def keep_alive_on_interrupt() -> None:
    """Let Ctrl-C cancel an operation cleanly instead of leaving the stack locked.

    Ctrl-C reaches the whole foreground process group. The Pulumi CLI then cancels: it waits
    for the steps in flight, writes the state and releases the stack's lock. It can only do so
    while this process lives, because the inline program's language runtime runs here; dying
    at once (Python's default) leaves the lock behind (docs/faults.md). So this process only
    says what is happening, and the CLI's exit ends the operation with an error as usual.
    """

    def waiting(_signum, _frame) -> None:
        print(
            "\nstackctl: interrupted; the engine is cancelling (steps in flight finish, the "
            "lock is released). Ctrl-C again interrupts the engine harder.",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGINT, waiting)


def policy_args(stack: str, enabled: bool) -> dict:
    if not enabled:
        return {}
    args: dict = {"policy_packs": [str(POLICY_PACK)]}
    cfg = ROOT / "policies" / f"config.{stack}.json"
    if cfg.exists():
        args["policy_pack_configs"] = [str(cfg)]
    return args


def main(argv: list[str] | None = None) -> int:
    import pulumi.automation as auto

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("op", choices=["preview", "up", "refresh", "destroy", "outputs"])
    ap.add_argument("--stack", "-s", default="dev")
    ap.add_argument("--policy", action="store_true", help="review with the policy pack")
    ap.add_argument("--expect-no-changes", action="store_true")
    ap.add_argument("--diff", action="store_true")
    ap.add_argument("--refresh", action="store_true", help="refresh state from the hosts first")
    ap.add_argument("--json", action="store_true", help="outputs as JSON")
    a = ap.parse_args(argv)

    stack = select_stack(a.stack)
    keep_alive_on_interrupt()
    out = {"on_output": lambda line: print(line, flush=True)}
    try:
        if a.op == "preview":
            r = stack.preview(
                expect_no_changes=a.expect_no_changes,
                diff=a.diff,
                refresh=a.refresh,
                **out,
                **policy_args(a.stack, a.policy),
            )
            print(f"changes: {dict(r.change_summary)}")
        elif a.op == "up":
            r = stack.up(diff=a.diff, refresh=a.refresh, **out, **policy_args(a.stack, a.policy))
            print(f"result: {r.summary.result} {dict(r.summary.resource_changes or {})}")
        elif a.op == "refresh":
            r = stack.refresh(**out)
            print(f"result: {r.summary.result} {dict(r.summary.resource_changes or {})}")
        elif a.op == "destroy":
            stack.destroy(**out)
        else:
            outs = {k: ("[secret]" if v.secret else v.value) for k, v in stack.outputs().items()}
            print(json.dumps(outs, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in outs.items()))
    except auto.CommandError as e:
        # The engine already streamed its diagnostics; keep the summary short and traceback-free.
        tail = "\n".join(str(e).strip().splitlines()[-15:])
        print(f"\nstackctl: `{a.op}` on stack {a.stack!r} failed:\n{tail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
