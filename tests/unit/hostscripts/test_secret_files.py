"""The secret files on the nodes (the Ray token, the API keys): root only, whatever was left
behind (issue 31, item 9). hostscripts.common.secret_file_write runs here in the local sh, in a
sandbox folder standing in for the stack's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hostscripts import common


def _write(path: Path, secret: str = "the-secret") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", common.secret_file_write(str(path), "token")],
                          input=secret, capture_output=True, text=True, timeout=30)


def test_a_leftover_new_file_does_not_give_the_secret_its_mode(tmp_path):
    """`cat > <file>.new` keeps the mode of a `.new` an interrupted run (or anyone) left: a 0644
    leftover made the secret world-readable after the rename."""
    path = tmp_path / "stack" / "ray" / "auth-token"
    path.parent.mkdir(parents=True)
    leftover = Path(f"{path}.new")
    leftover.write_text("half a secret")
    leftover.chmod(0o644)
    done = _write(path)
    assert done.returncode == 0, done.stderr
    assert path.read_text() == "the-secret"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert not leftover.exists()


def test_a_leftover_new_symlink_is_not_written_through(tmp_path):
    """A `.new` that is a symlink would carry the secret to wherever it points."""
    path = tmp_path / "stack" / "vllm" / "api-key"
    path.parent.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("untouched")
    os.symlink(elsewhere, f"{path}.new")
    done = _write(path)
    assert done.returncode == 0, done.stderr
    assert elsewhere.read_text() == "untouched"
    assert path.read_text() == "the-secret" and not path.is_symlink()
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_an_existing_secret_file_of_the_wrong_mode_is_replaced_by_a_private_one(tmp_path):
    path = tmp_path / "stack" / "api-key"
    path.parent.mkdir(parents=True)
    path.write_text("old")
    path.chmod(0o666)
    assert _write(path).returncode == 0
    assert oct(path.stat().st_mode & 0o777) == "0o600" and path.read_text() == "the-secret"
