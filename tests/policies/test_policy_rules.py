"""Every rule of issue 7, passing and failing, through `policy.validate(args, report)`."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_testkit import (
    FIREWALL,
    GIB,
    MEM,
    POLICIES_DIR,
    QWEN_122B_FIT,
    RAY_CONFIG,
    STACK_FABRIC,
    fabric,
    fw_rule,
    nccl_env,
    node_firewall,
    rargs,
    ray_head,
    ray_worker,
    res,
    run,
    sargs,
    secret,
    spark_node,
    vllm_server,
)

import rules
from rules import (
    CONTAINER,
    MODEL_CACHE,
    NCCL_ENV,
    SPARK_NODE,
    VLLM_IMAGE,
    VLLM_SERVER,
    VLLM_SERVICE,
)

REMOTE = "command:remote:Command"


def healthy_stack(**over):
    resources = [
        res(SPARK_NODE, spark_node("spark-1", "10.77.0.11"), "spark-1"),
        res(SPARK_NODE, spark_node("spark-2", "10.77.0.12"), "spark-2"),
        res(VLLM_SERVER, vllm_server(), "vllm"),
        res(VLLM_IMAGE, {"ref": "registry.example:5000/vllm-spark@sha256:" + "a" * 64,
                         "imageIds": {"spark-1": "sha256:" + "a" * 64,
                                      "spark-2": "sha256:" + "a" * 64}}, "image"),
        res(MODEL_CACHE, {"repo": "Qwen/Qwen3.5-122B-A10B-FP8", "revision": "0" * 40,
                          "commit": "0" * 40}, "model"),
        res(CONTAINER, ray_head(), "ray-head-spark-1", provider_host="ssh://root@10.77.0.11"),
        res(CONTAINER, ray_worker(), "ray-worker-spark-2", provider_host="ssh://root@10.77.0.12"),
        # the program's channel: the token on stdin (components/model_cache.py), never env
        res(REMOTE, {"create": "python3 -c 'token = sys.stdin.read().strip() or None' "
                               "Qwen/Qwen3.5-122B-A10B-FP8",
                     "stdin": secret("hf_" + "x" * 34)}, "download", aso=["stdin"]),
    ]
    return resources


# ---------------------------------------------------------------------------- 1. memory-fit
def test_memory_fit_passes_for_122b_on_two_sparks():
    assert run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server())) == []


def test_the_testkit_props_are_what_the_component_computes():
    """QWEN_122B_FIT is inspection/memory_fit.estimate's result for the staging/prod settings
    (the pack cannot import it; the VllmServer component computes it)."""
    from inspection.memory_fit import estimate, shape_from_config
    from tests.unit.inspection.model_configs import QWEN35_122B_A10B_FP8

    est = estimate(shape_from_config(QWEN35_122B_A10B_FP8), model_bytes=125_000_000_000,
                   tensor_parallel_size=2, max_model_len=65536, max_num_seqs=4,
                   kv_cache_dtype="fp8", speculative_config={"method": "mtp",
                                                             "num_speculative_tokens": 1})
    assert est.props() == QWEN_122B_FIT


def test_memory_fit_fails_when_weights_do_not_fit_one_gpu():
    # no memoryFit (an older component): the KV cache counted is the kvMinBytes floor
    msgs = run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server(tensorParallelSize=1,
                                                                clusterGpus=1, memoryFit=None)))
    assert len(msgs) == 2  # both nodes
    assert "node spark-1" in msgs[0]
    assert "weights per GPU 116.4 GiB" in msgs[0]
    assert "runtime overhead 6.0 GiB" in msgs[0] and "minimum KV cache 4.0 GiB (kvMinBytes)" in msgs[0]
    assert "vLLM budget 95.4 GiB (gpuMemoryUtilization 0.80 x memTotal 119.2 GiB)" in msgs[0]


def test_memory_fit_counts_the_kv_cache_of_the_models_config():
    """262144 tokens x 64 sequences of the 122B at fp8: 104 GiB of KV + 13.8 GiB of Gated
    DeltaNet state per GPU, far beyond the budget even though the weights fit."""
    basis = QWEN_122B_FIT["basis"].replace("65536 tokens x 4 seqs", "262144 tokens x 64 seqs")
    fit = {**QWEN_122B_FIT, "kvCacheBytesPerRank": 6656 * 262144 * 64, "basis": basis,
           "stateBytesPerRank": 64 * 231_800_832, "maxModelLen": 262144, "maxNumSeqs": 64}
    msgs = run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server(memoryFit=fit)))
    assert len(msgs) == 2
    assert msgs[0] == (
        "node spark-1: weights per GPU 58.2 GiB (modelBytes 116.4 GiB / (tp 2 x pp 1)) + runtime "
        "overhead 6.0 GiB + KV cache 117.8 GiB for 64 x 262144 tokens at fp8 (13 KV layers (incl. "
        "MTP) x 1 of 2 KV heads x 256 x 1 B (fp8) = 6656 B/token/rank; 262144 tokens x 64 seqs; 36 "
        "linear-attention layers keep 221.1 MiB state per sequence) = 182.0 GiB exceeds the vLLM "
        "budget 95.4 GiB (gpuMemoryUtilization 0.80 x memTotal 119.2 GiB); short by 86.7 GiB")


def test_memory_fit_uses_kv_cache_memory_bytes_and_needs_one_sequence_in_it():
    ok = vllm_server(kvCacheMemoryBytes=20 * GIB)
    assert run(rules.memory_fit, rargs(VLLM_SERVER, ok)) == []
    msgs = run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server(kvCacheMemoryBytes=512 * 2**20)))
    assert msgs == [
        "kvCacheMemoryBytes 0.5 GiB holds less than one maxModelLen sequence (65536 tokens need "
        "0.6 GiB per GPU: " + QWEN_122B_FIT["basis"] + "); vLLM refuses to start"]
    big = run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server(kvCacheMemoryBytes=60 * GIB)))
    assert len(big) == 2 and "+ KV cache 60.0 GiB (kvCacheMemoryBytes) = " in big[0]


def test_memory_fit_says_when_the_config_gave_no_kv_estimate():
    fit = {"weightsBytesPerRank": 62_500_000_000, "maxNumSeqs": 4, "kvCacheDtype": "fp8",
           "basis": "model shape unknown: config.json: no num_hidden_layers"}
    msgs = run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server(memoryFit=fit),
                                       config={"kvMinBytes": 40 * GIB}))
    assert msgs and ("minimum KV cache 40.0 GiB (kvMinBytes; KV cache not estimated: model shape "
                     "unknown: config.json: no num_hidden_layers)") in msgs[0]


def test_memory_fit_fails_when_the_os_reserve_is_eaten():
    msgs = run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server(gpuMemoryUtilization=0.95)))
    assert any("less than the OS reserve 8.0 GiB" in m and "highest safe utilization 0.93" in m
               for m in msgs), msgs


def test_memory_fit_adds_the_services_shares_on_a_node_to_the_main_models():
    """spark-vllm:services: the VllmServer's nodes carry the shares of the services placed
    there; together they must leave the OS its reserve (0.80 + 0.05 fits, 0.80 + 0.15 not)."""
    fits = vllm_server(nodes=[{"name": "spark-1", "memTotalBytes": MEM, "unifiedMemory": True,
                               "services": {"embed": 0.05, "rerank": 0.05}}])
    assert run(rules.memory_fit, rargs(VLLM_SERVER, fits)) == []
    over = vllm_server(nodes=[{"name": "spark-1", "memTotalBytes": MEM, "unifiedMemory": True,
                               "services": {"embed": 0.10, "rerank": 0.05}}])
    (msg,) = run(rules.memory_fit, rargs(VLLM_SERVER, over))
    assert ("node spark-1: vLLM budgets 113.2 GiB (gpuMemoryUtilization 0.80 + service embed "
            "0.10 + service rerank 0.05 = 0.95 x memTotal") in msg, msg
    assert "less than the OS reserve 8.0 GiB" in msg and "for all of them together" in msg


def test_memory_fit_judges_a_service_in_its_own_share():
    service = {"environment": "prod", "tensorParallelSize": 1, "pipelineParallelSize": 1,
               "gpuMemoryUtilization": 0.05, "modelBytes": 1_200_000_000,
               "memoryFit": {"kvCacheBytesPerRank": 2**28, "maxNumSeqs": 8, "maxModelLen": 8192,
                             "kvCacheDtype": "auto", "basis": "test"},
               "nodes": [{"name": "spark-1", "memTotalBytes": MEM, "unifiedMemory": True}]}
    assert run(rules.memory_fit, rargs(VLLM_SERVICE, service)) == []
    small = {**service, "gpuMemoryUtilization": 0.02}
    (msg,) = run(rules.memory_fit, rargs(VLLM_SERVICE, small))
    assert "node spark-1: weights per GPU 1.1 GiB" in msg and "exceeds the vLLM budget" in msg
    # a service's own overhead and KV floor (serviceOverheadBytes, serviceKvMinBytes)
    assert "runtime overhead 2.0 GiB" in msg and "KV cache 0.2 GiB" in msg


def test_memory_fit_reserve_only_on_unified_memory_and_is_configurable():
    discrete = vllm_server(gpuMemoryUtilization=0.95, nodes=[
        {"name": "dgx", "memTotalBytes": MEM, "unifiedMemory": False}])
    assert run(rules.memory_fit, rargs(VLLM_SERVER, discrete)) == []
    # a bigger KV minimum from pack config makes the healthy case fail: the 2.5 GiB estimate is
    # raised to the floor
    msgs = run(rules.memory_fit, rargs(VLLM_SERVER, vllm_server(),
                                       config={"kvMinBytes": 40 * GIB}))
    assert msgs and "KV cache 2.5 GiB for 4 x 65536 tokens at fp8" in msgs[0]
    assert "raised to kvMinBytes 40.0 GiB" in msgs[0]


def test_memory_fit_ignores_other_types():
    assert run(rules.memory_fit, rargs(CONTAINER, {"modelBytes": 1e15})) == []


# ---------------------------------------------------------------- 2. same-image-everywhere
def test_same_image_passes():
    assert run(rules.same_image_everywhere, sargs(healthy_stack())) == []


def test_same_image_fails_on_different_ids_and_container_images():
    stack = [
        res(VLLM_IMAGE, {"ref": "r@sha256:" + "a" * 64,
                         "imageIds": {"spark-1": "sha256:" + "a" * 64,
                                      "spark-2": "sha256:" + "b" * 64}}, "image"),
        res(CONTAINER, ray_head(), "ray-head"),
        res(CONTAINER, ray_worker(image="vllm-spark:latest"), "ray-worker"),
    ]
    msgs = run(rules.same_image_everywhere, sargs(stack))
    assert any("different image IDs per node" in m and "spark-2=sha256:bbbbbbbbbbbb" in m
               for m in msgs), msgs
    assert any("Ray and vLLM containers run different images" in m and "vllm-spark:latest" in m
               for m in msgs), msgs


def test_same_image_covers_the_service_containers():
    service = ray_head(image="vllm-spark:other", command=["vllm", "serve", "x"],
                       labels=[{"label": "spark-vllm.managed", "value": "true"},
                               {"label": "spark-vllm.role", "value": "vllm-service"}])
    stack = [*healthy_stack(), res(CONTAINER, service, "svc-embed-serve-spark-1")]
    msgs = run(rules.same_image_everywhere, sargs(stack))
    assert any("Ray and vLLM containers run different images" in m and "vllm-spark:other" in m
               for m in msgs), msgs


# ------------------------------------------------------------- 3. parallelism-matches-gpus
def test_parallelism_passes():
    assert run(rules.parallelism_matches_gpus, rargs(VLLM_SERVER, vllm_server())) == []


def test_parallelism_fails():
    msgs = run(rules.parallelism_matches_gpus,
               rargs(VLLM_SERVER, vllm_server(tensorParallelSize=2, pipelineParallelSize=2)))
    assert msgs == ["tensorParallelSize 2 x pipelineParallelSize 2 = 4 but the Ray cluster has 2 "
                    "GPUs; vLLM would wait for missing GPUs or leave GPUs idle"]


# ------------------------------------------------------------------ 4. nccl-rdma-interfaces
def test_nccl_passes_and_is_off_without_rdma():
    assert run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, nccl_env())) == []
    bad = nccl_env(rdma=False)
    bad["nodes"][0]["env"] = {}
    assert run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, bad)) == []


def test_nccl_fails_when_hca_misses_a_twin_and_socket_is_management():
    props = nccl_env()
    props["nodes"][1]["env"] = {"NCCL_IB_HCA": "=rocep1s0f1", "NCCL_SOCKET_IFNAME": "enP7s7",
                                "GLOO_SOCKET_IFNAME": "enp1s0f1np1"}
    msgs = run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, props))
    assert any("node spark-2: NCCL_IB_HCA==rocep1s0f1 does not cover carrier-up HCA(s) "
               "roceP2p1s0f1" in m for m in msgs), msgs
    assert any("NCCL_SOCKET_IFNAME=enP7s7 names enP7s7, not a carrier-up fabric interface" in m
               for m in msgs), msgs
    assert not any("spark-1" in m for m in msgs)


def test_nccl_carrier_down_twin_need_not_be_listed_but_unset_env_fails():
    props = nccl_env()
    props["nodes"][0]["fabric"][1] = fabric("enP2p1s0f1np1", "roceP2p1s0f1", carrier=False)
    props["nodes"][0]["env"]["NCCL_IB_HCA"] = "rocep1s0f1"
    assert run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, props)) == []
    del props["nodes"][0]["env"]["GLOO_SOCKET_IFNAME"]
    props["nodes"][0]["fabric"][0]["hcaState"] = "DOWN"
    msgs = run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, props))
    assert any("GLOO_SOCKET_IFNAME is not set" in m for m in msgs), msgs
    assert any("HCA rocep1s0f1 of carrier-up interface enp1s0f1np1 is DOWN" in m for m in msgs)


# ------------------------------------------------------------------------------ 5. fabric-mtu
def test_fabric_mtu_passes():
    assert run(rules.fabric_mtu, rargs(NCCL_ENV, nccl_env())) == []


def test_fabric_mtu_fails_and_threshold_is_config():
    props = nccl_env()
    props["nodes"][1]["fabric"][0]["mtu"] = 1500
    msgs = run(rules.fabric_mtu, rargs(NCCL_ENV, props))
    assert msgs == ["node spark-2: fabric interface enp1s0f1np1 has MTU 1500, below the required 9000"]
    assert run(rules.fabric_mtu, rargs(NCCL_ENV, props, config={"minMtu": 1500})) == []


# ---------------------------------------------------------------- 6. no-privileged-containers
def test_no_privileged_passes_with_ipc_lock():
    assert run(rules.no_privileged_containers, rargs(CONTAINER, ray_head(), "ray-head")) == []


def test_no_privileged_fails():
    props = ray_head(privileged=True, capabilities={"adds": ["CAP_IPC_LOCK", "SYS_ADMIN"]})
    msgs = run(rules.no_privileged_containers, rargs(CONTAINER, props, "ray-head"))
    assert any("container ray-head runs privileged" in m for m in msgs)
    assert any("adds capabilities SYS_ADMIN beyond the allowed IPC_LOCK" in m for m in msgs)


# ------------------------------------------------------------------------- 7. ray-not-exposed
def test_ray_not_exposed_passes():
    assert run(rules.ray_not_exposed, sargs(healthy_stack(), RAY_CONFIG)) == []
    # dashboard on loopback (Ray's default host) is fine too
    stack = [res(CONTAINER, ray_head(command=["ray", "start", "--head",
                                              "--node-ip-address=192.168.177.11"]), "h")]
    assert run(rules.ray_not_exposed, sargs(stack, RAY_CONFIG)) == []


def test_ray_not_exposed_fails_on_an_open_or_management_dashboard():
    """The dashboard rule stays: off, or on 127.0.0.1 or a fabric address only (a shell string
    command is read too). --node-ip-address is not judged (it only sets what Ray advertises)."""
    wildcard = ray_head(command=["bash", "-lc", "ray start --head --node-ip-address 10.77.0.11 "
                                                "--dashboard-host=0.0.0.0 --block"])
    mgmt = ray_head(command=["ray", "start", "--head", "--dashboard-host=10.77.0.11"])
    stack = [res(SPARK_NODE, spark_node("spark-1", "10.77.0.11"), "spark-1"),
             res(CONTAINER, wildcard, "ray-head-spark-1"), res(CONTAINER, mgmt, "h2")]
    msgs = run(rules.ray_not_exposed, sargs(stack, RAY_CONFIG))
    assert msgs == [
        "container ray-head-spark-1: the Ray dashboard listens on --dashboard-host 0.0.0.0 "
        "(every interface); disable it (--include-dashboard=false) or bind 127.0.0.1 or the "
        "fabric address",
        "container h2: the Ray dashboard listens on --dashboard-host 10.77.0.11 (a management "
        "address); disable it (--include-dashboard=false) or bind 127.0.0.1 or the fabric "
        "address"], msgs


def test_ray_not_exposed_fails_on_published_ports_not_on_the_node_ip():
    wildcard = ray_worker(command=["ray", "start", "--node-ip-address=0.0.0.0"])
    missing = ray_worker(command=["ray", "start", "--address=192.168.177.11:6379"])
    bridged = ray_head(networkMode="bridge", ports=[{"internal": 8265, "external": 8265},
                                                    {"internal": 6379, "external": 6379,
                                                     "ip": "127.0.0.1"}])
    # host networking: `ports` are irrelevant, the flags decide
    hostnet = ray_head(ports=[{"internal": 6379, "external": 6379}])
    stack = [res(CONTAINER, wildcard, "w1"), res(CONTAINER, missing, "w2"),
             res(CONTAINER, bridged, "h1"), res(CONTAINER, hostnet, "h2")]
    msgs = run(rules.ray_not_exposed, sargs(stack, RAY_CONFIG))
    # the wildcard/missing --node-ip-address is no finding: Ray listens everywhere anyway
    assert msgs == ["container h1: publishes Ray port 8265 on 0.0.0.0:8265"], msgs


def test_ray_not_exposed_uses_provider_host_as_management():
    head = ray_head(command=["ray", "start", "--head", "--dashboard-host=10.77.0.11"])
    msgs = run(rules.ray_not_exposed,
               sargs([res(CONTAINER, head, "h", provider_host="ssh://root@10.77.0.11:22")]))
    assert len(msgs) == 1 and "--dashboard-host 10.77.0.11 (a management address)" in msgs[0]


# ----------------------------------------------------------------------------- 8. vllm-api-key
def test_vllm_api_key_passes_with_a_key_and_in_dev_on_loopback_without():
    assert run(rules.vllm_api_key, sargs(healthy_stack())) == []
    for host in ("127.0.0.1", "127.0.1.1", "::1", "localhost"):
        dev = [res(VLLM_SERVER, vllm_server(environment="dev", apiKey=None, host=host), "vllm")]
        assert run(rules.vllm_api_key, sargs(dev)) == [], host


def test_vllm_api_key_fails_in_dev_without_key_beyond_loopback():
    """Issue 18: dev was exempt whatever vLLM listened on; a key is needed off loopback."""
    for host in ("0.0.0.0", "10.77.0.11", "::", "spark-1"):
        dev = [res(VLLM_SERVER, vllm_server(environment="dev", apiKey=None, host=host), "vllm")]
        msgs = run(rules.vllm_api_key, sargs(dev))
        assert len(msgs) == 1, host
        assert msgs[0].startswith(f"environment 'dev', vLLM listening on {host}: vLLM serves "
                                  "without an API key")
    # in prod a loopback bind does not exempt it
    prod = [res(VLLM_SERVER, vllm_server(apiKey=None, host="127.0.0.1"), "vllm")]
    assert run(rules.vllm_api_key, sargs(prod))[0].startswith("environment 'prod': ")


def test_vllm_api_key_fails_outside_dev_without_key():
    for env in ("staging", "prod"):
        props = vllm_server(environment=env)
        del props["apiKey"]
        msgs = run(rules.vllm_api_key, sargs([res(VLLM_SERVER, props, "vllm")]))
        assert len(msgs) == 1
        assert msgs[0].startswith(f"environment '{env}': vLLM serves without an API key")
        assert "pulumi config set --secret spark-vllm:vllmApiKey <key>" in msgs[0]
    # the environment may also come from pack config when the prop is missing
    props = vllm_server(apiKey="")
    del props["environment"]
    msgs = run(rules.vllm_api_key, sargs([res(VLLM_SERVER, props, "vllm")],
                                         {"environment": "prod"}))
    assert msgs and "environment 'prod'" in msgs[0]


def test_vllm_api_key_fails_on_plaintext_placements(monkeypatch):
    head = ray_head(command=["vllm", "serve", "m", "--api-key", "sk-live-123"])
    cmd = {"create": "VLLM_API_KEY=sk-live-123 docker exec ray-head vllm serve m"}
    msgs = run(rules.vllm_api_key, sargs([res(CONTAINER, head, "head"), res(REMOTE, cmd, "serve")]))
    assert any("container head: the vLLM API key passed on the command line (--api-key" in m
               for m in msgs), msgs
    assert any("command serve: its create script sets VLLM_API_KEY to an API key (sk-*** 11 "
               "chars); pass it on stdin from a secret, never inline" in m for m in msgs), msgs
    # a shell reference is fine
    ok = ray_head(command=["bash", "-c", 'vllm serve m --api-key "$VLLM_API_KEY"'])
    assert run(rules.vllm_api_key, sargs([res(CONTAINER, ok, "head")])) == []


def test_vllm_api_key_stack_file_must_hold_secure(monkeypatch):
    plain = "config:\n  spark-vllm:environment: dev\n  spark-vllm:vllmApiKey: sk-123\n"
    secure = "config:\n  spark-vllm:vllmApiKey:\n    secure: v1:abc==\n"
    monkeypatch.setattr(rules, "read_stack_config_text", lambda args: plain)
    msgs = run(rules.vllm_api_key, sargs([]))
    assert msgs == ["stack config spark-vllm:vllmApiKey is stored in plaintext; re-set it with "
                    "`pulumi config set --secret spark-vllm:vllmApiKey`"]
    monkeypatch.setattr(rules, "read_stack_config_text", lambda args: secure)
    assert run(rules.vllm_api_key, sargs([])) == []


def test_read_stack_config_text_finds_the_stack_file(tmp_path, monkeypatch):
    (tmp_path / "Pulumi.prod.yaml").write_text("config: {}\n")
    monkeypatch.setenv("PULUMI_STACK", "organization/spark-vllm/prod")
    assert rules.read_stack_config_text(sargs([], {"projectDir": str(tmp_path)})) == "config: {}\n"
    monkeypatch.delenv("PULUMI_STACK")
    assert rules.read_stack_config_text(sargs([], {"projectDir": str(tmp_path)})) is None


def test_secret_outputs_option_can_be_required():
    """An API key in envs is reported whatever its options; requireSecretOutputs adds the
    missing additionalSecretOutputs on top."""
    cfg = {"requireSecretOutputs": True}
    envs = ["RAY_AUTH_MODE=token", secret("VLLM_API_KEY=sk-test-key")]
    in_env = ("container head: env VLLM_API_KEY carries an API key (sk-*** 11 chars); "
              "environment values are readable in `docker inspect` and the state; pass it on "
              "stdin or in a mounted file from a secret")
    msgs = run(rules.vllm_api_key, sargs([res(CONTAINER, ray_head(envs=envs), "head")], cfg))
    assert msgs == [in_env, "container head: carries the vLLM API key in envs without "
                            "additionalSecretOutputs=['envs']"]
    assert run(rules.vllm_api_key, sargs([res(CONTAINER, ray_head(envs=envs), "head",
                                              aso=["envs"])], cfg)) == [in_env]
    assert run(rules.vllm_api_key, sargs([res(CONTAINER, ray_head(), "head")], cfg)) == []


# -------------------------------------------------------------------------- 9. hf-token-secret
def test_hf_token_passes_via_stdin():
    """The program's channel (the fetch command's stdin); envs and `environment` are not safe
    (test_secret_env_values_are_flagged_wherever_they_are)."""
    assert run(rules.hf_token_secret, sargs(healthy_stack())) == []


def test_hf_token_fails_on_plaintext_placements(monkeypatch):
    token = "hf_" + "A1b2" * 9
    cmd = {"create": f"HF_TOKEN={token} hf download Qwen/Qwen3.5-122B-A10B-FP8"}
    head = ray_head(labels=[{"label": "note", "value": token}],
                    command=["hf", "download", "m", "--token", token])
    model = {"repo": "Qwen/Qwen3.5-122B-A10B-FP8", "revision": "main", "endpoint":
             f"https://u:{token}@mirror.example"}
    msgs = run(rules.hf_token_secret, sargs([res(REMOTE, cmd, "download"),
                                             res(CONTAINER, head, "head"),
                                             res(MODEL_CACHE, model, "model")]))
    assert any("command download: its create script sets HF_TOKEN to the HF token (hf_*** 39 "
               "chars)" in m for m in msgs), msgs
    assert any("container head: the HF token passed on the command line (--token" in m
               for m in msgs), msgs
    assert any("container head: the HF token in label note" in m for m in msgs), msgs
    assert any("ModelCache model: a literal HF token in prop endpoint" in m for m in msgs), msgs
    monkeypatch.setattr(rules, "read_stack_config_text",
                        lambda args: f"config:\n  spark-vllm:hfToken: {token}\n")
    msgs = run(rules.hf_token_secret, sargs([]))
    assert msgs == ["stack config spark-vllm:hfToken is stored in plaintext; re-set it with "
                    "`pulumi config set --secret spark-vllm:hfToken`"]


# ---------------------------------------------------------------------------- 10. prod-pinned
def test_prod_pinned_passes_and_skips_dev():
    assert run(rules.prod_pinned, sargs(healthy_stack())) == []
    dev = [res(VLLM_SERVER, vllm_server(environment="dev"), "vllm"),
           res(VLLM_IMAGE, {"ref": "vllm-spark:latest", "imageIds": {}}, "image")]
    assert run(rules.prod_pinned, sargs(dev)) == []


def test_prod_pinned_fails():
    stack = [
        res(VLLM_SERVER, vllm_server(), "vllm"),
        res(VLLM_IMAGE, {"ref": "registry.example:5000/vllm-spark:latest", "imageIds": {}}, "image"),
        res(MODEL_CACHE, {"repo": "Qwen/Qwen3.5-122B-A10B-FP8", "revision": "main"}, "model"),
        res(SPARK_NODE, spark_node("spark-2", "10.77.0.12", key=""), "spark-2"),
        res(CONTAINER, ray_head(image="vllm-spark:latest"), "head"),
    ]
    msgs = run(rules.prod_pinned, sargs(stack))
    assert any("image ref 'registry.example:5000/vllm-spark:latest' is not pinned by digest" in m
               for m in msgs), msgs
    assert any("model Qwen/Qwen3.5-122B-A10B-FP8 revision 'main' is not a 40-hex commit" in m
               for m in msgs), msgs
    assert any("node spark-2 has no pinned host key" in m for m in msgs), msgs
    assert any("container head image 'vllm-spark:latest'" in m for m in msgs), msgs


# ------------------------------------------------------------ 11./12. advisories
def test_utilization_advisory():
    assert run(rules.gpu_memory_utilization_advisory, rargs(VLLM_SERVER, vllm_server())) == []
    msgs = run(rules.gpu_memory_utilization_advisory,
               rargs(VLLM_SERVER, vllm_server(gpuMemoryUtilization=0.9)))
    assert msgs == ["gpuMemoryUtilization 0.90 is above 0.85 on unified-memory nodes spark-1, "
                    "spark-2: CPU, page cache and the container share that memory"]
    assert run(rules.gpu_memory_utilization_advisory,
               rargs(VLLM_SERVER, vllm_server(gpuMemoryUtilization=0.9),
                     config={"utilizationThreshold": 0.92})) == []


def test_enforce_eager_advisory():
    assert run(rules.enforce_eager_advisory, rargs(VLLM_SERVER, vllm_server())) == []
    assert run(rules.enforce_eager_advisory,
               rargs(VLLM_SERVER, vllm_server(environment="dev", enforceEager=True))) == []
    msgs = run(rules.enforce_eager_advisory, rargs(VLLM_SERVER, vllm_server(enforceEager=True)))
    assert msgs and msgs[0].startswith("environment 'prod': enforceEager disables CUDA graphs")


def test_levels_names_and_metadata():
    from pulumi_policy import EnforcementLevel
    assert [p.name for p in rules.POLICIES] == [
        "memory-fit", "same-image-everywhere", "parallelism-matches-gpus", "nccl-rdma-interfaces",
        "fabric-mtu", "no-privileged-containers", "ray-not-exposed", "vllm-api-key",
        "hf-token-secret", "prod-pinned", "gpu-memory-utilization-advisory",
        "enforce-eager-advisory", "mp-rendezvous-fabric-only", "vllm-behind-gateway",
        "fabric-config", "fabric-addresses-unique", "monitoring-not-exposed",
        "nccl-build-advisory", "stack-ports-firewalled", "remote-code-reviewed"]
    for p in rules.POLICIES:
        assert p.description and p.remediation_steps, p.name
        advisory = p.name.endswith("-advisory")
        assert p.enforcement_level == (EnforcementLevel.ADVISORY if advisory
                                       else EnforcementLevel.MANDATORY), p.name
        if p.config_schema is not None:
            assert "enforcementLevel" not in p.config_schema.properties


# ------------------------------------------------------------ shapes the program really emits
def test_hca_state_spellings():
    props = nccl_env()
    for node in props["nodes"]:
        node["fabric"][0]["hcaState"] = "Up"          # ibdev2netdev
        node["fabric"][1]["hcaState"] = "4: ACTIVE"   # sysfs
    assert run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, props)) == []
    props["nodes"][0]["fabric"][0]["hcaState"] = "Down"
    msgs = run(rules.nccl_rdma_interfaces, rargs(NCCL_ENV, props))
    assert msgs == ["node spark-1: HCA rocep1s0f1 of carrier-up interface enp1s0f1np1 is Down, "
                    "not ACTIVE"]


def test_ray_fabric_addresses_come_from_the_nccl_component():
    nccl = nccl_env()
    for i, node in enumerate(nccl["nodes"]):
        node["fabric"][0]["ip"] = f"192.168.177.1{i + 1}"
    head = ray_head(command=["ray", "start", "--head", "--block", "--port", "6379",
                             "--node-ip-address", "192.168.177.11", "--include-dashboard=true",
                             "--dashboard-host=192.168.177.11"])
    other = ray_head(command=["ray", "start", "--head", "--node-ip-address", "172.16.9.9",
                              "--dashboard-host", "172.16.9.9"])
    msgs = run(rules.ray_not_exposed, sargs([res(NCCL_ENV, nccl, "nccl"), res(CONTAINER, head, "h"),
                                             res(CONTAINER, other, "w")]))
    assert msgs == ["container w: the Ray dashboard listens on --dashboard-host 172.16.9.9 (not a "
                    "fabric address); disable it (--include-dashboard=false) or bind 127.0.0.1 "
                    "or the fabric address"]


def test_nested_sh_c_scripts_are_inspected():
    script = ("set -eu\ndocker exec -d ray-head sh -c 'cd /x; VLLM_API_KEY=sk-live-9 "
              "exec vllm serve m'")
    msgs = run(rules.vllm_api_key, sargs([res(REMOTE, {"create": script}, "serve")]))
    assert msgs == ["command serve: its create script sets VLLM_API_KEY to an API key (sk-*** 9 "
                    "chars); pass it on stdin from a secret, never inline"]


def test_the_programs_vllm_scripts_pass_the_secret_rules():
    """The program's own API key file and health gate scripts (not copies) against the secret
    rules."""
    from hostscripts.deployment import GateRestore, GateVerdict, Held, NodeDeployment
    from hostscripts.paths import StackNames
    from hostscripts.vllm import main_key_write, vllm_deployment_final, vllm_health_gate

    names = StackNames("dev")
    key = res(REMOTE, {"create": main_key_write(names), "stdin": secret("sk-live-123")},
              "api-key", aso=["stdin"])
    part = NodeDeployment(names.deployment_dir(), (Held(names.ray_head), Held(names.serve)))
    gate = res(REMOTE, {"create": vllm_health_gate(names.serve, names.ray_head,
                                                   "ab" * 32, "http://127.0.0.1:8000", "m",
                                                   "Say hello", 60,
                                                   key_file=names.vllm_key_file,
                                                   deployment=GateRestore(
                                                       part, api=names.serve,
                                                       shape={"spark-1": [names.serve]},
                                                       on_failure="restore"))}, "health")
    # the deployment step after it, a pass and a failure that put the last one back
    steps = [res(REMOTE, {"create": vllm_deployment_final(
        part, verdict, {}, api_container=names.serve, probe_container=names.ray_head,
        health_url="http://127.0.0.1:8000", served_model_name="m", smoke_prompt="Say hello",
        timeout=60, key_file=names.vllm_key_file, facts={"image": "img"})}, f"deployment-{i}")
        for i, verdict in enumerate([GateVerdict(ok=True, deployment="a" * 16),
                                     GateVerdict(ok=False, restored_from="a" * 16,
                                                 restore="b" * 16)])]
    assert run(rules.vllm_api_key, sargs([key, gate, *steps])) == []
    assert run(rules.hf_token_secret, sargs([key, gate, *steps])) == []


def test_memory_fit_reserve_check_runs_while_model_bytes_are_unknown():
    from pulumi_policy.proxy import UNKNOWN_NUMBER_VALUE
    props = vllm_server(modelBytes=UNKNOWN_NUMBER_VALUE, gpuMemoryUtilization=0.99)
    msgs = run(rules.memory_fit, rargs(VLLM_SERVER, props))
    assert len(msgs) == 2 and all("less than the OS reserve" in m for m in msgs)
    assert not any("weights per GPU" in m for m in msgs)


# ----------------------------------------------------- secrets in environment values, anywhere
HF_LIT = "hf_" + "Q7w8E9r0" * 4 + "zz"      # 37 characters in all
SK_LIT = "sk-" + "live0123456789abcdefXYZ"   # an OpenAI-style key
SECRETS = (HF_LIT, SK_LIT, "hunter2-pass", "ghp_example_token_1234", "s3cr3t-value")


def _env_stack():
    head = ray_head(envs=[
        "NCCL_DEBUG=WARN", f"HF_TOKEN={HF_LIT}", f"NCCL_EXTRA={SK_LIT}",
        "DB_PASSWORD=hunter2-pass", "GITHUB_TOKEN=ghp_example_token_1234",
        "TOKENIZERS_PARALLELISM=false", "RAY_AUTH_TOKEN_PATH=/run/spark-vllm/ray-token",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN=1", "RAY_AUTH_MODE=token"])
    cmd = {"create": f"export AWS_SECRET_ACCESS_KEY=s3cr3t-value\nFOO={HF_LIT} run\n"
                     'HF_TOKEN="$HF_TOKEN" hf download m\ntoken=token; print(token)',
           "environment": {"HF_TOKEN": secret(HF_LIT), "VLLM_API_KEY": secret(SK_LIT),
                           "LOG_LEVEL": "info"}}
    nccl = nccl_env()
    nccl["nodes"][1]["env"].update({"HF_TOKEN": HF_LIT, "VLLM_API_KEY": SK_LIT,
                                    "NCCL_NET_GDR_LEVEL": "2"})
    return [res(CONTAINER, head, "ray-head"), res(REMOTE, cmd, "download"),
            res(NCCL_ENV, nccl, "nccl")]


def test_secret_env_values_are_flagged_wherever_they_are():
    """nccl.extraEnv `HF_TOKEN=hf_...` / `VLLM_API_KEY=sk-...` reached the containers' env (and
    `docker inspect`) unflagged: every env value of every container, command and the
    NcclEnvironment's nodes[].env is scanned; findings name the resource and the key, never the
    value (a masked form only)."""
    hf = run(rules.hf_token_secret, sargs(_env_stack()))
    api = run(rules.vllm_api_key, sargs(_env_stack()))
    for fragment in ("container ray-head: env HF_TOKEN carries the HF token (hf_*** 37 chars)",
                     "container ray-head: env GITHUB_TOKEN carries a token",
                     "command download: environment HF_TOKEN carries the HF token",
                     "command download: its create script sets FOO to the HF token (hf_*** 37 chars)",
                     "NcclEnvironment nccl: node spark-2 env HF_TOKEN carries the HF token"):
        assert any(fragment in m for m in hf), (fragment, hf)
    for fragment in ("container ray-head: env NCCL_EXTRA carries an API key (sk-***",
                     "container ray-head: env DB_PASSWORD carries a secret",
                     "command download: environment VLLM_API_KEY carries an API key",
                     "command download: its create script sets AWS_SECRET_ACCESS_KEY to a secret",
                     "NcclEnvironment nccl: node spark-2 env VLLM_API_KEY carries an API key"):
        assert any(fragment in m for m in api), (fragment, api)
    for m in hf + api:
        assert not any(s in m for s in SECRETS), m  # never the secret itself
        for innocent in ("NCCL_DEBUG", "TOKENIZERS_PARALLELISM", "RAY_AUTH_TOKEN_PATH",
                         "HF_HUB_DISABLE_IMPLICIT_TOKEN", "RAY_AUTH_MODE", "LOG_LEVEL",
                         "NCCL_NET_GDR_LEVEL", "token=token", "spark-1"):
            assert innocent not in m, m
    # each finding once, in one rule
    assert not set(hf) & set(api)
    assert len(hf) == len(set(hf)) and len(api) == len(set(api))


def test_env_references_and_unknowns_are_not_secrets():
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE
    head = ray_head(envs=["HF_TOKEN=", UNKNOWN_STRING_VALUE, "VLLM_API_KEY=$VLLM_API_KEY"])
    cmd = {"create": 'VLLM_API_KEY="$KEY" vllm serve\nHF_TOKEN=${HF_TOKEN:-} x',
           "environment": {"HF_TOKEN": UNKNOWN_STRING_VALUE}}
    nccl = nccl_env()
    nccl["nodes"][0]["env"] = UNKNOWN_STRING_VALUE
    stack = [res(CONTAINER, head, "h"), res(REMOTE, cmd, "c"), res(NCCL_ENV, nccl, "n")]
    assert run(rules.hf_token_secret, sargs(stack)) == []
    assert run(rules.vllm_api_key, sargs(stack)) == []


def test_the_programs_own_resources_pass_the_secret_and_ray_rules():
    """Every resource of the components' golden stacks (tests/unit/components/golden), as the
    engine would send them: the program itself puts no secret in an env value, and its Ray
    containers carry token authentication (RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH, read-only mount)."""
    import json

    golden = Path(__file__).resolve().parents[1] / "unit" / "components" / "golden"

    def wire(value):
        if isinstance(value, dict):
            if set(value) == {"<secret>"}:
                return secret(wire(value["<secret>"]))
            return {k: wire(v) for k, v in value.items()}
        if isinstance(value, list):
            return [wire(v) for v in value]
        return value

    files = sorted(golden.glob("*.json"))
    assert files
    for path in files:
        stack = [res(r["type"], wire(r.get("inputs") or {}), r["name"])
                 for r in json.loads(path.read_text())["resources"]]
        assert run(rules.hf_token_secret, sargs(stack)) == [], path.name
        assert run(rules.vllm_api_key, sargs(stack)) == [], path.name
        assert run(rules.ray_not_exposed, sargs(stack)) == [], path.name
        rays = [r for r in stack if r.resource_type == CONTAINER and rules.is_ray_container(r.props)]
        assert rays and all(rules.auth_findings(r.name, r.props) == [] for r in rays), path.name


# ------------------------------------------------------- ray-not-exposed: token authentication
TOKEN_PATH = "/run/spark-vllm/ray-auth-token"
AUTH_ENVS = ["NCCL_SOCKET_IFNAME=enp1s0f1np1", "RAY_AUTH_MODE=token",
             f"RAY_AUTH_TOKEN_PATH={TOKEN_PATH}"]
AUTH_MOUNTS = [{"target": "/root/.cache/huggingface/hub", "type": "bind",
                "source": "/root/.cache/huggingface/hub", "readOnly": True},
               {"target": TOKEN_PATH, "type": "bind",
                "source": "/var/lib/spark-vllm/stacks/dev/ray/auth-token", "readOnly": True}]


def _ray(name, envs=AUTH_ENVS, mounts=AUTH_MOUNTS, **over):
    return res(CONTAINER, ray_head(envs=envs, mounts=mounts, **over), name)


def test_ray_not_exposed_passes_with_token_auth_whatever_the_node_ip():
    """--node-ip-address only sets what Ray advertises (its servers listen on every interface):
    it is not judged any more; token authentication is."""
    head = ["ray", "start", "--head", "--node-ip-address=10.77.0.11", "--include-dashboard=false"]
    stack = [res(SPARK_NODE, spark_node("spark-1", "10.77.0.11"), "spark-1"),
             _ray("ray-head", command=head), _ray("ray-worker", command=[
                 "ray", "start", "--address=10.77.0.11:6379"])]
    assert run(rules.ray_not_exposed, sargs(stack, RAY_CONFIG)) == []


def test_ray_not_exposed_fails_without_token_auth():
    mounted_rw = [AUTH_MOUNTS[0], {**AUTH_MOUNTS[1], "readOnly": False}]
    stack = [
        _ray("none", envs=["NCCL_DEBUG=WARN"]),
        _ray("mode-off", envs=["RAY_AUTH_MODE=disabled", f"RAY_AUTH_TOKEN_PATH={TOKEN_PATH}"]),
        _ray("no-path", envs=["RAY_AUTH_MODE=token"]),
        _ray("unmounted", mounts=AUTH_MOUNTS[:1]),
        _ray("writable", mounts=mounted_rw),
        _ray("literal", envs=[*AUTH_ENVS, "RAY_AUTH_TOKEN=0123456789abcdef0123456789abcdef"]),
    ]
    msgs = run(rules.ray_not_exposed, sargs(stack, RAY_CONFIG))
    expected = [
        "container none: Ray runs without token authentication: RAY_AUTH_MODE is not set",
        "container none: RAY_AUTH_TOKEN_PATH is not set",
        "container mode-off: Ray runs without token authentication: RAY_AUTH_MODE=disabled",
        "container no-path: RAY_AUTH_TOKEN_PATH is not set",
        f"container unmounted: RAY_AUTH_TOKEN_PATH {TOKEN_PATH} is not mounted into the "
        f"container (no mount with target {TOKEN_PATH})",
        f"container writable: the Ray auth token file {TOKEN_PATH} is mounted writable",
        "container literal: carries the Ray auth token itself in env RAY_AUTH_TOKEN (*** 32 chars)",
    ]
    for fragment in expected:
        assert any(m.startswith(fragment) for m in msgs), (fragment, msgs)
    assert len(msgs) == len(expected), msgs
    assert not any("0123456789abcdef" in m for m in msgs)


def test_ray_auth_is_not_judged_on_unknowns():
    from pulumi_policy.proxy import UNKNOWN_ARRAY_VALUE, UNKNOWN_STRING_VALUE
    stack = [_ray("a", envs=UNKNOWN_ARRAY_VALUE),
             _ray("b", envs=["RAY_AUTH_MODE=token", UNKNOWN_STRING_VALUE]),
             _ray("c", mounts=UNKNOWN_ARRAY_VALUE),
             _ray("d", mounts=[AUTH_MOUNTS[0], UNKNOWN_STRING_VALUE])]
    assert run(rules.ray_not_exposed, sargs(stack, RAY_CONFIG)) == []


def test_prod_pinned_refuses_a_trailing_newline():
    """Issue 31, item 7: `^[0-9a-f]{40}$` with .match (and `...$` with search) took a value with
    a trailing newline as pinned."""
    assert rules.COMMIT_RE.fullmatch("c" * 40) and not rules.COMMIT_RE.fullmatch("c" * 40 + "\n")
    assert rules.DIGEST_REF_RE.fullmatch("r:5/x@sha256:" + "a" * 64)
    assert not rules.DIGEST_REF_RE.fullmatch("r:5/x@sha256:" + "a" * 64 + "\n")
    assert not rules.IMAGE_ID_RE.fullmatch("sha256:" + "a" * 64 + "\n")
    from rules import pinning

    class R:
        def __init__(self, props):
            self.props, self.name, self.urn = props, "r", "urn"

    assert pinning._model_revision_finding("prod", R({"revision": "c" * 40 + "\n",
                                                     "repo": "o/m"}))
    assert pinning._image_ref_finding("prod", R({"ref": "r:5/x@sha256:" + "a" * 64 + "\n"}))
    assert pinning._container_image_finding("prod", R({"image": "sha256:" + "a" * 64 + "\n"}))
    assert pinning._model_revision_finding("prod", R({"revision": "c" * 40, "repo": "o/m"})) \
        is None


# --------------------------------------------------------------- 13. mp-rendezvous-fabric-only
# Issue 31, item 5 and issue 45: with vllm.executor mp the ranks meet at the head's master
# port, where torch's TCPStore listens on every address without authentication; the head's
# firewall (NodeFirewall) keeps it to the stack's fabric addresses.
MP_RULE = fw_rule("vllm-rendezvous", 29501)


def _mp(**over):
    return vllm_server(**{"executor": "mp", "masterAddr": "192.168.177.11", "masterPort": 29501,
                          **over})


def _head_fw(*rules):
    return res(FIREWALL, node_firewall("spark-1", rules=rules or (MP_RULE,)), "firewall-spark-1")


def _mp_container(addr="192.168.177.11", name="vllm-serve"):
    return res(CONTAINER, {"image": "sha256:" + "a" * 64, "networkMode": "host",
                           "command": ["vllm", "serve", "m", "--nnodes", "2", "--node-rank", "0",
                                       "--master-addr", addr, "--master-port", "29501"]}, name)


def test_mp_rendezvous_passes_with_the_guard_on_the_fabric():
    stack = [res(VLLM_SERVER, _mp(), "vllm"), _mp_container(), _head_fw()]
    assert run(rules.mp_rendezvous_fabric_only, sargs(stack, RAY_CONFIG)) == []
    # not mp, or mp on one node: nothing listens for other ranks
    for props in (vllm_server(), vllm_server(executor="mp", nodes=[{"name": "spark-1"}])):
        assert run(rules.mp_rendezvous_fabric_only,
                   sargs([res(VLLM_SERVER, props, "vllm")], RAY_CONFIG)) == []


def test_mp_rendezvous_fails_without_the_guard_or_off_the_fabric():
    why = "vllm: vllm.executor mp's rendezvous (torch's TCPStore binds 0.0.0.0 and ::, " \
          "unauthenticated)"
    msgs = run(rules.mp_rendezvous_fabric_only,
               sargs([res(VLLM_SERVER, _mp(), "vllm")], RAY_CONFIG))
    assert msgs == [f"{why} listens on port 29501 of spark-1, which has no firewall "
                    "(NodeFirewall): every address reaches it"], msgs
    other = _head_fw(fw_rule("vllm-rendezvous", 29600))
    (msg,) = run(rules.mp_rendezvous_fabric_only,
                 sargs([res(VLLM_SERVER, _mp(), "vllm"), other], RAY_CONFIG))
    assert msg == f"{why}: no rule of spark-1's firewall names port 29501: every address " \
                  "reaches it", msg
    wide = _head_fw(fw_rule("vllm-rendezvous", 29501, sources=[*STACK_FABRIC, "10.77.0.12"]))
    (msg,) = run(rules.mp_rendezvous_fabric_only,
                 sargs([res(VLLM_SERVER, _mp(), "vllm"), wide], RAY_CONFIG))
    assert msg == f"{why}: spark-1's firewall rule vllm-rendezvous admits 10.77.0.12 to port " \
                  "29501, beyond the stack's fabric addresses", msg
    public = res(FIREWALL, node_firewall("spark-1", rules=(MP_RULE,), public=(29501,)), "fw")
    (msg,) = run(rules.mp_rendezvous_fabric_only,
                 sargs([res(VLLM_SERVER, _mp(), "vllm"), public], RAY_CONFIG))
    assert "is a public port of its firewall, admitted from every address" in msg
    mgmt = _mp(masterAddr="10.77.0.11")
    (msg,) = run(rules.mp_rendezvous_fabric_only,
                 sargs([res(VLLM_SERVER, mgmt, "vllm"), _head_fw()], RAY_CONFIG))
    assert "masterAddr 10.77.0.11 is not a fabric address" in msg
    msgs = run(rules.mp_rendezvous_fabric_only,
               sargs([res(VLLM_SERVER, _mp(), "vllm"), _mp_container("0.0.0.0", "c1"),
                      _mp_container("10.77.0.11", "c2"), _head_fw()], RAY_CONFIG))
    assert msgs == [
        "container c1: --master-addr 0.0.0.0 is not a fabric address (the other ranks would "
        "reach the rendezvous over another network)",
        "container c2: --master-addr 10.77.0.11 is not a fabric address (the other ranks would "
        "reach the rendezvous over another network)"], msgs


def test_mp_rendezvous_skips_what_a_preview_cannot_know():
    from pulumi_policy.proxy import UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE

    stack = [res(VLLM_SERVER, _mp(masterAddr=UNKNOWN_STRING_VALUE), "vllm"),
             res(FIREWALL, node_firewall("spark-1", rules=UNKNOWN_OBJECT_VALUE), "fw")]
    assert run(rules.mp_rendezvous_fabric_only, sargs(stack, RAY_CONFIG)) == []


# -------------------------------------------------------------------- 14. vllm-behind-gateway
GATEWAY = rules.GATEWAY


def gateway(**over):
    """The Gateway component's props (components/gateway.py)."""
    props = {"environment": "prod", "node": "spark-1", "host": "10.77.0.11", "port": 8080,
             "listen": "0.0.0.0:8080", "tls": False, "livenessPath": "/gateway/live",
             "routes": [
                 {"name": "qwen3.5-122b", "task": "generate",
                  "servers": [{"node": "spark-1", "address": "127.0.0.1", "port": 8000}]},
                 {"name": "embed", "task": "embed",
                  "servers": [{"node": "spark-2", "address": "192.168.177.12", "port": 8001}]}]}
    props.update(over)
    return props


def service(**over):
    props = {"environment": "prod", "service": "embed", "task": "embed",
             "servedModelName": "embed", "port": 8001, "hosts": {"spark-2": "192.168.177.12"}}
    props.update(over)
    return props


def vllm_container(host: str | None = "127.0.0.1", role: str = "vllm-serve", name="vllm-serve",
                   extra=(), **over):
    command = ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8", "--served-model-name",
               "qwen3.5-122b", *extra, *(["--host", host] if host is not None else []),
               "--port", "8000"]
    props = {"image": "sha256:" + "a" * 64, "networkMode": "host", "privileged": False,
             "command": command, "labels": [{"label": "spark-vllm.managed", "value": "true"},
                                            {"label": "spark-vllm.role", "value": role}],
             "ports": []}
    props.update(over)
    return res(CONTAINER, props, name, provider_host="ssh://root@10.77.0.11:22")


def gateway_stack(*, server=None, svc=None, gw=None, containers=()):
    return [
        res(SPARK_NODE, spark_node("spark-1", "10.77.0.11"), "spark-1"),
        res(SPARK_NODE, spark_node("spark-2", "10.77.0.12"), "spark-2"),
        res(NCCL_ENV, nccl_env(nodes=[
            {"name": n, "env": {}, "fabric": [{**fabric("enp1s0f1np1", "rocep1s0f1"),
                                               "ip": f"192.168.177.{ip}"},
                                              {**fabric("enP2p1s0f1np1", "roceP2p1s0f1"),
                                               "ip": f"192.168.178.{ip}"}]}
            for n, ip in (("spark-1", 11), ("spark-2", 12))]), "nccl"),
        res(VLLM_SERVER, vllm_server(servedModelName="qwen3.5-122b", **(server or {})), "vllm"),
        res(VLLM_SERVICE, service(**(svc or {})), "svc-embed"),
        *([] if gw is False else [res(GATEWAY, gateway(**(gw or {})), "gateway")]),
        vllm_container(),
        vllm_container("192.168.177.12", "vllm-service", "svc-embed-serve-spark-2"),
        *containers,
    ]


def test_vllm_behind_gateway_passes_for_what_the_program_makes():
    assert run(rules.vllm_behind_gateway, sargs(gateway_stack())) == []
    # the head's fabric address (mp on several nodes, guarded), the second twin, ::1
    mp = {"host": "192.168.177.11", "executor": "mp", "masterAddr": "192.168.177.11",
          "masterPort": 29501}
    assert run(rules.vllm_behind_gateway, sargs(gateway_stack(server=mp))) == []
    assert run(rules.vllm_behind_gateway, sargs(gateway_stack(
        svc={"hosts": {"spark-2": "192.168.178.12"}}))) == []
    assert run(rules.vllm_behind_gateway, sargs(gateway_stack(
        containers=[vllm_container("::1", name="c")]))) == []
    # a headless rank serves no API; without the NcclEnvironment the fabric subnets decide
    headless = vllm_container(None, extra=["--headless"], name="vllm-serve-spark-2")
    assert run(rules.vllm_behind_gateway, sargs(gateway_stack(containers=[headless]))) == []
    no_nccl = [r for r in gateway_stack() if r.resource_type != NCCL_ENV]
    assert run(rules.vllm_behind_gateway, sargs(no_nccl, RAY_CONFIG)) == []


@pytest.mark.parametrize(("host", "why"), [
    ("0.0.0.0", "0.0.0.0 is every address of the node, the management network's included"),
    ("::", ":: is every address of the node, the management network's included"),
    ("10.77.0.11", "10.77.0.11 is a management address"),
    ("10.1.2.3", "10.1.2.3 is neither loopback nor a fabric address"),
    ("192.168.177.99", "192.168.177.99 is neither loopback nor a fabric address"),
    ("spark-1", "spark-1 is not an address"),
])
def test_vllm_behind_gateway_fails_a_vllm_listening_beyond_it(host, why):
    msgs = run(rules.vllm_behind_gateway, sargs(gateway_stack(server={"host": host})))
    assert msgs == [f"vLLM (qwen3.5-122b) listens where the gateway does not guard it: {why}; "
                    "bind it to 127.0.0.1 or the node's fabric address (spark-vllm:vllm.host "
                    "unset: the stack's choice); clients use the gateway's endpoint"], msgs
    msgs = run(rules.vllm_behind_gateway, sargs(gateway_stack(svc={"hosts": {"spark-2": host}})))
    assert len(msgs) == 1 and msgs[0].startswith("service embed on spark-2 listens where"), msgs


def test_vllm_behind_gateway_reads_the_containers_own_command_line():
    for bad, fragment in ((vllm_container("0.0.0.0", name="a"), "0.0.0.0 is every address"),
                          (vllm_container(None, name="b"), "no address: vLLM then listens on "
                                                          "every address"),
                          (vllm_container("10.77.0.11", "vllm-service", name="c"),
                           "10.77.0.11 is a management address"),
                          (vllm_container(ports=[{"internal": 8000, "external": 8000}],
                                          name="d"), "publishes port 8000 of vLLM")):
        msgs = run(rules.vllm_behind_gateway, sargs(gateway_stack(containers=[bad])))
        assert len(msgs) == 1 and fragment in msgs[0], (bad.name, msgs)
        assert msgs[0].startswith(f"container {bad.name}: ")
    # the docker provider's ssh host counts as a management address too
    lone = [vllm_container("10.77.0.13", name="e")]
    lone[0] = res(CONTAINER, dict(lone[0].props), "e", provider_host="ssh://root@10.77.0.13")
    msgs = run(rules.vllm_behind_gateway, sargs(lone, RAY_CONFIG))
    assert msgs == ["container e: vLLM listens where the gateway does not guard it: 10.77.0.13 "
                    "is a management address; bind it to 127.0.0.1 or the node's fabric address "
                    "(spark-vllm:vllm.host unset: the stack's choice); clients use the gateway's "
                    "endpoint"], msgs


def test_an_unguarded_rendezvous_port_is_rule_13s_not_the_gateways():
    """mp's rendezvous port is no API port the gateway could front: one rule judges it (13,
    mp-rendezvous-fabric-only, the head's firewall); a stack without it still fails the pack,
    once."""
    unguarded = gateway_stack(server={"host": "192.168.177.11", "executor": "mp",
                                      "masterAddr": "192.168.177.11", "masterPort": 29501})
    assert run(rules.vllm_behind_gateway, sargs(unguarded)) == []
    msgs = run(rules.mp_rendezvous_fabric_only, sargs(unguarded))
    assert len(msgs) == 1 and "which has no firewall (NodeFirewall)" in msgs[0], msgs
    one_node = {"executor": "mp",
                "nodes": [{"name": "spark-1", "memTotalBytes": MEM, "unifiedMemory": True}]}
    assert run(rules.mp_rendezvous_fabric_only, sargs(gateway_stack(server=one_node))) == []


def test_vllm_behind_gateway_wants_a_gateway_routing_every_model():
    msgs = run(rules.vllm_behind_gateway, sargs(gateway_stack(gw=False)))
    assert msgs == ["the stack serves vLLM without a gateway (spark-vllm:gateway:Gateway): "
                    "nothing checks the API key on every path"]
    routes = gateway()["routes"][:1]
    msgs = run(rules.vllm_behind_gateway, sargs(gateway_stack(gw={"routes": routes})))
    assert msgs == ["the gateway does not route embed: its clients would have to reach vLLM "
                    "directly"]
    bad = [{**gateway()["routes"][0], "servers": [{"node": "spark-1", "address": "10.77.0.11",
                                                   "port": 8000}]}, gateway()["routes"][1]]
    msgs = run(rules.vllm_behind_gateway, sargs(gateway_stack(gw={"routes": bad})))
    assert msgs == ["the gateway reaches qwen3.5-122b at 10.77.0.11: 10.77.0.11 is a management "
                    "address; a vLLM there listens beyond the gateway"]
    # a service whose component says nothing of where it listens cannot pass
    props = service()
    del props["hosts"]
    stack = [r for r in gateway_stack() if r.resource_type != VLLM_SERVICE]
    msgs = run(rules.vllm_behind_gateway, sargs([*stack, res(VLLM_SERVICE, props, "s")]))
    assert msgs == ["service embed does not say where its vLLM listens (no `hosts`): it cannot "
                    "be shown to stay behind the gateway"]


def test_vllm_behind_gateway_skips_what_it_cannot_know():
    from pulumi_policy.proxy import UNKNOWN_ARRAY_VALUE, UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE
    stack = gateway_stack(server={"host": UNKNOWN_STRING_VALUE},
                          svc={"hosts": UNKNOWN_OBJECT_VALUE},
                          gw={"routes": UNKNOWN_ARRAY_VALUE},
                          containers=[vllm_container(command=UNKNOWN_ARRAY_VALUE, name="u")])
    assert run(rules.vllm_behind_gateway, sargs(stack)) == []


# ------------------------------------------------- 18. remote-code-reviewed (issue 44, item 1)
REVIEWED_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _trc(**over):
    return vllm_server(trustRemoteCode=True, remoteCode=[
        {"repo": "nvidia/Nemotron-Nano", "commit": REVIEWED_COMMIT},
        {"repo": "z-lab/Drafter", "commit": "89abcdef0123456789abcdef0123456789abcdef"}], **over)


def test_remote_code_is_a_review_item_until_the_pack_config_lists_it():
    assert run(rules.remote_code_reviewed, rargs(VLLM_SERVER, vllm_server())) == []
    msgs = run(rules.remote_code_reviewed, rargs(VLLM_SERVER, _trc()))
    assert msgs == [
        f"nvidia/Nemotron-Nano at {REVIEWED_COMMIT}: runs the repository's own Python code "
        "(trustRemoteCode); read it at that commit, then list "
        f"\"nvidia/Nemotron-Nano@{REVIEWED_COMMIT}\" in remote-code-reviewed's `reviewed`",
        "z-lab/Drafter at 89abcdef0123456789abcdef0123456789abcdef: runs the repository's own "
        "Python code (trustRemoteCode); read it at that commit, then list "
        "\"z-lab/Drafter@89abcdef0123456789abcdef0123456789abcdef\" in remote-code-reviewed's "
        "`reviewed`"]
    reviewed = {"reviewed": [f"nvidia/Nemotron-Nano@{REVIEWED_COMMIT}"]}
    msgs = run(rules.remote_code_reviewed, rargs(VLLM_SERVER, _trc(), config=reviewed))
    assert len(msgs) == 1 and msgs[0].startswith("z-lab/Drafter at ")
    # a service's code too
    svc = {"trustRemoteCode": True, "remoteCode": [{"repo": "org/embed", "commit": "main"}]}
    assert run(rules.remote_code_reviewed, rargs(VLLM_SERVICE, svc)) == [
        "org/embed: runs the repository's own Python code from 'main', not a 40-hex commit"]


def test_remote_code_unknown_during_a_preview_is_not_judged_yet():
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE
    props = vllm_server(trustRemoteCode=True, remoteCode=[{"repo": "a/b",
                                                           "commit": UNKNOWN_STRING_VALUE}])
    assert run(rules.remote_code_reviewed, rargs(VLLM_SERVER, props)) == []


def test_remote_code_is_advisory_in_dev_and_mandatory_elsewhere():
    import json

    from pulumi_policy import EnforcementLevel
    assert rules.remote_code_reviewed.enforcement_level == EnforcementLevel.MANDATORY
    dev = json.loads((POLICIES_DIR / "config.dev.json").read_text())
    prod = json.loads((POLICIES_DIR / "config.prod.json").read_text())
    assert dev["remote-code-reviewed"] == "advisory"
    assert prod["remote-code-reviewed"] == {"reviewed": []}


def test_the_pack_flags_the_contracts_secret_shapes():
    """contract/forms.py: the broader of the program's and the pack's old shapes."""
    from rules import _secrets
    assert _secrets.classify_env("X", "hf_" + "a" * 20) == (_secrets.HF, "the HF token")
    assert _secrets.classify_env("X", "-----BEGIN " + "RSA PRIVATE KEY-----") == (_secrets.API, "a private key")
    assert _secrets.classify_env("MAX_TOKENS", "4096") == (_secrets.HF, "a token")
    assert _secrets.classify_env("TOKENIZERS_PARALLELISM", "false") is None  # a flag value
