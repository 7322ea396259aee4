"""`spark-vllm reconcile -s STACK [--every 5m] [--once] [--install | --uninstall]`: the stack
watches itself (issue 50). Each run:

1. takes the stack's reconcile lock (an flock of its own, $SPARK_VLLM_HOME/reconcile/
   <stack>.lock): a second run, by the timer or by hand, is skipped while one runs; Pulumi's
   own stack lock keeps the run's `up` and a human's `up` apart (whichever comes second is
   refused by the engine: the run then says `skipped`);
2. copies Pulumi.<stack>.yaml into a project folder of its own (the program is the same) and
   compares that copy's config with the config of the stack's last successful update
   (`pulumi stack history`): a stack file with edits not yet applied is refused and reported,
   nothing previewed or applied: the run repairs drift from what was applied, never applies
   what nobody has `up`-ed yet;
3. previews with a refresh first and the policy pack (policies/, its config
   policies/config.<stack>.json), reading every step the engine plans;
4. applies the `up` (refresh and the policy pack again) only when every step is in a class the
   stack repairs safely (tools/drift.py CLASSES); reports the rest by name: a change outside
   them, a policy violation, a node the preview could not reach;
5. writes one line (what it saw, what it did, how long) and its result as metrics for
   Prometheus (tools/reconcile_report.py: the head's node exporter reads them).

`--once` runs once (the timer's service does); without it, a run every `--every`. `--install`
writes a systemd timer and service of the stack's own for the user (tools/reconcile_timer.py);
`--uninstall` removes them. Exit codes: 0 clean, repaired or skipped; 1 failed; 2 usage; 3
refused (drift reported, not repaired).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from config.load import plain_value
from config.paths import local_state_dir
from tools import drift, reconcile_timer
from tools.reconcile_report import (
    FILE,
    RunResult,
    head_script,
    last_repair_of,
    metrics_text,
    record,
    write_atomic,
)

if TYPE_CHECKING:  # imported where used: `--help` and the unit tests need no engine
    import pulumi.automation as auto

    from config import StackConfig

PROJECT = "spark-vllm"
REPOSITORY = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
EXIT = {"clean": EXIT_OK, "repaired": EXIT_OK, "skipped": EXIT_OK, "failed": EXIT_FAILED,
        "refused": EXIT_REFUSED}
_INTERVAL = re.compile(r"(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
# what the engine says when another update holds the stack's lock (a human's `up`)
_LOCKED = ("the stack is currently locked", "currently locked by")


class Usage(Exception):
    """A problem with how the run was asked for (exit 2)."""


def parse_interval(text: str) -> int:
    """`5m`, `30s`, `1h`, `1h30m` -> seconds (at least 1)."""
    m = _INTERVAL.fullmatch(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise Usage(f"--every {text!r}: expected a duration such as 5m, 30s, 1h or 1h30m")
    h, mins, s = (int(g or 0) for g in m.groups())
    seconds = h * 3600 + mins * 60 + s
    if seconds < 1:
        raise Usage(f"--every {text!r}: at least 1s")
    return seconds


# (config, result, metrics text) -> None, or why the head did not get them; tests replace it
Deliver = Callable[["StackConfig", RunResult, str], str | None]


@dataclass
class Options:
    stack: str
    work_dir: Path = field(default_factory=Path.cwd)
    every: int = 300
    key: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra env for the workspace
    # the policy pack (None: the repository's policies/); its config: policies/config.<stack>.json
    policy_pack: Path | None = None
    # an inline program (tests, tests/promote's fake); default: the project's own, run by the
    # CLI through the language host from a copy of work_dir's Pulumi.yaml
    program: Callable[[], None] | None = None
    state_dir: Path = field(default_factory=local_state_dir)
    out: Callable[[str], None] = print
    engine_output: Callable[[str], None] | None = None
    deliver: Deliver | None = None  # None: over ssh to the head (deliver_to_head)


@contextmanager
def run_lock(path: Path) -> Iterator[bool]:
    """An exclusive flock on `path`, not waited for: yields whether this run holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lock_path(o: Options) -> Path:
    return o.state_dir / "reconcile" / f"{o.stack}.lock"


def scratch_project(work_dir: Path, stack: str, dest: Path) -> bytes:
    """`dest` made a project folder of the same program: work_dir's Pulumi.yaml with its
    program (`main`) and virtualenv made absolute, and a copy of Pulumi.<stack>.yaml. Returns
    the stack file's bytes: what this run compares and previews, whatever the file becomes
    meanwhile."""
    stack_file = work_dir / f"Pulumi.{stack}.yaml"
    if not stack_file.is_file():
        raise Usage(f"{stack_file} does not exist: run reconcile in the folder of the stack's "
                    "Pulumi.<stack>.yaml")
    data = stack_file.read_bytes()
    project = work_dir / "Pulumi.yaml"
    doc = yaml.safe_load(project.read_text()) if project.is_file() else None
    if not isinstance(doc, dict):
        raise Usage(f"{project}: no Pulumi project file beside the stack file")
    main = Path(str(doc.get("main") or "."))
    doc["main"] = str(main if main.is_absolute() else (work_dir / main).resolve())
    runtime = doc.get("runtime")
    options = runtime.get("options") if isinstance(runtime, dict) else None
    if isinstance(options, dict) and options.get("virtualenv"):
        venv = Path(str(options["virtualenv"]))
        options["virtualenv"] = str(venv if venv.is_absolute() else (work_dir / venv).resolve())
    (dest / "Pulumi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (dest / stack_file.name).write_bytes(data)
    return data


def _value(v: Any) -> Any:
    return plain_value(getattr(v, "value", v))


def config_differences(applied: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The keys whose values differ between the config an update ran with and the stack file's
    (names only: a value may be a secret)."""
    keys = sorted(set(applied) | set(current))
    return [k for k in keys if (k in applied) != (k in current)
            or _value(applied[k]) != _value(current[k])
            or bool(getattr(applied[k], "secret", False)) !=
            bool(getattr(current[k], "secret", False))]


def last_success(stack: auto.Stack) -> tuple[Any | None, str]:
    """(the last successful update's summary, "") or (None, why there is none to reconcile to).
    A stack destroyed since is none."""
    for entry in stack.history(page_size=50):
        if entry.kind == "destroy" and entry.result == "succeeded":
            return None, "the stack was destroyed: nothing to reconcile"
        if entry.kind == "update" and entry.result == "succeeded":
            return entry, ""
    return None, "no successful update in the stack's last 50 operations: nothing to " \
                 "reconcile to"


def _engine_env(o: Options) -> dict[str, str]:
    from tools.promote import _default_env, _workspace_env, check_environment

    env = {**_default_env(), **o.env}
    check_environment(env)  # promote.Refusal: turned into Usage by the caller
    return _workspace_env(env, o.stack, o.work_dir)


def _policy(o: Options) -> tuple[list[str], list[str]]:
    pack = o.policy_pack or (REPOSITORY / "policies")
    if not (pack / "PulumiPolicy.yaml").is_file():
        raise Usage(f"{pack}: no policy pack there (PulumiPolicy.yaml)")
    config = pack / f"config.{o.stack}.json"
    return [str(pack)], [str(config)] if config.is_file() else []


def _open(o: Options, folder: Path, env: dict[str, str]) -> auto.Stack:
    import pulumi.automation as auto

    ws = auto.LocalWorkspaceOptions(work_dir=str(folder), env_vars=env)
    if o.program is not None:
        return auto.select_stack(stack_name=o.stack, project_name=PROJECT, program=o.program,
                                 opts=ws)
    return auto.select_stack(stack_name=o.stack, work_dir=str(folder), opts=ws)


def _tail(error: Exception, lines: int = 6) -> str:
    text = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    keep = [ln for ln in text if not ln.startswith(("+ ", "~ ", "- ", "@ ", "Resources:"))]
    return " / ".join((keep or text)[-lines:])


def _why_preview_failed(error: Exception, policy: list[str]) -> tuple[str, str]:
    """(result, why) of a preview the engine failed: refused for what the issue reports (a
    policy violation, a node the preview could not reach, preflight's findings), failed for
    anything else."""
    text = str(error)
    if policy:
        return "refused", "policy violation: " + "; ".join(policy)
    m = re.search(r"^[ \t-]*(\S+: unreachable: [^\n]*)$", text, re.M)
    if m or "unreachable:" in text:
        line = m.group(1).strip() if m else "a node is unreachable"
        return "refused", f"a node is unreachable ({line})"
    m = re.search(r"preflight failed with [^\n]*\n\s*- ([^\n]*)", text)
    if m:
        return "refused", f"preflight failed ({m.group(1).strip()})"
    return "failed", f"the preview failed: {_tail(error)}"


def reconcile_once(o: Options, folder: Path, r: RunResult) -> None:
    """Steps 2 to 4 of the module's docstring, into `r`."""
    import pulumi.automation as auto

    try:
        env = _engine_env(o)
    except Exception as exc:  # promote.Refusal: the environment
        raise Usage(getattr(exc, "message", str(exc))) from None
    packs, configs = _policy(o)
    scratch_project(o.work_dir, o.stack, folder)
    try:
        stack = _open(o, folder, env)
    except auto.StackNotFoundError:
        raise Usage(f"stack {o.stack!r} does not exist on the backend "
                    f"({env.get('PULUMI_BACKEND_URL')})") from None
    last, why = last_success(stack)
    if last is None:
        r.result, r.why = "refused", why
        return
    differ = config_differences(dict(last.config or {}), dict(stack.get_all_config()))
    if differ:
        when = last.end_time or last.start_time
        r.result = "refused"
        r.why = (f"Pulumi.{o.stack}.yaml differs from the config of the last successful update "
                 f"({when:%Y-%m-%d %H:%M:%S}) at {', '.join(differ)}: nothing previewed or "
                 "applied; `pulumi up` the edit (or undo it) and the next run reconciles")
        return
    events: list[Any] = []
    t0 = time.monotonic()
    try:
        stack.preview(refresh=True, policy_packs=packs, policy_pack_configs=configs,
                      on_event=events.append, on_output=o.engine_output, color="never")
    except auto.CommandError as exc:
        r.phases["preview"] = time.monotonic() - t0
        r.result, r.why = _why_preview_failed(exc, drift.policy_findings(events))
        return
    r.phases["preview"] = time.monotonic() - t0
    v = drift.verdict(drift.changes_of(events))
    r.saw = {cls: [str(c) for c in items] for cls, items in v.safe.items()}
    r.unrepaired = [str(c) for c in v.unsafe]
    policy = drift.policy_findings(events)
    if policy:
        r.result, r.why = "refused", "policy violation: " + "; ".join(policy)
        return
    if not v.changes:
        r.result = "clean"
        return
    if not v.repairable:
        r.result = "refused"
        r.why = ("changes outside the classes the stack repairs by itself (tools/drift.py): "
                 + ", ".join(r.unrepaired) + "; review them and `pulumi up` by hand")
        return
    events = []
    t0 = time.monotonic()
    try:
        stack.up(refresh=True, policy_packs=packs, policy_pack_configs=configs,
                 on_event=events.append, on_output=o.engine_output, color="never")
    except auto.CommandError as exc:
        r.phases["up"] = time.monotonic() - t0
        if any(s in str(exc) for s in _LOCKED):
            r.result, r.why = "skipped", "another update holds the stack's lock (a `pulumi up`)"
        else:
            r.result, r.why = "failed", f"the up failed: {_tail(exc)}"
        r.did = [str(c) for c in drift.changes_of(events) if c.kind != drift.STACK]
        return
    r.phases["up"] = time.monotonic() - t0
    done = [c for c in drift.changes_of(events) if c.kind != drift.STACK]
    r.did = [str(c) for c in done]
    planned = {c.split(" ")[0] for items in r.saw.values() for c in items}
    beyond = [str(c) for c in done if c.name not in planned]
    if beyond:
        r.notes.append("the up did more than its preview planned: " + ", ".join(beyond))
    r.result = "repaired"


def run(o: Options) -> RunResult:
    """One run, under the lock; its result reported (line, metrics). Never raises for what the
    run finds: a failure is a result."""
    started = time.time()
    mono = time.monotonic()
    r = RunResult(o.stack, "failed", started)
    with run_lock(lock_path(o)) as held:
        if not held:
            r.result = "skipped"
            r.why = f"another reconcile of {o.stack} runs (it holds {lock_path(o)})"
        else:
            with tempfile.TemporaryDirectory(prefix="spark-vllm-reconcile-") as tmp:
                try:
                    reconcile_once(o, Path(tmp), r)
                except Usage:
                    raise
                except Exception as exc:  # the run's own failure is a result, never a traceback
                    r.result, r.why = "failed", f"{type(exc).__name__}: {_tail(exc)}"
                r.seconds = time.monotonic() - mono
                report(o, r, Path(tmp))
    r.seconds = r.seconds or time.monotonic() - mono
    return r


def report(o: Options, r: RunResult, folder: Path) -> None:
    """The metrics, on the control machine and (monitoring on) on the head."""
    local = o.state_dir / "reconcile" / f"{o.stack}.prom"
    previous = local.read_text() if local.is_file() else ""
    last_repair = r.started if r.result == "repaired" else last_repair_of(previous)
    text = metrics_text(r, o.every, last_repair)
    try:
        write_atomic(local, text)
    except OSError as exc:
        r.notes.append(f"metrics not written to {local}: {exc}")
    cfg = _applied_config(o, folder, r)
    if cfg is None or not cfg.monitoring.enabled:
        return
    why = (o.deliver if o.deliver is not None else deliver_to_head)(cfg, r, text)
    if why:
        r.notes.append(f"metrics not delivered to the head: {why}")


def _applied_config(o: Options, folder: Path, r: RunResult) -> StackConfig | None:
    from config import ConfigError
    from tools.recon_report import load_stack_config

    root = folder if (folder / f"Pulumi.{o.stack}.yaml").is_file() else o.work_dir
    try:
        return load_stack_config(o.stack, root)
    except ConfigError as exc:
        r.notes.append(f"metrics not delivered to the head: the stack file is not valid "
                       f"({str(exc).splitlines()[-1].strip()})")
        return None


def _key(o: Options, cfg: StackConfig) -> str | None:
    """--key; else the key file the program wrote from the secret sshPrivateKey (config/load.py
    ssh_key_path), when there is one; else ssh.privateKeyPath."""
    if o.key:
        return o.key
    written = o.state_dir / "keys" / f"{PROJECT}.{o.stack}"
    return str(written) if written.is_file() else None


def deliver_to_head(cfg: StackConfig, r: RunResult, text: str,
                    o: Options | None = None) -> str | None:
    """LIVE PATH: the metrics into the head's textfile folder, over the stack's ssh (pinned
    host key). None when written, else why not."""
    from hostscripts.monitoring import textfile_dir
    from tools import stack_access

    key = _key(o, cfg) if o is not None else None
    script = head_script(textfile_dir(r.stack), text)
    try:
        with stack_access.ssh_argv(cfg, cfg.head, key=key) as argv:
            done = subprocess.run(argv, input=script.encode(), capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ssh to {cfg.head.name}: {exc}"
    if done.returncode != 0 or b"written" not in done.stdout:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"ssh to {cfg.head.name} exited {done.returncode}: {(err or ['no output'])[-1]}"
    return None


_STOP = threading.Event()  # set by SIGTERM: the loop ends after the run in progress


def wait(seconds: float) -> bool:
    """Wait `seconds` between two runs; True when asked to stop meanwhile (tests replace it)."""
    return _STOP.wait(seconds)


def loop(o: Options, once: bool, as_json: bool) -> int:
    """Run once, or every `o.every` seconds (from one start to the next; a run longer than that
    is followed by the next at once) until interrupted (Ctrl-C, SIGTERM: systemctl stop)."""
    _STOP.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: _STOP.set())
    code = EXIT_OK
    try:
        while True:
            r = run(o)
            o.out(record(r) if as_json else r.line())
            code = EXIT[r.result]
            if once or wait(max(0.0, o.every - r.seconds)):
                return code
    except KeyboardInterrupt:
        return code


def _toolchain_on_path() -> None:
    toolchain = Path.home() / ".cache" / "spark-vllm" / "toolchain" / "bin"
    if (toolchain / "pulumi").exists() and str(toolchain) not in os.environ.get("PATH", ""):
        os.environ["PATH"] = f"{toolchain}{os.pathsep}{os.environ.get('PATH', '')}"


def _exe() -> str:
    """The spark-vllm console script of this installation (what the service runs)."""
    beside = Path(sys.executable).parent / "spark-vllm"
    found = beside if beside.is_file() else shutil.which("spark-vllm")
    if not found:
        raise Usage("no spark-vllm console script beside this Python (make venv installs it)")
    return str(found)


@click.command("reconcile")
@click.option("-s", "--stack", required=True, help="the stack (Pulumi.<stack>.yaml here)")
@click.option("--every", "every_text", default="5m", show_default=True,
              help="how often to run (5m, 30s, 1h, 1h30m); the timer's interval with --install")
@click.option("--once", is_flag=True, help="run once and exit (what the timer's service runs)")
@click.option("--install", is_flag=True, help="write and enable a systemd user timer for it")
@click.option("--uninstall", is_flag=True, help="stop and remove that timer and service")
@click.option("--key", help="ssh private key for the head (default: the stack's)")
@click.option("--json", "as_json", is_flag=True, help="print each run as a JSON line")
@click.option("--verbose", "-v", is_flag=True, help="stream the engine's output")
@click.pass_context
def command(ctx: click.Context, stack: str, every_text: str, once: bool, install: bool,
            uninstall: bool, key: str | None, as_json: bool, verbose: bool) -> None:
    """Repair the stack's drift in the classes it repairs safely, report the rest (one line
    and metrics per run); --install a systemd timer that runs it."""
    try:
        every = parse_interval(every_text)
        if install and uninstall:
            raise Usage("--install or --uninstall, not both")
        unit_dir = reconcile_timer.UNIT_DIR.expanduser()
        if uninstall:
            ctx.exit(reconcile_timer.uninstall(stack, unit_dir=unit_dir,
                                               run=reconcile_timer.systemctl, out=click.echo))
        if install:
            if not (Path.cwd() / f"Pulumi.{stack}.yaml").is_file():
                raise Usage(f"Pulumi.{stack}.yaml is not in this folder: --install from the "
                            "folder of the stack file")
            units = reconcile_timer.render(
                stack, exe=_exe(), work_dir=str(Path.cwd()), every_seconds=every,
                env=reconcile_timer.environment(stack))
            ctx.exit(reconcile_timer.install(stack, units, unit_dir=unit_dir,
                                             run=reconcile_timer.systemctl, out=click.echo))
    except (Usage, reconcile_timer.InstallError) as exc:
        raise click.UsageError(str(exc)) from None
    _toolchain_on_path()
    o = Options(stack=stack, every=every, key=key, out=click.echo,
                engine_output=(lambda line: click.echo(line, err=True)) if verbose else None)
    o.deliver = lambda cfg, r, text: deliver_to_head(cfg, r, text, o)
    try:
        ctx.exit(loop(o, once, as_json))
    except Usage as exc:
        raise click.UsageError(str(exc)) from None


__all__ = ["FILE", "Options", "command", "config_differences", "parse_interval", "run"]
