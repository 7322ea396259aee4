"""tools/recipe_import.py: community recipe files (eugr's spark-vllm-docker and sparkrun
formats) into typed recipes: each format carried into a Recipe that validates and a stack
accepts, every refusal and note named once per field. The files here
(tests/fixtures/community_recipes/*.yaml, and the short documents built below) are written for
these tests, one case each; the real files operators run are test_recipe_corpus.py's."""

from __future__ import annotations

import pytest
import yaml

from config.recipes import Recipe, load_recipe
from config.serve import RECIPE_FIELDS
from hostscripts.vllm import key_flags
from tests.conftest import ROOT
from tools import recipe_import
from tools.recipe_import import ImportFormatError, detect_format, import_recipe, to_yaml

FIXTURES = ROOT / "tests" / "fixtures" / "community_recipes"


def imported(file: str, **kw: str) -> recipe_import.Imported:
    return import_recipe((FIXTURES / file).read_text(), file_name=file, **kw)


def test_every_fixture_says_it_was_written_for_the_tests_and_which_format():
    for path in FIXTURES.glob("*.yaml"):
        head = path.read_text().splitlines()[0]
        assert head.startswith("# Written for spark-vllm's tests"), path.name
    for name in ("eugr-style.yaml", "eugr-refused.yaml"):
        assert recipe_import.EUGR_FORMAT_DOC in (FIXTURES / name).read_text()
    for name in ("sparkrun-style.yaml", "sparkrun-defaults-only.yaml", "sparkrun-refused.yaml"):
        assert recipe_import.SPARKRUN_FORMAT_DOC in (FIXTURES / name).read_text()


# ----------------------------------------------------------------------------- the formats
@pytest.mark.parametrize(("file", "fmt"), [
    ("eugr-style.yaml", "eugr"), ("eugr-refused.yaml", "eugr"),
    ("sparkrun-style.yaml", "sparkrun"), ("sparkrun-defaults-only.yaml", "sparkrun"),
    ("sparkrun-refused.yaml", "sparkrun"), ("other-runtime.yaml", "sparkrun"),
])
def test_the_format_is_told_by_its_keys(file, fmt):
    assert detect_format(yaml.safe_load((FIXTURES / file).read_text())) == fmt


@pytest.mark.parametrize(("data", "fmt"), [
    ({"recipe_version": "1", "model": "a/b"}, "eugr"),
    ({"container": "x", "command": "vllm serve a/b"}, "eugr"),
    ({"recipe_version": "2", "model": "a/b"}, "sparkrun"),
    ({"model": "a/b", "runtime": "vllm", "container": "x"}, "sparkrun"),
    ({"recipe_version": 1, "metadata": {}}, "sparkrun"),  # sparkrun's reading of version 1
])
def test_format_detection_rules(data, fmt):
    assert detect_format(data) == fmt


@pytest.mark.parametrize(("file", "message"), [
    ("not-yaml.yaml", "cannot be read as YAML"),
    ("not-a-mapping.yaml", "expected a mapping"),
    ("unknown-format.yaml", "not a recipe in a format the importer knows"),
])
def test_a_file_that_is_no_recipe_is_a_format_error(file, message):
    with pytest.raises(ImportFormatError, match=message):
        imported(file)


def test_an_unknown_recipe_version_is_a_format_error():
    with pytest.raises(ImportFormatError, match="recipe_version '3'"):
        import_recipe('recipe_version: "3"\nmodel: a/b\n', file_name="x.yaml")


# ------------------------------------------------------------------------------- eugr
def test_eugr_style_carries_into_a_valid_recipe():
    r = imported("eugr-style.yaml")
    assert r.format == "eugr" and r.refused == [] and r.recipe is not None
    assert r.name == "eugr-style"
    assert r.recipe.model == "example-org/Example-MoE-FP8"
    assert r.recipe.description == "An example MoE in FP8 on two nodes"
    assert r.recipe.serve_settings() == {
        "gpu_memory_utilization": 0.75, "max_model_len": 131072, "max_num_seqs": 8,
        "kv_cache_dtype": "fp8", "enable_prefix_caching": False,
        "speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                               "prompt_lookup_max": 4},
        "enforce_eager": True, "enable_expert_parallel": True,
        "extra_args": ["--swap-space", "8", "--enable-chunked-prefill"],
    }
    assert r.recipe.env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert r.recipe.launcher_env == {"NCCL_IB_GID_INDEX": "3"}
    assert any(c.startswith("extraArgs: --swap-space 8") for c in r.carried)


def test_eugr_style_notes_what_is_the_stacks():
    notes = imported("eugr-style.yaml").notes
    assert notes == [
        "container vllm-node: not carried: the image is the stack's image.ref, not a recipe key",
        "build_args: not carried: --pre-tf: builds the launcher's image; the stack serves "
        "image.ref as built",
        "mods: mods/example-fix: not carried: a patch the launcher applies to its container "
        "(third-party code); the stack runs image.ref unpatched: an image that needs it is "
        "built with it",
        "cluster_only: not carried: the nodes are the stack's (spark-vllm:nodes)",
        "defaults.unused_default: not carried: no placeholder of command uses it",
        "command: --port 8000: not carried: the stack's key spark-vllm:vllm.port, not a recipe's",
        "command: --host 0.0.0.0: not carried: the stack's key spark-vllm:vllm.host, not a "
        "recipe's",
        "command: -tp 2: not carried: the stack's key spark-vllm:vllm.tensorParallelSize, not a "
        "recipe's",
        "command: --distributed-executor-backend ray: not carried: the stack's key "
        "spark-vllm:vllm.executor, not a recipe's",
        "env.NCCL_SOCKET_IFNAME: not carried: set by the stack itself per node "
        "(config/recipes.py STACK_ENV)",
    ]


def test_the_written_yaml_is_a_recipe_of_the_shipped_shape(tmp_path, monkeypatch):
    r = imported("eugr-style.yaml", name="example-moe")
    text = to_yaml(r)
    assert text.startswith("# example-moe: imported by `spark-vllm recipes import` from "
                           "eugr-style.yaml")
    assert "#   - container vllm-node: the image is the stack's image.ref" in text
    doc = yaml.safe_load(text)
    assert list(doc)[:4] == ["name", "description", "model", "sources"]
    assert list(doc)[-2:] == ["env", "launcherEnv"]
    assert doc["speculativeConfig"]["method"] == "ngram" and "maxNumSeqs" in doc
    assert Recipe.model_validate(doc) == r.recipe
    # the shipped loader reads it as a recipe of its folder
    (tmp_path / "example-moe.yaml").write_text(text)
    monkeypatch.setattr("config.recipe_files.RECIPES_DIR", tmp_path)
    assert load_recipe("example-moe").serve_settings() == r.recipe.serve_settings()


def test_the_source_is_the_recipe_itself_when_the_file_names_none():
    src = imported("eugr-style.yaml", name="example-moe").recipe.sources
    assert len(src) == 1 and src[0].url is None
    assert src[0].path == "config/recipes_data/example-moe.yaml"
    assert "eugr-style.yaml (eugr format" in src[0].covers and "sha256 " in src[0].covers
    assert "not kept in this repository" in src[0].covers


def test_an_unpinned_github_source_comment_is_noted_and_not_used():
    text = (FIXTURES / "eugr-style.yaml").read_text() + \
        "# source: https://github.com/example/recipes/blob/main/x.yaml\n"
    r = import_recipe(text, file_name="x.yaml")
    assert r.recipe is not None and r.recipe.sources[0].path == "config/recipes_data/x.yaml"
    assert any(n.startswith("# source: https://github.com/example/recipes/blob/main/x.yaml: "
                            "not carried: expected a URL pinned to a 40-hex commit")
               for n in r.notes)


# --------------------------------------------------------------------------- sparkrun
def test_sparkrun_style_carries_into_a_valid_recipe_with_its_source_url():
    r = imported("sparkrun-style.yaml")
    assert r.format == "sparkrun" and r.refused == [] and r.recipe is not None
    assert r.recipe.description == "Example dense 8B: long context, tool calls"
    assert r.recipe.model == "example-org/Example-Dense-8B"
    assert r.recipe.serve_settings() == {
        "gpu_memory_utilization": 0.6, "max_model_len": 65536, "load_format": "safetensors",
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
        "enable_auto_tool_choice": True, "tool_call_parser": "hermes",
    }
    assert r.recipe.env == {"VLLM_LOGGING_LEVEL": "DEBUG"} and r.recipe.launcher_env == {}
    assert [s.url for s in r.recipe.sources] == ["https://example.org/recipes/example-dense-8b.yaml"]
    assert "sparkrun-style.yaml (sparkrun format" in r.recipe.sources[0].covers


def test_sparkrun_style_notes():
    notes = imported("sparkrun-style.yaml").notes
    assert "model_revision main: not carried: the stack's key spark-vllm:model.revision" in notes
    assert "min_nodes: not carried: the nodes are the stack's (spark-vllm:nodes)" in notes
    assert "metadata (model_params): not carried: sparkrun's estimates and display data, not " \
           "serve settings" in notes
    assert any(n.startswith("post_commands: not carried:") for n in notes)
    assert any(n.startswith("executor_config: not carried:") for n in notes)
    assert "command: --served-model-name dense8b: not carried: the stack's key " \
           "spark-vllm:vllm.servedModelName, not a recipe's" in notes
    assert len(notes) == 11


def test_sparkrun_without_command_makes_flags_of_the_common_defaults():
    r = imported("sparkrun-defaults-only.yaml")
    assert r.refused == [] and r.recipe is not None
    assert r.recipe.serve_settings() == {
        "gpu_memory_utilization": 0.5, "max_model_len": 8192, "max_num_seqs": 16,
        "kv_cache_dtype": "auto", "enable_prefix_caching": True,
    }
    assert r.recipe.description == ("example-org/Example-Small-1B, imported from "
                                    "sparkrun-defaults-only.yaml (sparkrun format)")
    assert "defaults.reasoning_parser: not carried: sparkrun passes it to a command template " \
           "only, and this recipe has no command" in r.notes
    assert "defaults.tensor_parallel: -tp 1: not carried: the stack's key " \
           "spark-vllm:vllm.tensorParallelSize, not a recipe's" in r.notes


# --------------------------------------------------------------------------- refusals
EUGR_REFUSED = [
    "extra_setting: not a key of the eugr format (" + recipe_import.EUGR_FORMAT_DOC + "); the "
    "importer carries only what it knows",
    "command: {missing_default}: a placeholder with no value in defaults",
    "command: --kv-transfer-config {\"kv_connector\":\"ExampleConnector\"}: --kv-transfer-config "
    "imports the KV connector module its JSON names (kv_connector_module_path) and opens the "
    "connector's side channel (docs/design.md \"What extraArgs may set\")",
    "command: --config extra.yaml: --config reads flags from a file the stack cannot check: "
    "give them here or in their typed keys (docs/design.md \"What extraArgs may set\")",
    "command: --max-num-seqs 8: given twice with different values (also --max-num-seqs 4): say "
    "which",
    "env.VLLM_SERVER_DEV_MODE: opens vLLM's development routes (/reset_prefix_cache, /sleep, "
    "/collective_rpc...) beside the API (docs/design.md \"What extraEnv may set\")",
    "env.HF_TOKEN: a secret (not shown): a recipe holds none; the stack's secrets are "
    "spark-vllm:hfToken and spark-vllm:vllmApiKey",
    "command: --gpu-memory-utilization 1.5: gpuMemoryUtilization: got 1.5; expected a fraction "
    "strictly "
    "between 0 and 1, e.g. 0.80",
]


def test_eugr_refusals_one_message_per_field():
    r = imported("eugr-refused.yaml")
    assert r.recipe is None and r.document == {} and r.outcome == "refused"
    assert r.refused == [f"recipe file eugr-refused.yaml: {m}" for m in EUGR_REFUSED]
    # `-n2` is vLLM's `--nnodes 2`, the stack's own: noted, not carried
    assert "command: -n2: not carried: owned by the stack (the nodes of spark-vllm:nodes, with " \
           "vllm.executor mp)" in r.notes
    assert "not-a-real-token" not in " ".join(r.refused + r.notes)


def test_sparkrun_refusals_one_message_per_field():
    r = imported("sparkrun-refused.yaml")
    assert r.recipe is None
    prefix = "recipe file sparkrun-refused.yaml: "
    assert [m.removeprefix(prefix) for m in r.refused] == [
        "pre_exec: commands that change the container before vLLM starts; the stack runs "
        "image.ref as built: remove them from the file if the image already has what they do",
        "runtime_config.some_setting: a runtime-specific setting the importer does not know",
        "command: --speculative-config {not json}: expected JSON (Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1))",
        "env.NCCL_DEBUG_FILE: names code to load, a file or folder, an address, a port or a "
        "command (PLUGIN, MODULE, _PATH, _DIR, _HOST, _PORT, _URL, ...) (docs/design.md "
        "\"What extraEnv may set\")",
        "env.NCCL_IB_TC: expands the control machine's environment ($VAR); give the value itself",
    ]
    assert all(m.startswith(prefix) for m in r.refused)


def test_another_runtime_is_not_vllm_in_one_line():
    r = imported("other-runtime.yaml")
    assert r.recipe is None and r.outcome == "not vLLM"
    assert r.reason == ("runtime llama-cpp: this stack serves with vLLM only (runtimes "
                        "eugr-vllm, vllm, vllm-distributed, vllm-ray)")
    assert r.refused == [f"recipe file other-runtime.yaml: runtime: {r.reason}"]


def test_a_command_that_is_not_vllm_serve_is_not_vllm():
    r = import_recipe(yaml.safe_dump({"recipe_version": "1", "model": "a/b", "container": "c",
                                      "command": "python3 -m sglang.launch_server --tp 2"}),
                      file_name="t.yaml")
    assert r.outcome == "not vLLM"
    assert r.reason == ("command 'python3 -m sglang.launch_server': not a `vllm serve` line "
                        "(this stack serves with vLLM only)")


def eugr(command: str, **extra: object) -> recipe_import.Imported:
    doc = {"recipe_version": "1", "model": "a/b", "container": "c",
           "command": f"vllm serve a/b {command}", **extra}
    return import_recipe(yaml.safe_dump(doc), file_name="t.yaml")


@pytest.mark.parametrize(("command", "refused"), [
    ("--max-model-len", "command: --max-model-len: expected a value after the flag"),
    ("--enforce-eager=true", "command: --enforce-eager=true: expected the flag alone (a switch "
                             "takes no value)"),
    ("--max-model-len 4096 8192", "command: --max-model-len 4096 8192: expected one value after "
                                  "the flag, got 2"),
    ("--kv_transfer_config={}", "command: --kv_transfer_config={}: --kv-transfer-config (as "
                                "--kv_transfer_config) imports the KV connector module its JSON "
                                "names (kv_connector_module_path) and opens the connector's side "
                                "channel (docs/design.md \"What extraArgs may set\")"),
    ("-dp 2", "command: -dp 2: -dp starts data-parallel replicas that coordinate through a "
              "listener of their own (an address and RPC port beside the API, outside the "
              "stack's fabric rules); the stack serves one replica (docs/design.md \"What "
              "extraArgs may set\")"),
    ("other/model", "command: other/model: a second positional argument (vllm serve takes one "
                    "model)"),
    ("--model other/model", "command: --model other/model: serves another model than a/b"),
    ("--max-model-len 8 ; rm -rf x", None),
    ("--speculative-config '[1]'", "command: --speculative-config [1]: expected a JSON object"),
    ("-tp 2 --tensor-parallel-size 4", "command: --tensor-parallel-size 4: given twice with "
                                       "different values (also -tp 2): say which"),
    ("--max-model-len abc", "command: --max-model-len abc: maxModelLen: got 'abc'; expected an integer"),
])
def test_a_flag_that_cannot_be_carried_is_refused(command, refused):
    r = eugr(command)
    assert r.recipe is None and len(r.refused) == 1
    if refused is None:
        assert "shell syntax" in r.refused[0]
    else:
        assert r.refused == [f"recipe file t.yaml: {refused}"]


def test_a_yaml_boolean_env_value_is_refused():
    r = eugr("", env={"NCCL_IB_DISABLE_X": True})
    assert r.refused == ["recipe file t.yaml: env.NCCL_IB_DISABLE_X: a YAML boolean: quote the "
                         "value the variable takes"]


def test_a_missing_command_is_refused_in_the_eugr_format():
    r = import_recipe('recipe_version: "1"\nmodel: a/b\ncontainer: c\n', file_name="t.yaml")
    assert r.refused == ["recipe file t.yaml: command: missing: the eugr format requires the "
                         f"`vllm serve` line ({recipe_import.EUGR_FORMAT_DOC})"]


def test_a_bad_name_is_refused():
    r = import_recipe((FIXTURES / "eugr-style.yaml").read_text(), file_name="x.yaml",
                      name="Bad Name")
    assert r.refused == ["recipe file x.yaml: name: 'Bad Name': expected a name of lowercase "
                         "letters, digits, '.' and '-' (give --name)"]


# ------------------------------------------------------------------- spellings and notes
@pytest.mark.parametrize(("command", "settings"), [
    ("--max_model_len=4096", {"max_model_len": 4096}),
    ("--max-model 4096", {"max_model_len": 4096}),  # vLLM's parser takes a unique prefix
    ("--no-enable-prefix-caching", {"enable_prefix_caching": False}),
    ("--enable-prefix-caching", {"enable_prefix_caching": True}),
    ("--no-enforce-eager", {"enforce_eager": False}),
    ("-ep", {"enable_expert_parallel": True}),
    ("--speculative-config.method mtp --speculative-config.num_speculative_tokens 2",
     {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}),
    ("--gpu-memory-utilization=0.9", {"gpu_memory_utilization": 0.9}),
    ("--kv-cache-memory-bytes 2147483648", {"kv_cache_memory_bytes": 2147483648}),
    ("-cc.cudagraph_mode=PIECEWISE", {"extra_args": ["-cc.cudagraph_mode=PIECEWISE"]}),
    ("--seed 42", {"extra_args": ["--seed", "42"]}),
])
def test_vllm_spellings_map_onto_the_typed_keys(command, settings):
    r = eugr(command)
    assert r.refused == [] and r.recipe is not None
    assert r.recipe.serve_settings() == settings


@pytest.mark.parametrize(("command", "note"), [
    ("--api-key sk-not-shown", "command: --api-key: not carried: owned by the secret "
                               "spark-vllm:vllmApiKey: the stack passes its own key (the value "
                               "is not carried, nor shown)"),
    ("-n2", "command: -n2: not carried: owned by the stack (the nodes of spark-vllm:nodes, with "
            "vllm.executor mp)"),
    ("--revision abc", "command: --revision abc: not carried: owned by "
                       "spark-vllm:model.revision"),
    ("-pp 2", "command: -pp 2: not carried: the stack's key spark-vllm:vllm.pipelineParallelSize, "
              "not a recipe's"),
    ("--chat-template x.jinja", "command: --chat-template x.jinja: not carried: not a chat "
                                "template shipped in config/recipes_data/ (vLLM serves the "
                                "model's own; ship a <name>.jinja there and set chatTemplate)"),
])
def test_the_stacks_own_flags_are_noted_not_refused(command, note):
    r = eugr(command)
    assert r.refused == [] and r.recipe is not None
    assert r.notes == ["container c: not carried: the image is the stack's image.ref, not a "
                       "recipe key", note]
    assert "sk-not-shown" not in " ".join(r.notes + r.carried) + to_yaml(r)


def test_doubled_braces_are_literal_in_eugr_templates():
    r = eugr("--speculative-config '{{\"method\":\"mtp\",\"num_speculative_tokens\":{n}}}'",
             defaults={"n": 3})
    assert r.refused == []
    assert r.recipe.speculative_config == {"method": "mtp", "num_speculative_tokens": 3}


# ------------------------------------------- the flags `recipes show` prints (hostscripts/vllm.py)
def test_key_flags_render_what_the_importer_reads_back():
    """Every serve key of the shipped 122B recipe, rendered as flags and imported again, is the
    same recipe: the importer reads config/serve.py's table the way the stack writes it."""
    recipe = load_recipe("qwen3.5-122b-a10b-fp8")
    flags = [a for n, v in recipe.serve_settings().items()
             for a in key_flags(n, v, model=recipe.model, commit=None)]
    r = eugr(" ".join(f"'{a}'" for a in flags))
    assert r.refused == [] and r.recipe.serve_settings() == recipe.serve_settings()
    assert set(recipe.serve_settings()) <= set(RECIPE_FIELDS)


def test_key_flags_forms():
    def flags(name, value):
        return key_flags(name, value, model="m", commit=None)

    assert flags("enable_prefix_caching", False) == ["--no-enable-prefix-caching"]
    assert flags("enforce_eager", False) == []
    assert flags("gpu_memory_utilization", 0.7) == ["--gpu-memory-utilization", "0.7"]
    # as the recipe holds it; the stack pins the drafter to the served commit
    assert flags("speculative_config", {"b": 1, "a": 2}) == ["--speculative-config", '{"a":2,"b":1}']
    assert key_flags("speculative_config", {"method": "mtp"}, model="m", commit="c" * 40) == [
        "--speculative-config", '{"method":"mtp","revision":"' + "c" * 40 + '"}']
    assert flags("extra_args", ["--seed", "1"]) == ["--seed", "1"]


def test_a_secret_flag_is_refused_and_never_shown():
    """A token on the serve line (`--hf-token hf_...`, `--x-password=...`, a value shaped like a
    key) is refused: extraArgs holds no secret (it would be on every node's command line and in
    the recipe file), and no message prints it."""
    token = "hf_" + "a1B2c3D4e5" * 4
    for line in (f"--hf-token {token}", "--db-password=hunter2hunter2", f"--seed {token}"):
        r = eugr(line)
        text = "\n".join(r.refused + r.notes + r.carried)
        assert r.recipe is None and r.refused, line
        assert token not in text and "hunter2" not in text, text
        assert "expected no secret on vLLM's command line" in text, text


def test_control_characters_of_a_recipe_file_never_reach_a_message(tmp_path):
    """YAML can hold an escape sequence (a terminal title, a cursor move); every line the
    importer prints is one printable line."""
    f = tmp_path / "x.yaml"
    f.write_text('recipe_version: "1"\nmodel: org/m\ncontainer: "evil\\e]0;owned\\a\\e[2J"\n'
                 'command: vllm serve org/m --max-model-len 4096\n')
    r = import_recipe(f.read_text(), file_name="x.yaml", name="x")
    lines = r.refused + r.notes + r.carried
    assert any("container" in ln for ln in lines), lines
    assert all(ln.isprintable() for ln in lines), lines


# ------------------------------------------------- issue 44: what real recipes need carried
def sparkrun(**doc: object) -> recipe_import.Imported:
    return import_recipe(yaml.safe_dump({"recipe_version": "2", "model": "a/b",
                                         "runtime": "vllm", **doc}), file_name="t.yaml")


def test_a_placeholder_is_named_as_sparkrun_names_it_hyphens_included():
    """sparkrun fills any `{...}`; `{hf-overrides}` was carried literally before and the YaRN
    override dropped while a note said the default was unused."""
    yarn = '{"rope_scaling":{"rope_type":"yarn","factor":4.0}}'
    r = sparkrun(defaults={"hf-overrides": yarn, "max.len": 8192},
                 command="vllm serve {model} --hf-overrides '{hf-overrides}' "
                         "--max-model-len {max.len}")
    assert r.outcome == "imported", r.refused
    assert r.recipe.serve_settings() == {"extra_args": ["--hf-overrides", yarn],
                                         "max_model_len": 8192}
    assert not any("hf-overrides" in n for n in r.notes)
    assert r.carried[0].startswith("defaults: hf-overrides, max.len, model: the command's "
                                   "placeholders")


def test_a_flag_takes_every_value_up_to_the_next_flag():
    r = eugr("--cudagraph-capture-sizes 1 2 4 8 16 24 32 --max-num-seqs 8 "
             "--compilation-config.cudagraph_capture_sizes+ 64 --seed -1")
    assert r.outcome == "imported", r.refused
    s = r.recipe.serve_settings()
    assert s["extra_args"] == ["--cudagraph-capture-sizes", "1", "2", "4", "8", "16", "24", "32",
                               "--compilation-config.cudagraph_capture_sizes+", "64",
                               "--seed", "-1"]
    assert s["max_num_seqs"] == 8


def test_a_flag_given_twice_the_same_way_is_carried_once_and_noted():
    r = eugr("--enable-auto-tool-choice --tool-call-parser hermes --enable-auto-tool-choice "
             "--async-scheduling --async-scheduling --seed 1 --seed 2")
    assert r.outcome == "imported", r.refused
    assert r.recipe.serve_settings()["extra_args"] == ["--async-scheduling", "--seed", "1",
                                                       "--seed", "2"]
    assert "command: --enable-auto-tool-choice: not carried: given twice with the same value " \
           "(also --enable-auto-tool-choice): carried once" in r.notes
    assert "command: --seed 2: not carried: given twice (also --seed 1): both carried in this " \
           "order; vLLM's parser takes the last for a single-value flag" in r.notes


def test_sparkrun_defaults_become_the_flags_sparkrun_makes_of_them():
    """Without a command, sparkrun's vLLM runtimes make flags of api_key and
    otlp_traces_endpoint too (its VLLM_FLAG_MAP): the key is the stack's own secret (noted, never
    shown), the traces endpoint a door the security design keeps shut (refused by name)."""
    r = sparkrun(defaults={"api_key": "sk-" + "k" * 30, "max_model_len": 4096,
                           "trust_remote_code": True})
    assert r.outcome == "imported", r.refused
    assert r.recipe.serve_settings() == {"max_model_len": 4096, "trust_remote_code": True}
    assert "defaults.api_key: --api-key: not carried: owned by the secret spark-vllm:vllmApiKey:" \
           " the stack passes its own key (the value is not carried, nor shown)" in r.notes
    assert "k" * 30 not in " ".join(r.notes + r.carried + r.refused) + to_yaml(r)
    r = sparkrun(defaults={"otlp_traces_endpoint": "http://collector:4317"})
    assert r.reason == ("defaults.otlp_traces_endpoint: --otlp-traces-endpoint "
                        "http://collector:4317: --otlp-traces-endpoint sends every request's "
                        "traces to an outside endpoint (docs/design.md \"What extraArgs may "
                        "set\")")


def test_trust_remote_code_is_carried_with_what_a_stack_must_pin():
    r = eugr("--trust-remote-code")
    assert r.outcome == "imported" and r.recipe.serve_settings() == {"trust_remote_code": True}
    (line,) = [c for c in r.carried if c.startswith("trustRemoteCode")]
    assert line == ("trustRemoteCode: true  <- command: --trust-remote-code; a stack serving it "
                    "pins spark-vllm:model.revision to a 40-hex commit (config refuses it "
                    "otherwise) and has that commit's code reviewed (policy "
                    "remote-code-reviewed)")


def test_the_model_repos_plugin_needs_remote_code():
    r = eugr("--reasoning-parser-plugin nano_v3_reasoning_parser.py --reasoning-parser nano_v3")
    assert r.reason == ("command: --reasoning-parser-plugin nano_v3_reasoning_parser.py: "
                        "expected trustRemoteCode with reasoningParserPlugin (the plugin is the "
                        "model repository's own Python code)")
    r = eugr("--trust-remote-code --reasoning-parser-plugin ../../etc/x.py")
    assert "expected the path of a Python file inside the model repository" in r.reason


def test_environment_of_the_families_is_carried_where_it_belongs():
    r = eugr("", env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": 1, "OMP_NUM_THREADS": "8",
                      "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "NCCL_IB_GID_INDEX": 3,
                      "B12X_MOE_FORCE_A8": "1"})
    assert r.reason == ("env.B12X_MOE_FORCE_A8: not in the families the stack passes (VLLM_*, "
                        "TORCH_*, PYTORCH_*, OMP_*, CUDA_*, NCCL_*, UCX_*, GLOO_*) "
                        "(docs/design.md \"What extraEnv may set\")")
    r = eugr("", env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": 1, "OMP_NUM_THREADS": "8",
                      "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "NCCL_IB_GID_INDEX": 3})
    assert r.outcome == "imported"
    assert r.recipe.env == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "8",
                            "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    assert r.recipe.launcher_env == {"NCCL_IB_GID_INDEX": "3"}


def test_a_drafter_of_another_repo_is_carried_for_a_stack_that_declares_it():
    spec = '{"method":"eagle3","model":"org/eagle3-head","num_speculative_tokens":3}'
    r = eugr(f"--speculative-config '{spec}'")
    assert r.outcome == "imported" and r.drafter == "org/eagle3-head"
    stack = recipe_import.reference_stack(r.recipe)
    assert stack["model"] == {"repo": "a/b", "revision": recipe_import.REFERENCE_COMMIT,
                              "drafter": {"repo": "org/eagle3-head",
                                          "revision": recipe_import.REFERENCE_DRAFTER_COMMIT}}


def test_imported_means_a_stack_accepts_it():
    """A recipe that is a valid Recipe but that no stack would accept is refused with the
    stack config's own message: a speculative config naming its own revision (the stack pins
    the drafter)."""
    r = eugr("--speculative-config '{\"method\":\"mtp\",\"revision\":\"main\"}'")
    assert r.outcome == "refused" and r.recipe is None
    assert r.reason == ("a stack on this recipe: spark-vllm:vllm.speculativeConfig.revision: got "
                        "'main'; expected no revision: the stack pins the drafter to its commit "
                        "(spark-vllm:model.revision, or spark-vllm:model.drafter.revision)")
