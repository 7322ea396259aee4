"""The toolchain `make setup` installed is Pulumi's own, at the pinned versions, and works.

- `pulumi version`, `pulumi plugin ls`, `pulumi-language-python -version` and each plugin's own
  answer to GetPluginInfo show the pinned versions; status.json says where each came from.
- The release route installs a bundle of archives laid out like Pulumi's releases (made here
  from the installed binaries: no release is reachable) offline, and refuses a bundle whose
  SHA256SUMS do not match, installing nothing; the source route refuses a tarball whose digest
  is not the pinned one, installing nothing.
- An inline Automation API program (dynamic provider, then the command plugin) is previewed,
  updated, re-previewed with expect-no-changes and destroyed on a file backend.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
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


ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN_SH = ROOT / "scripts" / "toolchain.sh"
PINS = {"cli": "3.274.1", "command": "1.2.1", "docker": "5.1.0"}
LANG_HOST = {"3.274.1", "3.259.0"}  # shipped in the CLI release archive | built from source
COMMITS = {"command": "7f3eb6f3b77cd0fa3895ba437a695dd393f7dd25",
           "docker": "e944612c4c970123d9a16a48c40d37dc84c89a70"}


def _plugin_info(path: Path) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "plugin_info.py"), str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_installed_binaries_are_pulumis_own_at_the_pinned_versions(pulumi_bin, engine_env):
    env = {**os.environ, **engine_env}
    assert subprocess.run([str(pulumi_bin), "version"], capture_output=True, text=True,
                          env=env).stdout.strip() == f"v{PINS['cli']}"
    host = pulumi_bin.parent / "pulumi-language-python"
    version = subprocess.run([str(host), "-version"], capture_output=True, text=True).stdout.strip()
    assert version.lstrip("v") in LANG_HOST, version
    assert (pulumi_bin.parent / "pulumi-language-python-exec").is_file()
    listed = json.loads(subprocess.run([str(pulumi_bin), "plugin", "ls", "--json"], env=env,
                                       capture_output=True, text=True, check=True).stdout)
    resources = {(p["name"], p["version"]) for p in listed if p["kind"] == "resource"}
    assert {("command", PINS["command"]), ("docker", PINS["docker"])} <= resources, resources
    home = Path(engine_env["PULUMI_HOME"])
    for name in ("command", "docker"):
        binary = home / "plugins" / f"resource-{name}-v{PINS[name]}" / f"pulumi-resource-{name}"
        assert _plugin_info(binary) == PINS[name], f"{name} reports another version"

    status = json.loads((pulumi_bin.parent.parent / "status.json").read_text())
    routes = {"installed", "release", "release-bundle", "source"}
    assert status["cli"]["version"] == PINS["cli"] and status["cli"]["route"] in routes
    assert status["languageHost"]["version"] in LANG_HOST
    for name in ("command", "docker"):
        entry = status["plugins"][name]
        assert entry["version"] == PINS[name] and entry["route"] in routes, entry
        if entry["route"] != "installed":
            assert entry["commit"] == COMMITS[name], entry
    assert not (ROOT / "lab" / "providers").exists(), "stand-in plugins are back in the tree"


# --------------------------------------------------------------------------- install routes


def _tar(path: Path, members: dict[str, Path]) -> None:
    with tarfile.open(path, "w:gz") as t:
        for arcname, src in members.items():
            t.add(src, arcname=arcname)


@pytest.fixture(scope="module")
def release_bundle(tmp_path_factory, pulumi_bin) -> Path:
    """A bundle laid out like `make toolchain-bundle` writes it, from the installed binaries:
    Pulumi's archive names and layouts (pulumi/<binaries>; the plugin binary at the root)."""
    bundle = tmp_path_factory.mktemp("bundle")
    bin_ = pulumi_bin.parent
    home = Path(os.environ.get("PULUMI_HOME", Path.home() / ".pulumi"))
    _tar(bundle / f"pulumi-v{PINS['cli']}-linux-x64.tar.gz", {
        f"pulumi/{n}": bin_ / n for n in ("pulumi", "pulumi-language-python",
                                          "pulumi-language-python-exec",
                                          "pulumi-resource-pulumi-python")})
    for name in ("command", "docker"):
        plugin = home / "plugins" / f"resource-{name}-v{PINS[name]}" / f"pulumi-resource-{name}"
        _tar(bundle / f"pulumi-resource-{name}-v{PINS[name]}-linux-amd64.tar.gz",
             {f"pulumi-resource-{name}": plugin})
    sums = subprocess.run("sha256sum pulumi-*.tar.gz", shell=True, cwd=bundle,
                          capture_output=True, text=True, check=True).stdout
    (bundle / "SHA256SUMS").write_text(sums)
    return bundle


def _fresh_setup(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    """scripts/toolchain.sh into an empty cache and PULUMI_HOME, offline, with only the
    system's tools on PATH (no installed `pulumi` to take the first route)."""
    env = {
        "HOME": str(tmp_path / "home"),
        "PATH": "/usr/local/go/bin:/usr/local/bin:/usr/bin:/bin",
        "SPARK_VLLM_CACHE": str(tmp_path / "cache"),
        "PULUMI_HOME": str(tmp_path / "pulumi-home"),
        "VENV": str(Path(sys.executable).parent.parent),
        "TOOLCHAIN_OFFLINE": "1",
        **extra,
    }
    return subprocess.run([str(TOOLCHAIN_SH), "all"], env=env, capture_output=True, text=True,
                          timeout=900)


def _installed(tmp_path: Path) -> list[str]:
    found = []
    bin_ = tmp_path / "cache" / "toolchain" / "bin"
    found += [p.name for p in bin_.iterdir()] if bin_.exists() else []
    plugins = tmp_path / "pulumi-home" / "plugins"
    found += [p.name for p in plugins.iterdir()] if plugins.exists() else []
    return found


def test_release_bundle_installs_offline(tmp_path, release_bundle):
    done = _fresh_setup(tmp_path, TOOLCHAIN_BUNDLE=str(release_bundle))
    assert done.returncode == 0, done.stderr[-3000:]
    status = json.loads((tmp_path / "cache" / "toolchain" / "status.json").read_text())
    assert status["cli"]["route"] == "release-bundle"
    assert status["languageHost"]["route"] == "release-bundle"
    assert {n: e["route"] for n, e in status["plugins"].items()} == {
        "command": "release-bundle", "docker": "release-bundle"}
    env = {**os.environ, "PULUMI_HOME": str(tmp_path / "pulumi-home")}
    listed = subprocess.run([str(tmp_path / "cache" / "toolchain" / "bin" / "pulumi"), "plugin",
                             "ls", "--json"], env=env, capture_output=True, text=True, check=True)
    assert {(p["name"], p["version"]) for p in json.loads(listed.stdout)} >= {
        ("command", PINS["command"]), ("docker", PINS["docker"])}
    again = _fresh_setup(tmp_path, TOOLCHAIN_BUNDLE=str(release_bundle))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "started" not in again.stderr, "a warm run must not install anything again"
    assert again.stderr.count("ready") == 4, again.stderr


def test_corrupt_release_bundle_is_refused_and_nothing_is_installed(tmp_path, release_bundle):
    bad = tmp_path / "bad-bundle"
    shutil.copytree(release_bundle, bad)
    archive = bad / f"pulumi-resource-docker-v{PINS['docker']}-linux-amd64.tar.gz"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    done = _fresh_setup(tmp_path, TOOLCHAIN_BUNDLE=str(bad))
    assert done.returncode == 1
    assert "FAILED: release bundle" in done.stderr and "SHA256SUMS" in done.stderr, done.stderr
    assert _installed(tmp_path) == [], _installed(tmp_path)


def test_source_tarball_with_another_digest_is_refused(tmp_path, release_bundle):
    """A source bundle whose own SHA256SUMS agree with a changed tarball: the digest pinned in
    the script refuses it before anything is built."""
    sources = tmp_path / "sources"
    sources.mkdir()
    tarball = sources / f"pulumi-resource-command-{PINS['command']}-src.tar.gz"
    _tar(tarball, {"provider/go.mod": TOOLCHAIN_SH})
    digest = subprocess.run(["sha256sum", tarball.name], cwd=sources, capture_output=True,
                            text=True, check=True).stdout
    (sources / "SHA256SUMS").write_text(digest)
    only_cli = tmp_path / "only-cli"
    only_cli.mkdir()
    cli = f"pulumi-v{PINS['cli']}-linux-x64.tar.gz"
    shutil.copy(release_bundle / cli, only_cli / cli)
    (only_cli / "SHA256SUMS").write_text(
        next(ln for ln in (release_bundle / "SHA256SUMS").read_text().splitlines() if cli in ln) + "\n")
    done = _fresh_setup(tmp_path, TOOLCHAIN_BUNDLE=str(only_cli), TOOLCHAIN_SOURCES=str(sources))
    assert done.returncode == 1
    assert "FAILED: source bundle" in done.stderr and "expected 9ee4036a" in done.stderr, done.stderr
    assert not any(p.startswith("resource-command") for p in _installed(tmp_path))
