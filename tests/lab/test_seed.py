"""`lab.py seed` reproduces the reference machine on spark-1."""

import pytest

pytestmark = pytest.mark.lab
FOREIGN = ("vllm_node", "reranker", "vllm_embeddings")
CACHE = "/root/.cache/huggingface/hub/models--spark-lab--tiny-moe"


def test_seed_creates_foreign_containers_and_partial_cache(lab):
    lab.cli("seed")
    try:
        fmt = "'{{.Names}} {{.Image}} {{json .Labels}}'"
        ps = lab.ssh("spark-1", f"docker ps --format {fmt}").stdout.splitlines()
        running = {line.split()[0]: line for line in ps}
        for name in FOREIGN:
            assert name in running and running[name].split()[1] == "vllm-node", ps
            assert "spark-vllm.managed" not in running[name]
        # the image was built on spark-1 itself, not pulled under that name
        image_id = lab.ssh("spark-1", "docker image inspect vllm-node -f '{{.Id}}'").stdout
        assert image_id.startswith("sha256:")
        assert lab.ssh("spark-2", "docker image inspect vllm-node", check=False).returncode != 0
        fmt = "'{{.Name}} {{.MemUsage}}'"
        stats = lab.ssh("spark-1", f"docker stats --no-stream --format {fmt}").stdout
        mem = {line.split()[0]: line.split()[1] for line in stats.splitlines()}
        assert mem["vllm_node"].endswith("MiB") and float(mem["vllm_node"][:-3]) > 200, stats
        # partly filled cache: config/tokenizer present, weights absent, an unfinished blob
        snap = lab.ssh("spark-1", f"ls {CACHE}/snapshots/*/").stdout
        assert "config.json" in snap and "tokenizer.json" in snap
        assert "model.safetensors" not in snap
        assert ".incomplete" in lab.ssh("spark-1", f"ls {CACHE}/blobs").stdout
    finally:
        lab.ssh("spark-1", "docker rm -f " + " ".join(FOREIGN), check=False)
