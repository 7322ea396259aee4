"""What one stack's containers may write that another stack's load (issue 31, item 4).

* Compile and JIT caches hold code (inductor's generated modules, Triton's and FlashInfer's
  kernels, CUDA's JIT'd PTX): every stack on a node mounted the same writable folder, so one
  stack's image could plant code another stack loads. Each stack has its own folder now,
  StackNames.compile_cache_dir (in the stack's own folder under /var/lib/spark-vllm/stacks/).
* The HF cache (model.cacheDir) is shared by every stack that names the same folder. No
  serving container (Ray, vLLM, a service's) writes it any more: it is mounted read-only; only
  the stack's own short-lived model commands (fetch, sync: `docker run --rm` of the stack's
  verified image, and verify, the host's python) write it. docs/design.md says why what stays
  shared is safe.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pulumi

from hostscripts import paths, ray
from tests.conftest import config_raw, reveal
from tests.unit.components.test_vllm_server import settled

HF = "/root/.cache/huggingface"
SERVING = ("ray-head", "ray-worker-spark-2", "vllm-serve", "svc-embed-serve-spark-1")


def _mounts(mocks, name: str) -> dict[str, dict]:
    return {m["target"]: m for m in reveal(mocks.named(name).inputs["mounts"])}


@pulumi.runtime.test
def test_every_serving_container_mounts_the_stacks_own_compile_cache_and_the_hf_cache_read_only(
        build, mocks):
    raw = config_raw(2)
    raw["services"] = [{"name": "embed", "repo": "org/e", "task": "embed", "port": 8001,
                        "gpuMemoryUtilization": 0.05}]
    h = build(raw=raw)

    def check(_):
        for name in SERVING:
            mounts = _mounts(mocks, name)
            assert mounts["/var/cache/spark-vllm"]["source"] == \
                "/var/lib/spark-vllm/stacks/dev/compile-cache", name
            # the hub only, read-only: never HF_HOME, where `hf auth login` leaves a node's
            # token (issue 46)
            hub = f"{HF}/hub"
            assert mounts[hub]["source"] == hub and mounts[hub].get("readOnly") is True, name
            assert HF not in mounts and not any(
                m["source"] in (HF, HF + "/", f"{HF}/token") for m in mounts.values()), name
        # the model commands, which must write, keep a writable mount of their own: the
        # cache's hub/ only, never HF_HOME with a node's `token` (issue 46)
        fetch = reveal(mocks.named("model-fetch").inputs["create"])
        assert f"-v {HF}/hub:{HF}/hub " in fetch and f"-v {HF}:" not in fetch
        for node in ("spark-1", "spark-2"):
            cache = reveal(mocks.named(f"ray-compile-cache-{node}").inputs["create"])
            assert "mkdir -p /var/lib/spark-vllm/stacks/dev/compile-cache" in cache
            assert "/var/lib/spark-vllm/compile-cache" not in cache

    return settled(h).apply(check)


def test_two_stacks_never_share_a_compile_cache():
    dev, prod = paths.StackNames("dev"), paths.StackNames("prod")
    assert dev.compile_cache_dir != prod.compile_cache_dir
    assert dev.compile_cache_dir.startswith(dev.dir + "/")


def test_the_compile_cache_folder_is_root_only_and_the_stack_folder_too(tmp_path):
    """The script, run here with the nodes' /var/lib/spark-vllm moved into a sandbox: the
    stack's folder and its compile cache are made 0700 whatever the umask."""
    names = paths.StackNames("dev")
    script = ray.compile_cache_dir(names).replace("/var/lib/spark-vllm",
                                                  f"{tmp_path}/var/lib/spark-vllm")
    done = subprocess.run(["sh", "-c", f"umask 022; {script}"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    for folder in (names.dir, names.compile_cache_dir):
        mode = stat.S_IMODE(os.stat(f"{tmp_path}{folder}").st_mode)
        assert mode == 0o700, (folder, oct(mode))
    assert Path(f"{tmp_path}{names.compile_cache_dir}").is_dir()
