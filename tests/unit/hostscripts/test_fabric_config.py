"""The fabric's netplan file and scripts as text (hostscripts/fabric_config.py); the netplan
file is validated by the real netplan (Debian's netplan.io, installed by `make setup`), as the
node does before writing it. Running the scripts: tests/lab/test_fabric_script.py."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from hostscripts.fabric_config import InterfaceSpec, apply_script, netplan_sha256, netplan_yaml

SPEC = InterfaceSpec(node="spark-1", stack="dev", interface="enP2p1s0f1np1",
                     address="192.168.178.11/24", mtu=9000)


def generate(tmp_path, text: str) -> subprocess.CompletedProcess:
    netplan = shutil.which("netplan") or "/usr/sbin/netplan"
    folder = tmp_path / "etc" / "netplan"
    folder.mkdir(parents=True)
    (folder / "40-spark-vllm-dev-enP2p1s0f1np1.yaml").write_text(text)
    (folder / "40-spark-vllm-dev-enP2p1s0f1np1.yaml").chmod(0o600)
    return subprocess.run([netplan, "generate", "--root-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_file_is_one_the_real_netplan_accepts(tmp_path):
    done = generate(tmp_path, netplan_yaml(SPEC))
    assert done.returncode == 0, done.stderr
    network = (tmp_path / "run" / "systemd" / "network" /
               "10-netplan-enP2p1s0f1np1.network").read_text()
    assert "Address=192.168.178.11/24" in network and "MTUBytes=9000" in (
        tmp_path / "run" / "systemd" / "network" / "10-netplan-enP2p1s0f1np1.link").read_text()


def test_the_real_netplan_rejects_what_the_check_exists_for(tmp_path):
    done = generate(tmp_path, netplan_yaml(SPEC).replace("/24", "/33"))
    assert done.returncode != 0 and "invalid prefix length" in done.stderr


def test_the_digest_recon_compares_is_the_files():
    assert netplan_sha256(SPEC) == hashlib.sha256(netplan_yaml(SPEC).encode()).hexdigest()
    assert SPEC.path == "/etc/netplan/40-spark-vllm-dev-enP2p1s0f1np1.yaml"


def test_a_value_that_is_not_cidr_never_becomes_a_file():
    with pytest.raises(ValueError):
        netplan_yaml(InterfaceSpec("spark-1", "dev", "enp1s0f1np1", "192.168.177.11", 9000))


def test_every_value_reaches_the_script_quoted():
    odd = InterfaceSpec(node="spark-1", stack="dev", interface="enp1s0f1np1",
                        address="192.168.177.11/24", mtu=9000)
    script = apply_script(odd)
    assert "iface=enp1s0f1np1; addr=192.168.177.11/24; mtu=9000; file=" \
           "/etc/netplan/40-spark-vllm-dev-enp1s0f1np1.yaml" in script
    assert script.startswith("set -eu\n") and "netplan generate --root-dir" in script
    assert "netplan apply" not in script  # every interface of the node would be restarted
