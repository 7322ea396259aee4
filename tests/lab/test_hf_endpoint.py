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
    # every file of the real model (.gitattributes is empty: no bytes to count)
    assert {p.rsplit("/", 1)[1] for p in got} == {
        "README.md", "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}, got
    shard1 = f"/{REPO}/resolve/{commits['main']}/model-00001-of-00002.safetensors"
    assert got[shard1] > 2_000_000, got  # the weights: ~1.08 M bf16 parameters
    # a revision change re-downloads only the file that changed (the router shard); blobs of the
    # other files are shared between the snapshots
    path = _download(lab, node, commits["first"])
    assert path.endswith("/snapshots/" + commits["first"])
    after = _resolve_bytes(lab)
    delta = {p: after[p] - mid.get(p, 0) for p in after if after[p] != mid.get(p, 0)}
    shard2 = f"/{REPO}/resolve/{commits['first']}/model-00002-of-00002.safetensors"
    assert list(delta) == [shard2] and delta[shard2] < 10_000, delta
    ref = "/root/.cache/huggingface/hub/models--spark-lab--tiny-moe/refs/main"
    assert lab.ssh(node, f"cat {ref}").stdout.strip() == commits["main"]
