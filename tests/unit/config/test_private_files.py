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
