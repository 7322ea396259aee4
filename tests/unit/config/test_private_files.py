"""config.ssh.write_private: the SSH key and known_hosts files are the only plaintext secrets
on the machine that runs Pulumi; a planted symlink or a loose mode must not leak them."""

from __future__ import annotations

import os
import stat

import pytest

from config.ssh import write_private


def test_a_symlink_planted_at_the_path_is_replaced_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    key = home / "key"
    key.symlink_to(target)
    write_private(key, "SECRET")
    assert target.read_text() == "untouched"
    assert not key.is_symlink() and key.read_text() == "SECRET"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_an_existing_loose_file_ends_up_0600(tmp_path):
    key = tmp_path / "key"
    key.write_text("old")
    os.chmod(key, 0o644)
    write_private(key, "new")
    assert key.read_text() == "new" and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["key"]  # no temporary file left


def test_a_symlinked_folder_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(OSError, match="is a symlink; refusing to write a private file there"):
        write_private(tmp_path / "link" / "key", "SECRET")
    assert list(real.iterdir()) == []


def test_a_node_taken_out_keeps_its_pinned_key_for_the_deletes(tmp_path, monkeypatch):
    """The engine deletes a removed node's containers through the provider settings in the
    state, which name the stack's known_hosts file: the removed node's alias line stays; a node
    of the same name back in the config gets its configured key."""
    from components.spark_node import write_known_hosts
    from config import validate_config
    from tests.conftest import config_raw

    monkeypatch.setenv("SPARK_VLLM_HOME", str(tmp_path))
    three = validate_config(config_raw(3))
    path = write_known_hosts(three, "p", "s")
    spark3 = [ln for ln in path.read_text().splitlines() if ln.startswith("spark-vllm-spark-3 ")]
    assert len(spark3) == 1
    two = write_known_hosts(validate_config(config_raw(2)), "p", "s").read_text().splitlines()
    assert spark3[0] in two, "the removed node's pinned key must stay for its deletes"
    assert [ln for ln in two if ln.startswith("spark-vllm-spark-1 ")] == [
        ln for ln in path.read_text().splitlines() if ln.startswith("spark-vllm-spark-1 ")]
    # back with another key: the configured key, once
    raw = config_raw(3)
    other = "ssh-ed25519 " + "A" * 68
    raw["nodes"][2]["hostKey"] = other
    back = write_known_hosts(validate_config(raw), "p", "s").read_text().splitlines()
    assert [ln for ln in back if ln.startswith("spark-vllm-spark-3 ")] == [
        f"spark-vllm-spark-3 {other}"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
