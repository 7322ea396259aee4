"""The toolchain works end to end: CLI + engine + file backend + secrets + a resource plugin.

An inline Automation API program (the language runtime runs in this process) is previewed,
updated, re-previewed with expect-no-changes, and destroyed on a file backend in a temp folder.
The resource is a dynamic-provider resource so the plugin protocol is exercised with plugins
that are always present; the command-provider variant runs when that plugin is installed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pulumi
import pulumi.automation as auto
import pulumi.dynamic as dyn
import pytest

pytestmark = pytest.mark.engine


class _FileProvider(dyn.ResourceProvider):
    """Writes `content` to `path`; a change of content is an in-place update."""

    def create(self, props):
        Path(props["path"]).write_text(props["content"])
        return dyn.CreateResult(id_=props["path"], outs=dict(props))

    def diff(self, _id, olds, news):
        return dyn.DiffResult(changes=olds.get("content") != news.get("content"))

    def update(self, _id, _olds, news):
        Path(news["path"]).write_text(news["content"])
        return dyn.UpdateResult(outs=dict(news))

    def delete(self, _id, props):
        Path(props["path"]).unlink(missing_ok=True)


class _File(dyn.Resource):
    def __init__(self, name, path, content, opts=None):
        super().__init__(_FileProvider(), name, {"path": path, "content": content}, opts)


def _stack(engine_env, tmp_path, program, name="smoke"):
    settings = auto.ProjectSettings(
        name="spark-vllm-smoke",
        runtime="python",
        backend=auto.ProjectBackend(url=engine_env["PULUMI_BACKEND_URL"]),
    )
    return auto.create_or_select_stack(
        stack_name=name,
        project_name="spark-vllm-smoke",
        program=program,
        opts=auto.LocalWorkspaceOptions(
            work_dir=str(tmp_path),
            project_settings=settings,
            env_vars=engine_env,
            secrets_provider="passphrase",
        ),
    )


def test_preview_up_noop_destroy_on_file_backend(engine_env, tmp_path):
    target = tmp_path / "out.txt"

    def program():
        f = _File("marker", str(target), "hello")
        pulumi.export("content", f.content if hasattr(f, "content") else "hello")
        pulumi.export("token", pulumi.Config().require_secret("token"))

    stack = _stack(engine_env, tmp_path, program)
    stack.set_config("token", auto.ConfigValue("s3cr3t-value-for-smoke", secret=True))

    preview = stack.preview()
    assert preview.change_summary.get("create", 0) >= 2  # the stack + the resource
    assert not target.exists(), "preview must not change anything"

    up = stack.up()
    assert up.summary.result == "succeeded"
    assert target.read_text() == "hello"
    assert up.outputs["token"].secret is True

    # The raw files of the file backend (export_stack() would decrypt): ciphertext only.
    backend = Path(engine_env["PULUMI_BACKEND_URL"].removeprefix("file://"))
    stored = [p for p in backend.rglob("*") if p.is_file()]
    assert any(p.name.startswith("smoke.json") for p in stored), stored
    leaked = [p for p in stored if b"s3cr3t-value-for-smoke" in p.read_bytes()]
    assert not leaked, f"a secret reached the backend in plaintext: {leaked}"

    again = stack.preview(expect_no_changes=True)
    assert again.change_summary.get("same", 0) >= 2

    stack.destroy()
    assert not target.exists()
    stack.workspace.remove_stack("smoke")


def test_command_provider_local_command(engine_env, tmp_path, require_plugin):
    import importlib.resources as r

    meta = json.loads((r.files("pulumi_command") / "pulumi-plugin.json").read_text())
    require_plugin("command", meta["version"])
    from pulumi_command import local

    def program():
        cmd = local.Command("echo", create="echo spark-vllm-smoke")
        pulumi.export("stdout", cmd.stdout)

    stack = _stack(engine_env, tmp_path, program, name="smoke-command")
    up = stack.up()
    assert up.outputs["stdout"].value == "spark-vllm-smoke"
    stack.destroy()


def test_status_lists_plugin_folders_not_the_cli_marker_files(tmp_path):
    """status.json names each installed plugin with its version; the CLI's .lock/.lastused
    files next to a plugin folder, and a half-installed (.partial) plugin, are not plugins."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    home = tmp_path / "pulumi-home"
    plugins = home / "plugins"
    (plugins / "resource-command-v1.2.1").mkdir(parents=True)
    for marker in (".lastused", ".lock"):
        (plugins / f"resource-command-v1.2.1{marker}").write_text("")
    (plugins / "resource-docker-v5.1.0").mkdir()
    (plugins / "resource-docker-v5.1.0.partial").write_text("")
    cache = tmp_path / "cache"
    (cache / "toolchain").mkdir(parents=True)
    env = {**os.environ, "PULUMI_HOME": str(home), "SPARK_VLLM_CACHE": str(cache)}
    r = subprocess.run([str(root / "scripts" / "toolchain.sh"), "status"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    status = json.loads((cache / "toolchain" / "status.json").read_text())
    assert status["plugins"] == {"command": "1.2.1"}
