"""The lab's HF endpoint (olah + access log) works with huggingface_hub unchanged; bytes are
counted."""
import json

import pytest

pytestmark = pytest.mark.lab
REPO = "spark-lab/tiny-moe"


def _resolve_bytes(lab) -> dict:
    d = json.loads(lab.cli("hf-bytes", "--json").stdout)["paths"]
    return {p: v["bytes"] for p, v in d.items() if "/resolve/" in p}


def _download(lab, node, revision=None):
    rev = f", revision={revision!r}" if revision else ""
    code = f"from huggingface_hub import snapshot_download; print(snapshot_download({REPO!r}{rev}))"
    return lab.ssh(node, f"docker run --rm --network host -e HF_ENDPOINT={lab.cfg['hfEndpoint']} "
                         "-v /root/.cache/huggingface:/root/.cache/huggingface "
                         f"{lab.image} python3 -c \"{code}\"",
                   timeout=900).stdout.strip()


def test_snapshot_download_two_revisions_and_byte_counts(lab):
    node = list(lab.nodes)[-1]
    commits = lab.cfg["model"]["commits"]
    assert commits["main"] == commits["second"] != commits["first"]
    lab.ssh(node, "rm -rf /root/.cache/huggingface/hub/models--spark-lab--tiny-moe")
    before = _resolve_bytes(lab)
    path = _download(lab, node)
    assert path.endswith("/snapshots/" + commits["main"])
    mid = _resolve_bytes(lab)
    got = {p: mid[p] - before.get(p, 0) for p in mid if mid[p] != before.get(p, 0)}
    st = [p for p in got if p.endswith(f"/resolve/{commits['main']}/model.safetensors")]
    assert st and got[st[0]] > 500_000, got
    # a revision change re-downloads only the file that changed (config.json); blobs are shared
    path = _download(lab, node, commits["first"])
    assert path.endswith("/snapshots/" + commits["first"])
    after = _resolve_bytes(lab)
    delta = {p: after[p] - mid.get(p, 0) for p in after if after[p] != mid.get(p, 0)}
    assert list(delta) == [f"/{REPO}/resolve/{commits['first']}/config.json"], delta
    ref = "/root/.cache/huggingface/hub/models--spark-lab--tiny-moe/refs/main"
    assert lab.ssh(node, f"cat {ref}").stdout.strip() == commits["main"]
