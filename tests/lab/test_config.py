"""What the lab generates reaches the dev stack without editing a tracked file.

`lab.py up` writes the nodes' host keys into its known_hosts file (Pulumi.dev.yaml points
ssh.knownHostsFile at it) and tags the image it pushed with the tag Pulumi.dev.yaml names (the
program resolves it to a digest at the registry). stack.json describes the live lab.
"""
import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]


def test_stack_json_matches_the_live_nodes(lab):
    cfg = json.loads(lab.cli("config").stdout.split("\n[lab ")[0])
    assert cfg["sshKeyPath"] == "/root/.cache/spark-vllm/lab/id_ed25519"
    assert os.path.exists(cfg["sshKeyPath"])
    assert cfg["hfEndpoint"] == "http://10.77.0.1:8090" and cfg["rdma"] is False
    assert cfg["image"]["ref"].startswith("10.77.0.1:5000/") and "@sha256:" in cfg["image"]["ref"]
    for i, n in enumerate(cfg["nodes"], 1):
        assert (n["name"], n["host"], n["port"], n["user"]) == \
            (f"spark-{i}", f"10.77.0.1{i}", 22, "root")
        assert [f["interface"] for f in n["fabric"]] == ["enp1s0f1np1", "enP2p1s0f1np1"]
        assert [f["ip"] for f in n["fabric"]] == [f"192.168.177.1{i}", f"192.168.178.1{i}"]
        # the exported key is the one the node's sshd presents
        scanned = lab.ssh(n["name"], "true")  # StrictHostKeyChecking=yes with this key
        assert scanned.returncode == 0


def _dev_config() -> dict:
    data = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    return {k.split(":", 1)[1]: v for k, v in data.items()}


def test_dev_stack_pins_the_lab_host_keys_through_the_known_hosts_file(lab):
    sys.path.insert(0, str(ROOT))
    from config import pin_host_keys, validate_config

    raw = _dev_config()
    assert all("hostKey" not in n for n in raw["nodes"]), "Pulumi.dev.yaml must not carry lab keys"
    assert raw["ssh"]["knownHostsFile"] == lab.cfg["knownHostsFile"]
    cfg = pin_host_keys(validate_config(raw))
    for node in cfg.nodes:
        assert node.host_key == lab.nodes[node.name]["hostKey"], node.name


def test_dev_stack_image_tag_points_at_the_lab_image(lab):
    ref = _dev_config()["image"]["ref"]
    assert ref == lab.cfg["image"]["tag"] and "@" not in ref
    registry, rest = ref.split("/", 1)
    repo, tag = rest.rsplit(":", 1)
    req = urllib.request.Request(
        f"http://{registry}/v2/{repo}/manifests/{tag}", method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        digest = r.headers["Docker-Content-Digest"]
    assert lab.image.endswith("@" + digest), (lab.image, digest)


def test_dev_stack_gateway_tag_points_at_the_lab_gateway_image(lab):
    """Pulumi.dev.yaml's gateway.image.ref is the tag `up` points at the gateway image it built
    from Debian's haproxy package (lab/image.py ensure_gateway_image)."""
    ref = _dev_config()["gateway"]["image"]["ref"]
    assert ref == lab.cfg["gatewayImage"]["tag"] and "@" not in ref
    registry, rest = ref.split("/", 1)
    repo, tag = rest.rsplit(":", 1)
    req = urllib.request.Request(
        f"http://{registry}/v2/{repo}/manifests/{tag}", method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        digest = r.headers["Docker-Content-Digest"]
    assert lab.cfg["gatewayImage"]["ref"].endswith("@" + digest), (lab.cfg["gatewayImage"],
                                                                     digest)
