"""A deployment put back by payloads/deployment.py (issue 49) against a real Docker daemon, with
containers made by Pulumi's own docker plugin as the program makes them.

An inline program creates a "Ray head" and a "vLLM" container the way components/ray_cluster.py
and components/vllm_server.py do (host network and IPC, vLLM in the Ray head's PID namespace, a
bind mount, ulimits, restart unless-stopped, labels, a file uploaded into it, entrypoint and
command, env); the payload records them; the next `up` replaces vLLM (delete before replace,
another env value) as a failing upgrade does; the payload recreates it from the record through
the daemon's create API. What comes back must be what was recorded: command, env, mounts, PID
namespace, restart policy, ulimits, the uploaded file, running. The daemon is the engine tier's
private one (tests/engine/test_docker_plugin.py `daemon`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pulumi
import pytest

from hostscripts.deployment import DEPLOYMENT_PY, Held, NodeDeployment
from tests.engine.test_docker_plugin import IMAGE, SDK_VERSION, _docker, _stack, daemon

pytestmark = pytest.mark.engine
__all__ = ["daemon"]  # the fixture, shared with the docker plugin's test

UPLOAD = "/etc/spark-vllm/chat-template.jinja"


def _payload(host: str, command: str, args: dict, *extra: str) -> dict:
    done = subprocess.run([sys.executable, "-c", DEPLOYMENT_PY, command, json.dumps(args),
                           *extra],
                          env={"DOCKER_HOST": host, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _inspect(name: str) -> dict:
    return json.loads(_docker("inspect", name).stdout)[0]


def test_a_replaced_container_is_put_back_as_recorded_on_a_real_daemon(
        daemon, engine_env, require_plugin, tmp_path):
    import pulumi_docker as docker

    require_plugin("docker", SDK_VERSION)
    run = uuid.uuid4().hex[:8]
    ray_name, serve_name = f"svl-restore-{run}-ray-head", f"svl-restore-{run}-serve"
    mount = tmp_path / "mounted"
    mount.mkdir()
    flag = {"value": "verified"}

    def program():
        prov = docker.Provider("testdocker", host=daemon)
        opts = pulumi.ResourceOptions(provider=prov, delete_before_replace=True)
        image = docker.RemoteImage("image", name=IMAGE, keep_locally=True,
                                   opts=pulumi.ResourceOptions(provider=prov))
        common = {"image": image.image_id, "network_mode": "host", "ipc_mode": "host",
                  "restart": "unless-stopped",
                  "ulimits": [docker.ContainerUlimitArgs(name="nofile", soft=1024, hard=2048)]}
        ray = docker.Container(
            "ray", name=ray_name, entrypoints=["/bin/sleep"], command=["3600"],
            labels=[docker.ContainerLabelArgs(label="svl-restore", value=run)],
            **common, opts=opts)
        serve = docker.Container(
            "serve", name=serve_name, entrypoints=["/bin/sleep"], command=["3601"],
            envs=[f"VLLM_FLAG={flag['value']}", "SVL_FIXED=1"],
            mounts=[docker.ContainerMountArgs(target="/mounted", type="bind", source=str(mount),
                                              read_only=True)],
            uploads=[docker.ContainerUploadArgs(file=UPLOAD, content="{{ template }}\n")],
            labels=[docker.ContainerLabelArgs(label="svl-restore", value=run)],
            pid_mode=ray.id.apply(lambda i: f"container:{i}"),
            destroy_grace_seconds=5, **common, opts=opts)
        pulumi.export("ray", ray.id)
        pulumi.export("serve", serve.id)

    stack = _stack(engine_env, tmp_path, program, f"restore-{run}")
    part = NodeDeployment(str(tmp_path / "record"), (Held(ray_name), Held(serve_name, (UPLOAD,))))
    try:
        up = stack.up()
        ray_id, verified_id = up.outputs["ray"].value, up.outputs["serve"].value
        assert _payload(daemon, "record", part.args(deployment="d" * 16))["result"] == "recorded"
        verified = _inspect(verified_id)
        # a gate that passed, and the summary read from the daemon (the image by its ID)
        (tmp_path / "probe").write_text('{"health": "ok", "seconds": 2.0}\n')
        gate = _payload(daemon, "gate", part.args(restore=None, api=serve_name), "ok",
                        str(tmp_path / "probe"), "", "/dev/null")
        summary = _payload(daemon, "final", part.args(
            mode="ok", deployment=gate["deployment"], container=serve_name,
            facts={"model": {"repo": "org/m", "commit": "c" * 40}}))
        assert summary["image"]["id"] == verified["Image"] and summary["argv"] == ["3601"]
        assert summary["env"] == {"VLLM_FLAG": "verified"}

        flag["value"] = "failing"  # the upgrade: the provider replaces vLLM's container
        up2 = stack.up()
        assert up2.outputs["serve"].value != verified_id
        assert "VLLM_FLAG=failing" in _inspect(serve_name)["Config"]["Env"]

        out = _payload(daemon, "restore", part.args(expect=gate["deployment"],
                                                    restore="e" * 16))
        assert out["restored"] == [serve_name] and out["kept"] == [ray_name], out
        back = _inspect(serve_name)
        assert back["Id"] not in (verified_id, up2.outputs["serve"].value)
        assert back["State"]["Running"] is True
        for key in ("Image", "Entrypoint", "Cmd", "Env", "WorkingDir", "User"):
            assert back["Config"][key] == verified["Config"][key], key
        assert back["Config"]["Labels"] == {**verified["Config"]["Labels"],
                                            "spark-vllm.restored": "e" * 16}
        for key in ("NetworkMode", "IpcMode", "PidMode", "RestartPolicy", "Ulimits", "Mounts"):
            assert back["HostConfig"][key] == verified["HostConfig"][key], key
        assert back["HostConfig"]["PidMode"] == f"container:{ray_id}"
        cat = _docker("exec", serve_name, "/bin/busybox", "cat", UPLOAD)
        assert cat.stdout == "{{ template }}\n", cat.stderr
        assert _inspect(ray_name)["Id"] == ray_id  # the Ray head was never touched
    finally:
        leftovers = _docker("ps", "-aq", "--filter", f"label=svl-restore={run}",
                            check=False).stdout.split()
        if leftovers:
            _docker("rm", "-f", *leftovers, check=False)
        stack.workspace.remove_stack(f"restore-{run}", force=True)
