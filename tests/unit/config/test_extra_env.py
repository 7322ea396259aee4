"""nccl.extraEnv (and a recipe's env/launcherEnv, merged into it): only the families that belong
there and a short documented list (issue 31, item 3).

The variables reach every Ray and vLLM container of every node. Accepted before:
VLLM_SERVER_DEV_MODE=1 (vLLM's development routes, outside the API key check), PYTHONPATH and
LD_PRELOAD pointing into the model cache (a model repo's own code run although
--trust-remote-code is refused). Now NCCL_*, UCX_* and GLOO_* (but not the ones that name a
library, a plugin or a file) and config.types.EXTRA_ENV_NAMES; anything else is a key-path
error naming the variable.
"""

from __future__ import annotations

import pytest
import yaml

from config import ConfigError, recipe_files, validate_config
from config.types import EXTRA_ENV_NAMES
from tests.conftest import config_raw

REFUSED = [
    "VLLM_SERVER_DEV_MODE", "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONSTARTUP",
    "PYTHONHOME", "VLLM_PLUGINS", "VLLM_NCCL_SO_PATH", "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "VLLM_LOGGING_CONFIG_PATH", "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_USE_MODELSCOPE",
    "VLLM_DEBUG_DUMP_PATH", "TRANSFORMERS_TRUST_REMOTE_CODE", "HF_HUB_ENABLE_HF_TRANSFER",
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN",
    "NCCL_CONF_FILE", "NCCL_DEBUG_FILE", "NCCL_TOPO_FILE", "NCCL_GRAPH_DUMP_FILE",
    "UCX_MODULE_DIR", "UCX_LOG_FILE", "UCX_MODULES", "GLOO_PLUGIN", "RAY_ADDRESS", "PATH",
    "BASH_ENV", "ENV", "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR", "X_Y",
]
ACCEPTED = ["NCCL_IB_GID_INDEX", "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL", "NCCL_IB_TIMEOUT",
            "UCX_TLS", "UCX_RNDV_THRESH", "GLOO_DEVICE_TRANSPORT", "PYTORCH_ALLOC_CONF",
            "VLLM_LOGGING_LEVEL"]


def _with_env(env: dict[str, str]) -> dict:
    raw = config_raw(2)
    raw["nccl"] = {**raw["nccl"], "extraEnv": env}
    return raw


@pytest.mark.parametrize("name", REFUSED)
def test_a_variable_outside_the_allowed_families_is_refused_by_key_path(name):
    with pytest.raises(ConfigError) as exc:
        validate_config(_with_env({name: "/root/.cache/huggingface/hub/x" if "PATH" in name
                                   or "DIR" in name or "FILE" in name else "1"}))
    (problem,) = exc.value.problems
    assert problem.startswith("spark-vllm:nccl.extraEnv: got "), problem
    assert f"({name})" in problem or f"{name})" in problem, problem
    assert "expected only NCCL_*, UCX_*, GLOO_*" in problem, problem


@pytest.mark.parametrize("name", ACCEPTED)
def test_the_allowed_families_and_names_are_kept(name):
    assert validate_config(_with_env({name: "3"})).nccl.extra_env[name] == "3"


def test_the_short_list_is_documented_one_by_one():
    """Each exact name carries its reason (docs/design.md shows the list)."""
    assert EXTRA_ENV_NAMES and all(len(why) > 20 for why in EXTRA_ENV_NAMES.values())
    assert not any(n.startswith(("NCCL_", "UCX_", "GLOO_")) for n in EXTRA_ENV_NAMES)


def test_a_recipe_cannot_bring_what_the_stack_file_may_not(tmp_path, monkeypatch):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({
        "name": "bad", "description": "d", "model": "org/m",
        "sources": [{"path": "lab/tinymodel.py", "covers": "everything"}],
        "env": {"VLLM_SERVER_DEV_MODE": "1"}, "launcherEnv": {"LD_PRELOAD": "/x.so"}}))
    monkeypatch.setattr(recipe_files, "RECIPES_DIR", tmp_path)
    raw = config_raw(2)
    raw["vllm"]["recipe"] = "bad"
    with pytest.raises(ConfigError) as exc:
        validate_config(raw)
    text = "\n".join(exc.value.problems)
    assert "spark-vllm:vllm.recipe" in text
    assert "recipe bad: env: " in text and "VLLM_SERVER_DEV_MODE" in text
    assert "recipe bad: launcherEnv: " in text and "LD_PRELOAD" in text



# Issue 46, item 10, verified in the libraries' sources (config.types.EXTRA_ENV_REFUSED names
# where): UCX runs UCX_GDB_COMMAND (execvp) when UCX_HANDLE_ERRORS has `debug` and an error is
# handled; UCX mails error reports (sendmail) to UCX_ERROR_MAIL_TO; UCX_STATS_DEST and
# UCX_MEMTRACK_DEST write a file or send to a host; NCCL's RAS listens at NCCL_RAS_ADDR and its
# bootstrap root at NCCL_COMM_ID, NCCL_OOB_NET_IFNAME picks the bootstrap's interface. They
# passed as members of the NCCL_/UCX_ families.
COMMANDS_AND_LISTENERS = {
    "UCX_GDB_COMMAND": "sh -c id", "UCX_HANDLE_ERRORS": "debug",
    "UCX_ERROR_MAIL_TO": "someone@example.com", "UCX_ERROR_MAIL_FOOTER": "x",
    "UCX_STATS_DEST": "udp:203.0.113.9:7777", "UCX_MEMTRACK_DEST": "file:/tmp/x",
    "NCCL_RAS_ADDR": "0.0.0.0:28028", "NCCL_COMM_ID": "0.0.0.0:29500",
    "NCCL_OOB_NET_IFNAME": "enP7s7",
}


@pytest.mark.parametrize("name", sorted(COMMANDS_AND_LISTENERS))
def test_a_variable_that_runs_a_command_or_chooses_a_listener_is_refused_with_its_reason(name):
    from config.types import EXTRA_ENV_REFUSED

    with pytest.raises(ConfigError) as exc:
        validate_config(_with_env({name: COMMANDS_AND_LISTENERS[name]}))
    (problem,) = exc.value.problems
    assert problem.startswith("spark-vllm:nccl.extraEnv: got "), problem
    assert f"; {name}: {EXTRA_ENV_REFUSED[name]}" in problem, problem


def test_the_gdb_command_pair_is_refused_together():
    with pytest.raises(ConfigError) as exc:
        validate_config(_with_env({"UCX_HANDLE_ERRORS": "debug", "UCX_GDB_COMMAND": "sh -c id"}))
    (problem,) = exc.value.problems
    assert "(UCX_GDB_COMMAND, UCX_HANDLE_ERRORS)" in problem, problem
    # a recipe's env is judged the same way (tests/unit/config/test_recipes.py, "listener-env")


@pytest.mark.parametrize("name", ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE",
                                  "NCCL_DEBUG", "UCX_NET_DEVICES", "GLOO_SOCKET_IFNAME"])
def test_the_stacks_own_variables_cannot_be_overridden(name):
    """extraEnv came last in a node's environment (components/nccl.node_env) and replaced what
    the stack derived: NCCL_SOCKET_IFNAME=enP7s7 moved NCCL to the management interface."""
    with pytest.raises(ConfigError) as exc:
        validate_config(_with_env({name: "enP7s7"}))
    (problem,) = exc.value.problems
    assert problem.startswith("spark-vllm:nccl.extraEnv: got "), problem
    assert f"expected variables the stack does not set itself ({name})" in problem, problem
