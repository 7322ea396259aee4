"""The LAB STAND-IN command plugin (lab/providers/command) behaves as pulumi-command 1.2.1
for what spark-vllm uses, driven through the real engine.

Each test gets its own PULUMI_HOME in tmp_path with the stand-in installed as resource plugin
command 1.2.1 (`pulumi plugin install ... --file`), a file backend in tmp_path, and runs an
INLINE Automation API program (the Python runtime runs in this process). Ambient plugins are
ignored so nothing on PATH can stand in for the binary under test. The remote tests start a
private sshd on 127.0.0.1 with its own host keys and an authorized test key.
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pulumi
import pulumi.automation as auto
import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "lab" / "providers" / "command"
SDK_VERSION = json.loads(
    (Path(importlib.util.find_spec("pulumi_command").origin).parent / "pulumi-plugin.json").read_text()
)["version"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def plugin_binary() -> Path:
    """The stand-in binary: LAB_COMMAND_PLUGIN, or build.sh's output (seconds when up to date)."""
    given = os.environ.get("LAB_COMMAND_PLUGIN")
    if given:
        return Path(given)
    if shutil.which("go") is None:
        pytest.skip("go is not installed: the lab command plugin cannot be built")
    done = subprocess.run(
        [str(PLUGIN_DIR / "build.sh")], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"lab/providers/command/build.sh failed:\n{done.stderr[-4000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def lab_env(engine_env: dict[str, str], tmp_path: Path, pulumi_bin: Path, plugin_binary: Path):
    """engine_env with a private PULUMI_HOME holding the stand-in as command SDK_VERSION."""
    env = dict(engine_env)
    env["PULUMI_HOME"] = str(tmp_path / "pulumi-home")
    env["PULUMI_IGNORE_AMBIENT_PLUGINS"] = "true"
    env["LAB_PULUMI_ROOT"] = str(pulumi_bin.parent.parent)  # PulumiCommand(root) runs root/bin/pulumi
    subprocess.run(
        [str(pulumi_bin), "plugin", "install", "resource", "command", SDK_VERSION, "--file", str(plugin_binary)],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        timeout=120,
    )
    installed = Path(env["PULUMI_HOME"]) / "plugins" / f"resource-command-v{SDK_VERSION}" / "pulumi-resource-command"
    assert installed.exists(), "plugin install did not place the binary where the engine looks"
    return env


def _stack(env: dict[str, str], work: Path, program, name: str) -> auto.Stack:
    work.mkdir(parents=True, exist_ok=True)
    settings = auto.ProjectSettings(
        name="lab-command", runtime="python", backend=auto.ProjectBackend(url=env["PULUMI_BACKEND_URL"])
    )
    return auto.create_or_select_stack(
        stack_name=name,
        project_name="lab-command",
        program=program,
        opts=auto.LocalWorkspaceOptions(
            work_dir=str(work),
            project_settings=settings,
            env_vars=env,
            secrets_provider="passphrase",
            pulumi_command=auto.PulumiCommand(root=env["LAB_PULUMI_ROOT"]),
        ),
    )


def _raw_state(env: dict[str, str]) -> str:
    """Every file the file backend wrote (checkpoints, history, backups), as stored on disk.
    (Stack.export_stack() passes --show-secrets, so it cannot show what is stored.)"""
    root = Path(env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# --------------------------------------------------------------------------- schema


def test_schema_covers_every_name_the_sdk_uses(lab_env, pulumi_bin, plugin_binary, tmp_path):
    """`pulumi package get-schema` on the binary vs. the names parsed from the SDK source."""
    out = subprocess.run(
        [str(pulumi_bin), "package", "get-schema", str(plugin_binary)],
        env={**os.environ, **lab_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    schema = json.loads(out.stdout)
    assert schema["name"] == "command"
    assert schema.get("version", SDK_VERSION).lstrip("v") == SDK_VERSION, "the version ldflag is not 1.2.1"

    spec = importlib.util.spec_from_file_location("sdk_contract", PLUGIN_DIR / "testdata" / "sdk_contract.py")
    contract_mod = importlib.util.module_from_spec(spec)
    sys.modules["sdk_contract"] = contract_mod
    spec.loader.exec_module(contract_mod)
    sdk = Path(importlib.util.find_spec("pulumi_command").origin).parent
    contract = contract_mod.sdk_contract(sdk)
    assert {"command:local:Command", "command:remote:Command"} <= set(contract["resources"])
    assert contract_mod.compare(contract, schema) == []


# --------------------------------------------------------------------------- local.Command


def test_local_command_lifecycle(lab_env, tmp_path):
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

    stack = _stack(lab_env, tmp_path / "work", program, "local")

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


def test_local_stdin_secret_is_delivered_and_not_in_state(lab_env, tmp_path):
    from pulumi_command import local

    received = tmp_path / "stdin.out"
    secret = "s3cr3t-stdin-for-lab-plugin"

    def program():
        local.Command("stdin", create=f"cat > {received}", stdin=pulumi.Output.secret(secret))

    stack = _stack(lab_env, tmp_path / "work", program, "stdin")
    stack.up()
    assert received.read_text() == secret
    state = _raw_state(lab_env)
    assert "ciphertext" in state and "stdin" in state
    assert secret not in state, "a secret stdin reached the state in plaintext"
    stack.destroy()


def test_local_failure_reports_stderr_tail(lab_env, tmp_path):
    from pulumi_command import local

    def program():
        local.Command("fails", create="echo first >&2; echo the-real-reason >&2; exit 7")

    stack = _stack(lab_env, tmp_path / "work", program, "fails")
    with pytest.raises(auto.CommandError) as err:
        stack.up()
    msg = str(err.value)
    assert "create command failed" in msg and "exit status 7" in msg and "the-real-reason" in msg


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


@pytest.mark.parametrize("pinned", ["host_ed25519", "host_rsa"])
def test_remote_command_with_pinned_host_key(lab_env, tmp_path, sshd, pinned):
    """Pinned host key (of either type the server has) -> runs; environment through the
    session (refused names warned about, never put on the command line); stdin; delete."""
    from pulumi_command import remote

    marker = tmp_path / "remote-delete.log"

    def program():
        cmd = remote.Command(
            "remote",
            connection=_connection(sshd, sshd[pinned]),
            create='printf "%s|%s|%s" "$LAB_GREETING" "${NOT_ACCEPTED:-unset}" "$(cat)"',
            delete=f'echo "delete prev=$PULUMI_COMMAND_STDOUT" >> {marker}',
            environment={"LAB_GREETING": "hello-over-ssh", "NOT_ACCEPTED": "must-not-leak"},
            stdin="from-stdin",
        )
        pulumi.export("stdout", cmd.stdout)

    stack = _stack(lab_env, tmp_path / "work", program, "remote")
    up = stack.up()
    assert up.outputs["stdout"].value == "hello-over-ssh|unset|from-stdin"
    assert "NOT_ACCEPTED" in up.stdout, "a refused environment variable must be reported"
    assert "must-not-leak" not in sshd["log"].read_text()
    state = _raw_state(lab_env)
    assert "ciphertext" in state and "connection" in state
    assert "OPENSSH PRIVATE KEY" not in state, "the private key reached the state in plaintext"
    stack.preview(expect_no_changes=True)
    stack.destroy()
    assert _lines(marker) == ["delete prev=hello-over-ssh|unset|from-stdin"]


def test_remote_command_wrong_host_key_fails(lab_env, tmp_path, sshd):
    from pulumi_command import remote

    ran = tmp_path / "must-not-exist"

    def program():
        remote.Command("wrong-key", connection=_connection(sshd, sshd["unrelated"]), create=f"touch {ran}")

    stack = _stack(lab_env, tmp_path / "work", program, "wrongkey")
    started = time.monotonic()
    with pytest.raises(auto.CommandError) as err:
        stack.up()
    msg = str(err.value)
    assert "host key mismatch" in msg and "SHA256:" in msg, msg[-3000:]
    assert not ran.exists()
    assert time.monotonic() - started < 60, "a host key mismatch must not be retried"
