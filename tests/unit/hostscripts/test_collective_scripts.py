"""The collective gate's scripts on the nodes (hostscripts/collective.py, issue 51), run for real
with a stand-in `docker` that records how it was called (tests/stand_in.py); the payload itself
runs in the lab's serving image (tests/e2e/test_collective.py) and its arithmetic in
tests/unit/inspection/test_collective.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from hostscripts import collective
from hostscripts.common import RemoteValueError, payload
from hostscripts.paths import StackNames
from inspection.collective import CollectiveError, parse_rank
from tests.stand_in import python_stand_in

IMAGE = "sha256:" + "ab" * 32
NAMES = StackNames("dev")
LABELS = {"spark-vllm.managed": "true", "spark-vllm.stack": "spark-vllm/dev",
          "spark-vllm.role": "collective-gate"}
ANSWER = {"rank": 0, "world": 2, "backend": "gloo", "results": []}

# A docker that records each call's argv (one JSON line per call) and, for `run`, prints what
# FAKE_DOCKER_OUT says on stdout, FAKE_DOCKER_ERR on stderr, and exits FAKE_DOCKER_RC.
DOCKER = """import json, os, sys
with open(os.environ["FAKE_DOCKER_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "run":
    sys.stdout.write(os.environ.get("FAKE_DOCKER_OUT", ""))
    sys.stderr.write(os.environ.get("FAKE_DOCKER_ERR", ""))
    sys.exit(int(os.environ.get("FAKE_DOCKER_RC", "0")))
"""


def rank_script(env: dict[str, str] | None = None, **kw) -> str:
    request = collective.rank_request(rank=1, world=2, master="192.168.177.11", port=29517,
                                      sizes=[65536, 262144], deadline=120)
    return collective.collective_rank(NAMES, IMAGE, env or {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"},
                                      request, LABELS, **kw)


def run(tmp_path: Path, script: str, **env: str) -> tuple[subprocess.CompletedProcess, list]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    python_stand_in(bin_ / "docker", DOCKER)
    log = tmp_path / "docker.log"
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}",
                               "FAKE_DOCKER_LOG": str(log), **env})
    calls = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def test_a_rank_runs_the_payload_in_the_image_as_the_stacks_gpu_containers_run(tmp_path):
    env = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_DEBUG": "WARN",
           "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "ODD": "a value with 'quotes' and $x"}
    script = rank_script(env, devices=["/dev/infiniband"], cap_add=["IPC_LOCK"],
                         memlock_unlimited=True, nofile=16384)
    done, calls = run(tmp_path, script, FAKE_DOCKER_OUT=json.dumps(ANSWER) + "\n")
    assert done.returncode == 0, done.stderr
    assert parse_rank("spark-2", done.stdout).world == 2
    # a leftover of an earlier gate of this stack goes first, then the rank's own container
    assert calls[0] == ["rm", "-f", "spark-vllm-dev-collective"]
    argv = calls[1]
    assert argv[:4] == ["run", "--rm", "--name", "spark-vllm-dev-collective"]
    for flag in (["--network", "host"], ["--ipc", "host"], ["--gpus", "all"],
                 ["--device", "/dev/infiniband:/dev/infiniband"], ["--cap-add", "IPC_LOCK"],
                 ["--ulimit", "memlock=-1:-1"], ["--ulimit", "nofile=16384:16384"],
                 ["--label", "spark-vllm.role=collective-gate"]):
        assert any(argv[j:j + 2] == flag for j in range(len(argv) - 1)), (flag, argv)
    envs = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    # the node's NCCL environment, with NCCL's INFO lines on init and the network for the gate
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in envs
    assert "ODD=a value with 'quotes' and $x" in envs
    assert "NCCL_DEBUG=INFO" in envs and "NCCL_DEBUG=WARN" not in envs
    assert "NCCL_DEBUG_SUBSYS=INIT,NET" in envs
    tail = argv[argv.index("--entrypoint"):]
    assert tail[:3] == ["--entrypoint", "python3", IMAGE]
    assert tail[3:5] == ["-c", payload("collective_bench.py")]
    assert json.loads(tail[5]) == {
        "rank": 1, "world": 2, "localRank": 0, "master": "192.168.177.11", "port": 29517,
        "sizes": [65536, 262144], "ops": ["all_gather", "all_reduce"], "deadline": 120,
        "connectTimeout": 120}


def test_a_rank_that_cannot_run_says_why_and_leaves_the_verdict_to_the_check(tmp_path):
    done, _ = run(tmp_path, rank_script(), FAKE_DOCKER_RC="125",
                  FAKE_DOCKER_ERR="docker: Error response from daemon: could not select device "
                                  "driver \"\" with capabilities: [[gpu]].\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "collective rank failed: exit 125",
        "stderr: docker: Error response from daemon: could not select device driver \"\" with "
        "capabilities: [[gpu]]."]
    with pytest.raises(CollectiveError, match="spark-2: collective rank failed: exit 125"):
        parse_rank("spark-2", done.stdout)
    # the payload's own answer and then a failure (a collective that raised): not trusted
    done, _ = run(tmp_path, rank_script(), FAKE_DOCKER_RC="1",
                  FAKE_DOCKER_OUT=json.dumps(ANSWER) + "\n", FAKE_DOCKER_ERR="boom\n")
    with pytest.raises(CollectiveError, match=r"exit 1 \| stderr: boom"):
        parse_rank("spark-2", done.stdout)


def test_only_an_image_id_reaches_the_rank_script():
    with pytest.raises(RemoteValueError):
        collective.collective_rank(NAMES, "registry/x:tag; rm -rf /", {}, {}, LABELS)


def _sandboxed(root: Path, script: str) -> str:
    return script.replace("/var/lib/spark-vllm", f"{root}/var/lib/spark-vllm")


def test_the_check_leaves_its_record_then_fails_with_the_problems(tmp_path):
    record = {"verdict": "below threshold", "stopped": True, "allGatherBusGBps": 0.1}
    script = collective.collective_check(NAMES, ["collective gate below threshold: ..."],
                                         ["all_gather bus bandwidth 0.100 GB/s is below ..."],
                                         ["a warning"], record)
    done = subprocess.run(["/bin/sh", "-c", _sandboxed(tmp_path, script)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 1
    assert done.stdout == "collective gate below threshold: ...\n"
    assert done.stderr.splitlines() == [
        "collective gate warning: a warning",
        "collective gate failed: all_gather bus bandwidth 0.100 GB/s is below ..."]
    path = Path(f"{tmp_path}{NAMES.collective_record}")
    assert json.loads(path.read_text()) == record
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"  # made under umask 077
    # passed: the record is replaced, exit 0; the remove takes it away
    script = collective.collective_check(NAMES, ["collective gate passed"], [], [],
                                         {"verdict": "passed", "stopped": False})
    done = subprocess.run(["/bin/sh", "-c", _sandboxed(tmp_path, script)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and json.loads(path.read_text())["verdict"] == "passed"
    subprocess.run(["/bin/sh", "-c", _sandboxed(tmp_path, collective.collective_record_remove(
        NAMES))], check=True, timeout=30)
    assert not path.exists()
