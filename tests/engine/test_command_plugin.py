"""Pulumi's own command plugin (pulumi-resource-command 1.2.1, as `make setup` installed it) does
what the program relies on, driven through the real engine.

Each test runs an inline Automation API program on a file backend in tmp_path against the
plugin in the ambient PULUMI_HOME (nothing else is installed or built here). The remote tests
start a private sshd on 127.0.0.1 with its own host keys and an authorized test key.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pulumi
import pulumi.automation as auto
import pytest

pytestmark = pytest.mark.engine


@pytest.fixture
def cmd_env(engine_env: dict[str, str], require_plugin) -> dict[str, str]:
    require_plugin("command", "1.2.1")
    return engine_env


def _stack(env: dict[str, str], work: Path, program, name: str) -> auto.Stack:
    work.mkdir(parents=True, exist_ok=True)
    settings = auto.ProjectSettings(
        name="cmd-plugin", runtime="python", backend=auto.ProjectBackend(url=env["PULUMI_BACKEND_URL"])
    )
    return auto.create_or_select_stack(
        stack_name=name,
        project_name="cmd-plugin",
        program=program,
        opts=auto.LocalWorkspaceOptions(
            work_dir=str(work),
            project_settings=settings,
            env_vars=env,
            secrets_provider="passphrase",
        ),
    )


def _raw_state(env: dict[str, str]) -> str:
    """Every file the file backend wrote (checkpoints, history, backups), as stored on disk.
    (Stack.export_stack() passes --show-secrets, so it cannot show what is stored.)"""
    root = Path(env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --------------------------------------------------------------------------- local.Command


def test_local_command_lifecycle(cmd_env, tmp_path):
    """preview runs nothing; create/stdout; update path with PULUMI_COMMAND_STDOUT; no perpetual
    diff; triggers replace (delete and create both run); delete runs on destroy."""
    from pulumi_command import local

    marker = tmp_path / "marker.log"
    spec = {"create": f"echo create >> {marker}; echo hello", "triggers": ["t1"]}

    def program():
        cmd = local.Command(
            "lifecycle",
            create=spec["create"],
            update=f'echo "update prev=$PULUMI_COMMAND_STDOUT" >> {marker}; echo updated',
            delete=f'echo "delete prev=$PULUMI_COMMAND_STDOUT" >> {marker}',
            triggers=spec["triggers"],
            environment={"LAB_GREETING": "hi"},
        )
        pulumi.export("stdout", cmd.stdout)

    stack = _stack(cmd_env, tmp_path / "work", program, "local")

    preview = stack.preview()
    assert preview.change_summary.get("create") == 2  # stack + command
    assert not marker.exists(), "a preview ran the command"

    up = stack.up()
    assert up.summary.result == "succeeded"
    assert up.outputs["stdout"].value == "hello"
    assert _lines(marker) == ["create"]

    stack.preview(expect_no_changes=True)  # raises if anything would change

    spec["create"] = f"echo create-v2 >> {marker}; echo hello2"
    up = stack.up()
    assert up.summary.resource_changes.get("update") == 1
    assert up.outputs["stdout"].value == "updated", "an input change must run `update`"
    assert _lines(marker)[-1] == "update prev=hello", "update must see the previous stdout"
    stack.preview(expect_no_changes=True)

    spec["triggers"] = ["t2"]
    up = stack.up()
    assert up.summary.resource_changes.get("replace") == 1
    tail = _lines(marker)[-2:]
    assert sorted(tail) == ["create-v2", "delete prev=updated"], tail
    assert up.outputs["stdout"].value == "hello2"
    stack.preview(expect_no_changes=True)

    stack.destroy()
    assert _lines(marker)[-1] == "delete prev=hello2"
    stack.workspace.remove_stack("local")


def test_local_stdin_secret_is_delivered_and_not_in_state(cmd_env, tmp_path):
    from pulumi_command import local

    received = tmp_path / "stdin.out"
    secret = "s3cr3t-stdin-for-the-plugin"

    def program():
        local.Command("stdin", create=f"cat > {received}", stdin=pulumi.Output.secret(secret))

    stack = _stack(cmd_env, tmp_path / "work", program, "stdin")
    stack.up()
    assert received.read_text() == secret
    state = _raw_state(cmd_env)
    assert "ciphertext" in state and "stdin" in state
    assert secret not in state, "a secret stdin reached the state in plaintext"
    stack.destroy()


def test_local_failure_reports_stderr_tail(cmd_env, tmp_path):
    from pulumi_command import local

    def program():
        local.Command("fails", create="echo first >&2; echo the-real-reason >&2; exit 7")

    stack = _stack(cmd_env, tmp_path / "work", program, "fails")
    with pytest.raises(auto.CommandError) as err:
        stack.up()
    msg = str(err.value)
    # pulumi-command 1.2.1's form: "exit status N: running <command>:" then the output
    assert "exit status 7: running" in msg and "the-real-reason" in msg, msg


# --------------------------------------------------------------------------- remote.Command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path: Path):
    """A private sshd on 127.0.0.1:<free port>: its own ed25519 + rsa host keys, one authorized
    key, AcceptEnv LAB_* and PULUMI_COMMAND_* only."""
    binary = Path("/usr/sbin/sshd")
    if not binary.exists() or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (apt-get install openssh-server)")
    d = tmp_path / "sshd"
    d.mkdir()

    def keygen(name: str, kind: str) -> tuple[str, str]:
        path = d / name
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", name, "-f", str(path)], check=True)
        return path.read_text(), (d / f"{name}.pub").read_text().strip()

    _, host_ed25519 = keygen("host_ed25519", "ed25519")
    _, host_rsa = keygen("host_rsa", "rsa")
    client_key, client_pub = keygen("client", "ed25519")
    _, unrelated_pub = keygen("unrelated", "ed25519")
    (d / "authorized_keys").write_text(client_pub + "\n")
    port = _free_port()
    cfg = d / "sshd_config"
    cfg.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {d / 'host_ed25519'}",
                f"HostKey {d / 'host_rsa'}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "UsePAM no",
                "AcceptEnv LAB_* PULUMI_COMMAND_*",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen([str(binary), "-D", "-e", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"sshd did not start:\n{(d / 'sshd.log').read_text()[-2000:]}")
        time.sleep(0.1)
    try:
        yield {
            "port": port,
            "user": getpass.getuser(),
            "key": client_key,
            "host_ed25519": host_ed25519,
            "host_rsa": host_rsa,
            "unrelated": unrelated_pub,
            "log": d / "sshd.log",
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _connection(sshd, host_key: str | None):
    from pulumi_command import remote

    return remote.ConnectionArgs(
        host="127.0.0.1",
        port=sshd["port"],
        user=sshd["user"],
        private_key=pulumi.Output.secret(sshd["key"]),
        host_key=host_key,
        dial_error_limit=2,
        per_dial_timeout=5,
    )


@pytest.mark.parametrize("pinned", ["host_ed25519"])
def test_remote_command_with_pinned_host_key(cmd_env, tmp_path, sshd, pinned):
    """Pinned host key (of either type the server has) -> runs; environment through the
    session (never on the command line); stdin; delete sees the previous stdout."""
    from pulumi_command import remote

    marker = tmp_path / "remote-delete.log"

    def program():
        cmd = remote.Command(
            "remote",
            connection=_connection(sshd, sshd[pinned]),
            create='printf "%s|%s" "$LAB_GREETING" "$(cat)"',
            delete=f'echo "delete prev=$PULUMI_COMMAND_STDOUT" >> {marker}',
            environment={"LAB_GREETING": "hello-over-ssh"},
            stdin="from-stdin",
        )
        pulumi.export("stdout", cmd.stdout)

    stack = _stack(cmd_env, tmp_path / "work", program, "remote")
    up = stack.up()
    assert up.outputs["stdout"].value == "hello-over-ssh|from-stdin"
    state = _raw_state(cmd_env)
    assert "ciphertext" in state and "connection" in state
    assert "OPENSSH PRIVATE KEY" not in state, "the private key reached the state in plaintext"
    stack.preview(expect_no_changes=True)
    stack.destroy()
    assert _lines(marker) == ["delete prev=hello-over-ssh|from-stdin"]


def test_remote_command_fails_when_sshd_refuses_an_environment_variable(cmd_env, tmp_path, sshd):
    """pulumi-command 1.2.1 fails the command (it does not warn and go on) when the server's
    AcceptEnv does not list a variable: the program must never pass `environment` to a remote
    command (tests/unit/components/test_graph.py checks that it does not)."""
    from pulumi_command import remote

    ran = tmp_path / "must-not-exist"

    def program():
        remote.Command("refused", connection=_connection(sshd, sshd["host_ed25519"]),
                       create=f"touch {ran}", environment={"NOT_ACCEPTED": "must-not-leak"})

    stack = _stack(cmd_env, tmp_path / "work", program, "refused")
    with pytest.raises(auto.CommandError) as err:
        stack.up()
    assert 'could not set environment variable "NOT_ACCEPTED"' in str(err.value), str(err.value)
    assert not ran.exists()
    assert "must-not-leak" not in sshd["log"].read_text()


def test_remote_command_cannot_verify_a_pinned_rsa_host_key(cmd_env, tmp_path, sshd):
    """pulumi-command 1.2.1 offers only the SHA-1 `ssh-rsa` algorithm for a pinned RSA key,
    which OpenSSH >= 8.8 refuses: the config refuses ssh-rsa host keys for this reason
    (config/models.py, tests/unit/config/test_config.py)."""
    from pulumi_command import remote

    def program():
        remote.Command("rsa", connection=_connection(sshd, sshd["host_rsa"]), create="true")

    stack = _stack(cmd_env, tmp_path / "work", program, "rsa")
    with pytest.raises(auto.CommandError) as err:
        stack.up()
    assert "no common algorithm for host key; we offered: [ssh-rsa]" in str(err.value)


def test_remote_command_wrong_host_key_fails(cmd_env, tmp_path, sshd):
    from pulumi_command import remote

    ran = tmp_path / "must-not-exist"

    def program():
        remote.Command("wrong-key", connection=_connection(sshd, sshd["unrelated"]), create=f"touch {ran}")

    stack = _stack(cmd_env, tmp_path / "work", program, "wrongkey")
    started = time.monotonic()
    with pytest.raises(auto.CommandError) as err:
        stack.up()
    msg = str(err.value)
    assert "ssh: host key mismatch" in msg, msg[-3000:]
    assert not ran.exists()
    assert time.monotonic() - started < 60, "a host key mismatch must not be retried"
