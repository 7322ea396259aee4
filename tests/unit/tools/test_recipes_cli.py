"""`spark-vllm recipes list|show|import` (tools/recipes_cli.py) through click's test runner.
Imports go into a tmp_path --out, never into config/recipes_data/."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from config import recipe_files
from config.recipes import Recipe
from config.serve import ServeSettings
from hostscripts.vllm import vllm_argv
from tests.conftest import ROOT
from tools.cli import main
from tools.recipes_cli import group

FIXTURES = ROOT / "tests" / "fixtures" / "community_recipes"
QWEN = "qwen3.5-122b-a10b-fp8"
COMMIT = "0" * 40


def run(*args: str, columns: int | None = None):
    env = {"COLUMNS": str(columns)} if columns else None
    return CliRunner().invoke(group, list(args), env=env)


def test_the_group_is_registered_on_the_operator_cli():
    result = CliRunner().invoke(main, ["recipes", "list", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["name"] for r in json.loads(result.stdout)] == recipe_files.names()


# -------------------------------------------------------------------------------- list
def test_list_is_a_table_of_the_shipped_recipes():
    result = run("list")
    assert result.exit_code == 0, result.output
    for name in recipe_files.names():
        assert name in result.stdout
    assert "Qwen/Qwen3.5-122B-A10B-FP8" in result.stdout and "spark-lab/tiny-moe" in result.stdout


def test_list_json():
    result = run("list", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert rows[0] == {"name": QWEN, "model": "Qwen/Qwen3.5-122B-A10B-FP8",
                       "description": rows[0]["description"]}
    assert rows[0]["description"].startswith("Qwen3.5-122B-A10B in native FP8")
    assert [r["name"] for r in rows] == [QWEN, "spark-lab-tiny-moe"]


# -------------------------------------------------------------------------------- show
def test_show_json_has_the_keys_and_their_flags():
    result = run("show", QWEN, "--json")
    assert result.exit_code == 0, result.output
    view = json.loads(result.stdout)
    assert view["serve"]["maxModelLen"] == 262144
    assert view["flags"]["maxModelLen"] == ["--max-model-len", "262144"]
    assert view["flags"]["enableExpertParallel"] == ["--enable-expert-parallel"]
    assert view["env"] == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert view["launcherEnv"] == {}
    assert len(view["sources"]) == 5 and all("url" in s for s in view["sources"])


def test_show_flags_are_the_ones_the_stack_puts_on_the_command_line():
    """Each key's flags, as `show` prints them, stand in the `vllm serve` line the stack makes
    (hostscripts/vllm.py vllm_argv) of the same recipe (the drafter's pin aside)."""
    view = json.loads(run("show", QWEN, "--json").stdout)
    settings = ServeSettings.model_validate({
        **view["serve"], "servedModelName": "qwen", "tensorParallelSize": 2, "host": "127.0.0.1"})
    argv = vllm_argv(settings, model=view["model"], commit=COMMIT)
    line = " ".join(argv)
    for key, flags in view["flags"].items():
        if key == "speculativeConfig":
            assert argv[argv.index("--speculative-config") + 1] == (
                '{"method":"mtp","num_speculative_tokens":1,"revision":"' + COMMIT + '"}')
            continue
        assert " ".join(flags) in line, key


def test_show_prints_tables():
    result = run("show", "spark-lab-tiny-moe")
    assert result.exit_code == 0, result.output
    for text in ("spark-lab/tiny-moe", "maxModelLen", "--max-model-len 2048",
                 "--enable-prefix-caching", "VLLM_LOGGING_LEVEL", "lab/tinymodel.py"):
        assert text in result.stdout, text


def test_show_an_unknown_recipe_exits_2_and_lists_the_known():
    result = run("show", "no-such-recipe")
    assert result.exit_code == 2
    assert "unknown recipe 'no-such-recipe'; known: qwen3.5-122b-a10b-fp8, spark-lab-tiny-moe" \
        in result.stderr


# ------------------------------------------------------------------------------ import
def test_import_writes_a_recipe_that_validates(tmp_path):
    result = run("import", str(FIXTURES / "eugr-style.yaml"), "--name", "example-moe",
                 "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    written = tmp_path / "example-moe.yaml"
    doc = yaml.safe_load(written.read_text())
    recipe = Recipe.model_validate(doc)
    assert recipe.name == "example-moe" and recipe.max_num_seqs == 8
    assert "eugr-style.yaml: eugr format -> recipe example-moe" in result.stderr
    assert "carried:\n  defaults: gpu_memory_utilization, host, max_model_len, port, " \
           "tensor_parallel: the command's placeholders" in result.stderr
    assert "\n  description: An example MoE in FP8 on two nodes" in result.stderr
    assert "noted:\n  container vllm-node: not carried" in result.stderr
    assert f"wrote {written}" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example-moe.yaml"]  # no temp left


def test_import_sparkrun_takes_the_name_of_the_file(tmp_path):
    result = run("import", str(FIXTURES / "sparkrun-style.yaml"), "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((tmp_path / "sparkrun-style.yaml").read_text())
    assert doc["sources"][0]["url"] == "https://example.org/recipes/example-dense-8b.yaml"
    assert doc["toolCallParser"] == "hermes"


def test_dry_run_prints_the_yaml_and_writes_nothing(tmp_path):
    result = run("import", str(FIXTURES / "eugr-style.yaml"), "--out", str(tmp_path),
                 "--dry-run")
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == []
    doc = yaml.safe_load(result.stdout)
    assert doc["name"] == "eugr-style" and Recipe.model_validate(doc).max_model_len == 131072
    assert f"dry run: {tmp_path / 'eugr-style.yaml'} not written" in result.stderr


def test_no_overwrite_without_force(tmp_path):
    target = tmp_path / "eugr-style.yaml"
    target.write_text("# someone's recipe\n")
    result = run("import", str(FIXTURES / "eugr-style.yaml"), "--out", str(tmp_path))
    assert result.exit_code == 1
    assert f"{target} exists: not overwritten (--force to overwrite" in result.stderr
    assert target.read_text() == "# someone's recipe\n"
    dry = run("import", str(FIXTURES / "eugr-style.yaml"), "--out", str(tmp_path), "--dry-run")
    assert dry.exit_code == 0 and "it exists: --force would overwrite it" in dry.stderr
    assert target.read_text() == "# someone's recipe\n"
    forced = run("import", str(FIXTURES / "eugr-style.yaml"), "--out", str(tmp_path), "--force")
    assert forced.exit_code == 0, forced.output
    assert yaml.safe_load(target.read_text())["name"] == "eugr-style"


@pytest.mark.parametrize("file", ["eugr-refused.yaml", "sparkrun-refused.yaml",
                                  "other-runtime.yaml"])
def test_a_refused_import_writes_nothing_and_exits_1(tmp_path, file):
    result = run("import", str(FIXTURES / file), "--out", str(tmp_path))
    assert result.exit_code == 1
    assert list(tmp_path.iterdir()) == []
    assert "refused:\n  recipe file " + file in result.stderr
    assert "nothing written:" in result.stderr and "field(s) refused" in result.stderr


def test_every_refusal_is_printed(tmp_path):
    result = run("import", str(FIXTURES / "eugr-refused.yaml"), "--out", str(tmp_path))
    refused = [line for line in result.stderr.splitlines()
               if line.startswith("  recipe file eugr-refused.yaml: ")]
    assert len(refused) == 8
    assert "Error: nothing written: 8 field(s) refused" in result.stderr


@pytest.mark.parametrize(("file", "message"), [
    ("not-yaml.yaml", "cannot be read as YAML"),
    ("not-a-mapping.yaml", "got ['vllm serve example-org/Model', '--port 8000']; expected a "
                           "mapping"),
    ("unknown-format.yaml", "not a recipe in a format the importer knows"),
])
def test_a_file_that_is_no_recipe_exits_2(tmp_path, file, message):
    result = run("import", str(FIXTURES / file), "--out", str(tmp_path))
    assert result.exit_code == 2
    assert f"recipe file {FIXTURES / file}: {message}" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_utf8_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: \xff\xfe\n")
    out = tmp_path / "out"
    out.mkdir()
    result = run("import", str(bad), "--out", str(out))
    assert result.exit_code == 2 and "expected UTF-8 text" in result.stderr
    assert list(out.iterdir()) == []


def test_a_missing_file_and_a_bad_name_exit_2(tmp_path):
    missing = run("import", str(tmp_path / "nope.yaml"), "--out", str(tmp_path))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    bad = run("import", str(FIXTURES / "eugr-style.yaml"), "--name", "Bad Name",
              "--out", str(tmp_path))
    assert bad.exit_code == 2 and "expected lowercase letters" in bad.stderr
    assert list(tmp_path.iterdir()) == []


def test_show_names_the_chat_template_where_vllm_reads_it():
    from hostscripts.vllm import CHAT_TEMPLATE, key_flags

    assert key_flags("chat_template", "x.jinja", model="m", commit=None) == ["--chat-template", CHAT_TEMPLATE]


# ------------------------------------------------------------------- a folder (issue 44)
REAL = FIXTURES / "real"


def test_a_folder_imports_every_recipe_a_stack_can_serve_and_ends_with_a_table(tmp_path):
    """The real corpus (tests/fixtures/community_recipes/real): each vLLM recipe a stack
    accepts is written, named by its file (or, where two share a name, with its folders); the
    table says per file imported (into which recipe), refused (why, one line) or not vLLM; a
    refused file makes the exit 1."""
    result = run("import", str(REAL), "--out", str(tmp_path), columns=400)
    assert result.exit_code == 1
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 67
    for name in written:
        Recipe.model_validate(yaml.safe_load((tmp_path / name).read_text()))
    out = result.stdout
    assert "86 file(s): 67 imported, 6 refused, 13 not vLLM; of the 73 vLLM recipe(s), 67 " \
           "imported" in out
    assert "Error: 6 file(s) not imported (see the table)" in result.stderr
    for text in ("qwen3.6-35b-a3b-fp8-dflash", "not vLLM", "runtime sglang: this stack serves",
                 "env.LAMPORT_RS_SCONV: not in the families"):
        assert text in out, text
    row = next(ln for ln in out.splitlines() if "recipes/inkling-small-nvfp4.yaml" in ln)
    assert "│ refused " in row and "env.LAMPORT_RS_SCONV: not in the families" in row
    # the same file name in two folders: told apart by the folder
    assert {"recipes-qwen3.5-397b-int4-autoround.yaml", "3x-spark-cluster-qwen3.5-397b-int4-"
            "autoround.yaml", "4x-spark-cluster-qwen3.5-397b-int4-autoround.yaml"} <= set(written)
    # again: every recipe exists, nothing is overwritten without --force
    again = run("import", str(REAL), "--out", str(tmp_path))
    assert again.exit_code == 1 and "67 exists" in again.stdout


def test_a_folder_dry_run_writes_nothing_and_a_stray_file_is_not_a_recipe(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.yaml").write_text((FIXTURES / "eugr-style.yaml").read_text())
    (folder / "profile.yml").write_text("benchmark_profile: x\n")
    out = tmp_path / "out"
    out.mkdir()
    result = run("import", str(folder), "--out", str(out), "--dry-run")
    assert result.exit_code == 0, result.output
    assert list(out.iterdir()) == []
    assert "2 file(s): 1 imported, 1 not a recipe; of the 1 vLLM recipe(s), 1 imported" \
        in result.stdout
    assert run("import", str(folder), "--name", "x").exit_code == 2
