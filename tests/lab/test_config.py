"""`lab.py config` exports what the dev stack needs; --write-stack edits only hostKey and image.ref."""
import json
import os

import pytest

pytestmark = pytest.mark.lab

SAMPLE = """# comment kept
config:
  spark-vllm:environment: dev
  spark-vllm:nodes:
    - name: spark-1
      host: 10.77.0.11
      port: 22
      user: root
      hostKey: "ssh-ed25519 PLACEHOLDER1"
      fabric:
        - {interface: enp1s0f1np1, ip: 192.168.177.11, hca: rocep1s0f1}
    - name: spark-2
      host: 10.77.0.12
      port: 22
      user: root
      hostKey: "ssh-ed25519 PLACEHOLDER2"
  spark-vllm:ssh:
    privateKeyPath: /root/.cache/spark-vllm/lab/id_ed25519
  spark-vllm:image:
    ref: 10.77.0.1:5000/old:latest
    source: registry
  spark-vllm:model:
    repo: spark-lab/tiny-moe
    revision: main
"""


def test_stack_json_matches_the_live_nodes(lab):
    cfg = json.loads(lab.cli("config").stdout.split("\n[lab ")[0])
    assert cfg["sshKeyPath"] == "/root/.cache/spark-vllm/lab/id_ed25519" and os.path.exists(cfg["sshKeyPath"])
    assert cfg["hfEndpoint"] == "http://10.77.0.1:8090" and cfg["rdma"] is False
    assert cfg["image"]["ref"].startswith("10.77.0.1:5000/") and "@sha256:" in cfg["image"]["ref"]
    for i, n in enumerate(cfg["nodes"], 1):
        assert (n["name"], n["host"], n["port"], n["user"]) == (f"spark-{i}", f"10.77.0.1{i}", 22, "root")
        assert [f["interface"] for f in n["fabric"]] == ["enp1s0f1np1", "enP2p1s0f1np1"]
        assert [f["ip"] for f in n["fabric"]] == [f"192.168.177.1{i}", f"192.168.178.1{i}"]
        # the exported key is the one the node's sshd presents
        scanned = lab.ssh(n["name"], "true")  # StrictHostKeyChecking=yes with this key
        assert scanned.returncode == 0


def test_write_stack_touches_only_host_keys_and_image_ref(lab, tmp_path):
    p = tmp_path / "Pulumi.dev.yaml"
    p.write_text(SAMPLE)
    lab.cli("config", "--write-stack", str(p))
    new = p.read_text().split("\n")
    old = SAMPLE.split("\n")
    assert len(new) == len(old)
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    assert len(changed) == 3, changed
    assert new[8] == f'      hostKey: "{lab.nodes["spark-1"]["hostKey"]}"'
    assert new[15] == f'      hostKey: "{lab.nodes["spark-2"]["hostKey"]}"'
    assert new[19] == f"    ref: {lab.image}"


def test_write_stack_accepts_a_bare_file_name(lab, tmp_path):
    """`make lab-up` / `make demo` run `config --write-stack Pulumi.dev.yaml` from the repo root."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "Pulumi.dev.yaml").write_text(SAMPLE)
    lab_py = Path(__file__).resolve().parents[2] / "lab" / "lab.py"
    r = subprocess.run([sys.executable, str(lab_py), "config", "--write-stack", "Pulumi.dev.yaml"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert lab.image in (tmp_path / "Pulumi.dev.yaml").read_text()
