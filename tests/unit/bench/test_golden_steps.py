"""docs/benchmarks.md's paragraph of what a model revision reaches is the goldens' (bench/
golden_steps.py): it fails when the doc and tests/unit/components/golden/ differ."""

from __future__ import annotations

import pytest

from bench import golden_steps

COMMIT = "f" * 40


def golden(*resources: tuple[str, str, dict[str, object]]) -> dict[str, object]:
    return {"resources": [{"type": t, "name": n, "inputs": i} for t, n, i in resources]}


def test_the_doc_says_what_the_goldens_say():
    assert golden_steps.main(["--check"]) == 0, \
        "docs/benchmarks.md differs from the goldens: run python bench/golden_steps.py"


def test_the_goldens_name_the_steps_that_came_after_the_last_bench():
    steps = golden_steps.revision_steps(golden_steps.load_golden())
    assert {"model", "model-fetch", "vllm-serve", "vllm-serve-check-spark-1",
            "vllm-deployment-spark-1"} <= set(steps)
    assert "gateway-config" not in steps and "ray-head" not in steps


def test_steps_are_the_resources_whose_inputs_carry_the_commit_anywhere():
    g = golden(("spark-vllm:model_cache:ModelCache", "model", {"commit": COMMIT}),
               ("command:remote:Command", "deep", {"create": {"a": [f"x {COMMIT} y"]}}),
               ("command:remote:Command", "other", {"create": "c" * 40}),
               ("docker:index/container:Container", "serve", {"env": [f"REV={COMMIT}"]}))
    assert golden_steps.revision_steps(g) == ["deep", "model", "serve"]
    with pytest.raises(ValueError, match="no single ModelCache"):
        golden_steps.revision_steps(golden(("command:remote:Command", "x", {})))


def test_the_paragraph_is_put_once_and_then_replaced():
    doc = "Steps per change:\n\n- nothing: none\n\nThe model revision changed 1 B.\n"
    first = golden_steps.with_paragraph(
        doc, golden_steps.BEGIN + "\nfirst-text\n" + golden_steps.END)
    assert first.index(golden_steps.BEGIN) < first.index("The model revision changed")
    second = golden_steps.with_paragraph(
        first, golden_steps.BEGIN + "\nsecond-text\n" + golden_steps.END)
    assert "second-text" in second and "first-text" not in second
    assert second.count(golden_steps.BEGIN) == 1
    with pytest.raises(ValueError, match="no place"):
        golden_steps.with_paragraph("# Benchmarks\n", "x")
