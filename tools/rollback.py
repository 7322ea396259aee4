"""`spark-vllm rollback -s STACK [--to N] [--yes] [--dry-run] [-- PULUMI UP ARGS...]`: back to a
deployment the stack verified (issue 49; docs/design.md "An upgrade that fails").

1. The verified deployments come from `pulumi stack history --json` (the config each update ran
   with): every `update` that succeeded ran every health gate and passed. Updates in a row with
   the same deployment config (`image`, `model`, `vllm`, `services`, `nccl.extraEnv`) are one
   deployment; they are numbered from 1, the newest, and listed with what differs from the
   stack file now.
2. The chosen one (`--to N`, default 1: the last verified) is written back through Pulumi's own
   CLI: `pulumi config set-all --json` for those keys (and `pulumi config rm` for one it did not
   have), into a scratch copy of Pulumi.<stack>.yaml first, whose diff is shown before the stack
   file is replaced (`--yes` skips the question; `--dry-run` stops after the diff). Secrets and
   every other key are left as they are.
3. `pulumi up --yes --stack STACK` runs (the arguments after `--` are added, e.g. the policy
   pack), its output streamed; its exit code is rollback's.

A model revision that is a branch in the history is written back as that branch: the history
keeps the config, not the commit it resolved to (the stack output `deployment`, and
`spark-vllm status`, show the commit that was verified), and rollback says so.

Run it in the project's folder with the stack's backend and passphrase in the environment (the
Makefile sets both; README "Running a stack"). Exit codes: 0 done (or nothing to do, or a dry
run), 1 the up or Pulumi's CLI failed, 2 usage, 3 no verified deployment, 6 not confirmed.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import yaml

from config.forms import NAMESPACE, is_commit
from config.load import plain_value
from tools.init_cli import write_stack_file

# The keys a deployment is made of: whole objects, and the VLLM_*/NCCL_* env of nccl.extraEnv
DEPLOYMENT_KEYS = ("image", "model", "vllm", "services")
EXTRA_ENV = ("nccl", "extraEnv")
HISTORY_PAGE = 100
HISTORY_PAGES = 20  # at most this many pages of the history are read (2000 operations)

EXIT_ENGINE, EXIT_USAGE, EXIT_UNVERIFIED, EXIT_NOT_CONFIRMED = 1, 2, 3, 6


def pulumi(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """LIVE PATH: Pulumi's CLI, its output captured."""
    return subprocess.run(["pulumi", *args], capture_output=True, text=True, timeout=300)


def pulumi_up(args: Sequence[str]) -> int:
    """LIVE PATH: `pulumi up`, its output on this terminal as it comes."""
    return subprocess.run(["pulumi", *args], check=False).returncode


PULUMI: Callable[[Sequence[str]], subprocess.CompletedProcess[str]] = pulumi
PULUMI_UP: Callable[[Sequence[str]], int] = pulumi_up


class RollbackError(click.ClickException):
    """A refusal or a failure: printed as `rollback: ...`, exit `code`."""

    def __init__(self, message: str, code: int = EXIT_ENGINE):
        super().__init__(message)
        setattr(self, "exit_code", code)  # noqa: B010 (click's ClassVar, per refusal here)

    def show(self, file: Any = None) -> None:
        click.echo(f"rollback: {self.message}", err=True)


@dataclass
class Deployment:
    """One verified deployment: its config (view), and the updates that ran it."""

    view: dict[str, Any]
    first: str  # when the first update of it ended (the history's time)
    last: str
    updates: int = 1
    number: int = 0
    notes: list[str] = field(default_factory=list)


def _value(entry: Any) -> Any:
    """A history config value as the program reads it (objects as objects)."""
    if not isinstance(entry, dict) or entry.get("secret"):
        return None
    if "objectValue" in entry:
        return entry["objectValue"]
    return plain_value(entry.get("value"))


def view_of(config: dict[str, Any], decode: Callable[[Any], Any] = _value) -> dict[str, Any]:
    """The deployment keys of a config (`spark-vllm:<key>` -> value), absent ones left out."""
    out: dict[str, Any] = {}
    for key in DEPLOYMENT_KEYS:
        if f"{NAMESPACE}:{key}" in config:
            value = decode(config[f"{NAMESPACE}:{key}"])
            if value is not None:
                out[key] = value
    nccl = decode(config.get(f"{NAMESPACE}:{EXTRA_ENV[0]}"))
    if isinstance(nccl, dict) and EXTRA_ENV[1] in nccl:
        out[".".join(EXTRA_ENV)] = nccl[EXTRA_ENV[1]]
    return out


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}"))
        return out or {prefix: {}}
    return {prefix: value}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two views."""
    fa = {k: v for key, value in a.items() for k, v in _flat(value, key).items()}
    fb = {k: v for key, value in b.items() for k, v in _flat(value, key).items()}
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))


def read_history(stack: str) -> list[dict[str, Any]]:
    """Every operation `pulumi stack history --json` lists, newest first."""
    out: list[dict[str, Any]] = []
    for page in range(1, HISTORY_PAGES + 1):
        done = PULUMI(["stack", "history", "--json", "--stack", stack, "--page-size",
                       str(HISTORY_PAGE), "--page", str(page)])
        if done.returncode != 0:
            raise RollbackError("pulumi stack history failed: "
                                + (done.stderr.strip() or done.stdout.strip()))
        try:
            entries = json.loads(done.stdout or "[]")
        except ValueError:
            raise RollbackError("pulumi stack history printed no JSON") from None
        if not isinstance(entries, list):
            raise RollbackError("pulumi stack history printed no JSON list")
        out += [e for e in entries if isinstance(e, dict)]
        if len(entries) < HISTORY_PAGE:
            break
    return out


def verified_deployments(history: list[dict[str, Any]]) -> list[Deployment]:
    """The verified deployments (module docstring), newest first, numbered from 1."""
    found: list[Deployment] = []
    for e in reversed(history):  # oldest first: a run of equal views is one deployment
        if e.get("kind") != "update" or e.get("result") != "succeeded":
            continue
        view = view_of(e.get("config") or {})
        when = str(e.get("endTime") or e.get("startTime") or "")
        if found and found[-1].view == view:
            found[-1].last = when
            found[-1].updates += 1
        else:
            found.append(Deployment(view=view, first=when, last=when))
    found.reverse()
    for i, d in enumerate(found, start=1):
        d.number = i
        for path, revision in _revisions(d.view):
            if isinstance(revision, str) and not is_commit(revision):
                d.notes.append(f"{path} {revision!r} is a branch or tag: it is set back as "
                               "such, and serves the commit it names at the hub now")
    return found


def _revisions(view: dict[str, Any]) -> list[tuple[str, Any]]:
    model: dict[str, Any] = view["model"] if isinstance(view.get("model"), dict) else {}
    out = [("model.revision", model.get("revision", "main"))]
    for s in view.get("services") or []:
        if isinstance(s, dict):
            out.append((f"services.{s.get('name')}.revision", s.get("revision", "main")))
    return out


def _when(text: str) -> str:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return text or "?"


def _summary(view: dict[str, Any]) -> str:
    image = (view.get("image") or {}).get("ref", "?") if isinstance(view.get("image"), dict) \
        else "?"
    model: dict[str, Any] = view["model"] if isinstance(view.get("model"), dict) else {}
    return f"image {image}, {model.get('repo', '?')}@{model.get('revision', 'main')}"


def current_view(path: Path) -> dict[str, Any]:
    """The deployment keys of the stack file as it is (plain values; JSON strings decoded)."""
    try:
        data = (yaml.safe_load(path.read_text()) or {}).get("config") or {}
    except (OSError, yaml.YAMLError) as exc:
        raise RollbackError(f"{path.name}: cannot read it ({exc})", EXIT_USAGE) from None

    def plain(v: Any) -> Any:
        if isinstance(v, dict) and "secure" in v:
            return None
        return plain_value(v)

    return view_of(data, plain)


def _check(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        raise RollbackError(f"{what} failed: {done.stderr.strip() or done.stdout.strip()}")


def rendered(stack: str, path: Path, chosen: dict[str, Any]) -> str:
    """Pulumi.<stack>.yaml with the chosen deployment's keys, written by Pulumi's CLI into a
    scratch copy (the stack file itself untouched): its text."""
    now = current_view(path)
    raw = yaml.safe_load(path.read_text()) or {}
    nccl = (raw.get("config") or {}).get(f"{NAMESPACE}:{EXTRA_ENV[0]}")
    values: dict[str, Any] = {k: chosen[k] for k in DEPLOYMENT_KEYS if k in chosen}
    gone = [k for k in DEPLOYMENT_KEYS if k not in chosen and k in now]
    env_key = ".".join(EXTRA_ENV)
    if env_key in chosen or env_key in now:
        merged = dict(nccl) if isinstance(nccl, dict) else {}
        if env_key in chosen:
            merged[EXTRA_ENV[1]] = chosen[env_key]
        else:
            merged.pop(EXTRA_ENV[1], None)
        values[EXTRA_ENV[0]] = merged
    payload = {f"{NAMESPACE}:{k}": {"value": json.dumps(v), "objectValue": v, "secret": False}
               for k, v in values.items()}
    fd, scratch = tempfile.mkstemp(prefix=f".Pulumi.{stack}.", suffix=".yaml", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(path.read_text())
        if payload:
            _check(PULUMI(["config", "set-all", "--stack", stack, "--config-file", scratch,
                           "--json", json.dumps(payload)]), "pulumi config set-all")
        for key in gone:
            _check(PULUMI(["config", "rm", "--stack", stack, "--config-file", scratch,
                           f"{NAMESPACE}:{key}"]), f"pulumi config rm {key}")
        return Path(scratch).read_text()
    finally:
        Path(scratch).unlink(missing_ok=True)


@click.command("rollback", context_settings={"ignore_unknown_options": False})
@click.option("-s", "--stack", required=True, help="the stack: Pulumi.<stack>.yaml here")
@click.option("--to", "number", type=click.IntRange(min=1), default=1, show_default=True,
              help="the verified deployment to go back to, as listed (1: the last verified)")
@click.option("--yes", "-y", is_flag=True, help="write the stack file and up without asking")
@click.option("--dry-run", is_flag=True, help="list and show the change; write nothing, no up")
@click.argument("up_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- PULUMI UP ARGS]")
def command(stack: str, number: int, yes: bool, dry_run: bool, up_args: tuple[str, ...]) -> None:
    """Set the stack's config back to a verified deployment from its history and `pulumi up`."""
    root = Path.cwd()
    path = root / f"Pulumi.{stack}.yaml"
    if not (root / "Pulumi.yaml").is_file() or not path.is_file():
        raise click.UsageError(f"run it in the project's folder, where Pulumi.yaml and "
                               f"{path.name} are")
    history = read_history(stack)
    deployments = verified_deployments(history)
    if not deployments:
        raise RollbackError(f"stack {stack!r} has no verified deployment in its history (no "
                            "`pulumi up` of it succeeded): nothing to go back to",
                            EXIT_UNVERIFIED)
    now = current_view(path)
    click.echo(f"verified deployments of {stack} (pulumi stack history: each update that "
               "succeeded passed every health gate), the newest first:")
    for d in deployments:
        diff = differences(d.view, now)
        same = "the stack file now" if not diff else "differs from the stack file in " + \
            ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
        ups = f", {d.updates} updates" if d.updates > 1 else ""
        click.echo(f"  {d.number:>2}  {_when(d.last)}  {_summary(d.view)}{ups}  ({same})")
    if number > len(deployments):
        raise RollbackError(f"--to {number}: the history holds {len(deployments)} verified "
                            "deployment(s)", EXIT_USAGE)
    chosen = deployments[number - 1]
    for note in chosen.notes:
        click.echo(f"note: {note}")
    before = path.read_text()
    last = next((e for e in history if e.get("kind") in ("update", "destroy")), {})
    if not differences(chosen.view, now):
        if last.get("kind") == "update" and last.get("result") == "succeeded":
            click.echo(f"{path.name} already holds deployment {number} and its last update "
                       "succeeded: nothing to do")
            return
        click.echo(f"{path.name} already holds deployment {number}; its last update "
                   f"{last.get('result', 'did not succeed')}: running the up again")
    else:
        after = rendered(stack, path, chosen.view)
        click.echo(f"planned change to {path.name} (back to deployment {number}, verified "
                   f"{_when(chosen.last)}):")
        click.echo("".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                                f"a/{path.name}", f"b/{path.name}")).rstrip("\n"))
        if dry_run:
            click.echo("dry run: nothing written")
            return
        if not yes and not (sys.stdin.isatty() and click.confirm(
                f"write {path.name} and run pulumi up", default=False)):
            raise RollbackError("not confirmed (pass --yes to go on without asking)",
                                EXIT_NOT_CONFIRMED)
        if path.read_text() != before:
            raise RollbackError(f"{path.name} changed meanwhile; run rollback again", EXIT_USAGE)
        write_stack_file(path, after)
        click.echo(f"wrote {path.name}")
    if dry_run:
        return
    args = ["up", "--yes", "--stack", stack, *up_args]
    click.echo(f"running: pulumi {' '.join(args)}")
    rc = PULUMI_UP(args)
    if rc != 0:
        raise RollbackError(f"pulumi up failed (exit code {rc}); {path.name} holds deployment "
                            f"{number}'s config")
    click.echo(f"stack {stack} serves deployment {number} again (spark-vllm status -s {stack})")
