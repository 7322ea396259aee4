"""A FAKE `huggingface_hub` for tests/unit/hostscripts/test_snapshot_download.py: only
`snapshot_download`, which downloads nothing. It writes the files named by the environment
variable FAKE_HF_FILES (JSON [[etag, size], ...]) into the HF cache layout the real one uses
(`<HF_HOME>/hub/models--<org>--<name>/blobs/<etag>`), each first as `<etag>.incomplete` growing
in FAKE_HF_CHUNKS steps FAKE_HF_GAP seconds apart (as a slow download does), and returns the
snapshot folder. It records the token it was given in FAKE_HF_TOKEN_SEEN (a file path)."""

from __future__ import annotations

import json
import os
import time


def snapshot_download(repo_id: str, revision: str, token: str | None = None) -> str:
    hub = os.path.join(os.environ["HF_HOME"], "hub")
    repo = os.path.join(hub, "models--" + repo_id.replace("/", "--"))
    blobs = os.path.join(repo, "blobs")
    os.makedirs(blobs, exist_ok=True)
    with open(os.environ["FAKE_HF_TOKEN_SEEN"], "w") as f:
        f.write(token or "")
    steps, gap = int(os.environ.get("FAKE_HF_CHUNKS", "4")), float(os.environ.get("FAKE_HF_GAP", "0"))
    for etag, size in json.loads(os.environ["FAKE_HF_FILES"]):
        final = os.path.join(blobs, etag)
        if os.path.exists(final) and os.path.getsize(final) == size:
            continue  # the real one skips a file already in the cache too
        part = final + ".incomplete"
        with open(part, "wb") as f:
            for i in range(steps):
                f.write(b"\0" * (size // steps + (size % steps if i == steps - 1 else 0)))
                f.flush()
                time.sleep(gap)
        os.replace(part, final)
    snapshot = os.path.join(repo, "snapshots", revision)
    os.makedirs(snapshot, exist_ok=True)
    return snapshot
