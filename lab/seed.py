"""`lab.py seed`: make spark-1 look like the reference machine before the stack touches it.

- an image tagged `vllm-node`, built locally on spark-1's own dockerd (FROM the lab image, so no
  Docker Hub), as people build it from community recipes;
- three running foreign containers (no spark-vllm labels) named vllm_node, reranker and
  vllm_embeddings, each a sleeping process holding some memory so `docker stats` shows usage;
- a partly filled HF cache: config and tokenizer files of the tiny model, but no weights, plus an
  unfinished blob download.
"""
import os
import subprocess
import tempfile

HOG = ("import time,sys; b=bytearray(int(sys.argv[1])<<20); "
       "[b.__setitem__(i,1) for i in range(0,len(b),4096)]; time.sleep(1e9)")
CONTAINERS = [("vllm_node", 256), ("reranker", 64), ("vllm_embeddings", 96)]


def _run(argv, **kw):
    return subprocess.run(argv, check=True, **kw)


def seed(docker: list, image_ref: str, hf_endpoint: str, hf_repo: str, log,
         hf_dir: str) -> None:
    names = subprocess.run([*docker, "ps", "-a", "--format", "{{.Names}}"], check=True,
                           capture_output=True, text=True).stdout.split()
    log("seed: pulling the lab image on spark-1 and building vllm-node locally")
    _run([*docker, "pull", "-q", image_ref], stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as ctx:
        with open(os.path.join(ctx, "Dockerfile"), "w") as f:
            f.write(f"FROM {image_ref}\n"
                    "LABEL org.opencontainers.image.title=vllm-node\n"
                    "ENV VLLM_NODE=community-build\n"
                    'CMD ["sleep", "infinity"]\n')
        _run([*docker, "build", "-q", "-t", "vllm-node", ctx], stdout=subprocess.DEVNULL,
             stderr=subprocess.DEVNULL, env=dict(os.environ, DOCKER_BUILDKIT="0"))
    for name, mib in CONTAINERS:
        if name in names:
            subprocess.run([*docker, "rm", "-f", name], capture_output=True, check=False)
        _run([*docker, "run", "-d", "--name", name, "--restart", "unless-stopped",
              "--network", "host", "vllm-node", "python3", "-c", HOG, str(mib)],
             stdout=subprocess.DEVNULL)
        log(f"seed: started foreign container {name} (holds {mib} MiB)")
    # start from a clean slate for this repo in spark-1's cache (host path of its bind mount)
    cached = os.path.join(hf_dir, "hub", "models--" + hf_repo.replace("/", "--"))
    subprocess.run(["rm", "-rf", cached], check=True)
    code = (
        "import os\n"
        "from huggingface_hub import snapshot_download\n"
        f"p = snapshot_download({hf_repo!r}, "
        "allow_patterns=['config.json', 'tokenizer*', 'README.md'])\n"
        "blobs = os.path.join(os.path.dirname(os.path.dirname(p)), 'blobs')\n"
        "open(os.path.join(blobs, 'f' * 64 + '.incomplete'), 'wb').write(b'\\0' * 65536)\n"
        "print(p)\n")
    _run([*docker, "run", "--rm", "--network", "host", "-e", f"HF_ENDPOINT={hf_endpoint}",
          "-v", "/root/.cache/huggingface:/root/.cache/huggingface", image_ref,
          "python3", "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log("seed: spark-1 HF cache partly filled "
        "(config + tokenizer, no weights, one .incomplete blob)")
