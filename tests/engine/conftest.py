"""Fixtures for tests that drive the real Pulumi engine through the Automation API.

They use the toolchain `make setup` installed (scripts/toolchain.sh: Pulumi's own CLI, language
host and plugins) and a file backend in a temporary folder: no Pulumi Cloud, no network. A
missing binary fails the test: the engine tier exists to prove Pulumi's own binaries.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("SPARK_VLLM_CACHE", Path.home() / ".cache" / "spark-vllm"))
TOOLCHAIN = CACHE / "toolchain"

# The Automation API looks `pulumi` up on this process's PATH (not the workspace env_vars), and
# the dynamic-provider shim runs `python3` from PATH: put the toolchain and this venv first.
os.environ["PATH"] = os.pathsep.join(
    [str(TOOLCHAIN / "bin"), os.path.dirname(sys.executable), os.environ.get("PATH", "")]
)


def toolchain_status() -> dict:
    try:
        return json.loads((TOOLCHAIN / "status.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture(scope="session")
def pulumi_bin() -> Path:
    """The Pulumi CLI `make setup` installed (a missing CLI fails the engine tier)."""
    candidate = TOOLCHAIN / "bin" / "pulumi"
    if candidate.exists():
        return candidate
    found = shutil.which("pulumi")
    if found:
        return Path(found)
    pytest.fail("the Pulumi CLI is not installed: run `make setup` (scripts/toolchain.sh)")


def _require_plugin(name: str, version: str) -> None:
    """Pulumi's own plugin must be installed: `make test` runs `make setup` first, so a missing
    plugin is a failure of the set-up, never a reason to skip."""
    home = Path(os.environ.get("PULUMI_HOME", Path.home() / ".pulumi"))
    if (home / "plugins" / f"resource-{name}-v{version}" / f"pulumi-resource-{name}").exists():
        return
    entry = toolchain_status().get("plugins", {}).get(name)
    pytest.fail(f"resource plugin {name} {version} is not installed in {home} (toolchain "
                f"status: {entry}); run `make setup`")


@pytest.fixture
def engine_env(tmp_path: Path, pulumi_bin: Path) -> dict[str, str]:
    """Environment for a LocalWorkspace: file backend in tmp, fixed passphrase, offline."""
    state = tmp_path / "state"
    state.mkdir()
    return {
        "PULUMI_BACKEND_URL": f"file://{state}",
        "PULUMI_CONFIG_PASSPHRASE": "spark-vllm-test",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_HOME": os.environ.get("PULUMI_HOME", str(Path.home() / ".pulumi")),
    }


@pytest.fixture
def require_plugin():
    """Call with (name, version): skips the test when that resource plugin is unavailable."""
    return _require_plugin
