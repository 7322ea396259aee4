"""Helpers for the recon tests: recorded real outputs (tests/fixtures/gb10, line 1 = source note)
and the labelled samples in tests/recon/samples (formats without a published GB10 capture)."""

from __future__ import annotations

from pathlib import Path

GB10 = Path(__file__).resolve().parents[1] / "fixtures" / "gb10"
SAMPLES = Path(__file__).resolve().parent / "samples"


def _body(path: Path) -> str:
    text = path.read_text()
    first, _, rest = text.partition("\n")
    assert first.startswith("# source:"), f"{path.name}: line 1 must be the '# source:' note"
    return rest


def gb10(name: str) -> str:
    """The raw output recorded in tests/fixtures/gb10/<name> (without its source line)."""
    return _body(GB10 / name)


def sample(name: str) -> str:
    return _body(SAMPLES / name)
