"""A configured daemon on the head: the pieces the gateway (HAProxy, hostscripts/gateway.py),
Prometheus (hostscripts/monitoring.py) and Alertmanager (hostscripts/alertmanager.py) share.

Each runs in a container of the stack on the head (restart `unless-stopped`), reads its
configuration from a folder of the stack's (`Daemon.dir`) that its container mounts read-only,
and reloads on a signal. The scripts here, parametrised by the daemon:

* `config_write`: the configuration into a new folder `conf.<hash>`, checked by the daemon's own
  image (`check_run`: no network, the stack's labels), then made the one in use (`conf` is a
  link, swapped atomically: `swap_lines`) and the running daemon reloaded (`reload_lines`); a
  check that fails fails the command and leaves the configuration in use as it was;
* `secret_write`: a secret (stdin) into a root-only file, and the running daemon reloaded;
* `config_remove`: the configuration folders;
* `gate_script`: the gate that proves it from the head, each container started first when recon
  found it stopped (`start_lines`); its marker (`gate_words`) holds the containers' IDs and the
  configurations' hashes (`config_digest`), so a new one runs the gate again.

A secret file of the stack is removed by hostscripts.common.stack_path_remove.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hostscripts.common import label_flags, plain, q, secret_file_write


@dataclass(frozen=True)
class Daemon:
    """One configured daemon on the head.

    `name`: the word of its reload line (`<name> reloaded`); `config`: that of its configuration
    (`<config> config <hash>`, and the errors about it); `container`: its container's name;
    `dir`: its folder on the head; `signal`: the signal that reloads it (USR2, HUP); `wait`: shell
    lines run before the signal, with the container's main process in `$pid` (a daemon that
    would lose or die of a signal sent too early: `wait_caught`, `wait_age`)."""

    name: str
    config: str
    container: str
    dir: str
    signal: str
    wait: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for word in (self.name, self.config, self.signal):
            if not re.fullmatch(r"[a-z0-9-]+|[A-Z0-9]+", word):
                raise ValueError(f"not a daemon's word: {word!r}")


def running_test(container: str, *, quiet: bool = True) -> str:
    """The `if` line: the container runs (`quiet`: no error when there is no such container)."""
    err = " 2>/dev/null" if quiet else ""
    return (f"if [ \"$(docker inspect -f '{{{{.State.Running}}}}' {q(container)}{err})\" "
            "= true ]; then")


def wait_caught(daemon: str, signal: str, bit: int, seconds: int = 30) -> tuple[str, ...]:
    """Shell lines: wait until the process `$pid` catches `signal` (its SigCgt bit `bit`,
    counted from 0 for signal 1), at most `seconds`; the script fails after that."""
    return (
        "  i=0",
        "  until [ $(( 0x$(awk '/^SigCgt/ {print $2}' /proc/$pid/status 2>/dev/null || "
        f"echo 0) & {1 << bit:#x} )) -ne 0 ]; do",
        "    i=$((i + 1))",
        f"    [ $i -le {seconds * 2} ] || {{ echo 'the {daemon} does not take its reload signal "
        f"({signal}) after {seconds} s' >&2; exit 1; }}",
        "    sleep 0.5",
        "  done",
    )


def wait_age(seconds: int) -> tuple[str, ...]:
    """Shell lines: wait until the process `$pid` has run `seconds` (a Go program such as
    Prometheus dies of a SIGHUP in its first milliseconds, and catches it from its start, so
    SigCgt cannot tell: hostscripts/monitoring.py daemon)."""
    return (
        "  age=$(ps -o etimes= -p \"$pid\" | tr -d ' ')",
        f"  [ \"${{age:-0}}\" -ge {int(seconds)} ] || sleep $(( {int(seconds)} - ${{age:-0}} ))",
    )


def reload_lines(d: Daemon) -> list[str]:
    """Shell lines: the daemon, if it runs, reloaded: its `wait` lines, then its signal to the
    container's main process.

    The signal goes from the host to the container's main process (`kill`), never through
    `docker kill -s`: Docker records any signal sent by its kill API as a manual stop
    (HasBeenManuallyStopped), and a container so marked is not started again by its
    `unless-stopped` policy when dockerd restarts (seen on the lab: after one reload, a restart
    of the head's dockerd brought Ray and vLLM back and left the gateway down; moby's
    daemon/kill.go sets the flag for every signal while the daemon is not shutting down)."""
    return [
        running_test(d.container),
        f"  pid=$(docker inspect -f '{{{{.State.Pid}}}}' {q(d.container)})",
        *d.wait,
        f'  kill -{d.signal} "$pid"',
        f"  echo '{d.name} reloaded'",
        "fi",
    ]


def secret_write(d: Daemon, path: str, what: str) -> str:
    """On the head: a secret (stdin) into the root-only file `path`, and the running daemon
    reloaded to read it (a new secret takes at once); prints `<what> <the file's sha256>`."""
    return "\n".join([secret_file_write(path, what), *reload_lines(d)])


def files_hash(text: str) -> str:
    """A short content hash of a configuration's text (names the folder it goes in)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_run(labels: Mapping[str, str], volumes: Sequence[str], entrypoint: str, image: str,
              args: str) -> str:
    """`docker run` of the daemon's image as its own check of a configuration: no network, as
    root (to read the root-only files), the labels given (the stack's, and a check's role), the
    `volumes` (shell words: `<host>:<container>:ro`), `entrypoint` with `args` (shell text)."""
    return (f"docker run --rm --network none --user 0 {label_flags(labels)} "
            + "".join(f"-v {v} " for v in volumes)
            + f"--entrypoint {q(entrypoint)} {q(image)} {args}")


def swap_lines(d: Daemon, target: str, new: str) -> list[str]:
    """Shell lines: `conf` made a link to `target` (a shell word: the new folder's name) by an
    atomic rename, and every other `conf.*` (`new`: the new folder's path, a shell word)
    removed."""
    return [
        f"ln -sfn {target} {q(d.dir + '/conf.link')}",
        f"mv -T {q(d.dir + '/conf.link')} {q(d.dir + '/conf')}",
        f"for old in {q(d.dir)}/conf.*; do [ \"$old\" = {new} ] || rm -rf \"$old\"; done",
    ]


def config_write(d: Daemon, files: Iterable[tuple[str, str]], digest: str, check: str,
                 subdir: str | None = None) -> str:
    """On the head: the configuration `files` ((name, text), in order; their names checked by
    the caller) into a new folder `<dir>/conf.<digest>` (with `subdir` made in it), checked by
    `check` (check_run's, mounting it), then made the one in use and the running daemon
    reloaded. Nothing secret is in its text. Prints `<config> config <digest>`."""
    if not re.fullmatch(r"[0-9a-f]{16}", digest):
        raise ValueError(f"not a {d.config} config hash: {digest!r}")
    new = f"{d.dir}/conf.{digest}"
    tmp = new + ".tmp"
    lines = [
        "set -eu",
        "umask 077",
        f"rm -rf {q(new)} {q(tmp)}",
        f"mkdir -p {q(tmp + (f'/{subdir}' if subdir else ''))} {q(d.dir + '/secrets')}",
        f"chmod 700 {q(d.dir)}",
        *(f"printf '%s' {q(text)} > {q(tmp + '/' + path)}" for path, text in files),
        f"mv {q(tmp)} {q(new)}",
        check,
        *swap_lines(d, q("conf." + digest), q(new)),
        *reload_lines(d),
        f"echo '{d.config} config {digest}'",
    ]
    return "\n".join(lines)


def config_remove(d: Daemon, stack_dir: str, *, secrets: bool = True,
                  scratch: Sequence[str] = ()) -> str:
    """The daemon's configuration folders (`conf`, `conf.*`, and `<scratch>.*`), then its
    `secrets` folder (its files go with their own commands), its folder and the stack's, as far
    as they are empty."""
    if d.dir.rsplit("/", 1)[0] != stack_dir:
        raise ValueError(f"{d.dir} is not a folder of the stack's {stack_dir}")
    globs = " ".join(f"{q(d.dir)}/{g}.*" for g in ("conf", *scratch))
    folders = [*([d.dir + "/secrets"] if secrets else []), d.dir, stack_dir]
    return (f"rm -rf {q(d.dir + '/conf')} {globs}; "
            f"rmdir {' '.join(q(f) for f in folders)} 2>/dev/null || true")


def config_digest(stdout: str, what: str) -> str:
    """The hash config_write printed (its last word), checked: 16 hex."""
    digest = (stdout or "").strip().rsplit(" ", 1)[-1]
    if not re.fullmatch(r"[0-9a-f]{16}", digest):
        raise ValueError(f"not a {what} config hash: {digest!r}")
    return digest


def start_lines(container: str, said: str | None = None) -> list[str]:
    """Shell lines: the container started when it does not run (recon found it stopped by hand:
    Docker's restart policy keeps a manual stop); with `said`, saying which it was."""
    c = q(container)
    lines = [f"if [ \"$(docker inspect -f '{{{{.State.Running}}}}' {c})\" != true ]; then",
             f"  docker start {c} >/dev/null"]
    if said is not None:
        said = " ".join(plain(w) for w in said.split(" "))  # in a quoted echo: plain words
        lines += [f"  echo '{said} started'", "else", f"  echo '{said} running'"]
    return [*lines, "fi"]


def gate_script(what: str, marker: str, containers: Sequence[str], check: str) -> str:
    """On the head: the gate, `check` (a shell line), after each of the `containers` started
    when it does not run. `marker` is a comment line of its text, so a new container or
    configuration (a new marker) runs it again; every word of it plain."""
    # a comment line: quoting does not protect it from a newline, so every word plain
    for word in marker.split(" "):
        plain(word)
    return "\n".join([
        "set -eu",
        f"# {plain(what)}: {q(marker)}",
        *(line for c in containers for line in start_lines(c)),
        check,
    ])
