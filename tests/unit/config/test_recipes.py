"""Recipes (config/recipes.py, config/recipes_data/): the shipped ones, precedence, and every bad
recipe or recipe value named by its key path."""

from __future__ import annotations

import copy
import fnmatch
import re
import tomllib

import pytest
import yaml

from config import ConfigError, StackConfig, load_recipe, recipe_files, recipes, validate_config
from config.recipes import STACK_ENV
from tests.conftest import ROOT, config_raw

DATA = ROOT / "config" / "recipes_data"
QWEN = "qwen3.5-122b-a10b-fp8"
TINY = "spark-lab-tiny-moe"


def stack(name: str) -> dict:
    data = yaml.safe_load((ROOT / f"Pulumi.{name}.yaml").read_text())["config"]
    return {k.split(":", 1)[1]: v for k, v in data.items()}


def problems(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    return err.value.problems


# ------------------------------------------------------------------------ the shipped recipes
def test_the_shipped_recipes_load_and_cite_pinned_sources():
    assert recipe_files.names() == [QWEN, TINY]
    assert recipe_files.chat_templates() == []  # none shipped: see test_no_chat_template_is_shipped
    for name in recipe_files.names():
        r = load_recipe(name)
        assert r.name == name and r.sources
        for s in r.sources:
            if s.url and s.url.startswith(("https://github.com/", "https://huggingface.co/")):
                assert re.search(r"/[0-9a-f]{40}/", s.url), s.url
            if s.path:
                assert (ROOT / s.path).is_file(), s.path


FIXED_TEMPLATE = ("https://github.com/eugr/spark-vllm-docker/blob/"
                  "d42c4199fa6c18c8a05980c36a6f8b93404266a8/mods/fix-qwen3.5-chat-template/"
                  "chat_template.jinja")


def test_no_chat_template_is_shipped():
    """The community's fixed Qwen3.5 template is third-party code: not copied into the product.
    The 122B recipe serves the model's own template and says where the fix is."""
    assert sorted(p.name for p in DATA.iterdir() if p.name.endswith(".jinja")) == []
    assert recipe_files.chat_templates() == []
    doc = yaml.safe_load((DATA / f"{QWEN}.yaml").read_text())
    assert "chatTemplate" not in doc and "chat_template" not in doc
    assert load_recipe(QWEN).chat_template is None
    assert "chat_template" not in load_recipe(QWEN).serve_settings()
    assert not any(s.url == FIXED_TEMPLATE for s in load_recipe(QWEN).sources)
    assert FIXED_TEMPLATE in (DATA / f"{QWEN}.yaml").read_text()  # the comment: where the fix is
    readme = (DATA / "README.md").read_text()
    assert "## Not shipped" in readme and FIXED_TEMPLATE in readme
    assert f"`{QWEN}.jinja`" not in readme


def test_the_122b_recipe_is_the_communitys_serve_line():
    r = load_recipe(QWEN)
    assert r.model == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert r.serve_settings() == {
        "gpu_memory_utilization": 0.7, "max_model_len": 262144, "max_num_seqs": 4,
        "max_num_batched_tokens": 8192, "kv_cache_dtype": "fp8", "enable_prefix_caching": True,
        "load_format": "fastsafetensors",
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
        "language_model_only": True, "enable_expert_parallel": True, "reasoning_parser": "qwen3",
        "enable_auto_tool_choice": True, "tool_call_parser": "qwen3_coder",
    }
    assert r.env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert r.launcher_env == {}


def test_every_recipe_file_is_package_data():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = conf["package-data"]["config.recipes_data"]
    assert "config*" in conf["packages"]["find"]["include"]
    assert (DATA / "__init__.py").is_file()  # a package, so find() ships it
    for f in DATA.iterdir():
        if f.is_file() and f.name != "__init__.py" and not f.name.endswith(".pyc"):
            assert any(fnmatch.fnmatch(f.name, p) for p in patterns), f.name


def test_stack_files_use_their_recipes():
    dev = validate_config(stack("dev"))
    assert dev.vllm.recipe == TINY
    assert (dev.vllm.max_model_len, dev.vllm.max_num_batched_tokens) == (2048, 4096)  # recipe
    assert (dev.vllm.max_num_seqs, dev.vllm.gpu_memory_utilization) == (4, 0.25)  # the lab's
    assert dev.nccl.extra_env == {"VLLM_LOGGING_LEVEL": "INFO"}
    staging = validate_config(stack("staging"))
    for cfg in (staging, StackConfig.model_validate(stack("prod"))):  # prod: placeholders
        v = cfg.vllm
        assert v.recipe == QWEN and v.served_model_name == "qwen3.5-122b"
        assert (v.max_model_len, v.gpu_memory_utilization, v.kv_cache_dtype) == (262144, 0.7, "fp8")
        assert v.chat_template is None and v.tool_call_parser == "qwen3_coder"  # model's own
        assert (v.host, v.port, v.tensor_parallel_size) == (None, 8000, 2)  # host: the stack's
    assert staging.nccl.extra_env == load_recipe(QWEN).env


# ------------------------------------------------------------------------ precedence
def test_stack_file_keys_win_over_the_recipe_and_the_recipe_over_defaults():
    raw = config_raw(2)
    raw["vllm"] = {"servedModelName": "m", "recipe": QWEN, "tensorParallelSize": 2,
                   "maxModelLen": 65536, "tool_call_parser": "hermes",
                   "enableExpertParallel": False}
    raw["nccl"]["extraEnv"] = {"PYTORCH_ALLOC_CONF": "expandable_segments:False", "NCCL_X_Y": "1"}
    cfg = validate_config(raw)
    v = cfg.vllm
    assert v.max_model_len == 65536  # the stack file's
    assert v.tool_call_parser == "hermes"  # the stack file's, in snake_case too
    assert v.enable_expert_parallel is False  # explicit false
    assert v.max_num_batched_tokens == 8192 and v.language_model_only  # the recipe's
    assert v.enforce_eager is False and v.host is None  # neither: the defaults
    assert cfg.nccl.extra_env == {"PYTORCH_ALLOC_CONF": "expandable_segments:False", "NCCL_X_Y": "1"}
    assert raw["nccl"]["extraEnv"] == {"PYTORCH_ALLOC_CONF": "expandable_segments:False",
                                       "NCCL_X_Y": "1"}  # the caller's mapping is not changed
    no_recipe = copy.deepcopy(raw)
    del no_recipe["vllm"]["recipe"]
    v = validate_config(no_recipe).vllm
    assert v.max_num_batched_tokens is None and not v.language_model_only
    assert v.kv_cache_dtype == "auto" and v.gpu_memory_utilization == 0.80


# ------------------------------------------------------------------------ bad names and values
def test_an_unknown_recipe_is_named_by_key_path():
    raw = config_raw(2)
    raw["vllm"]["recipe"] = "qwen3.5-122b"
    assert problems(raw) == [
        "spark-vllm:vllm.recipe: got 'qwen3.5-122b'; expected one of "
        "['qwen3.5-122b-a10b-fp8', 'spark-lab-tiny-moe'] (the recipes in config/recipes_data/)"
    ]
    raw["vllm"]["recipe"] = "../../../etc/passwd"  # names, never paths
    assert problems(raw)[0].startswith("spark-vllm:vllm.recipe: got '../../../etc/passwd'; "
                                       "expected one of [")
    raw["vllm"]["recipe"] = 7
    assert problems(raw) == ["spark-vllm:vllm.recipe: got 7; expected a string"]


GOOD = {
    "name": "bad", "description": "d", "model": "org/m",
    "sources": [{"path": "lab/tinymodel.py", "covers": "everything"}],
    "maxNumSeqs": 2,
}
BAD_RECIPES = [
    ("range", {"maxNumSeqs": 0},
     "recipe bad: maxNumSeqs: got 0; expected a value that should be greater than or equal to 1"),
    ("type", {"languageModelOnly": "yes please"},
     "recipe bad: languageModelOnly: got 'yes please'; expected true or false"),
    ("unknown-key", {"maxNumSeq": 2},
     "recipe bad: maxNumSeq: unknown key; expected one of: name, description, model, sources, "
     "env, launcherEnv, gpuMemoryUtilization, "),
    ("stack-owned-key", {"servedModelName": "x"}, "recipe bad: servedModelName: unknown key"),
    ("util", {"gpuMemoryUtilization": 1.5},
     "recipe bad: gpuMemoryUtilization: got 1.5; expected a fraction strictly between 0 and 1"),
    ("parser", {"toolCallParser": "qwen3 coder"},
     "recipe bad: toolCallParser: got 'qwen3 coder'; expected the name of a parser"),
    ("owned-flag", {"extraArgs": ["--max-num-batched-tokens", "4"]},
     "recipe bad: extraArgs: got ['--max-num-batched-tokens', '4']; expected flags the stack "
     "does not set itself; --max-num-batched-tokens is owned by "
     "spark-vllm:vllm.maxNumBatchedTokens"),
    ("template", {"chatTemplate": "missing.jinja"},
     "recipe bad: chatTemplate: got 'missing.jinja'; expected one of ['ok.jinja']"),
    ("secret-name", {"env": {"HF_TOKEN": "x"}},
     "recipe bad: env: got {'HF_TOKEN': '<secret, not shown>'}; expected no secrets in plain environment "
     "(HF_TOKEN)"),
    ("secret-value", {"launcherEnv": {"X": "hf_" + "a" * 34}},
     "recipe bad: launcherEnv: got {'X': '<secret, not shown>'}"),
    ("stack-env", {"env": {"NCCL_IB_HCA": "mlx5_0", "VLLM_HOST_IP": "1.2.3.4"}},
     "expected variables the stack does not set itself (NCCL_IB_HCA, VLLM_HOST_IP)"),
    ("listener-env", {"env": {"NCCL_RAS_ADDR": "0.0.0.0:28028"}},
     "NCCL_RAS_ADDR: the address NCCL's RAS listens on for clients"),
    ("control", {"env": {"A": "1\n2"}}, "expected values without control characters (A)"),
    ("env-name", {"env": {"1A": "x"}}, "expected environment variable names, got ['1A']"),
    ("both", {"env": {"NCCL_A": "1"}, "launcherEnv": {"NCCL_A": "2"}},
     "recipe bad: expected each variable in env or launcherEnv, not both (['NCCL_A'])"),
    ("tool-choice", {"enableAutoToolChoice": True},
     "recipe bad: expected toolCallParser with enableAutoToolChoice"),
    ("unpinned-source", {"sources": [{"url": "https://github.com/o/r/blob/main/x.yaml",
                                      "covers": "x"}]},
     "recipe bad: sources[0].url: got 'https://github.com/o/r/blob/main/x.yaml'; expected a URL "
     "pinned to a 40-hex commit"),
    ("no-sources", {"sources": []}, "recipe bad: sources: got []; expected at least 1 item(s)"),
    ("source-both", {"sources": [{"url": "https://pypi.org/p/", "path": "x", "covers": "x"}]},
     "recipe bad: sources[0]: expected exactly one of url or path"),
    ("name", {"name": "other"},
     "recipe bad: name: got 'other'; expected 'bad' (the file's name)"),
    ("missing", {"model": None}, "recipe bad: model: got None; expected a string"),
]


OWN_TEMPLATE = "{{ messages }}"


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch):
    """An empty recipes folder of the test's own, with one template; write(doc) adds bad.yaml."""
    (tmp_path / "ok.jinja").write_text(OWN_TEMPLATE)
    monkeypatch.setattr(recipe_files, "RECIPES_DIR", tmp_path)

    def write(doc, name: str = "bad") -> None:
        text = doc if isinstance(doc, str) else yaml.safe_dump(doc)
        (tmp_path / f"{name}.yaml").write_text(text)

    return write


@pytest.mark.parametrize("case", BAD_RECIPES, ids=[c[0] for c in BAD_RECIPES])
def test_a_bad_recipe_value_is_named_by_recipe_and_key(case, recipe_dir):
    _, edits, expected = case
    recipe_dir({**GOOD, **edits})
    raw = config_raw(2)
    raw["vllm"]["recipe"] = "bad"
    found = problems(raw)
    assert len(found) == 1, found
    assert found[0].startswith("spark-vllm:vllm.recipe: got 'bad'; recipe bad: "), found[0]
    assert expected in found[0], found[0]


def test_a_recipe_file_that_is_not_a_mapping_or_not_yaml(recipe_dir):
    raw = config_raw(2)
    raw["vllm"]["recipe"] = "bad"
    recipe_dir("- a\n- list\n")
    assert problems(raw) == ["spark-vllm:vllm.recipe: got 'bad'; recipe bad: (the file): got "
                             "['a', 'list']; expected a mapping"]
    recipe_dir("a: [unclosed\n", name="worse")
    raw["vllm"]["recipe"] = "worse"
    assert problems(raw)[0].startswith("spark-vllm:vllm.recipe: got 'worse'; recipe worse: "
                                       "cannot be read as YAML (")


def test_a_good_recipe_of_the_tests_own(recipe_dir):
    recipe_dir({**GOOD, "chatTemplate": "ok.jinja", "env": {"NCCL_A": "1"},
                "launcherEnv": {"UCX_B": "2"},
                "extraArgs": ["--moe-backend", "triton"]})
    raw = config_raw(2)
    raw["vllm"]["recipe"] = "bad"
    cfg = validate_config(raw)
    assert cfg.vllm.max_num_seqs == 4  # Pulumi.dev.yaml's own key wins over the recipe's 2
    assert cfg.vllm.chat_template == "ok.jinja"  # the recipe's template
    assert cfg.vllm.extra_args == []  # the stack file's extraArgs: [] wins too
    assert cfg.nccl.extra_env == {"NCCL_A": "1", "UCX_B": "2"}
    del raw["vllm"]["extraArgs"]
    assert validate_config(raw).vllm.extra_args == ["--moe-backend", "triton"]
    raw["vllm"]["chatTemplate"] = None  # an explicit null wins: the model's own template
    assert validate_config(raw).vllm.chat_template is None


TRICKY_TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                   "<|im_end|>\n{% endfor %}{# it's \"$HOME\" `id` \\ ü #}")


def test_a_chat_template_of_the_tests_own_is_read_byte_for_byte(recipe_dir, tmp_path):
    """The mechanism: a `.jinja` in the recipes folder is listed, read as it is, and named by
    chatTemplate from the stack file (no recipe needed) or from a recipe."""
    (tmp_path / "tool-args.jinja").write_bytes(TRICKY_TEMPLATE.encode())
    (tmp_path / "Upper.jinja").write_text(OWN_TEMPLATE)  # not a name the stack accepts
    (tmp_path / "notes.txt").write_text("{{ not a template }}")
    assert recipe_files.chat_templates() == ["ok.jinja", "tool-args.jinja"]
    assert recipe_files.chat_template_text("tool-args.jinja") == TRICKY_TEMPLATE
    assert recipe_files.chat_template_text("ok.jinja") == OWN_TEMPLATE
    raw = config_raw(2)
    del raw["vllm"]["recipe"]
    raw["vllm"]["chatTemplate"] = "tool-args.jinja"
    assert validate_config(raw).vllm.chat_template == "tool-args.jinja"
    raw["vllm"]["chatTemplate"] = "Upper.jinja"
    assert problems(raw) == [
        "spark-vllm:vllm.chatTemplate: got 'Upper.jinja'; expected one of ['ok.jinja', "
        "'tool-args.jinja'] (the chat templates in config/recipes_data/), or null for the "
        "model's own"]


@pytest.mark.parametrize("text, expected", [
    ("x" * 70000, "chat template big.jinja: 70000 bytes; expected at most 65536"),
    ("no braces at all", "chat template big.jinja: expected a Jinja template (text with '{', no "
                         "NUL)"),
])
def test_a_bad_chat_template_file(text, expected, recipe_dir, tmp_path):
    (tmp_path / "big.jinja").write_text(text)
    raw = config_raw(2)
    del raw["vllm"]["recipe"]  # the test's folder has no recipes
    raw["vllm"]["chatTemplate"] = "big.jinja"
    assert problems(raw) == [f"spark-vllm:vllm.chatTemplate: got 'big.jinja'; {expected}"]


def test_stack_file_values_of_the_new_keys():
    raw = config_raw(2)
    raw["vllm"]["chatTemplate"] = "/etc/passwd"
    assert problems(raw) == [
        "spark-vllm:vllm.chatTemplate: got '/etc/passwd'; expected one of [] (the chat "
        "templates in config/recipes_data/), or null for the model's own"]
    raw["vllm"]["chatTemplate"] = "qwen3.5-122b-a10b-fp8.jinja"  # no longer shipped
    assert problems(raw) == [
        "spark-vllm:vllm.chatTemplate: got 'qwen3.5-122b-a10b-fp8.jinja'; expected one of [] "
        "(the chat templates in config/recipes_data/), or null for the model's own"]
    raw = config_raw(2)
    raw["vllm"]["enableAutoToolChoice"] = True
    assert problems(raw) == [
        "spark-vllm:vllm.enableAutoToolChoice: got True; expected spark-vllm:vllm.toolCallParser "
        "too (vLLM refuses --enable-auto-tool-choice without --tool-call-parser)"]
    raw = config_raw(2)
    raw["vllm"] = {**raw["vllm"], "recipe": QWEN, "toolCallParser": None}  # the recipe turns it on
    assert problems(raw)[0].startswith("spark-vllm:vllm.enableAutoToolChoice: got True;")
    raw = config_raw(2)
    raw["vllm"]["maxNumBatchedTokens"] = 0
    assert problems(raw)[0].startswith("spark-vllm:vllm.maxNumBatchedTokens: got 0; ")


@pytest.mark.parametrize("flag", ["--max-num-batched-tokens=8", "--language-model-only",
                                  "--enable-expert-parallel", "-ep", "--reasoning-parser",
                                  "--tool-call-parser", "--enable-auto-tool-choice",
                                  "--chat-template", "--no-enable-expert-parallel"])
def test_flags_owned_by_the_new_keys_are_refused_in_extra_args(flag):
    raw = config_raw(2)
    raw["vllm"]["extraArgs"] = [flag]
    (problem,) = problems(raw)
    assert problem.startswith("spark-vllm:vllm.extraArgs: ") and "is owned by spark-vllm:vllm." \
        in problem


def test_recipe_env_may_not_set_what_the_containers_get_from_the_stack():
    """STACK_ENV is what node_env and the Ray containers set themselves (test_containers.py
    checks it against a built stack); a recipe setting one would override or be overridden."""
    assert {"VLLM_HOST_IP", "RAY_OVERRIDE_NODE_IP_ADDRESS", "NCCL_IGNORE_CPU_AFFINITY",
            "HF_HUB_OFFLINE", "RAY_AUTH_TOKEN_PATH", "VLLM_API_KEY"} <= STACK_ENV
    assert not (set(load_recipe(QWEN).env) | set(load_recipe(TINY).env)) & STACK_ENV


def test_the_recipe_env_merge_leaves_malformed_input_to_validation():
    for raw in (None, [], {"vllm": 3}, {"vllm": {"recipe": 3}}, {"vllm": {"recipe": "nope"}},
                {"vllm": {"recipe": QWEN}, "nccl": "x"},
                {"vllm": {"recipe": QWEN}, "nccl": {"extraEnv": ["x"]}}):
        assert recipes.with_recipe_env(raw) is raw
    merged = recipes.with_recipe_env({"vllm": {"recipe": QWEN}})
    assert merged["nccl"] == {"extraEnv": load_recipe(QWEN).env}
    snake = recipes.with_recipe_env({"vllm": {"recipe": QWEN}, "nccl": {"extra_env": {"A": "1"}}})
    assert snake["nccl"] == {"extra_env": {**load_recipe(QWEN).env, "A": "1"}}
