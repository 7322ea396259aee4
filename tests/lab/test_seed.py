"""`lab.py seed` reproduces the reference machine on spark-1."""

import pytest

pytestmark = pytest.mark.lab
FOREIGN = ("vllm_node", "reranker", "vllm_embeddings")


def test_seed_creates_foreign_containers_and_partial_cache(lab):
    lab.cli("seed")
    try:
        ps = lab.ssh("spark-1", "docker ps --format '{{.Names}} {{.Image}} {{json .Labels}}'").stdout.splitlines()
        running = {l.split()[0]: l for l in ps}
        for name in FOREIGN:
            assert name in running and running[name].split()[1] == "vllm-node", ps
            assert "spark-vllm.managed" not in running[name]
        # the image was built on spark-1 itself, not pulled under that name
        assert lab.ssh("spark-1", "docker image inspect vllm-node -f '{{.Id}}'").stdout.startswith("sha256:")
        assert lab.ssh("spark-2", "docker image inspect vllm-node", check=False).returncode != 0
        stats = lab.ssh("spark-1", "docker stats --no-stream --format '{{.Name}} {{.MemUsage}}'").stdout
        mem = {l.split()[0]: l.split()[1] for l in stats.splitlines()}
        assert mem["vllm_node"].endswith("MiB") and float(mem["vllm_node"][:-3]) > 200, stats
        # partly filled cache: config/tokenizer present, weights absent, an unfinished blob
        snap = lab.ssh("spark-1", "ls /root/.cache/huggingface/hub/models--spark-lab--tiny-moe/snapshots/*/").stdout
        assert "config.json" in snap and "tokenizer.json" in snap and "model.safetensors" not in snap
        assert ".incomplete" in lab.ssh("spark-1", "ls /root/.cache/huggingface/hub/models--spark-lab--tiny-moe/blobs").stdout
    finally:
        lab.ssh("spark-1", "docker rm -f " + " ".join(FOREIGN), check=False)
