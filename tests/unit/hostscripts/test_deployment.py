"""A model's verified deployment on a node (issue 49): payloads/deployment.py run for real with the
node's python3 against a FAKE Docker Engine API (tests/fake_docker_api.py: containers in memory),
and the scripts of hostscripts/deployment.py and hostscripts/vllm.py around it run with sh
against a fake docker CLI. The same payload against a real dockerd: tests/engine/
test_deployment_restore.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hostscripts import deployment as dep
from hostscripts import vllm
from hostscripts.common import RemoteValueError
from hostscripts.deployment import GateRestore, GateVerdict, Held, NodeDeployment
from hostscripts.paths import StackNames
from tests.conftest import ROOT
from tests.fake_docker_api import FakeDocker

NAMES = StackNames("dev")
IMAGE_OLD, IMAGE_NEW = "sha256:" + "1" * 64, "sha256:" + "2" * 64
TEMPLATE, NON_CARRY = "/etc/spark-vllm/chat-template.jinja", \
    "/etc/spark-vllm/vllm-config/ray_non_carry_over_env_vars.json"
HEAD = (Held("spark-vllm-dev-ray-head"), Held("spark-vllm-dev-serve", (TEMPLATE, NON_CARRY)))


@pytest.fixture
def docker(tmp_path):
    fake = FakeDocker(str(tmp_path / "docker.sock"))
    fake.images = {IMAGE_OLD: {"Id": IMAGE_OLD, "RepoDigests": ["reg/vllm@sha256:" + "a" * 64]},
                   IMAGE_NEW: {"Id": IMAGE_NEW, "RepoDigests": ["reg/vllm@sha256:" + "b" * 64]}}
    yield fake
    fake.close()


def _env(tmp_path: Path, fake: FakeDocker, docker_cli: str = "") -> dict[str, str]:
    env = {**os.environ, "DOCKER_HOST": f"unix://{fake.path}"}
    if docker_cli:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "docker").write_text("#!/bin/sh\n" + docker_cli)
        (bin_dir / "docker").chmod(0o755)
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def _payload(tmp_path, fake, command: str, args: dict, *extra: str):
    return subprocess.run([sys.executable, "-c", dep.DEPLOYMENT_PY, command, json.dumps(args),
                           *extra], env=_env(tmp_path, fake), capture_output=True, text=True,
                          timeout=60)


def _deployed(fake: FakeDocker, image: str, argv: list[str], ray_head: str | None = None) -> \
        tuple[str, str]:
    """The head of a Ray stack as the provider makes it: (the Ray head's ID, vLLM's ID)."""
    ray = ray_head or fake.add("spark-vllm-dev-ray-head",
                               {"Image": image, "Cmd": ["ray", "start", "--head"],
                                "Hostname": "spark-1", "Labels": {"spark-vllm.role": "ray-head"}},
                               {"NetworkMode": "host", "RestartPolicy": {"Name": "unless-stopped"}})
    serve = fake.add("spark-vllm-dev-serve",
                     {"Image": image, "Cmd": argv, "Hostname": "spark-1",
                      "Env": ["VLLM_RPC_BASE_PATH=/tmp/ray", "PATH=/usr/bin", "HF_HUB_OFFLINE=1"],
                      "Labels": {"spark-vllm.role": "vllm-serve",
                                 dep.AFTER_RESTORE_LABEL: "0" * 16}},
                     {"NetworkMode": "host", "PidMode": f"container:{ray}",
                      "RestartPolicy": {"Name": "unless-stopped"},
                      "Mounts": [{"Type": "bind", "Source": "/var/lib/x", "Target": "/y"}]},
                     files={TEMPLATE: b"{{ messages }}", NON_CARRY: b'["NCCL_IB_HCA"]\n'})
    return ray, serve


def _record(tmp_path, fake, folder, deployment="d" * 16):
    part = NodeDeployment(str(folder), HEAD)
    return _payload(tmp_path, fake, "record", part.args(deployment=deployment))


def _by_name(fake: FakeDocker, name: str) -> dict:
    c = fake.find(name)
    assert c is not None, f"{name} is gone"
    return c


# ---------------------------------------------------------------------------- the record


def test_record_keeps_each_containers_config_host_config_and_uploaded_files_root_only(
        tmp_path, docker):
    ray, serve = _deployed(docker, IMAGE_OLD, ["vllm", "serve", "m", "--max-model-len", "4096"])
    folder = tmp_path / "stacks" / "dev" / "vllm" / "deployment"
    r = _record(tmp_path, docker, folder)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"result": "recorded", "deployment": "d" * 16}
    rec = json.loads((folder / "containers.json").read_text())
    assert [c["name"] for c in rec["containers"]] == ["spark-vllm-dev-ray-head",
                                                      "spark-vllm-dev-serve"]
    assert [c["id"] for c in rec["containers"]] == [ray, serve]
    assert rec["containers"][1]["config"]["Cmd"][-1] == "4096"
    assert rec["containers"][1]["hostConfig"]["PidMode"] == f"container:{ray}"
    assert set(rec["containers"][1]["files"]) == {TEMPLATE, NON_CARRY}
    assert oct((folder / "containers.json").stat().st_mode & 0o777) == "0o600"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"


# ---------------------------------------------------------------------------- the restore


def test_a_flag_change_that_failed_puts_back_only_vllm_as_recorded(tmp_path, docker):
    ray, old = _deployed(docker, IMAGE_OLD, ["vllm", "serve", "m", "--max-model-len", "4096"])
    folder = tmp_path / "deployment"
    assert _record(tmp_path, docker, folder).returncode == 0
    recorded = json.loads((folder / "containers.json").read_text())["containers"][1]
    # the up replaced vLLM (delete before replace) with the failing flag; Ray stayed
    del docker.containers[old]
    _deployed(docker, IMAGE_OLD, ["vllm", "serve", "m", "--max-model-len", "1048576"],
              ray_head=ray)
    part = NodeDeployment(str(folder), HEAD)
    r = _payload(tmp_path, docker, "restore", part.args(expect="d" * 16, restore="e" * 16))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["result"] == "restored" and out["restored"] == ["spark-vllm-dev-serve"]
    assert out["kept"] == ["spark-vllm-dev-ray-head"]
    back = _by_name(docker, "spark-vllm-dev-serve")
    assert back["State"]["Running"] is True
    assert back["Config"]["Cmd"] == recorded["config"]["Cmd"]  # the verified flags
    assert back["Config"]["Env"] == recorded["config"]["Env"]
    # the restore's label, and not the label of the container it was recorded from
    assert back["Config"]["Labels"] == {"spark-vllm.role": "vllm-serve",
                                        dep.RESTORED_LABEL: "e" * 16}
    assert back["HostConfig"]["PidMode"] == f"container:{ray}"  # the Ray head kept its ID
    assert back["HostConfig"]["Mounts"] == recorded["hostConfig"]["Mounts"]
    assert back["files"][TEMPLATE] == b"{{ messages }}"  # the uploads are back
    assert "Hostname" not in back["Config"]  # host network: Docker refuses a hostname
    assert _by_name(docker, "spark-vllm-dev-ray-head")["Id"] == ray
    # the record now names what runs, so a second failure compares against it
    rec = json.loads((folder / "containers.json").read_text())
    assert [c["id"] for c in rec["containers"]] == [ray, back["Id"]]
    assert rec["restored"]["id"] == "e" * 16


def test_an_image_change_that_failed_puts_back_ray_and_vllm_with_the_new_ray_heads_pid(
        tmp_path, docker):
    _deployed(docker, IMAGE_OLD, ["vllm", "serve", "m"])
    folder = tmp_path / "deployment"
    assert _record(tmp_path, docker, folder).returncode == 0
    docker.containers.clear()  # every container replaced by the new image
    _deployed(docker, IMAGE_NEW, ["vllm", "serve", "m"])
    part = NodeDeployment(str(folder), HEAD)
    r = _payload(tmp_path, docker, "restore", part.args(expect="d" * 16, restore="e" * 16))
    assert json.loads(r.stdout)["restored"] == ["spark-vllm-dev-ray-head", "spark-vllm-dev-serve"]
    ray, serve = (_by_name(docker, n) for n in ("spark-vllm-dev-ray-head", "spark-vllm-dev-serve"))
    assert ray["Image"] == serve["Image"] == IMAGE_OLD
    assert serve["HostConfig"]["PidMode"] == f"container:{ray['Id']}"
    assert len(docker.containers) == 2


@pytest.mark.parametrize(("expect", "names", "why"), [
    ("f" * 16, HEAD, "this node's record is deployment dddddddddddddddd, not ffffffffffffffff "
                     "(the head's)"),
    ("d" * 16, HEAD[1:], "the verified deployment ran spark-vllm-dev-ray-head, "
                         "spark-vllm-dev-serve here, this one spark-vllm-dev-serve"),
])
def test_a_record_of_another_deployment_or_shape_is_not_put_back(tmp_path, docker, expect, names,
                                                                  why):
    _deployed(docker, IMAGE_OLD, ["vllm", "serve", "m"])
    folder = tmp_path / "deployment"
    assert _record(tmp_path, docker, folder).returncode == 0
    before = json.loads(json.dumps({k: v["Config"] for k, v in docker.containers.items()}))
    part = NodeDeployment(str(folder), names)
    r = _payload(tmp_path, docker, "restore", part.args(expect=expect, restore="e" * 16))
    out = json.loads(r.stdout)
    assert out["result"] == "not-restored" and out["notRestored"] == why
    assert {k: v["Config"] for k, v in docker.containers.items()} == before  # nothing touched


def test_a_node_without_a_record_says_so(tmp_path, docker):
    part = NodeDeployment(str(tmp_path / "none"), HEAD)
    r = _payload(tmp_path, docker, "restore", part.args(expect="d" * 16, restore="e" * 16))
    assert json.loads(r.stdout)["notRestored"] == \
        "no verified deployment is recorded on this node"


# ---------------------------------------------------------------------------- gate and final

GATE_CLI = """
case "$1" in
  inspect) case "$3" in
    *Running*) echo true ;;
    *Status*) echo "$STATE" ;;
    *) echo 0 ;;
  esac ;;
  exec) cat >/dev/null; if [ "$PROBE" = ok ]; then
          echo '{"health": "ok", "models": ["m"], "smoke": "hi", "seconds": 4.5}'
        else sleep 30; fi ;;
  logs) if [ -n "${LOG_FILE:-}" ]; then cat "$LOG_FILE"
        else echo "ValueError: max_model_len 1048576 is greater than the model's 4096"; fi ;;
esac
"""


SHAPE = {"spark-1": ["spark-vllm-dev-ray-head", "spark-vllm-dev-serve"],
         "spark-2": ["spark-vllm-dev-ray-worker"]}


def _gate_script(folder: Path, on_failure: str = "restore", shape: dict | None = None) -> str:
    spec = GateRestore(NodeDeployment(str(folder), HEAD), api="spark-vllm-dev-serve",
                       shape=shape or SHAPE, on_failure=on_failure)  # type: ignore[arg-type]
    return vllm.vllm_health_gate("spark-vllm-dev-serve", "spark-vllm-dev-ray-head", "ab" * 32,
                                 "http://127.0.0.1:8000", "m", "hi", 60, key_file="/dev/null",
                                 deployment=spec)


def _final(folder: Path, verdict: GateVerdict, others: dict[str, str]) -> str:
    return vllm.vllm_deployment_final(
        NodeDeployment(str(folder), HEAD), verdict, others, api_container="spark-vllm-dev-serve",
        probe_container="spark-vllm-dev-ray-head", health_url="http://127.0.0.1:8000",
        served_model_name="m", smoke_prompt="hi", timeout=60, key_file="/dev/null",
        facts=dep.summary_facts(image="reg/vllm:lab", repo="org/m", commit="c" * 40,
                                served_name="m", shape=SHAPE, drafter=None))


def _sh(tmp_path, fake, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], env={**_env(tmp_path, fake, GATE_CLI), **env},
                          capture_output=True, text=True, timeout=120)


def _verified_summary(tmp_path, docker, folder: Path) -> dict:
    """A first up whose gate passed: the gate, then the head's final step."""
    gate = _sh(tmp_path, docker, _gate_script(folder), STATE="running 0", PROBE="ok")
    assert gate.returncode == 0, gate.stderr
    verdict = dep.parse_gate(gate.stdout)
    assert verdict.ok and verdict.deployment
    done = _sh(tmp_path, docker, _final(folder, verdict, {"spark-2": "recorded"}),
               STATE="running 0", PROBE="ok")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_pass_records_the_summary_the_stack_outputs(tmp_path, docker):
    _deployed(docker, IMAGE_OLD, ["vllm", "serve", "org/m", "--revision", "c" * 40])
    folder = tmp_path / "deployment"
    s = _verified_summary(tmp_path, docker, folder)
    assert re.fullmatch(r"[0-9a-f]{16}", s["deployment"])
    assert s["image"] == {"ref": "reg/vllm:lab", "id": IMAGE_OLD,
                          "repoDigests": ["reg/vllm@sha256:" + "a" * 64]}
    assert s["model"] == {"repo": "org/m", "commit": "c" * 40} and s["drafter"] is None
    assert s["argv"] == ["vllm", "serve", "org/m", "--revision", "c" * 40]
    assert s["env"] == {"VLLM_RPC_BASE_PATH": "/tmp/ray"}  # VLLM_* only
    assert s["gate"]["seconds"] == 4.5 and s["nodes"] == ["spark-1", "spark-2"]
    assert s["shape"] == SHAPE  # what the next gate compares its up's shape with
    assert json.loads((folder / "verified.json").read_text()) == s
    assert oct((folder / "verified.json").stat().st_mode & 0o777) == "0o600"


def test_a_failed_gate_puts_the_verified_deployment_back_and_the_final_step_fails_saying_so(
        tmp_path, docker):
    ray, old = _deployed(docker, IMAGE_OLD, ["vllm", "serve", "org/m", "--max-model-len", "4096"])
    folder = tmp_path / "deployment"
    verified = _verified_summary(tmp_path, docker, folder)
    del docker.containers[old]  # the next up replaced vLLM with a flag it dies of
    _deployed(docker, IMAGE_OLD, ["vllm", "serve", "org/m", "--max-model-len", "1048576"],
              ray_head=ray)
    gate = _sh(tmp_path, docker, _gate_script(folder), STATE="restarting 1", PROBE="hang")
    assert gate.returncode == 0, gate.stderr
    answer = json.loads(gate.stdout.strip().splitlines()[-1])
    assert answer["health"] == "failed"
    assert answer["why"] == "vllm serve exited while the gate waited (now: restarting 1)"
    assert answer["restore"]["deployment"] == verified["deployment"]
    assert answer["restore"]["restored"] == ["spark-vllm-dev-serve"]
    assert "max_model_len" not in gate.stdout  # the log tail stays on the node
    verdict = dep.parse_gate(gate.stdout)
    assert verdict == GateVerdict(ok=False, restored_from=verified["deployment"],
                                  restore=answer["restore"]["restore"])
    assert _by_name(docker, "spark-vllm-dev-serve")["Config"]["Cmd"][-1] == "4096"
    # the other nodes put theirs back (node_step), then the head's step waits and fails
    done = _sh(tmp_path, docker, _final(folder, verdict, {"spark-2": "restored"}),
               STATE="running 0", PROBE="ok")
    assert done.returncode == 1
    err = done.stderr
    assert "the new version failed its health gate: vllm serve exited while the gate waited " \
           "(now: restarting 1)" in err
    assert "--- vllm serve in spark-vllm-dev-serve: its log's error lines, then its last lines " \
           "---" in err
    assert "max_model_len 1048576 is greater than the model's 4096" in err
    m = re.search(r"serving the last verified deployment again \(([0-9a-f]{16}), verified "
                  r"[0-9TZ:-]+: image sha256:1{12}, org/m@cccccccccccc; recreated here: "
                  r"spark-vllm-dev-serve; spark-2: restored; answering [0-9.]+ s after the "
                  r"restore began\)", err)
    assert m and m.group(1) == verified["deployment"], err
    assert json.loads((folder / "verified.json").read_text())["restoredAfter"] == answer["why"]


@pytest.mark.parametrize(("on_failure", "shape", "others", "why"), [
    ("keep", None, {}, "health.onFailure is keep: the failing version stays"),
    # a node joins: nothing of this shape was verified
    ("restore", {**SHAPE, "spark-3": ["spark-vllm-dev-ray-worker"]}, {},
     "the last verified deployment ran spark-1: spark-vllm-dev-ray-head, spark-vllm-dev-serve; "
     "spark-2: spark-vllm-dev-ray-worker, this one spark-1: spark-vllm-dev-ray-head, "
     "spark-vllm-dev-serve; spark-2: spark-vllm-dev-ray-worker; spark-3: "
     "spark-vllm-dev-ray-worker: nothing of this shape was verified"),
    ("restore", None, {"spark-2": "not-restored"}, "spark-2: not-restored"),
])
def test_a_failed_gate_that_cannot_put_it_back_fails_with_the_log_tail_and_why(
        tmp_path, docker, on_failure, shape, others, why):
    ray, old = _deployed(docker, IMAGE_OLD, ["vllm", "serve", "org/m"])
    folder = tmp_path / "deployment"
    _verified_summary(tmp_path, docker, folder)
    del docker.containers[old]
    _deployed(docker, IMAGE_OLD, ["vllm", "serve", "org/m", "--bad"], ray_head=ray)
    gate = _sh(tmp_path, docker, _gate_script(folder, on_failure, shape),
               STATE="restarting 1", PROBE="hang")
    verdict = dep.parse_gate(gate.stdout)
    if on_failure == "keep" or shape:
        assert verdict == GateVerdict(ok=False)
        assert _by_name(docker, "spark-vllm-dev-serve")["Config"]["Cmd"][-1] == "--bad"
    done = _sh(tmp_path, docker, _final(folder, verdict, others), STATE="running 0", PROBE="ok")
    assert done.returncode == 1
    assert "max_model_len 1048576" in done.stderr  # the failing version's log tail
    assert f"not put back: {why}" in done.stderr, done.stderr
    assert "serving the last verified deployment again" not in done.stderr


def test_the_failure_names_the_root_cause_printed_above_the_api_servers_traceback(
        tmp_path, docker):
    """A vLLM whose engine fails to start ends its log with the API server's traceback (the
    real tail: tests/fixtures/rollback/); the rank's exception, the root cause, is further up,
    among lines of progress. The failure shows it, then the tail, with nothing else."""
    real_tail = (ROOT / "tests/fixtures/rollback/vllm-engine-init-failed-tail.txt").read_text()
    cause = ("(EngineCore pid=77) RuntimeError: spark-vllm lab fault: this image's vLLM fails "
             "while it loads the model")
    noise = [f"(EngineCore pid=77) INFO 12-06 07:41:{i:02d} [loader.py:{i}] loading" for i in
             range(60)]
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(["INFO starting", "ERROR 12-06 07:41:00 [core.py:1] EngineCore "
                              "failed to start.", *noise[:30], cause, *noise[30:], ""])
                   + real_tail)
    _deployed(docker, IMAGE_OLD, ["vllm", "serve", "org/m"])
    folder = tmp_path / "deployment"
    _verified_summary(tmp_path, docker, folder)
    gate = _sh(tmp_path, docker, _gate_script(folder, "keep"), STATE="restarting 1",
               PROBE="hang", LOG_FILE=str(log))
    done = _sh(tmp_path, docker, _final(folder, dep.parse_gate(gate.stdout), {}),
               STATE="running 0", PROBE="ok")
    assert done.returncode == 1
    shown = done.stderr.split("its last lines ---\n", 1)[1].split("\nnot put back:", 1)[0]
    lines = shown.splitlines()
    assert lines[:3] == ["ERROR 12-06 07:41:00 [core.py:1] EngineCore failed to start.", cause,
                         "[...]"], lines[:4]
    assert lines[3:] == real_tail.splitlines()[-30:]
    assert "loading" not in shown


# ---------------------------------------------------------------------------- the builders


@pytest.mark.parametrize("stdout", [None, "", "not json", "[1]", '{"health": "ok"}',
                                    '{"health": "ok", "deployment": "x; reboot"}',
                                    '{"health": "failed", "restore": {"deployment": "' + "d" * 16
                                    + '", "restore": "$(id)", "restored": []}}'])
def test_a_gate_answer_that_cannot_be_read_is_a_failure_with_nothing_put_back(stdout):
    assert dep.parse_gate(stdout) == GateVerdict(ok=False)


def test_the_other_nodes_step_records_puts_back_or_does_nothing():
    part = NodeDeployment(NAMES.deployment_dir(), (Held("spark-vllm-dev-ray-worker"),))
    ok = dep.node_step(part, GateVerdict(ok=True, deployment="a" * 16))
    assert " record " in ok and '"deployment":"' + "a" * 16 in ok
    back = dep.node_step(part, GateVerdict(ok=False, restored_from="b" * 16, restore="c" * 16))
    assert " restore " in back and '"expect":"' + "b" * 16 in back
    assert '"restore":"' + "c" * 16 in back
    nothing = dep.node_step(part, GateVerdict(ok=False))
    assert dep.PAYLOAD_FN not in nothing.split(dep.PAYLOAD_DEFINE, 1)[1]  # no call of it
    assert dep.node_result('{"result": "restored"}') == "restored"
    assert dep.node_result("garbage") == dep.node_result('{"result": "rm"}') == "unreadable"


@pytest.mark.parametrize("bad", ["../x", "a b", "x\ny", "$(id)"])
def test_a_container_name_that_is_not_one_never_reaches_a_script(bad):
    with pytest.raises(RemoteValueError, match="not a container name"):
        NodeDeployment("/d", (Held(bad),)).args()


def test_the_records_removal_stays_in_the_stacks_folder():
    text = dep.deployment_remove(NAMES, NAMES.deployment_dir())
    assert "rm -f /var/lib/spark-vllm/stacks/dev/vllm/deployment/containers.json" in text
    assert "rmdir /var/lib/spark-vllm/stacks/dev/vllm/deployment " \
           "/var/lib/spark-vllm/stacks/dev/vllm /var/lib/spark-vllm/stacks/dev " in text
    with pytest.raises(ValueError, match="not in the stack's folder"):
        dep.deployment_remove(NAMES, "/etc")


@pytest.mark.parametrize(("labels", "rid"), [
    ({dep.RESTORED_LABEL: "a" * 16}, "a" * 16),
    ({dep.AFTER_RESTORE_LABEL: "b" * 16}, "b" * 16),
    ({dep.RESTORED_LABEL: "a" * 16, dep.AFTER_RESTORE_LABEL: "b" * 16}, "a" * 16),
    ({dep.RESTORED_LABEL: "not-an-id"}, None),
    ({}, None),
])
def test_a_restores_id_is_read_from_a_containers_labels_only_in_its_exact_form(labels, rid):
    assert dep.after_restore(labels) == rid


@pytest.mark.parametrize(("labels", "removed"), [
    ("e" * 16 + " spark-vllm/dev", True),
    ("f" * 16 + " spark-vllm/dev", False),  # another restore's: not this run's to remove
    ("e" * 16 + " spark-vllm/other", False),  # another stack's container
    ("", False),  # none there (docker inspect fails)
])
def test_the_container_a_restore_put_back_is_removed_only_when_it_is_that_one(tmp_path, labels,
                                                                             removed):
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$1" in inspect) [ -n "{labels}" ] && echo "{labels}" || exit 1 ;; esac
""")
    (bin_dir / "docker").chmod(0o755)
    script = dep.restored_remove("spark-vllm-dev-serve", "spark-vllm/dev", "e" * 16)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    said = calls.read_text()
    assert ("rm -f spark-vllm-dev-serve" in said) is removed, said
    assert ("removed spark-vllm-dev-serve, put back by restore " in done.stdout) is removed
