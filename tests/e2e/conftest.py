"""End-to-end fixtures: the real engine, real plugins, real SSH and Docker, against the lab.

The lab (lab/lab.py) is brought up once per session (idempotent) and the dev stack's config is
written into a temporary copy of the project's stack files, so the repository's Pulumi.dev.yaml
is never modified by a test run. The program is the project's own `__main__.py`, run inline
through the Automation API (scripts/stackctl.py), with a file backend in a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from lab.deployments import (
    LAB_CACHE,
    _plugin_installed,
    destroy_unless_kept,
    lab,
    lock_lab,
    new_deployment,
    remove_leftover_stack_containers,
)


@pytest.fixture(scope="session")
def lab_cfg():
    """Bring the 2-node lab up (idempotent) and return what it wrote to stack.json."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    if shutil.which("pulumi") is None:
        pytest.skip("the Pulumi CLI is not on PATH: run `make setup`")
    for name in ("command", "docker"):
        if not _plugin_installed(name):
            pytest.skip(f"resource plugin {name} is not installed (see toolchain status.json)")
    held = lock_lab()  # released when the session's process ends
    t0 = time.monotonic()
    lab("up", "--nodes", os.environ.get("E2E_NODES", "2"))
    print(f"lab up: {time.monotonic() - t0:.1f} s")
    cfg = json.loads((LAB_CACHE / "stack.json").read_text())
    remove_leftover_stack_containers(cfg)
    yield json.loads((LAB_CACHE / "stack.json").read_text())
    held.close()


@pytest.fixture(scope="module")
def deployment(lab_cfg, tmp_path_factory):
    """A fresh dev stack on a file backend in a temporary folder; destroyed at the end."""
    d = new_deployment(tmp_path_factory.mktemp("e2e"), lab_cfg)
    yield d
    destroy_unless_kept(d)
