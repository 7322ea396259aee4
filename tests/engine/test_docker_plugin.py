"""Pulumi's own docker plugin (pulumi-resource-docker 5.1.0, as `make setup` installed it)
against a real Docker daemon: what the program relies on.

An inline Automation API program on a file backend drives the plugin in the ambient
PULUMI_HOME: up creates an image reference and a container that `docker ps` shows; a second
preview with expect_no_changes passes (no perpetual diff); changing an env var replaces the
container; destroy removes it and keeps the image (keep_locally).

Needs: a dockerd on SVL_PROVTEST_DOCKER_HOST (default unix:///run/svl-provtest/docker.sock,
started here as root when absent, with no bridge and no iptables so it cannot clash with the
lab's daemons) and the local image svl-provtest:1 (made here from busybox: no registry is
reachable). A missing piece skips with the reason.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import subprocess
import uuid
from pathlib import Path

import pulumi
import pulumi.automation as auto
import pytest

pytestmark = pytest.mark.engine

SDK_VERSION = json.loads(
    (importlib.resources.files("pulumi_docker") / "pulumi-plugin.json").read_text()
)["version"]
DEFAULT_HOST = "unix:///run/svl-provtest/docker.sock"
DOCKER_HOST = os.environ.get("SVL_PROVTEST_DOCKER_HOST", DEFAULT_HOST)
IMAGE = "svl-provtest:1"
HOW_TO_DAEMON = (
    "start one with: dockerd -H unix:///run/svl-provtest/docker.sock --data-root /var/lib/svl-provtest "
    "--exec-root /run/svl-provtest/exec --pidfile /run/svl-provtest/docker.pid --bridge none "
    "--iptables=false --ip-masq=false"
)


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "-H", DOCKER_HOST, *args], capture_output=True, text=True, timeout=60, check=check
    )


def _start_private_daemon() -> subprocess.Popen | None:
    """As root, start the test's own dockerd (no bridge, no iptables: it cannot clash with the
    lab's per-node daemons) and import a busybox image; None when that is not possible."""
    import shutil
    import tempfile
    import time

    if os.geteuid() != 0 or not shutil.which("dockerd") or DOCKER_HOST != DEFAULT_HOST:
        return None
    if not Path("/bin/busybox").exists():
        subprocess.run(["apt-get", "install", "-y", "-q", "busybox-static"],
                       capture_output=True, timeout=600, check=False)
    run = Path("/run/svl-provtest")
    run.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        ["dockerd", "-H", DEFAULT_HOST, "--data-root", "/var/lib/svl-provtest",
         "--exec-root", str(run / "exec"), "--pidfile", str(run / "docker.pid"),
         "--bridge", "none", "--iptables=false", "--ip-masq=false"],
        stdout=subprocess.DEVNULL, stderr=open(run / "dockerd.log", "ab"), start_new_session=True,
    )
    for _ in range(60):
        if _docker("version", check=False).returncode == 0:
            break
        time.sleep(0.5)
    if _docker("image", "inspect", IMAGE, check=False).returncode != 0 and Path("/bin/busybox").exists():
        with tempfile.TemporaryDirectory() as root:
            (Path(root) / "bin").mkdir()
            shutil.copy("/bin/busybox", Path(root) / "bin" / "busybox")
            (Path(root) / "bin" / "sleep").symlink_to("busybox")
            tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
            subprocess.run(["docker", "-H", DOCKER_HOST, "import", "-", IMAGE], stdin=tar.stdout,
                           capture_output=True, timeout=120, check=False)
            tar.wait()
    return proc


@pytest.fixture(scope="module")
def daemon():
    """The test daemon's address (started here when root and absent), or skip saying why."""
    started = None
    if DOCKER_HOST.startswith("unix://") and not Path(DOCKER_HOST[len("unix://"):]).exists():
        started = _start_private_daemon()
        if started is None:
            pytest.skip(f"no Docker daemon socket at {DOCKER_HOST}; {HOW_TO_DAEMON}")
    try:
        ping = _docker("version", "--format", "{{.Server.Version}}", check=False)
    except FileNotFoundError:
        pytest.skip("the docker CLI is not installed (Debian: apt-get install docker.io)")
    if ping.returncode != 0:
        pytest.skip(f"Docker daemon at {DOCKER_HOST} does not answer: {ping.stderr.strip()}")
    if _docker("image", "inspect", IMAGE, check=False).returncode != 0:
        pytest.skip(
            f"local image {IMAGE} missing on {DOCKER_HOST} (no registry reachable); make it with: "
            f"tar -C <dir with bin/busybox and bin/sleep -> busybox> -c . | "
            f"docker -H {DOCKER_HOST} import - {IMAGE}"
        )
    yield DOCKER_HOST
    if started is not None:
        started.terminate()
        started.wait(timeout=60)


def _stack(engine_env: dict, tmp_path: Path, program, name: str):
    settings = auto.ProjectSettings(
        name="spark-vllm-docker",
        runtime="python",
        backend=auto.ProjectBackend(url=engine_env["PULUMI_BACKEND_URL"]),
    )
    return auto.create_or_select_stack(
        stack_name=name,
        project_name="spark-vllm-docker",
        program=program,
        opts=auto.LocalWorkspaceOptions(
            work_dir=str(tmp_path),
            project_settings=settings,
            env_vars=engine_env,
            secrets_provider="passphrase",
        ),
    )


def test_container_lifecycle_on_real_daemon(daemon, engine_env, require_plugin, tmp_path):
    import pulumi_docker as docker

    require_plugin("docker", SDK_VERSION)
    run = uuid.uuid4().hex[:8]
    cname = f"svl-provtest-{run}"
    mode = {"value": "one"}

    def program():
        prov = docker.Provider("testdocker", host=daemon)
        opts = pulumi.ResourceOptions(provider=prov)
        image = docker.RemoteImage("image", name=IMAGE, keep_locally=True, opts=opts)
        container = docker.Container(
            "sleeper",
            name=cname,
            image=image.image_id,
            command=["/bin/sleep", "3600"],
            labels=[docker.ContainerLabelArgs(label="svl-provtest", value=run)],
            envs=[f"SVL_MODE={mode['value']}", "SVL_FIXED=1"],
            ulimits=[docker.ContainerUlimitArgs(name="nofile", soft=1024, hard=2048)],
            network_mode="none",
            restart="no",
            opts=opts,
        )
        pulumi.export("container_id", container.id)
        pulumi.export("image_id", image.image_id)

    def running() -> list[str]:
        return _docker("ps", "-q", "--no-trunc", "--filter", f"label=svl-provtest={run}").stdout.split()

    stack = _stack(engine_env, tmp_path, program, f"docker-{run}")
    try:
        up = stack.up()
        assert up.summary.result == "succeeded"
        first_id = up.outputs["container_id"].value
        assert running() == [first_id], "the container is not in `docker ps`"
        inspect = json.loads(_docker("inspect", first_id).stdout)[0]
        assert "SVL_MODE=one" in inspect["Config"]["Env"]
        assert inspect["HostConfig"]["NetworkMode"] == "none"
        assert inspect["HostConfig"]["Ulimits"] == [{"Name": "nofile", "Soft": 1024, "Hard": 2048}]
        assert up.outputs["image_id"].value.startswith("sha256:")

        # No perpetual diff: raises CommandError if the engine plans any change.
        stack.preview(expect_no_changes=True)

        mode["value"] = "two"
        up2 = stack.up()
        assert up2.summary.result == "succeeded"
        assert up2.summary.resource_changes.get("replace", 0) == 1, up2.summary.resource_changes
        second_id = up2.outputs["container_id"].value
        assert second_id != first_id
        assert running() == [second_id]
        env_now = json.loads(_docker("inspect", second_id).stdout)[0]["Config"]["Env"]
        assert "SVL_MODE=two" in env_now

        stack.destroy()
        assert _docker("ps", "-aq", "--filter", f"label=svl-provtest={run}").stdout.strip() == ""
        # keep_locally: the image stays for the next run.
        assert _docker("image", "inspect", IMAGE, check=False).returncode == 0
    finally:
        # Never leave containers behind on the shared test daemon, even when an assertion failed.
        leftovers = _docker("ps", "-aq", "--filter", f"label=svl-provtest={run}", check=False).stdout.split()
        if leftovers:
            _docker("rm", "-f", *leftovers, check=False)
        stack.workspace.remove_stack(f"docker-{run}", force=True)
