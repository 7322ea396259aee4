"""`spark-vllm logs` (tools/logs.py): the node script (hostscripts/logs.py) run for real by bash
against a fake `docker` on PATH (one folder per simulated node: nothing leaves this machine), the
sessions and the merge as printed, the sanitizer, and the command through click's CliRunner with
the ssh layer replaced by a local `bash -s`. The pure parts: tests/unit/inspection/test_logs.py
(selection, frames, merge) and tests/unit/hostscripts/test_logs_script.py (--since, quoting)."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from config import NodeConfig, StackConfig, validate_config
from hostscripts.logs import PIECE_BYTES, Options, node_script
from hostscripts.paths import StackNames
from inspection.logs import Target, short_name
from tests.conftest import config_raw
from tests.stand_in import python_stand_in
from tools import logs

NAMES = StackNames("dev")
SERVE, RAY_HEAD, RAY_WORKER, GATEWAY = NAMES.serve, NAMES.ray_head, NAMES.ray_worker, NAMES.gateway
EMBED = {"name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8100,
         "gpuMemoryUtilization": 0.05}


def stack(executor: str = "ray", services: tuple[dict[str, Any], ...] = ()) -> StackConfig:
    raw = config_raw(2)
    raw["vllm"] = {**raw["vllm"], "executor": executor}
    return validate_config({**raw, "services": list(services)})


def T(node: str, container: str) -> Target:
    return Target(node, container)


# --- the sanitizer ---------------------------------------------------------------------------------


def test_sanitize_removes_what_a_terminal_would_act_on():
    line = "\x1b[31mred\x1b[0m \x1b]0;title\x07bell\x07 nul\x00 \x9b2Jc1 \u202eevil tab\there"
    assert logs.sanitize(line) == "red bell nul c1 evil tab\there"
    assert logs.sanitize("Loading: 10%\rLoading: 50%\rLoading: 100%\r") == "Loading: 100%"
    assert logs.sanitize("[bold]not markup[/bold]") == "[bold]not markup[/bold]"


# --- the node script, for real, against a fake docker -----------------------------------------

# A stand-in for the docker CLI, state in $FAKE_DOCKER_DIR: <name>.state (true/false; absent: no
# such container), <name>.log ("<RFC3339Nano> <text>" lines, what `docker logs` shows),
# <name>.calls (the options of every `docker logs` call), <name>.phases (what each `logs
# --follow` call does: append lines to the log, then "stop" the container, which runs again
# after `down` inspections, or "block" like a running container's follow, until killed).
FAKE_DOCKER = r'''
import json, os, sys, time
from datetime import datetime, timezone

D = os.environ["FAKE_DOCKER_DIR"]


def ns(stamp):
    base, _, frac = stamp.rstrip("Z").partition(".")
    at = datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return int(at.timestamp()) * 10**9 + int(frac.ljust(9, "0"))


def path(name, ext):
    return os.path.join(D, f"{name}.{ext}")


def read(name, ext, default=None):
    try:
        with open(path(name, ext)) as fh:
            return fh.read()
    except FileNotFoundError:
        return default


def write(name, ext, text):
    with open(path(name, ext), "w") as fh:
        fh.write(text)


args = sys.argv[1:]
if args[:2] == ["container", "inspect"]:
    name = args[-1]
    state = read(name, "state")
    if state is None:
        sys.exit(f"Error: No such container: {name}")
    down = int(read(name, "down", "0"))
    if state == "false" and down > 0:
        write(name, "down", str(down - 1))
        if down == 1:
            write(name, "state", "true")
    print(state)
elif args[0] == "logs":
    name, opts = args[-1], args[1:-1]
    with open(path(name, "calls"), "a") as fh:
        fh.write(json.dumps(opts) + "\n")
    since = opts[opts.index("--since") + 1] if "--since" in opts else None
    tail = int(opts[opts.index("--tail") + 1]) if "--tail" in opts else None
    phase = None
    if "--follow" in opts:
        phases = json.loads(read(name, "phases", "[]"))
        phase = phases.pop(0)
        write(name, "phases", json.dumps(phases))
        with open(path(name, "log"), "a") as fh:
            fh.writelines(line + "\n" for line in phase["append"])
    lines = read(name, "log", "").splitlines()
    if since is not None and "T" in since:  # a duration is not simulated: every line is recent
        lines = [line for line in lines if ns(line.split(" ", 1)[0]) >= ns(since)]
    if tail is not None:
        lines = lines[len(lines) - tail:] if tail else []
    for line in lines:
        out = sys.stderr if "stderr" in line else sys.stdout
        out.write(line + "\n")
        out.flush()
    if phase is not None and phase["then"] == "stop":
        write(name, "state", "false")
        write(name, "down", str(phase.get("down", 2)))
    elif phase is not None:
        write(name, "pid", str(os.getpid()))
        while True:
            time.sleep(3600)
else:
    sys.exit(f"fake docker: unexpected {args}")
'''


def fake_node(tmp_path: Path, node: str, containers: dict[str, dict[str, Any]]) -> Path:
    """A folder for one simulated node: bin/docker and the containers' state."""
    home = tmp_path / node
    (home / "bin").mkdir(parents=True)
    docker = home / "bin" / "docker"
    python_stand_in(docker, FAKE_DOCKER)
    for name, c in containers.items():
        if "state" in c:
            (home / f"{name}.state").write_text(c["state"])
        (home / f"{name}.log").write_text("".join(f"{line}\n" for line in c.get("log", [])))
        (home / f"{name}.phases").write_text(json.dumps(c.get("phases", [])))
    return home


def local_bash(tmp_path: Path, fail: dict[str, str] | None = None) -> logs.ArgvFor:
    """ARGV_FOR's stand-in: `bash -s` here with the node's fake docker first on PATH; a node in
    `fail` ends like an ssh that cannot connect (exit 255, that message on stderr)."""
    fail = fail or {}

    @contextmanager
    def argv_for(cfg: StackConfig, node: NodeConfig, key: str | None) -> Iterator[list[str]]:
        if node.name in fail:
            yield ["bash", "-c", f"echo {shlex.quote(fail[node.name])} >&2; exit 255"]
            return
        home = tmp_path / node.name
        yield ["env", f"PATH={home / 'bin'}:{os.environ['PATH']}", f"FAKE_DOCKER_DIR={home}",
               f"TMPDIR={tmp_path}", "bash", "-s"]

    return argv_for


def ts(second: int, nanos: int = 0) -> str:
    return f"2026-01-01T00:00:{second:02d}.{nanos:09d}Z"


def run_logs(tmp_path, targets, opts, *, color=False, stop=None, fail=None):
    out, err = io.StringIO(), io.StringIO()
    printer = logs.Printer("dev", color, out=out, err=err)
    rc = logs.run(stack("ray"), targets, opts, printer, argv_for=local_bash(tmp_path, fail),
                  stop=stop)
    return rc, out.getvalue(), err.getvalue()


def test_two_nodes_merge_in_time_order_and_a_missing_container_is_reported(tmp_path):
    fake_node(tmp_path, "spark-1", {
        SERVE: {"state": "true", "log": [f"{ts(1)} head 1", f"{ts(3)} head 3 stderr",
                                         f"{ts(5)} head 5"]},
        RAY_HEAD: {"state": "false", "log": [f"{ts(2)} ray 2"]}})
    fake_node(tmp_path, "spark-2", {RAY_WORKER: {"state": "true", "log": [
        f"{ts(2, 500)} worker 2.5", f"{ts(4)} worker 4 \x1b[31mred\x1b[0m\x07 [bold]b[/bold]"]}})
    targets = [T("spark-1", SERVE), T("spark-1", RAY_HEAD), T("spark-1", GATEWAY),
               T("spark-2", RAY_WORKER)]
    rc, out, err = run_logs(tmp_path, targets, Options())
    assert rc == 0
    assert out.splitlines() == [
        "2026-01-01T00:00:01.000Z spark-1/serve | head 1",
        "2026-01-01T00:00:02.000Z spark-1/ray-head | ray 2",
        "2026-01-01T00:00:02.000Z spark-2/ray-worker | worker 2.5",
        "2026-01-01T00:00:03.000Z spark-1/serve | head 3 stderr",
        "2026-01-01T00:00:04.000Z spark-2/ray-worker | worker 4 red [bold]b[/bold]",
        "2026-01-01T00:00:05.000Z spark-1/serve | head 5",
    ]
    assert err.splitlines() == [f"spark-1/{GATEWAY}: no such container"]


def test_since_and_tail_reach_docker_and_a_long_line_comes_back_whole(tmp_path):
    long = "x" * (3 * PIECE_BYTES + 17) + " é"
    home = fake_node(tmp_path, "spark-1", {SERVE: {"state": "true", "log": [
        f"{ts(1)} old", f"{ts(2)} {long}", f"{ts(3)} last"]}})
    rc, out, _ = run_logs(tmp_path, [T("spark-1", SERVE)], Options(since="10m", tail=2))
    assert rc == 0
    assert [json.loads(c) for c in (home / f"{SERVE}.calls").read_text().splitlines()] == [
        ["--timestamps", "--since", "10m", "--tail", "2"]]
    assert out.splitlines() == [f"2026-01-01T00:00:02.000Z spark-1/serve | {long}",
                                "2026-01-01T00:00:03.000Z spark-1/serve | last"]


def test_containers_writing_at_once_never_mix_their_lines(tmp_path):
    """Three containers of one node stream at once, lines short and longer than a pipe's
    atomic write: each comes back whole (a frame is one write of at most PIPE_BUF bytes)."""
    def lines(tag: str) -> list[str]:
        return [f"{ts(1 + i // 100, i % 100)} {tag}{i} " + tag * (7000 if i % 3 else 50)
                for i in range(150)]

    names = [SERVE, RAY_HEAD, GATEWAY]
    fake_node(tmp_path, "spark-1", {n: {"state": "true", "log": lines(t)}
                                    for n, t in zip(names, "abc", strict=True)})
    rc, out, _ = run_logs(tmp_path, [T("spark-1", n) for n in names], Options())
    assert rc == 0
    got = out.splitlines()
    for n, t in zip(names, "abc", strict=True):
        short = short_name("dev", n)
        mine = [line.split(" | ", 1)[1] for line in got if f"spark-1/{short} |" in line]
        assert mine == [line.split(" ", 1)[1] for line in lines(t)]
    assert len(got) == 450


def test_follow_across_a_restart_prints_every_line_once(tmp_path):
    """History (--tail 2), then `--follow --since <newest printed>` (the seam history -> follow),
    the container stops, runs again and is followed again with `--since` the newest timestamp
    printed: what Docker shows again at each seam (`--since` is inclusive) is dropped, what it
    logged after prints, and a line --tail left out, in the same second as the newest one,
    never prints. stderr and stdout are stamped apart: the last line written (4.8 s) is not the
    newest (4.9 s)."""
    home = fake_node(tmp_path, "spark-1", {SERVE: {
        "state": "true",
        "log": [f"{ts(2, 50)} left out by tail", f"{ts(2, 100)} h1", f"{ts(2, 200)} h2"],
        "phases": [
            {"append": [f"{ts(3, 500)} run1 a", f"{ts(4, 900)} run1 b",
                        f"{ts(4, 800)} run1 c stderr"], "then": "stop", "down": 3},
            {"append": [f"{ts(7)} run2 a", f"{ts(8)} run2 end"], "then": "block"},
        ]}})
    fake_node(tmp_path, "spark-2", {RAY_WORKER: {"state": "true", "log": [f"{ts(3)} w3"],
                                                 "phases": [{"append": [f"{ts(6)} w6"],
                                                             "then": "block"}]}})
    stop = threading.Event()

    class Stopper(io.StringIO):
        def write(self, s: str) -> int:
            if "run2 end" in s:
                stop.set()
            return super().write(s)

    out, err = Stopper(), io.StringIO()
    printer = logs.Printer("dev", False, out=out, err=err)
    give_up = threading.Timer(30, stop.set)  # a lost last line fails the test, not hangs it
    give_up.start()
    try:
        rc = logs.run(stack("ray"), [T("spark-1", SERVE), T("spark-2", RAY_WORKER)],
                      Options(follow=True, tail=2, poll_seconds=0.01), printer,
                      argv_for=local_bash(tmp_path), stop=stop)
    finally:
        give_up.cancel()
    assert rc == 0
    printed = [line.split(" | ")[1] for line in out.getvalue().splitlines()]
    # the history of both nodes merged exactly, then every line once (lines that arrive within
    # REORDER_SECONDS of each other print in time order, which one burst of a container is)
    assert printed[:3] == ["h1", "h2", "w3"]
    assert sorted(printed) == sorted(["h1", "h2", "w3", "run1 a", "run1 b", "run1 c stderr",
                                      "w6", "run2 a", "run2 end"])
    assert printed.index("run1 c stderr") < printed.index("run1 b")  # 4.8 s before 4.9 s
    assert printed[-1] == "run2 end"
    calls = [json.loads(c) for c in (home / f"{SERVE}.calls").read_text().splitlines()]
    assert calls == [["--timestamps", "--tail", "2"],
                     ["--timestamps", "--follow", "--since", ts(2, 200)],
                     ["--timestamps", "--follow", "--since", ts(4, 900)]]
    assert err.getvalue().splitlines() == [
        f"spark-1/{SERVE}: stopped; waiting for it to run again",
        f"spark-1/{SERVE}: running again"]
    # nothing the node's script started outlives it: both blocked `docker logs -f` are gone
    for node in ("spark-1", "spark-2"):
        name = SERVE if node == "spark-1" else RAY_WORKER
        pid = int((tmp_path / node / f"{name}.pid").read_text())
        assert wait_gone(pid), f"{node}'s docker logs -f (pid {pid}) still runs"
    assert not list(tmp_path.glob("spark-vllm-logs.*")), "the script's temp folder is left"


def wait_gone(pid: int) -> bool:
    """True once `pid` no longer runs (reaped or a zombie of a dead parent's): polled, at most
    5 s, returns as soon as it is gone."""
    for _ in range(500):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.01)
    return False


def test_an_unreachable_node_exits_1_and_the_others_still_print(tmp_path):
    fake_node(tmp_path, "spark-1", {SERVE: {"state": "true", "log": [f"{ts(1)} head"]}})
    why = "ssh: connect to host 10.77.0.12 port 22: No route to host"
    rc, out, err = run_logs(tmp_path, [T("spark-1", SERVE), T("spark-2", RAY_WORKER)],
                            Options(), fail={"spark-2": why})
    assert rc == 1
    assert out.splitlines() == ["2026-01-01T00:00:01.000Z spark-1/serve | head"]
    assert err.splitlines() == [f"spark-2: cannot reach the node (ssh exit 255): {why}"]


def test_a_node_whose_ssh_cannot_start_exits_1(tmp_path):
    fake_node(tmp_path, "spark-1", {SERVE: {"state": "true", "log": [f"{ts(1)} head"]}})
    bash = local_bash(tmp_path)

    @contextmanager
    def argv_for(cfg: StackConfig, node: NodeConfig, key: str | None) -> Iterator[list[str]]:
        with bash(cfg, node, key) as argv:
            yield argv if node.name == "spark-1" else [str(tmp_path / "no-such-ssh")]

    out, err = io.StringIO(), io.StringIO()
    rc = logs.run(stack("ray"), [T("spark-1", SERVE), T("spark-2", RAY_WORKER)], Options(),
                  logs.Printer("dev", False, out=out, err=err), argv_for=argv_for)
    assert rc == 1
    assert out.getvalue().splitlines() == ["2026-01-01T00:00:01.000Z spark-1/serve | head"]
    assert err.getvalue() == f"spark-2: cannot start {tmp_path / 'no-such-ssh'}: No such file or directory\n"


def test_colour_never_passes_a_lines_escapes_or_markup(tmp_path):
    fake_node(tmp_path, "spark-1", {SERVE: {"state": "true", "log": [
        f"{ts(1)} \x1b[31mred\x1b]0;pwned\x07 [bold red]x[/bold red]"]}})
    rc, out, _ = run_logs(tmp_path, [T("spark-1", SERVE)], Options(), color=True)
    assert rc == 0
    assert "\x1b[" in out  # rich's own styles
    assert "\x1b[31m" not in out and "pwned" not in out and "\x07" not in out
    assert "red [bold red]x[/bold red]" in out


# --- the command ----------------------------------------------------------------------------


@pytest.fixture
def stack_dir(tmp_path, monkeypatch):
    """Pulumi.dev.yaml of a two-node ray stack with a service, in a folder the test runs in."""
    raw = {**config_raw(2), "services": [EMBED]}
    (tmp_path / "Pulumi.dev.yaml").write_text(
        yaml.safe_dump({"config": {f"spark-vllm:{k}": v for k, v in raw.items()}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_prints_the_merged_logs(stack_dir, monkeypatch):
    fake_node(stack_dir, "spark-1", {SERVE: {"state": "true", "log": [f"{ts(1)} a", f"{ts(3)} c"]},
                                     RAY_HEAD: {"state": "true", "log": [f"{ts(2)} b"]}})
    fake_node(stack_dir, "spark-2", {RAY_WORKER: {"state": "true", "log": [f"{ts(4)} d"]}})
    monkeypatch.setattr(logs, "ARGV_FOR", local_bash(stack_dir))
    from tools.cli import main

    result = CliRunner().invoke(main, ["logs", "-s", "dev", "tiny-moe", "--tail", "5"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "2026-01-01T00:00:01.000Z spark-1/serve | a", "2026-01-01T00:00:02.000Z spark-1/ray-head | b",
        "2026-01-01T00:00:03.000Z spark-1/serve | c", "2026-01-01T00:00:04.000Z spark-2/ray-worker | d"]


@pytest.mark.parametrize(("args", "message"), [
    (["qwen"], "no model 'qwen' in the stack; its models: tiny-moe, embed"),
    (["--node", "spark-7"], "no node 'spark-7' in the stack; its nodes: spark-1, spark-2"),
    (["--since", "yesterday"], "'yesterday' is not a time Docker accepts"),
    (["--tail", "-3"], "-3 is not in the range x>=0"),
])
def test_cli_usage_problems_exit_2(stack_dir, monkeypatch, args, message):
    def refuse(*_a: Any) -> Any:
        raise AssertionError("no node is contacted on a usage problem")

    monkeypatch.setattr(logs, "ARGV_FOR", refuse)
    from tools.cli import main

    result = CliRunner().invoke(main, ["logs", "-s", "dev", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


def test_cli_a_missing_stack_file_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from tools.cli import main

    result = CliRunner().invoke(main, ["logs", "-s", "nope"])
    assert result.exit_code == 2
    assert "Pulumi.nope.yaml: no such stack file" in result.stderr


def test_the_script_ends_when_its_stdin_closes(tmp_path):
    """What Ctrl-C does to a node: the local side closes the session's stdin, the script ends
    every `docker logs` it started and exits, even when no line flows (no SIGPIPE to help)."""
    home = fake_node(tmp_path, "spark-1", {SERVE: {"state": "true", "log": [f"{ts(1)} a"],
                                                   "phases": [{"append": [], "then": "block"}]}})
    env = {**os.environ, "PATH": f"{home / 'bin'}:{os.environ['PATH']}",
           "FAKE_DOCKER_DIR": str(home), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(["bash", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=env, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(node_script([SERVE], Options(follow=True, poll_seconds=0.01)).encode())
    proc.stdin.flush()
    assert proc.stdout.readline().startswith(b"L " + SERVE.encode() + b" ")
    assert proc.stdout.readline() == f"S {SERVE}\n".encode()
    pid_file = home / f"{SERVE}.pid"
    for _ in range(500):  # the follow call blocks once it wrote its pid
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.01)
    pid = int(pid_file.read_text())
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    assert proc.stdout.read() == b""
    assert wait_gone(pid)
