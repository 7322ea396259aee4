"""The remote scripts, run locally with sh against recorded outputs and temp files."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from components import nccl
from hostscripts import common, foreign, models, paths, ray, vllm
from inspection.hub import ModelFile
from tests.conftest import ROOT

RAY_STATUS = ROOT / "tests" / "fixtures" / "gb10" / "ray-status-oshlabs.txt"


def _fake_docker(tmp_path: Path, body: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n" + body)
    docker.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _ray_status_text() -> str:
    if not RAY_STATUS.exists():
        pytest.skip("recorded ray status fixture not present")
    return "".join(RAY_STATUS.read_text().splitlines(keepends=True)[1:])  # drop the header


def test_ray_ready_accepts_the_recorded_two_node_status(tmp_path):
    status = tmp_path / "status.txt"
    status.write_text(_ray_status_text())
    env = _fake_docker(tmp_path, f"cat {status}\n")
    out = subprocess.run(["sh", "-c", ray.ray_ready("head", 2, 2, 5, "a b")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ray ready: 2 nodes, 2 GPUs"


def test_ray_ready_times_out_with_a_clear_error(tmp_path):
    status = tmp_path / "status.txt"
    status.write_text(_ray_status_text())
    env = _fake_docker(tmp_path, f"cat {status}\n")
    out = subprocess.run(["sh", "-c", ray.ray_ready("head", 3, 3, 1, "a b c")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "want 3 nodes and 3 GPUs, have 2 nodes and 2 GPUs" in out.stderr


def test_model_verify_checks_every_file_and_size(tmp_path):
    files = [ModelFile("config.json", 3, "a" * 40), ModelFile("sub/w.safetensors", 5, "b" * 64)]
    snap = tmp_path / "hub" / "models--org--m" / "snapshots" / ("c" * 40)
    (snap / "sub").mkdir(parents=True)
    (snap / "config.json").write_text("abc")
    (snap / "sub" / "w.safetensors").write_text("12345")
    script = models.model_verify(str(tmp_path), "org/m", "c" * 40, files)
    ok = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == f"verified 2 files, 8 bytes at {'c' * 40}"
    (snap / "sub" / "w.safetensors").write_text("1234")
    bad = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "w.safetensors: have 4 bytes, want 5" in bad.stderr


def test_vllm_start_keeps_the_key_off_every_command_line():
    argv = ["vllm", "serve", "org/m", "--port", "8000"]
    text = vllm.vllm_start("head", argv, "http://127.0.0.1:8000", "m", "hi", 60, "id1")
    assert "--api-key" not in text and "VLLM_API_KEY=" in text
    assert "docker exec -i head sh -c" in text  # stdin (the key) goes into the container file


def test_vllm_start_keeps_per_node_env_on_the_workers():
    """vLLM's Ray executor copies NCCL_*/UCX_* from the head to every worker unless they are
    listed in $VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json (https://github.com/spark-arena/sparkrun issue #135)."""
    argv = ["vllm", "serve", "org/m"]

    def start(keys):
        return vllm.vllm_start("head", argv, "http://127.0.0.1:8000", "m", "hi", 60, "id1",
                                  non_carry_over=keys)

    text = start(nccl.PER_NODE_KEYS)
    assert "NCCL_IB_HCA" in nccl.PER_NODE_KEYS and "NCCL_SOCKET_IFNAME" in nccl.PER_NODE_KEYS
    listed = json.dumps(sorted(nccl.PER_NODE_KEYS))
    assert shlex.quote(listed) in text or listed in text
    assert f"{paths.VLLM_CONFIG_ROOT}/ray_non_carry_over_env_vars.json" in text
    assert f"VLLM_CONFIG_ROOT={paths.VLLM_CONFIG_ROOT}; export VLLM_CONFIG_ROOT" in text
    # a different list is a different configuration: a running vLLM is restarted for it
    want = re.compile(r"echo ([0-9a-f]{16}) > " + re.escape(paths.VLLM_ARGV))
    assert want.search(text).group(1) != want.search(start(("NCCL_IB_HCA",))).group(1)
    assert want.search(text).group(1) == want.search(start(tuple(reversed(nccl.PER_NODE_KEYS)))).group(1)


def test_foreign_container_stop_and_start_are_inverse():
    stop = foreign.stop_foreign_container("vllm_node", "spark-vllm/dev")
    start = foreign.start_foreign_container("vllm_node")
    assert "docker stop vllm_node" in stop and "docker start vllm_node" in start
    assert common.known_hosts_line("h", 2222, "ssh-ed25519 AAAA") == "[h]:2222 ssh-ed25519 AAAA"
