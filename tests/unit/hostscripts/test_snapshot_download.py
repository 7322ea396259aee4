"""payloads/snapshot_download.py (the hub download on the head), run for real over a FAKE
`huggingface_hub` (tests/fake_hf: writes the cache layout slowly, downloads nothing): its
progress on stderr while it runs, what it fetched at the end, nothing for a cache that holds
every file, and the token from stdin handed to the hub library and printed nowhere."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hostscripts.common import payload
from tests.conftest import ROOT

REPO, COMMIT = "Qwen/Qwen3.5-122B-A10B-FP8", "0123456789abcdef0123456789abcdef01234567"
FILES = [["a" * 64, 3_000_000], ["b" * 40, 1_000], ["c" * 64, 2_000_000]]
TOKEN = "hf_snapshot_test_token"


def _run(tmp_path: Path, every: float = 0.2, gap: float = 0.15) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "fake_hf"),
           "HF_HOME": str(tmp_path / "hf"), "FAKE_HF_FILES": json.dumps(FILES),
           "FAKE_HF_GAP": str(gap), "FAKE_HF_TOKEN_SEEN": str(tmp_path / "token-seen")}
    return subprocess.run(
        [sys.executable, "-c", payload("snapshot_download.py"), REPO, COMMIT, str(every),
         json.dumps(FILES)],
        input=TOKEN + "\n", env=env, capture_output=True, text=True, timeout=120, check=True)


def test_progress_while_it_downloads_then_what_it_fetched(tmp_path):
    blobs = tmp_path / "hf/hub/models--Qwen--Qwen3.5-122B-A10B-FP8/blobs"
    blobs.mkdir(parents=True)
    (blobs / ("b" * 40)).write_bytes(b"\0" * 1_000)  # one small file already in the cache
    r = _run(tmp_path)
    lines = r.stderr.splitlines()
    prefix = f"model-fetch {REPO}@{COMMIT[:12]}: "
    assert all(line.startswith(prefix) for line in lines), lines
    assert lines[0] == prefix + "5.0 MB to fetch (2 of 3 files), 0.0 MB already in the cache"
    ticks = [line for line in lines[1:-1]]
    assert len(ticks) >= 3, lines  # 2 files x 4 chunks x 0.15 s: several 0.2 s reports
    got = [float(re.search(r": ([0-9.]+) MB of 5\.0 MB \((\d+)%\), [0-9.]+ MB/s, ", t).group(1))
           for t in ticks]
    assert got == sorted(got) and got[0] < 5.0, ticks  # growing as the blobs grow
    assert re.fullmatch(re.escape(prefix) + r"5\.0 MB fetched in \d+ s \([0-9.]+ MB/s\)",
                        lines[-1]), lines[-1]
    assert r.stdout.strip() == str(tmp_path / "hf/hub/models--Qwen--Qwen3.5-122B-A10B-FP8"
                                   / "snapshots" / COMMIT)
    # the token went to the hub library, and nowhere else
    assert (tmp_path / "token-seen").read_text() == TOKEN
    assert TOKEN not in r.stderr + r.stdout


def test_a_cache_that_holds_every_file_fetches_nothing_and_says_so(tmp_path):
    _run(tmp_path, gap=0)
    r = _run(tmp_path, gap=0)
    assert r.stderr.splitlines() == [
        f"model-fetch {REPO}@{COMMIT[:12]}: nothing to fetch: every file is in the cache"]
