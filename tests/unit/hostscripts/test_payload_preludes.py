"""Payload composition (issue 47): a payload cannot import, so the rules several payloads share
are prelude texts that hostscripts/common.py `payload()` joins in front of the payloads whose
header asks for them (`# Prelude: <name>, ...`). Each rule exists once: the hub-manifest rules
in contract/manifest.py (which config/forms.py imports too), the progress lines' sizes and
times in payloads/progress.py, the seeders' server and bearer check in payloads/seeder.py.

These tests hold that: the text sent is the preludes' then the payload's own; a payload that
asks for none is its own text, byte for byte; no payload defines again what a prelude defines;
every name a payload (or a prelude) uses without defining it comes from a prelude joined before
it; and the program's checks and the payloads' agree on real and refused manifests, run as the
node runs them.
"""

from __future__ import annotations

import ast
import builtins
import json
import subprocess
import sys
from pathlib import Path

import pytest

from config import forms
from contract import manifest
from hostscripts import common, models
from hostscripts.models import ModelFile

PAYLOADS = Path(common.__file__).parent / "payloads"
NAMES = sorted(p.name for p in PAYLOADS.glob("*.py") if p.name != "__init__.py")
PRELUDE_FILES = {f"{package.replace('.', '/')}/{name}" for package, name in common.PRELUDES.values()}


def _defined(text: str, *, modules: bool = True) -> set[str]:
    """The names a text binds in its module scope (functions, classes, assignments, and the
    modules it imports unless `modules` is False), not those of its functions' own scopes."""
    names: set[str] = set()
    todo: list[ast.AST] = list(ast.parse(text).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)  # its body is its own scope
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if modules:
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp
                        | ast.GeneratorExp):
            continue  # their own scopes too
        else:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            todo.extend(ast.iter_child_nodes(node))
    return names


def _free(text: str) -> set[str]:
    """The names a text loads that neither it (anywhere) nor Python's builtins bind."""
    tree = ast.parse(text)
    bound = set(dir(builtins))
    loaded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return loaded - bound


def _prelude_text(section: str) -> str:
    return common._text(*common.PRELUDES[section])


def test_the_text_sent_is_the_preludes_then_the_payload():
    composed = 0
    for name in NAMES:
        wanted = common.preludes(name)
        sent = common.payload(name)
        assert sent == "".join(_prelude_text(p) for p in wanted) + common.own_text(name), name
        if not wanted:  # unchanged by composition: the file minus its header, as before
            assert sent == common.own_text(name), name
        composed += bool(wanted)
    assert composed == 6  # model_verify/sync/ref, both seeders, fetch_url


def test_the_payloads_that_share_a_rule_ask_for_it():
    assert common.preludes("model_verify.py") == ["cache_fs", "manifest", "manifest_read"]
    assert common.preludes("model_sync.py") == ["cache_fs", "manifest", "manifest_read",
                                                "progress"]
    assert common.preludes("model_ref.py") == ["cache_fs", "manifest"]
    assert common.preludes("fetch_url.py") == ["progress"]
    assert common.preludes("image_seeder.py") == common.preludes("model_seeder.py") == ["seeder"]
    # the builders send the composed text
    assert common.payload("model_sync.py") == models._SYNC_PY
    assert models._VERIFY_PY.startswith(_prelude_text("cache_fs") + _prelude_text("manifest"))


def test_an_unknown_prelude_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(common.resources, "files", lambda _package: tmp_path)
    (tmp_path / "x.py").write_text("# X.\n# Prelude: manifest, nothing.\n\nprint(1)\n")
    with pytest.raises(ValueError, match="nothing"):
        common.payload("x.py")
    (tmp_path / "y.py").write_text("# Y.\n# Prelude: progress, progress.\n\nprint(1)\n")
    with pytest.raises(ValueError, match="repeated"):
        common.payload("y.py")


def test_each_rule_is_defined_once():
    """A name a prelude defines is defined by no payload's own text and no other prelude: the
    copies (bad_path, size, clock, refuse, inside, the seeders' Server and bearer check) are
    gone from the payloads."""
    owner: dict[str, str] = {}
    for section in common.PRELUDES:
        for defined in _defined(_prelude_text(section), modules=False):  # each imports its own
            assert defined not in owner, f"{defined}: {owner.get(defined)} and {section}"
            owner[defined] = section
    for name in NAMES:
        if f"hostscripts/payloads/{name}" in PRELUDE_FILES:
            continue
        again = _defined(common.own_text(name), modules=False) & set(owner)
        assert not again, f"{name} defines again what a prelude defines: {sorted(again)}"
    for gone in ("bad_path", "size", "clock", "refuse", "inside", "authorized"):
        for name in ("model_verify.py", "model_sync.py", "fetch_url.py", "image_seeder.py",
                     "model_seeder.py"):
            assert f"def {gone}(" not in common.own_text(name), (name, gone)


def test_every_name_a_payload_uses_comes_from_a_prelude_joined_before_it():
    """What ruff's F821 would see in the composed text (pyproject.toml ignores it in the payload
    files that use prelude names): nothing a text uses is left undefined."""
    for name in NAMES:
        if f"hostscripts/payloads/{name}" in PRELUDE_FILES:
            continue  # checked where it is joined, after the preludes before it
        before: set[str] = set()
        for section in common.preludes(name):
            text = _prelude_text(section)
            assert _free(text) <= before, (name, section, _free(text) - before)
            before |= _defined(text)
        own = common.own_text(name)
        assert _free(own) <= before, (name, sorted(_free(own) - before))
        assert not (common.preludes(name) and _free(common.payload(name))), name


def test_the_manifest_prelude_is_contract_manifest_and_config_uses_it():
    source = Path(manifest.__file__).read_text()
    assert source.endswith(_prelude_text("manifest"))
    assert forms.check_model_file is manifest.check_model_file
    assert forms.check_repo_path is manifest.check_repo_path
    # only the standard library: it runs on the nodes' own python
    imported = {a.name for node in ast.parse(source).body if isinstance(node, ast.Import)
                for a in node.names}
    assert imported <= set(sys.stdlib_module_names)
    assert not any(isinstance(node, ast.ImportFrom) for node in ast.parse(source).body)


COMMIT = "0123456789abcdef" * 2 + "01234567"
# A commit as the hub lists one (the shapes of a real model repo: LFS sha256 etags for the
# weights, git blob ids for the small files, nested folders)
REAL = [
    ModelFile(".gitattributes", 1519, "a6344aac8c09253b3b630fb776ae94478aa0275b"),
    ModelFile("README.md", 6740, "f2ab8d5b1f2f1ad6c2c26a5f3b1e0d8c9f61cbb2"),
    ModelFile("config.json", 728, "d1b3a6b1f2e1c51e6b88a0ea4ad3b1a7e9b4d1c0"),
    ModelFile("generation_config.json", 239, "5a4a2b7a5f3f0a4b2c1e6d8f9a0b1c2d3e4f5a6b"),
    ModelFile("model-00001-of-00002.safetensors", 4967215360, "ab" * 32),
    ModelFile("model-00002-of-00002.safetensors", 3077766632, "cd" * 32),
    ModelFile("model.safetensors.index.json", 32819, "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"),
    ModelFile("tokenizer.json", 7031645, "ef" * 32),
    ModelFile("tokenizer_config.json", 7306, "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"),
    ModelFile("original/params.json", 199, "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c"),
]
BAD_FILES = [
    {"path": "config.json", "size": 1, "etag": "../../../../victim"},
    {"path": "../../etc/cron.d/x", "size": 3, "etag": "3" * 40},
    {"path": "/etc/passwd", "size": 3, "etag": "3" * 40},
    {"path": "a\nb", "size": 3, "etag": "3" * 40},
    {"path": "x" * 2000, "size": 3, "etag": "3" * 40},
    {"path": "a.json", "size": -5, "etag": "3" * 40},
    {"path": "a.json", "size": True, "etag": "3" * 40},
    {"path": "a.json", "size": 2**41, "etag": "3" * 64},
]
BAD_LISTINGS = [
    [("a", 1, "1" * 40), ("a", 1, "2" * 40)],
    [("a", 1, "1" * 40), ("a/b", 1, "2" * 40)],
    [("a", 1, "1" * 40), ("b", 2, "1" * 40)],
]


def _verify(tmp_path: Path, manifest_json: str) -> subprocess.CompletedProcess[str]:
    cache = tmp_path / "cache"
    return subprocess.run([sys.executable, "-c", models._VERIFY_PY, str(cache),
                           str(tmp_path / "records"), "--prune"],
                          input=manifest_json, capture_output=True, text=True, timeout=30)


def _refusal(problem: str) -> str:
    return f"model manifest refused: {problem}; nothing was changed"


def test_the_program_and_the_payload_agree_on_a_real_manifest(tmp_path):
    """The manifest the program makes of a real listing passes the payload's rules too: the
    verify payload, run as the node runs it, gets past them (to the empty cache)."""
    assert models.listing_problem(REAL) is None
    text = models.verify_manifest_json("org/model", COMMIT, REAL)
    assert manifest.manifest_problem(json.loads(text)) is None
    out = _verify(tmp_path, text)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["files"] == len(REAL)


@pytest.mark.parametrize("bad", BAD_FILES)
def test_a_file_the_program_refuses_the_payload_refuses_with_the_same_words(tmp_path, bad):
    problem = forms.check_model_file(bad["path"], bad["size"], bad["etag"])
    assert problem is not None
    with pytest.raises(ValueError, match="refused"):
        ModelFile(**bad)
    m = json.loads(models.verify_manifest_json("org/model", COMMIT, REAL))
    m["files"].append(bad)
    out = _verify(tmp_path, json.dumps(m))
    assert out.returncode == 1 and out.stderr.strip() == _refusal(problem), out.stderr
    assert not (tmp_path / "cache").exists()  # refused before anything was made


@pytest.mark.parametrize("listing", BAD_LISTINGS)
def test_a_listing_the_program_refuses_the_payload_refuses_with_the_same_words(tmp_path,
                                                                                listing):
    files = [ModelFile(*f) for f in listing]
    problem = models.listing_problem(files)
    assert problem is not None
    with pytest.raises(ValueError, match="listing is refused"):
        models.verify_manifest_json("org/model", COMMIT, files)
    m = {"repoDir": common.repo_dir("org/model"), "commit": COMMIT,
         "files": [{"path": p, "size": s, "etag": e} for p, s, e in listing]}
    out = _verify(tmp_path, json.dumps(m))
    assert out.returncode == 1 and out.stderr.strip() == _refusal(problem), out.stderr
