"""scripts/host_packages.sh: the Debian packages the unit tier runs for real (haproxy), installed
by `make setup` when missing. Run here with a package name no machine has and stand-ins for
`id` and `apt-get` on PATH: nothing of this machine's packages (or /usr/sbin) is touched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import HAPROXY_MISSING, ROOT

SCRIPT = ROOT / "scripts" / "host_packages.sh"
PKG = "svllm-no-such-tool"


def _stub(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text("#!/bin/sh\n" + body + "\n")
    (folder / name).chmod(0o755)


def _run(tmp_path: Path, uid: int, installs: bool = True):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "apt.log"
    _stub(bin_, "id", f"echo {uid}")
    # apt-get records its calls; its `install` makes the binary when told to
    make = f'touch "{bin_}/{PKG}"; chmod 755 "{bin_}/{PKG}"' if installs else ":"
    _stub(bin_, "apt-get", f'echo "$*" >> "{log}"\ncase "$*" in *install*) {make};; esac')
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "SPARK_VLLM_HOST_PACKAGES": PKG,
           "POLICY_RC_D": str(tmp_path / "policy-rc.d"), "HOME": os.environ.get("HOME", "/")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return done, calls


def test_as_root_a_missing_package_is_installed_after_one_update(tmp_path):
    done, calls = _run(tmp_path, 0)
    assert done.returncode == 0, done.stderr
    assert calls == ["update -qq", f"install -y -qq --no-install-recommends {PKG}"], calls
    assert f"{PKG} installed" in done.stdout
    # no service was let start during the install, and the guard is gone afterwards
    assert not (tmp_path / "policy-rc.d").exists()


def test_as_root_an_install_that_leaves_it_missing_fails(tmp_path):
    done, calls = _run(tmp_path, 0, installs=False)
    assert done.returncode == 1 and f"{PKG} still missing" in done.stderr, done.stderr
    assert len(calls) == 2  # one update, one install: no retry loop


def test_not_root_it_says_how_and_installs_nothing(tmp_path):
    done, calls = _run(tmp_path, 1000)
    assert done.returncode == 0 and calls == []
    assert ("As root: make setup, or: apt-get update && apt-get install -y "
            f"--no-install-recommends {PKG}") in done.stderr, done.stderr


def test_present_packages_cost_nothing(tmp_path):
    bin_ = tmp_path / "bin"
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{bin_}:/usr/bin:/bin:/usr/sbin:/sbin",
                               "SPARK_VLLM_HOST_PACKAGES": "sh"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_setup_runs_it_and_the_tests_name_the_same_way():
    makefile = (ROOT / "Makefile").read_text()
    assert "\nsetup: venv toolchain host-packages " in makefile
    assert "\tscripts/host_packages.sh\n" in makefile
    assert "make setup" in HAPROXY_MISSING and "--no-install-recommends haproxy" in HAPROXY_MISSING


def test_without_haproxy_the_gateway_tests_fail_never_skip(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setattr(os, "access", lambda _path, _mode: False)
    with pytest.raises(pytest.fail.Exception) as failed:
        conftest.haproxy_binary()
    assert str(failed.value) == HAPROXY_MISSING
