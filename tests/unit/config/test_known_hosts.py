"""Host keys pinned through an OpenSSH known_hosts file (ssh.knownHostsFile)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from config import ConfigError, known_host_keys, pin_host_keys, validate_config
from tests.conftest import config_raw

ED = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ5yb4OZjqMklGL4RaqzBcg89ST1l71k"
EC = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBA"
RSA = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC"


def hashed(host: str) -> str:
    salt = b"0123456789abcdefghij"
    mac = hmac.new(salt, host.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


def test_plain_hashed_and_port_forms_are_matched_and_ed25519_is_preferred():
    text = "\n".join([
        "# comment",
        f"10.77.0.11 {RSA}",
        f"10.77.0.11,spark-1 {EC}",
        f"{hashed('10.77.0.11')} {ED}",
        f"[10.77.0.12]:2222 {ED}",
        f"@revoked 10.77.0.13 {ED}",
        f"@cert-authority * {ED}",
        f"10.77.0.14 {ED} trailing comment",
        "garbage",
    ])
    assert known_host_keys(text, "10.77.0.11", 22) == [ED, EC]  # RSA can never be pinned
    assert known_host_keys(text, "10.77.0.12", 22) == []
    assert known_host_keys(text, "10.77.0.12", 2222) == [ED]
    assert known_host_keys(text, "10.77.0.13", 22) == []  # revoked is not a pin
    assert known_host_keys(text, "10.77.0.14", 22) == [ED]


def _raw_without_keys(path: str | None):
    raw = config_raw(2)
    for n in raw["nodes"]:
        del n["hostKey"]
    raw["ssh"] = {**raw["ssh"], "knownHostsFile": path}
    return raw


def test_nodes_without_host_key_are_pinned_from_the_file(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"10.77.0.11 {ED}\n10.77.0.12 {EC}\n")
    cfg = pin_host_keys(validate_config(_raw_without_keys(str(kh))))
    assert [n.host_key for n in cfg.nodes] == [ED, EC]
    assert cfg.nodes[1].pinned_host_key == EC


def test_an_inline_key_wins_over_the_file(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"10.77.0.11 {EC}\n10.77.0.12 {EC}\n")
    raw = _raw_without_keys(str(kh))
    raw["nodes"][0]["hostKey"] = ED
    cfg = pin_host_keys(validate_config(raw))
    assert [n.host_key for n in cfg.nodes] == [ED, EC]


def test_a_node_missing_from_the_file_is_named(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"10.77.0.11 {ED}\n")
    with pytest.raises(ConfigError) as err:
        pin_host_keys(validate_config(_raw_without_keys(str(kh))))
    assert err.value.problems == [
        f"spark-vllm:nodes[1].hostKey: missing (no entry for 10.77.0.12 port 22 in {kh}); "
        "expected the node's SSH host key ('ssh-keyscan -t ed25519 <host>' without the host "
        "name) or a known_hosts file that lists it"
    ]


def test_no_key_and_no_file_and_an_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        pin_host_keys(validate_config(_raw_without_keys(None)))
    assert len(err.value.problems) == 2
    assert all("spark-vllm:ssh.knownHostsFile is not set" in p for p in err.value.problems)
    with pytest.raises(ConfigError) as err:
        pin_host_keys(validate_config(_raw_without_keys(str(tmp_path / "absent"))))
    assert err.value.problems[0].startswith("spark-vllm:ssh.knownHostsFile: got ")
    assert "expected a readable known_hosts file" in err.value.problems[0]
