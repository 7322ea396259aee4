"""config/serve.py: one declaration per serve key, and everything generated from it agrees with
it: the keys of `spark-vllm:vllm`, what promotion carries, a recipe's keys, a service's keys, the
flags extraArgs may not set, `vllm serve`'s argv and the README's table."""

from __future__ import annotations

import re

import pytest

from config import ConfigError, ServeSettings, ServiceConfig, VllmConfig, validate_config
from config.recipes import Recipe
from config.serve import (
    ENVIRONMENT_KEYS,
    FORBIDDEN_FLAGS,
    OWNED_FLAGS,
    PROMOTED_KEYS,
    RECIPE_FIELDS,
    SERVE_KEYS,
    SERVICE_FIELDS,
    Argv,
    markdown_table,
)
from hostscripts.vllm import mp_node_flags, vllm_argv
from tests.conftest import ROOT, config_raw
from tests.serve_samples import (
    COMMIT,
    SAMPLES,
    TEMPLATE,
    pinned,
    recipes_with_template,
    sample_vllm,
)
from tools import promote

KEYS = [k.key for k in SERVE_KEYS]


def test_every_vllm_key_is_promoted_or_the_environments():
    """The promise of tools/promote.py: every `vllm.*` key travels, but the environment's."""
    vllm_keys = set(VllmConfig.accepted_keys())
    assert set(KEYS) == vllm_keys
    missing = vllm_keys - set(PROMOTED_KEYS) - set(ENVIRONMENT_KEYS)
    assert not missing, f"vllm.* keys neither promoted nor the environment's: {missing}"
    assert not set(PROMOTED_KEYS) & set(ENVIRONMENT_KEYS)
    assert set(ENVIRONMENT_KEYS) == {"host", "port", "tensorParallelSize",
                                     "pipelineParallelSize", "masterPort"}
    assert len(PROMOTED_KEYS) == 22 and len(vllm_keys) == 27
    assert promote.PROMOTED_VLLM_KEYS == PROMOTED_KEYS
    assert promote.ENV_VLLM_KEYS == ENVIRONMENT_KEYS


def test_every_key_has_a_sample():
    """Adding a flag is its declaration plus its sample (tests/serve_samples.py), which the argv,
    promotion and round-trip tests use."""
    assert list(SAMPLES) == KEYS


@pytest.mark.parametrize("key", KEYS)
def test_each_key_puts_its_flag_on_the_command_line(key, tmp_path, monkeypatch):
    recipes_with_template(tmp_path, monkeypatch)
    k = next(k for k in SERVE_KEYS if k.key == key)
    value, tokens = SAMPLES[key]
    base = ServeSettings(served_model_name="m", tensor_parallel_size=2, host="127.0.0.1")
    plain = vllm_argv(base, model="org/m", commit=COMMIT)
    argv = vllm_argv(base.model_copy(update={k.name: value}), model="org/m", commit=COMMIT)
    if tokens:
        at = next(i for i in range(len(argv)) if argv[i:i + len(tokens)] == tokens)
        assert at >= 3, argv  # after `vllm serve <model>`
    else:  # nothing of its own: the command line is the plain one
        assert argv == plain
    # the spellings vLLM reads as this key's flag are refused in extraArgs
    for flag in (k.flag.flag, *k.flag.spellings) if k.flag.flag else ():
        assert OWNED_FLAGS[flag].startswith(f"spark-vllm:vllm.{key}"), flag
    if k.flag.argv is Argv.NODE:  # masterPort: in the node's place with mp
        assert "29600" in mp_node_flags(2, 1, "192.168.177.11", value)


def test_the_command_line_keeps_its_order():
    """The model, its name and commit, the flags in declaration order, a node's place, where it
    listens, the extra args: the goldens hold the exact lines, this holds the rule."""
    settings = ServeSettings(served_model_name="m", tensor_parallel_size=2, host="127.0.0.1",
                             extra_args=["--disable-log-stats"])
    argv = vllm_argv(settings, model="org/m", commit=COMMIT, node_flags=["--headless"])
    assert argv[:7] == ["vllm", "serve", "org/m", "--served-model-name", "m", "--revision",
                        COMMIT]
    assert argv[-6:] == ["--headless", "--host", "127.0.0.1", "--port", "8000",
                         "--disable-log-stats"]
    flags = [a for a in argv if a.startswith("--")]
    declared = [k.flag.flag for k in SERVE_KEYS if k.flag.flag]
    order = [f for f in flags if f in declared or f.removeprefix("--no-") in
             {d.removeprefix("--") for d in declared}]
    assert order == sorted(order, key=lambda f: next(
        i for i, d in enumerate(declared) if f in (d, "--no-" + d.removeprefix("--"))))
    with pytest.raises(ValueError, match="tensor_parallel_size is not resolved"):
        vllm_argv(ServeSettings(served_model_name="m", host="127.0.0.1"), model="org/m",
                  commit=COMMIT)
    # no --host would be every address: an unresolved host is refused, never left out
    with pytest.raises(ValueError, match="host is not resolved"):
        vllm_argv(ServeSettings(served_model_name="m", tensor_parallel_size=2), model="org/m",
                  commit=COMMIT)


def test_a_service_runs_in_one_process_whatever_the_stacks_executor():
    settings = ServeSettings(served_model_name="m", tensor_parallel_size=1, executor="mp",
                             host="127.0.0.1")
    argv = vllm_argv(settings, model="org/m", commit=COMMIT, backend="uni")
    assert argv[argv.index("--distributed-executor-backend") + 1] == "uni"


def test_owned_flags_are_the_declarations_and_the_stacks_own():
    declared = {f for k in SERVE_KEYS for f in (k.flag.flag, *k.flag.spellings) if f}
    stack_own = {"--api-key", "--model", "--revision", "--code-revision", "--download-dir",
                 "--spec-model", "--spec-method", "--nnodes", "-n", "--node-rank", "-r",
                 "--master-addr", "--headless", "--ssl-keyfile", "--ssl-certfile",
                 "--ssl-ca-certs", "--enable-ssl-refresh", "--ssl-cert-reqs", "--ssl-ciphers"}
    assert set(OWNED_FLAGS) == declared | stack_own and not declared & stack_own
    # 0.18.0's hand-written table had 41; trustRemoteCode's flag moved from the stack's own to
    # its key; the code revision, the --spec-* shorthands, vLLM's own TLS (the gateway's) and
    # reasoningParserPlugin's flag
    assert len(OWNED_FLAGS) == 51
    assert not set(OWNED_FLAGS) & set(FORBIDDEN_FLAGS)
    assert OWNED_FLAGS["--chat-template"] == (
        "spark-vllm:vllm.chatTemplate (a template shipped in config/recipes_data/)")


def test_a_recipe_takes_exactly_the_recipe_keys():
    own = ["name", "description", "model", "sources", "env", "launcherEnv"]
    recipe_keys = [k.key for k in SERVE_KEYS if k.flag.recipe]
    assert Recipe.accepted_keys() == [*own, *recipe_keys]
    assert [k.name for k in SERVE_KEYS if k.flag.recipe] == list(RECIPE_FIELDS)
    # a recipe never sets what names the model, where it runs or the recipe itself
    assert not {"servedModelName", "recipe", "executor", "host", "port", "tensorParallelSize",
                "pipelineParallelSize", "masterPort"} & set(recipe_keys)


SERVICE = {"name": "embed", "repo": "org/e", "task": "embed", "port": 8001,
           "gpuMemoryUtilization": 0.05}


@pytest.mark.parametrize("key", [k.key for k in SERVE_KEYS if not k.flag.service])
def test_a_service_refuses_the_main_models_keys_as_unknown(key):
    raw = config_raw(2)
    raw["services"] = [{**SERVICE, key: SAMPLES[key][0]}]
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    (problem,) = err.value.problems
    assert problem.startswith(f"spark-vllm:services[0].{key}: unknown key; expected one of: "
                              "servedModelName, recipe, gpuMemoryUtilization, ")
    assert f" {key}," not in problem and "name, repo, revision, task, nodes" in problem


def test_a_service_takes_the_service_keys_and_a_recipes_share_of_them(tmp_path, monkeypatch):
    recipes_with_template(tmp_path, monkeypatch)
    service_keys = [k.key for k in SERVE_KEYS if k.flag.service]
    assert [a for a in ServiceConfig.accepted_keys() if a in KEYS] == service_keys
    assert set(SERVICE_FIELDS) == {k.name for k in SERVE_KEYS if k.flag.service}
    raw = config_raw(2)
    raw["services"] = [{**SERVICE, "revision": COMMIT, **sample_vllm(tuple(service_keys))}]
    svc = validate_config(raw).services[0]
    for key in service_keys:
        name = next(k.name for k in SERVE_KEYS if k.key == key)
        assert getattr(svc, name) == SAMPLES[key][0], key
    # a recipe fills in a service's keys only: the 122B recipe's languageModelOnly stays off
    raw["services"] = [{**SERVICE, "recipe": "qwen3.5-122b-a10b-fp8"}]
    svc = validate_config(raw).services[0]
    assert svc.max_num_batched_tokens == 8192 and svc.language_model_only is False
    assert svc.served_name == "embed" and svc.gpu_memory_utilization == 0.05


def test_the_whole_sample_is_a_valid_vllm_section(tmp_path, monkeypatch):
    recipes_with_template(tmp_path, monkeypatch)
    raw = pinned(config_raw(2))
    raw["vllm"] = sample_vllm()
    v = validate_config(raw).vllm
    for k in SERVE_KEYS:
        assert getattr(v, k.name) == SAMPLES[k.key][0], k.key
    assert v.chat_template == TEMPLATE


def test_the_readme_table_is_the_declaration():
    """README.md's serve keys table is markdown_table() (between its markers): regenerate it
    with `venv/bin/python -c 'from config.serve import markdown_table; print(markdown_table())'`
    when a key changes."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- serve-keys:begin[^\n]*-->\n(.*?)<!-- serve-keys:end -->", text,
                      re.S)
    assert found, "README.md has no serve-keys markers"
    assert found.group(1) == markdown_table()
