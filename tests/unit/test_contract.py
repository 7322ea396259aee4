"""contract/: what the program and the policy pack share, defined once (issue 47)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from contract import forms, props, types

ROOT = Path(__file__).resolve().parents[2]


def test_the_doc_table_is_the_typeddicts():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/contract_doc.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_contract_imports_only_the_standard_library():
    for path in (ROOT / "contract").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "contract", (path.name, name)


def test_secret_shapes_take_both_old_shapes():
    # the pack's hf_ + 20 (the program asked for 30) and the program's unbounded forms
    assert forms.secret_value("hf_" + "a" * 20) and forms.secret_value("xhf_" + "a" * 30)
    assert forms.secret_value("sk-" + "a" * 16) and forms.secret_value("disk-" + "a" * 16)
    assert forms.secret_value("-----BEGIN " + "OPENSSH PRIVATE KEY-----")  # (no key header in the tree)
    assert not forms.secret_value("hf_" + "a" * 19) and not forms.secret_value("sk-short")
    # names: the program's TOKEN without exception, the pack's PASSPHRASE
    for name in ("HF_TOKEN", "MAX_TOKENS", "TOKENIZERS_PARALLELISM", "DB_PASSPHRASE",
                 "VLLM_API_KEY", "AWS_CREDENTIALS", "SSH_PRIVATE_KEY"):
        assert forms.secret_env_name(name), name
    assert not forms.secret_env_name("VLLM_LOGGING_LEVEL")


def test_every_reviewed_component_type_has_props():
    assert set(props.PROPS) == {v for k, v in vars(types).items() if k.isupper()
                                and isinstance(v, str) and v.startswith("spark-vllm:")
                                and k != "STACK_SECRETS"}
