"""`spark-vllm recipes import` on the recipe files operators already run (issue 44, item 6):
86 real files of eugr/spark-vllm-docker, spark-arena/recipe-registry and scitrera/oss-spark-run
(tests/fixtures/community_recipes/real, each with its repository, commit, path and licence in
sources.json). Every file is read without a crash; at least 90% of those whose runtime is vLLM
import into recipes a stack accepts (the same config checks, with the recipe applied to a
stack's config); the others are refused with one line, another runtime as "not vLLM"; and
nothing is changed in silence: every flag, env variable, default and key of an imported file is
named in a line that says it was carried, noted (left out, and why) or refused."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import yaml

from config import validate_config
from config.recipes import trial
from hostscripts.vllm import vllm_argv
from tests.conftest import ROOT
from tools.recipe_import import (
    Imported,
    ImportFormatError,
    import_recipe,
    reference_stack,
    stack_problems,
)

REAL = ROOT / "tests" / "fixtures" / "community_recipes" / "real"
LICENCES = {"MIT", "Apache-2.0"}
FILES = sorted(p for p in REAL.rglob("*.y*ml"))

# What the corpus holds and what becomes of it (SOURCES.md, docs/testing.md and the README say
# the same; a change of the importer that moves one of these is a change to review)
EXPECTED = {"files": 86, "vllm": 73, "imported": 67, "refused": 6, "not vLLM": 13}
# every refused vLLM recipe, and the one line that says why (the first refusal)
REFUSED = {
    "eugr-spark-vllm-docker/recipes/8x-spark-cluster/glm-5.2-nvfp4.yaml":
        "env.CUTE_DSL_ARCH: not in the families the stack passes",
    "eugr-spark-vllm-docker/recipes/deepseek-v4-flash-0731.yaml":
        "env.CUTE_DSL_ARCH: not in the families the stack passes",
    "eugr-spark-vllm-docker/recipes/deepseek-v4-flash.yaml":
        "env.DG_JIT_USE_NVRTC: not in the families the stack passes",
    "eugr-spark-vllm-docker/recipes/inkling-small-nvfp4.yaml":
        "env.LAMPORT_RS_SCONV: not in the families the stack passes",
    "spark-arena-recipe-registry/experimental-recipes/deepseek4/deepseek4-flash-fp8-mtp-vllm.yaml":
        "env.TILELANG_CLEANUP_TEMP_FILES: not in the families the stack passes",
    "spark-arena-recipe-registry/experimental-recipes/deepseek4/deepseek4-flash-fp8-vllm.yaml":
        "env.TILELANG_CLEANUP_TEMP_FILES: not in the families the stack passes",
}
# keys of a file that describe the file itself, not a setting (checked element by element
# where they hold settings: command, defaults, env)
FORMAT_KEYS = {"name", "recipe_version", "sparkrun_version", "command", "defaults", "env",
               "runtime"}


def rel(path: Path) -> str:
    return path.relative_to(REAL).as_posix()


@cache
def result(name: str) -> Imported:
    return import_recipe((REAL / name).read_text(encoding="utf-8"), file_name=name)


def all_results() -> dict[str, Imported]:
    return {rel(p): result(rel(p)) for p in FILES}


# ------------------------------------------------------------------------ the fixtures
def test_every_file_is_recorded_with_its_repository_commit_path_and_licence():
    sources = json.loads((REAL / "sources.json").read_text())["sources"]
    by_file = {s["file"]: s for s in sources}
    assert sorted(by_file) == sorted(rel(p) for p in FILES)
    for s in sources:
        data = (REAL / s["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s["sha256"], s["file"]
        assert re.fullmatch(r"[0-9a-f]{40}", s["commit"]), s
        assert s["licence"] in LICENCES, s
        assert s["file"].endswith(s["path"]), s
        folder = s["file"].split("/", 1)[0]
        assert (REAL / folder / "LICENSE").is_file(), folder
        assert s["repository"] in (REAL / "SOURCES.md").read_text(), s["repository"]


# ------------------------------------------------------------------- the import, by file
def test_no_file_crashes_the_importer_and_the_shares_are_what_the_docs_say():
    outcomes: Counter[str] = Counter()
    for path in FILES:
        try:
            outcomes[result(rel(path)).outcome] += 1
        except ImportFormatError as exc:  # every file of the corpus is a recipe
            pytest.fail(f"{rel(path)}: {exc}")
    vllm = outcomes["imported"] + outcomes["refused"]
    assert {"files": len(FILES), "vllm": vllm, **outcomes} == EXPECTED
    assert outcomes["imported"] / vllm >= 0.90  # the bar


def test_each_refused_vllm_recipe_says_why_in_one_line():
    refused = {f: r for f, r in all_results().items() if r.outcome == "refused"}
    assert sorted(refused) == sorted(REFUSED)
    for file, r in refused.items():
        assert r.reason.startswith(REFUSED[file]), (file, r.reason)
        assert "\n" not in r.reason and r.recipe is None and r.document == {}


def test_another_runtime_is_not_vllm_with_one_line():
    others = {f: r for f, r in all_results().items() if r.outcome == "not vLLM"}
    assert len(others) == EXPECTED["not vLLM"]
    for file, r in others.items():
        assert re.fullmatch(r"runtime (sglang|llama-cpp): this stack serves with vLLM only "
                            r"\(runtimes eugr-vllm, vllm, vllm-distributed, vllm-ray\)",
                            r.reason), (file, r.reason)


def _named(r: Imported) -> str:
    return "\n".join(r.carried + r.notes + r.refused)


def _command_flags(data: dict) -> set[str]:
    """Every flag of the file's command, as written (independently of the importer)."""
    command = re.sub(r"\\[ \t]*\r?\n", " ", data.get("command") or "")
    words = shlex.split(command, comments=True)
    return {w.split("=", 1)[0] for w in words
            if w.startswith("-") and not re.fullmatch(r"-[\d.]+", w)}


def test_nothing_of_an_imported_file_is_changed_in_silence():
    """Every flag of its command, every env variable, every default and every other key of an
    imported file is named in a line: carried (into which key), noted (left out, and why) or
    refused."""
    imported = {f: r for f, r in all_results().items() if r.outcome == "imported"}
    assert len(imported) == EXPECTED["imported"]
    for file, r in imported.items():
        data = yaml.safe_load((REAL / file).read_text())
        lines = _named(r)
        for flag in _command_flags(data):
            assert re.search(rf"(^|[\s:]){re.escape(flag)}([\s=;,)]|$)", lines, re.M), (file, flag)
        for var in data.get("env") or {}:
            assert f"env.{var}" in lines, (file, var)
        for key in data.get("defaults") or {}:
            assert re.search(rf"\b{re.escape(key)}\b", lines), (file, key)
        for key in set(data) - FORMAT_KEYS:
            if not data[key]:  # `mods: []`, `cluster_only: false`: nothing to carry
                continue
            assert re.search(rf"(^|\s|\(){re.escape(key)}\b", lines, re.M), (file, key)


def test_every_imported_recipe_is_one_a_stack_accepts():
    """The recipe applied by name to a stack's config (two Sparks, its model pinned, its
    drafter of another repo declared) passes every config check a stack runs, and its
    `vllm serve` line carries each extraArgs flag with all its values, in order."""
    for file, r in all_results().items():
        if r.recipe is None:
            continue
        assert stack_problems(r.recipe) == [], file
        with trial(r.recipe):
            cfg = validate_config(reference_stack(r.recipe))
        assert cfg.vllm.recipe == r.name
        argv = vllm_argv(cfg.vllm.model_copy(update={
            "tensor_parallel_size": cfg.tensor_parallel_size, "host": "127.0.0.1"}),
            model=cfg.model.repo, commit=cfg.model.revision)
        extra = list(r.recipe.serve_settings().get("extra_args") or [])
        assert argv[len(argv) - len(extra):] == extra, file
        assert set({**r.recipe.env, **r.recipe.launcher_env}) <= set(cfg.nccl.extra_env), file


# ----------------------------------------------------- what the issue found refused before
def test_trust_remote_code_is_carried_with_what_a_stack_must_pin():
    with_trc = {f: r for f, r in all_results().items()
                if r.recipe is not None and r.recipe.serve_settings().get("trust_remote_code")}
    assert len(with_trc) >= 40
    for file, r in with_trc.items():
        assert any(c.startswith("trustRemoteCode: true") and "pins spark-vllm:model.revision"
                   in c for c in r.carried), file


def test_several_values_a_repeated_flag_and_dotted_keys_are_read_as_vllm_reads_them():
    ultra = result("eugr-spark-vllm-docker/recipes/4x-spark-cluster/nemotron-3-ultra-nvfp4.yaml")
    args = ultra.recipe.serve_settings()["extra_args"]
    at = args.index("--cudagraph-capture-sizes")
    assert args[at:at + 5] == ["--cudagraph-capture-sizes", "5", "10", "15", "20"]
    assert args[args.index("-cc.mode"):args.index("-cc.mode") + 2] == ["-cc.mode", "0"]
    assert ultra.recipe.serve_settings()["speculative_config"] == {
        "method": "mtp", "num_speculative_tokens": 4, "moe_backend": "triton",
        "attention_backend": "TRITON_ATTN"}
    twice = result("scitrera-oss-spark-run/recipes/neomtron3-nano/nemotron3-nano-30b-vllm.yaml")
    assert twice.outcome == "imported"
    assert any("--enable-auto-tool-choice: not carried: given twice with the same value" in n
               for n in twice.notes)


def test_a_drafter_from_another_repository_imports_into_a_stack_that_declares_it():
    dflash = result("eugr-spark-vllm-docker/recipes/qwen3.6-35b-a3b-fp8-dflash.yaml")
    assert dflash.outcome == "imported" and dflash.drafter == "z-lab/Qwen3.6-35B-A3B-DFlash"
    assert reference_stack(dflash.recipe)["model"]["drafter"]["repo"] == dflash.drafter
    assert any("spark-vllm:model.drafter {repo: z-lab/Qwen3.6-35B-A3B-DFlash" in c
               for c in dflash.carried)


def test_the_model_repos_reasoning_parser_plugin_is_carried_with_remote_code():
    nano = result("eugr-spark-vllm-docker/recipes/nemotron-3-nano-nvfp4.yaml")
    s = nano.recipe.serve_settings()
    assert s["reasoning_parser_plugin"] == "nano_v3_reasoning_parser.py"
    assert s["trust_remote_code"] is True and s["reasoning_parser"] == "nano_v3"
