"""The `vllm serve` command line, and where the API key may (not) appear."""

from __future__ import annotations

import hashlib
import json
import shlex

import pulumi

from tests.conftest import is_secret, reveal
from tests.unit.conftest import API_KEY, COMMIT, SSH_KEY, settled

QWEN = {
    "servedModelName": "qwen3.5-122b",
    "gpuMemoryUtilization": 0.8,
    "kvCacheMemoryBytes": None,  # a GPU sizes its cache by utilization
    "maxModelLen": 65536,
    "maxNumSeqs": 4,
    "kvCacheDtype": "fp8",
    "enablePrefixCaching": True,
    "loadFormat": "fastsafetensors",
    "speculativeConfig": {"method": "mtp", "num_speculative_tokens": 1},
    "enforceEager": False,
    "host": "0.0.0.0",
    "port": 8000,
    "extraArgs": ["--max-num-batched-tokens", "16384"],
}


def serve_line(create: str) -> list[str]:
    """The argv of `exec vllm serve ...` inside the launch script."""
    launch = next(
        line.strip() for line in create.splitlines() if line.strip().startswith("docker exec -d ")
    )
    inner = shlex.split(launch)[-1]  # the sh -c script
    return shlex.split(inner.split("exec ", 1)[1].split(" >> ", 1)[0])


@pulumi.runtime.test
def test_vllm_command_line_exactly(build, mocks):
    h = build(2, model={"repo": "Qwen/Qwen3.5-122B-A10B-FP8"}, vllm=QWEN)

    def check(_):
        create = mocks.named("vllm-serve").inputs["create"]
        assert serve_line(create) == [
            "vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8",
            "--served-model-name", "qwen3.5-122b",
            "--revision", COMMIT,
            "--tensor-parallel-size", "2",
            "--pipeline-parallel-size", "1",
            "--distributed-executor-backend", "ray",
            "--gpu-memory-utilization", "0.8",
            "--max-model-len", "65536",
            "--max-num-seqs", "4",
            "--kv-cache-dtype", "fp8",
            "--enable-prefix-caching",
            "--load-format", "fastsafetensors",
            "--speculative-config", json.dumps(  # the drafter pinned to the served commit
                {"method": "mtp", "num_speculative_tokens": 1, "revision": COMMIT},
                separators=(",", ":")
            ),
            "--host", "0.0.0.0",
            "--port", "8000",
            "--max-num-batched-tokens", "16384",
        ]
        # runs inside the head Ray container, on the head, gated on health
        assert reveal(mocks.named("vllm-serve").inputs["connection"])["host"] == "10.77.0.11"
        assert "docker exec -d spark-vllm-ray-head sh -c" in create
        assert "/v1/models" in create and "/v1/completions" in create and "/health" in create
        assert "tail -n 50 /var/log/spark-vllm/vllm-serve.log" in create
        # the Ray containers' IDs: a replaced container re-runs vLLM's start
        ids = " ".join(hashlib.sha256(n.encode()).hexdigest() for n in ("ray-head", "ray-worker-spark-2"))
        assert f"# ray containers: {ids}" in create

    return settled(h).apply(check)


@pulumi.runtime.test
def test_kv_cache_bytes_when_set(build, mocks):
    """The lab's CPU vLLM sizes its KV cache in bytes (vLLM then ignores the utilization)."""
    h = build(2)

    def check(_):
        line = serve_line(mocks.named("vllm-serve").inputs["create"])
        assert line[line.index("--kv-cache-memory-bytes") + 1] == "67108864"
        assert mocks.named("vllm").inputs["kvCacheMemoryBytes"] == 67108864

    return settled(h).apply(check)


@pulumi.runtime.test
def test_optional_flags(build, mocks):
    h = build(2, vllm={"enablePrefixCaching": False, "enforceEager": True, "maxModelLen": None,
                       "maxNumSeqs": None})

    def check(_):
        argv = serve_line(mocks.named("vllm-serve").inputs["create"])
        assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
        assert "--enforce-eager" in argv
        assert "--max-model-len" not in argv and "--max-num-seqs" not in argv
        assert "--speculative-config" not in argv

    return settled(h).apply(check)


@pulumi.runtime.test
def test_api_key_only_as_secret_never_on_a_command_line(build, mocks):
    h = build(2, api_key=API_KEY, hf_token="hf_unit_test_token")

    def check(_):
        for r in mocks.resources:
            blob = json.dumps(
                {k: v for k, v in r.inputs.items() if k not in ("stdin", "connection", "apiKey")},
                default=str,
            )
            assert API_KEY not in blob, f"{r.name} exposes the API key"
            assert "hf_unit_test_token" not in blob, f"{r.name} exposes the HF token"
            assert SSH_KEY not in blob, f"{r.name} exposes the SSH key"
        serve = mocks.named("vllm-serve").inputs
        assert is_secret(serve["stdin"]) and reveal(serve["stdin"]) == API_KEY
        component = mocks.named("vllm").inputs
        assert is_secret(component["apiKey"]) and reveal(component["apiKey"]) == API_KEY
        fetch = mocks.named("model-fetch").inputs
        assert is_secret(fetch["stdin"]) and reveal(fetch["stdin"]) == "hf_unit_test_token"
        assert fetch["logging"] == "none"
        # the key reaches vLLM through a file inside the container, read by the launching shell
        assert "VLLM_API_KEY=$(cat /run/spark-vllm/api-key)" in serve["create"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_policy_props_on_vllm_server(build, mocks):
    h = build(3, api_key=None)  # dev without a configured key: the stack makes one

    def check(_):
        props = mocks.named("vllm").inputs
        assert props["environment"] == "dev"
        assert props["tensorParallelSize"] == 3 and props["pipelineParallelSize"] == 1
        assert props["clusterGpus"] == 3
        assert props["gpuMemoryUtilization"] == 0.25  # as Pulumi.dev.yaml sets it for the lab
        assert props["enforceEager"] is True  # as Pulumi.dev.yaml sets it; read by enforce-eager-advisory
        assert props["modelBytes"] == 1234 + 5_000_000 + 4_000_000 + 777
        assert props["nodes"][0] == {
            "name": "spark-1", "memTotalBytes": 125513720 * 1024, "unifiedMemory": True
        }
        # vLLM never serves without a key: the generated one, as a secret
        assert is_secret(props["apiKey"])
        assert mocks.named("secrets-vllm-api-key").inputs["create"].startswith("python3 -c")
        assert mocks.named("image").inputs["ref"] == "10.77.0.1:5000/spark-lab/vllm-spark:lab"
        node = mocks.named("spark-2").inputs
        assert node == {"name": "spark-2", "host": "10.77.0.12", "role": "worker",
                        "hostKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests"}

    return settled(h).apply(check)


@pulumi.runtime.test
def test_model_fetched_once_on_head_and_fanned_out_over_fabric(build, mocks):
    h = build(3)

    def check(_):
        fetch = mocks.named("model-fetch").inputs
        assert reveal(mocks.named("model-fetch").inputs["connection"])["host"] == "10.77.0.11"
        assert "HF_ENDPOINT=http://10.77.0.1:8090" in fetch["create"]
        assert f"spark-lab/tiny-moe {COMMIT}" in fetch["create"]
        assert "snapshot_download" in fetch["create"]
        assert [r.name for r in mocks.resources if "snapshot_download" in str(r.inputs)] == [
            "model-fetch"
        ]
        seed = mocks.named("model-seed").inputs["create"]
        # bound to the head's fabric address only, the cache mounted read-only
        assert "192.168.177.11 18472 /root/.cache/huggingface/hub/" in seed and ":ro" in seed
        for w in ("spark-2", "spark-3"):
            sync = mocks.named(f"model-sync-{w}").inputs
            manifest = json.loads(sync["stdin"])
            assert manifest["seedIp"] == "192.168.177.11" and manifest["commit"] == COMMIT
            assert len(manifest["files"]) == 4
        verify = mocks.named("model-verify-spark-3").inputs["create"]
        checked = json.loads(verify.split("printf '%s' '", 1)[1].split("' |", 1)[0])
        assert {f["path"]: f["size"] for f in checked["files"]} == {
            "config.json": 1234, "model-00001-of-00002.safetensors": 5_000_000,
            "model-00002-of-00002.safetensors": 4_000_000, "tokenizer/tokenizer.json": 777}
        assert checked["commit"] == COMMIT

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_transport_is_read_after_the_health_gate_and_exported(build, mocks, dependencies):
    h = build(2, nccl={"rdma": True, "debug": "WARN"})

    def check(values):
        (transport,) = values
        assert "vllm-serve" in dependencies["vllm-nccl-log"]
        log = mocks.named("vllm-nccl-log").inputs["create"]
        assert "docker exec spark-vllm-ray-head sh -c" in log and "NCCL INFO" in log
        text = mocks.named("vllm-transport").inputs["create"]
        # the mock log holds no NCCL lines: unknown, and with RDMA on a warning, no failure
        assert "nccl transport warning: the NCCL transport cannot be verified" in text
        assert "exit 1" not in text
        assert transport == {"all": "unknown: no NCCL transport lines (nccl.debug is WARN; INFO "
                                    "shows NCCL's choice)"}

    return settled(h, h.vllm.transport).apply(check)


@pulumi.runtime.test
def test_mtp_drafter_is_pinned_to_the_served_commit_offline(build, mocks):
    """Issue 16: vLLM gives the drafter the speculative config's own `revision` (default None),
    not `--revision`. With a pinned commit the fetch writes no refs/main, so the drafter must be
    told the commit or it finds nothing offline (prod after a promotion)."""
    h = build(2, model={"revision": COMMIT},
              vllm={"speculativeConfig": {"method": "mtp", "num_speculative_tokens": 1}})

    def check(_):
        argv = serve_line(mocks.named("vllm-serve").inputs["create"])
        assert argv[argv.index("--revision") + 1] == COMMIT
        spec = argv[argv.index("--speculative-config") + 1]
        assert spec == ('{"method":"mtp","num_speculative_tokens":1,'
                        f'"revision":"{COMMIT}"}}')
        # the cache layout the drafter meets: the commit's snapshot, no refs/main written
        fetch = mocks.named("model-fetch").inputs["create"]
        assert f"spark-lab/tiny-moe {COMMIT}" in fetch and "refs/main" not in fetch

    return settled(h).apply(check)


def test_drafter_pinning_by_method():
    from hostscripts.vllm import pinned_speculative_config as pin

    c = "c" * 40
    assert pin({"method": "mtp", "num_speculative_tokens": 2}, "org/m", c)["revision"] == c
    assert pin({"method": "draft_model", "model": "org/m"}, "org/m", c)["revision"] == c
    assert pin({"model": "org/m"}, "org/m", c)["revision"] == c  # auto-detected draft_model
    assert "revision" not in pin({"method": "ngram", "prompt_lookup_max": 3}, "org/m", c)
    assert "revision" not in pin({"method": "suffix"}, "org/m", c)
