"""What a model revision changes in what the program registers, read from the goldens.

docs/benchmarks.md's "Steps per change" are what the last `make bench` measured on the lab, as
the program was then. The steps a new model commit reaches directly are also in the goldens
(tests/unit/components/golden/, what the program registers now, held byte for byte by
tests/unit/components/test_golden.py): the resources whose inputs carry the resolved commit of
the main model (its ModelCache `model`'s `commit`). They re-run or are replaced on a revision
change; the gates after them (health, logs) follow through their dependencies, which a golden
does not show.

    python bench/golden_steps.py          rewrites that paragraph of docs/benchmarks.md
    python bench/golden_steps.py --check  exits 1 when the paragraph and the goldens differ

`make bench` writes the same paragraph (bench/bench.py `report`), and
tests/unit/bench/test_golden_steps.py fails when docs/benchmarks.md and the goldens differ.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "unit" / "components" / "golden" / "dev-2-nodes.json"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- golden-steps: bench/golden_steps.py writes this paragraph -->"
END = "<!-- /golden-steps -->"


def _mentions(value: Any, text: str) -> bool:
    if isinstance(value, dict):
        return any(_mentions(v, text) for v in value.values())
    if isinstance(value, list):
        return any(_mentions(v, text) for v in value)
    return isinstance(value, str) and text in value


def revision_steps(golden: dict[str, Any]) -> list[str]:
    """The names of the resources whose inputs carry the main model's commit, sorted."""
    models = [r for r in golden["resources"]
              if r["type"].endswith(":ModelCache") and r["name"] == "model"]
    if len(models) != 1:
        raise ValueError("the golden has no single ModelCache `model`")
    commit = models[0]["inputs"]["commit"]
    return sorted(r["name"] for r in golden["resources"] if _mentions(r["inputs"], commit))


def paragraph(golden: dict[str, Any]) -> str:
    """The paragraph, between its markers."""
    steps = revision_steps(golden)
    return "\n".join([
        BEGIN,
        "The steps above are what `make bench` measured when it last ran. What a model revision "
        f"reaches now, by the program's own inputs (the {len(steps)} "
        f"resources of tests/unit/components/golden/{GOLDEN.name} whose inputs carry the "
        "model's commit; the gates after them follow through their dependencies): "
        + ", ".join(steps) + ".",
        END,
    ])


def load_golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def with_paragraph(doc: str, para: str) -> str:
    """`doc` with its paragraph replaced (or, with none yet, put after the "Steps per change"
    list)."""
    if BEGIN in doc and END in doc:
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return head + para + tail
    anchor = "\n\nThe model revision changed "
    if anchor not in doc:
        raise ValueError("no place for the paragraph: the change table's notes are missing")
    return doc.replace(anchor, "\n\n" + para + anchor, 1)


def main(argv: list[str]) -> int:
    doc = DOC.read_text()
    want = with_paragraph(doc, paragraph(load_golden()))
    if "--check" in argv:
        if want != doc:
            print(f"{DOC}: the golden-steps paragraph differs from the goldens: run "
                  "python bench/golden_steps.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
