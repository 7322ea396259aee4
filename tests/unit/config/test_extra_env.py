"""nccl.extraEnv (and a recipe's env/launcherEnv, merged into it): the families of the libraries
the stack runs, less what loads code or opens a door (issue 31, item 3; issue 44, item 2).

The variables reach every Ray and vLLM container of every node. Accepted before issue 31:
VLLM_SERVER_DEV_MODE=1 (vLLM's development routes, outside the API key check), PYTHONPATH and
LD_PRELOAD pointing into the model cache (a model repo's own code run behind the stack's back).
Refused before issue 44: every VLLM_* variable but a hand list, so 61 real recipe variables
(VLLM_ALLOW_LONG_MAX_MODEL_LEN, TORCH_NCCL_ASYNC_ERROR_HANDLING, OMP_NUM_THREADS, ...). Now the
VLLM_*, TORCH_*, PYTORCH_*, OMP_*, CUDA_*, NCCL_*, UCX_* and GLOO_* families pass, less the names
that load code or name a file, folder, address or command and config.types.EXTRA_ENV_DENIED;
whether the image's vLLM knows a VLLM_* name is the serve check's to say
(tests/unit/hostscripts/test_serve_check.py). Anything else is a key-path error naming the
variable and why.
"""

from __future__ import annotations

import re

import pytest
import yaml

from config import ConfigError, recipe_files, validate_config
from config.types import EXTRA_ENV_DENIED, EXTRA_ENV_FAMILIES, STACK_ENV, extra_env_problem
from tests.conftest import ROOT, config_raw

REFUSED = [
    # outside the families
    "PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONSTARTUP", "PYTHONHOME",
    "TRANSFORMERS_TRUST_REMOTE_CODE", "HF_HUB_ENABLE_HF_TRANSFER", "RAY_ADDRESS", "PATH",
    "BASH_ENV", "ENV", "TORCHINDUCTOR_CACHE_DIR", "X_Y", "B12X_MOE_FORCE_A8", "CUTE_DSL_ARCH",
    # vLLM's doors and code loaders (docs/design.md "What extraEnv may set")
    "VLLM_SERVER_DEV_MODE", "VLLM_PLUGINS", "VLLM_NCCL_SO_PATH", "VLLM_CUDART_SO_PATH",
    "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_USE_MODELSCOPE", "VLLM_DEBUG_DUMP_PATH",
    "VLLM_PORT", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT", "VLLM_DP_SIZE",
    "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_USAGE_STATS_SERVER", "VLLM_TUNED_CONFIG_FOLDER",
    "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY", "VLLM_TRACE_FUNCTION", "VLLM_ASSETS_CACHE",
    # the libraries' plugins, files, addresses and commands
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN",
    "NCCL_CONF_FILE", "NCCL_DEBUG_FILE", "NCCL_TOPO_FILE", "NCCL_GRAPH_DUMP_FILE",
    "NCCL_RAS_ADDR", "NCCL_COMM_ID", "UCX_MODULE_DIR", "UCX_LOG_FILE", "UCX_MODULES",
    "UCX_GDB_COMMAND", "GLOO_PLUGIN", "CUDA_VISIBLE_DEVICES", "CUDA_INJECTION64_PATH",
    "CUDA_HOME", "TORCH_HOME", "TORCH_EXTENSIONS_DIR", "OMP_TOOL_LIBRARIES",
    "PYTORCH_KERNEL_CACHE_PATH",
]
# what real recipes set (tests/fixtures/community_recipes/real) and what the stack's own
# recipes set
ACCEPTED = ["NCCL_IB_GID_INDEX", "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL", "NCCL_IB_TIMEOUT",
            "UCX_TLS", "UCX_RNDV_THRESH", "GLOO_DEVICE_TRANSPORT", "PYTORCH_ALLOC_CONF",
            "PYTORCH_CUDA_ALLOC_CONF", "VLLM_LOGGING_LEVEL", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
            "VLLM_USE_FLASHINFER_MOE_FP4", "VLLM_FLASHINFER_ALLREDUCE_BACKEND",
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "VLLM_MARLIN_USE_ATOMIC_ADD",
            "VLLM_DISABLE_COMPILE_CACHE", "VLLM_KV_CACHE_LAYOUT", "VLLM_FLASHINFER_MOE_BACKEND",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "CUDA_LAUNCH_BLOCKING",
            # NCCL's socket tuning (issue 51's lab test sets the first): no address in them
            "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"]


def _with_env(env: dict[str, str]) -> dict:
    raw = config_raw(2)
    raw["nccl"] = {**raw["nccl"], "extraEnv": env}
    return raw


@pytest.mark.parametrize("name", REFUSED)
def test_a_variable_that_loads_code_or_opens_a_door_is_refused_by_name(name):
    with pytest.raises(ConfigError) as exc:
        validate_config(_with_env({name: "/root/.cache/huggingface/hub/x" if "PATH" in name
                                   or "DIR" in name or "FILE" in name else "1"}))
    (problem,) = exc.value.problems
    assert problem.startswith("spark-vllm:nccl.extraEnv: got "), problem
    if name in STACK_ENV:  # the stack's own (VLLM_PORT, RAY_ADDRESS...): said so first
        assert f"expected variables the stack does not set itself ({name})" in problem, problem
        return
    assert f"({name}: " in problem or f"; {name}: " in problem, problem
    assert f"{name}: {extra_env_problem(name)}" in problem, problem
    assert "expected only VLLM_*, TORCH_*, PYTORCH_*, OMP_*, CUDA_*, NCCL_*" in problem, problem


@pytest.mark.parametrize("name", ACCEPTED)
def test_the_families_pass(name):
    assert validate_config(_with_env({name: "3"})).nccl.extra_env[name] == "3"


def test_each_denied_name_is_documented_with_its_reason_and_is_of_a_family():
    assert EXTRA_ENV_DENIED and all(len(why) > 20 for why in EXTRA_ENV_DENIED.values())
    assert all(n.startswith(EXTRA_ENV_FAMILIES) for n in EXTRA_ENV_DENIED)
    design = (ROOT / "docs" / "design.md").read_text()
    for name in EXTRA_ENV_DENIED:
        assert f"`{name}`" in design, name


def test_the_deny_list_covers_every_door_the_security_design_names():
    """Every variable docs/design.md's "What extraEnv may set" names as a door is refused."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design.split('### What extraEnv may set', 1)[1].split("\n### ", 1)[0]
    section = section.split("less two kinds of names:", 1)[1].split("Of vLLM 0.32.0's", 1)[0]
    named = set(re.findall(r"`((?:VLLM|NCCL|UCX|CUDA|TORCH|OMP)_[A-Z0-9_]+)`", section))
    assert {"VLLM_SERVER_DEV_MODE", "VLLM_PLUGINS", "VLLM_ALLOW_INSECURE_SERIALIZATION"} <= named
    assert all(extra_env_problem(n) is not None for n in named), \
        [n for n in named if extra_env_problem(n) is None]


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
    assert f"{name}: {EXTRA_ENV_REFUSED[name]}" in problem, problem


def test_the_gdb_command_pair_is_refused_together():
    with pytest.raises(ConfigError) as exc:
        validate_config(_with_env({"UCX_HANDLE_ERRORS": "debug", "UCX_GDB_COMMAND": "sh -c id"}))
    (problem,) = exc.value.problems
    assert "(UCX_GDB_COMMAND: " in problem and "; UCX_HANDLE_ERRORS: " in problem, problem
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
