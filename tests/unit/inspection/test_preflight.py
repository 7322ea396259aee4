"""Every preflight check with a passing and a failing case, on facts parsed from the recorded GB10
outputs (recon_helpers.spark_output) and the reference head's seed containers."""

from __future__ import annotations

import hashlib
import json

import pytest

from hostscripts.paths import StackNames
from inspection import preflight, recon
from inspection.preflight import Plan, PreflightError
from tests.unit.inspection.recon_helpers import (
    GIB,
    MODEL_BYTES,
    NONCE,
    assemble,
    config,
    raw_config,
    sample,
    spark_output,
    spark_sections,
)


def facts_of(*outputs, names=("spark-1", "spark-2"), **pins):
    return {name: recon.parse_recon_output(name, text, nonce=NONCE) for name, text in zip(names, outputs, strict=False)}


def good_facts(**override_2):
    """Two healthy Sparks; override_2 replaces sections of spark-2's output."""
    return facts_of(spark_output(1), assemble(spark_sections(2, **override_2)))


def fail(cfg, facts, **kw) -> PreflightError:
    with pytest.raises(PreflightError) as exc:
        preflight.check(cfg, facts, **kw)
    return exc.value


def only(err: PreflightError, check: str) -> list:
    return [f for f in err.findings if f.check == check]


# --------------------------------------------------------------------------- the happy path

def test_two_healthy_sparks_pass_with_the_model():
    cfg = config()
    plan = preflight.check(cfg, good_facts(), model_bytes=MODEL_BYTES)
    assert isinstance(plan, Plan)
    assert plan.stop_containers == {}
    assert plan.hcas_up == {"spark-1": ["roceP2p1s0f1", "rocep1s0f1"],
                            "spark-2": ["roceP2p1s0f1", "rocep1s0f1"]}
    assert plan.model_bytes_missing["spark-1"] == MODEL_BYTES - 40_000_000_000
    total = 125513720 * 1024
    assert plan.memory_budget_bytes["spark-1"] == max(int(0.8 * total),
                                                      MODEL_BYTES // 2 + 8 * GIB)
    assert plan.warnings == []


def test_error_message_lists_node_fact_and_fix():
    err = fail(config(), good_facts(nvidia_smi_query="NVIDIA H100 80GB HBM3, 9.0, 580.159.03, 81559 MiB",
                                    nvidia_smi=("", 127)))
    text = str(err)
    assert text.startswith("preflight failed with 1 problem(s); nothing was changed:")
    assert "  - spark-2: GPU is 'NVIDIA H100 80GB HBM3', not NVIDIA GB10 — " in text


# --------------------------------------------------------------------------- reachability

@pytest.mark.parametrize("stderr,kind", [
    ("ssh: connect to host 10.77.0.12 port 22: Connection refused", "unreachable"),
    ("root@10.77.0.12: Permission denied (publickey).", "auth"),
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.",
     "host_key"),
])
def test_recon_errors_become_findings(stderr, kind):
    cfg = config()
    facts = good_facts()
    facts["spark-2"] = recon.classify_ssh_failure(cfg.nodes[1], 255, stderr, "/k")
    err = fail(cfg, facts)
    (finding,) = err.findings
    assert finding.node == "spark-2" and finding.check == kind and finding.fix


def test_a_node_missing_from_the_facts_fails():
    facts = good_facts()
    del facts["spark-2"]
    assert only(fail(config(), facts), "reachability")


# --------------------------------------------------------------------------- GB10

def test_gb10_fails_for_another_gpu_and_passes_when_not_required():
    other = dict(nvidia_smi_query="NVIDIA H100 80GB HBM3, 9.0, 580.159.03, 81559 MiB",
                 nvidia_smi=("", 127))
    (finding,) = only(fail(config(), good_facts(**other)), "gb10")
    assert "NVIDIA H100" in finding.fact and "requireGb10" in finding.fix
    preflight.check(config(preflight={"requireGb10": False}), good_facts(**other))


def test_gb10_fails_when_nvidia_smi_is_missing():
    missing = ("", 127, "nvidia-smi: command not found")
    (finding,) = only(fail(config(), good_facts(nvidia_smi_query=missing, nvidia_smi=missing,
                                                nvidia_smi_list=missing)), "gb10")
    assert finding.node == "spark-2" and "nvidia-smi is not installed" in finding.fact


def test_dgx_release_of_another_platform_is_only_a_warning():
    plan = preflight.check(config(), good_facts(dgx_release='DGX_NAME="DGX Station"\n'))
    assert [w.check for w in plan.warnings] == ["gb10"]


# --------------------------------------------------------------------------- driver / CUDA

def test_driver_mismatch_names_the_other_nodes_driver():
    table = spark_sections(1)["nvidia_smi"].replace("580.159.03", "580.95.05")
    query = spark_sections(1)["nvidia_smi_query"].replace("580.159.03", "580.95.05")
    err = fail(config(), good_facts(nvidia_smi=table, nvidia_smi_query=query))
    (finding,) = only(err, "driver")
    assert finding.node == "spark-2"
    assert finding.fact == "driver 580.95.05 differs from spark-1's 580.159.03"


def test_cuda_mismatch():
    table = spark_sections(1)["nvidia_smi"].replace("CUDA Version: 13.0", "CUDA Version: 13.1")
    (finding,) = only(fail(config(), good_facts(nvidia_smi=table)), "cuda")
    assert "CUDA 13.1 differs from spark-1's 13.0" in finding.fact


# --------------------------------------------------------------------------- Docker

def test_docker_missing():
    (finding,) = only(fail(config(), good_facts(docker_info=("", 127))), "docker")
    assert finding.fact == "Docker is not installed"


def test_docker_not_answering_quotes_the_daemon():
    err = fail(config(), good_facts(docker_info=("", 1, "permission denied while trying to "
                                                       "connect to the Docker daemon socket")))
    (finding,) = only(err, "docker")
    assert "permission denied" in finding.fact


def test_docker_too_old_and_passes_when_new_enough():
    old = '{"ServerVersion":"19.03.15","Runtimes":{"nvidia":{"path":"x"},"runc":{"path":"runc"}}}'
    (finding,) = only(fail(config(), good_facts(docker_info=old)), "docker")
    assert finding.fact == "Docker 19.03.15 is older than 20.10"
    preflight.check(config(preflight={"minDockerVersion": "19.03"}), good_facts(docker_info=old))


def test_docker_without_gpu_support_fails_and_hook_or_runtime_passes():
    (finding,) = only(fail(config(), good_facts(gpu_runtime="")), "docker")
    assert "no NVIDIA GPU support" in finding.fact and "nvidia-ctk" in finding.fix
    preflight.check(config(), good_facts(gpu_runtime="hook /usr/bin/nvidia-container-runtime-hook"))
    with_runtime = '{"ServerVersion":"29.2.1","Runtimes":{"nvidia":{"path":"nvidia-container-runtime"}}}'
    preflight.check(config(), good_facts(gpu_runtime="", docker_info=with_runtime))


# --------------------------------------------------------------------------- fabric

def _ip_json(**replace):
    text = spark_sections(2)["ip_addr"]
    for old, new in replace.items():
        text = text.replace(old, new)
    return text


def test_fabric_interface_missing():
    err = fail(config(), good_facts(ip_addr=_ip_json(enP2p1s0f1np1="enP2p1s0f1np9")))
    (finding,) = only(err, "fabric")
    assert "enP2p1s0f1np1 does not exist" in finding.fact and "case-sensitive" in finding.fix


def test_fabric_check_on_a_host_without_ip_says_iproute2_is_missing():
    """Issue 32: a GPU host without `ip` gave "fabric interface ... does not exist (present:
    none)"; the survey's `command not found` (rc 127) now names the missing tool."""
    err = fail(config(), good_facts(ip_addr=("", 127, "ip: command not found")))
    findings = only(err, "fabric")
    assert [f.node for f in findings] == ["spark-2", "spark-2"]
    assert findings[0].fact == ("cannot see fabric interface enp1s0f1np1: `ip` (iproute2) is not "
                                "installed on the node, so recon could not list any interface")
    assert "apt-get install iproute2" in findings[0].fix
    assert all("does not exist" not in f.fact for f in err.findings)


def test_fabric_interface_down():
    down = _ip_json(**{'"ifname":"enp1s0f1np1","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"]':
                       '"ifname":"enp1s0f1np1","flags":["NO-CARRIER","BROADCAST","MULTICAST","UP"]'})
    (finding,) = only(fail(config(), good_facts(ip_addr=down)), "fabric")
    assert finding.fact == "fabric interface enp1s0f1np1 is down (no carrier)"


# check-only (fabric.manage false): preflight wants the fabric configured already
CHECK_ONLY = config(fabric={"manage": False})


def test_fabric_mtu_below_minimum():
    small = _ip_json(**{'"mtu":9000,"qdisc":"mq","operstate":"UP","group":"default","txqlen":1000,'
                        '"link_type":"ether","address":"4c:bb:47:2d:f3:49"':
                        '"mtu":1500,"qdisc":"mq","operstate":"UP","group":"default","txqlen":1000,'
                        '"link_type":"ether","address":"4c:bb:47:2d:f3:49"'})
    (finding,) = only(fail(CHECK_ONLY, good_facts(ip_addr=small)), "fabric")
    assert "MTU 1500, below nccl.minMtu 9000" in finding.fact
    preflight.check(config(nccl={"minMtu": 1500}, fabric={"manage": False}),
                    good_facts(ip_addr=small))
    preflight.check(config(), good_facts(ip_addr=small))  # managed: the up sets MTU 9000


def test_fabric_ip_not_the_configured_one():
    # the hutch capture: link-local 169.254.x.x instead of the fabric address
    wrong = _ip_json(**{'"local":"192.168.177.12","prefixlen":24': '"local":"169.254.127.30","prefixlen":16'})
    preflight.check(config(), good_facts(ip_addr=wrong))  # managed: the up sets the address
    (finding,) = only(fail(CHECK_ONLY, good_facts(ip_addr=wrong)), "fabric")
    assert finding.fact == ("fabric interface enp1s0f1np1 has 169.254.127.30/16, "
                            "not the configured 192.168.177.12")
    assert "192.168.177.12/24" in finding.fix


def test_fabric_ip_prefix_outside_the_fabric_subnets():
    wide = _ip_json(**{'"local":"192.168.177.12","prefixlen":24': '"local":"192.168.177.12","prefixlen":16'})
    (finding,) = only(fail(CHECK_ONLY, good_facts(ip_addr=wide)), "fabric")
    assert "192.168.0.0/16 is outside nccl.fabricSubnets" in finding.fact


def test_the_management_interface_is_never_a_fabric_one_managed_or_not():
    """spark-2's enP7s7 carries its management address; a config that names it as a fabric
    interface is refused before any change, naming the key, whoever configures the fabric."""
    mgmt = _ip_json(**{'"local":"10.77.0.11"': '"local":"10.77.0.12"'})
    nodes = raw_config()["nodes"]
    nodes[1]["fabric"][0]["interface"] = "enP7s7"
    for manage in (True, False):
        err = fail(config(nodes=nodes, fabric={"manage": manage}), good_facts(ip_addr=mgmt))
        (finding,) = only(err, "fabric")
        assert finding.node == "spark-2"
        assert finding.fact.startswith("spark-vllm:nodes[1].fabric[0].interface: enP7s7 carries "
                                       "the management address 10.77.0.12"), finding.fact
    preflight.check(config(), good_facts(ip_addr=mgmt))  # named right, the same node passes


def test_slow_link_is_a_warning_on_a_spark():
    sections = spark_sections(2)
    sections["speed:enp1s0f1np1"] = spark_sections(2)["speed:enp1s0f1np1"].replace("200000", "100000")
    plan = preflight.check(config(), facts_of(spark_output(1), assemble(sections)))
    (warning,) = plan.warnings
    assert warning.node == "spark-2" and "100000 Mb/s" in warning.fact


# --------------------------------------------------------------------------- RoCE

def test_roce_device_down_when_rdma():
    # oshlabs capture: port 0 cabled, so the configured port-1 HCAs are Down
    from tests.unit.inspection.recon_helpers import gb10
    err = fail(config(), good_facts(ibdev2netdev=gb10("ibdev2netdev-oshlabs.txt")))
    assert sorted(f.fact for f in only(err, "roce")) == [
        "RoCE device roceP2p1s0f1 (enP2p1s0f1np1) is Down",
        "RoCE device rocep1s0f1 (enp1s0f1np1) is Down"]


def test_roce_down_is_fine_without_rdma():
    from tests.unit.inspection.recon_helpers import gb10
    plan = preflight.check(config(nccl={"rdma": False}),
                           good_facts(ibdev2netdev=gb10("ibdev2netdev-oshlabs.txt")))
    assert plan.hcas_up["spark-2"] == ["rocep1s0f0", "roceP2p1s0f0"]


def test_roce_device_missing():
    err = fail(config(), good_facts(ibdev2netdev=("", 127), rdma_link=("", 127)))
    findings = only(err, "roce")
    assert len(findings) == 2 and "not found" in findings[0].fact


# --------------------------------------------------------------------------- foreign containers

def seed_facts():
    """The reference scenario: the head runs vllm_node, reranker, vllm_embeddings (~98 GB)."""
    return facts_of(spark_output(1, seed=True), spark_output(2))


def test_foreign_containers_fail_by_default_naming_each_with_image_and_memory():
    err = fail(config(), seed_facts())
    foreign = only(err, "foreign")
    assert [f.fact for f in foreign] == [
        "foreign container vllm_node (image vllm-node:latest) is running and holds 68.2 GiB",
        "foreign container reranker (image nvcr.io/nvidia/vllm:25.10-py3) is running and holds 11.4 GiB",
        "foreign container vllm_embeddings (image nvcr.io/nvidia/vllm:25.10-py3) is running and holds 11.7 GiB",
    ]
    assert all(f.node == "spark-1" and "foreignContainers: stop" in f.fix for f in foreign)
    # the memory they hold also leaves the head short of its budget, and the fix says who holds it
    (memory,) = only(err, "memory")
    assert "vllm_node 68.2 GiB" in memory.fix
    # the stack's own ray head and the exited container are not foreign
    assert "spark-vllm-ray-head" not in str(err) and "old_bench" not in str(err)


def test_foreign_containers_stop_puts_them_in_the_plan_and_frees_their_memory():
    plan = preflight.check(config(preflight={"foreignContainers": "stop"}), seed_facts(),
                           model_bytes=MODEL_BYTES)
    assert [c.name for c in plan.stop_containers["spark-1"]] == ["vllm_node", "reranker",
                                                                 "vllm_embeddings"]
    assert "spark-2" not in plan.stop_containers
    assert plan.usable_memory_bytes["spark-1"] >= plan.memory_budget_bytes["spark-1"]


def test_allowlisted_container_is_neither_stopped_nor_reported():
    cfg = config(preflight={"foreignContainers": "stop", "allowContainers": ["reranker"]})
    plan = preflight.check(cfg, seed_facts())
    assert [c.name for c in plan.stop_containers["spark-1"]] == ["vllm_node", "vllm_embeddings"]


def test_foreign_containers_ignore_gives_warnings():
    # ignore: the containers stay, so a low gpuMemoryUtilization must fit next to them
    cfg = config(preflight={"foreignContainers": "ignore"}, vllm={"gpuMemoryUtilization": 0.15})
    plan = preflight.check(cfg, seed_facts())
    assert [w.check for w in plan.warnings] == ["foreign"] * 3 and plan.stop_containers == {}


def test_unreadable_container_list_is_an_error_unless_foreign_containers_are_ignored():
    """Before: an unreadable docker_ps looked like "no containers" and preflight passed (under
    `stop` the earlier stops dropped out of the plan, so the engine would start them again)."""
    facts = seed_facts()
    blind = facts["spark-1"].model_copy(update={
        "unreadable": {"docker_ps": "docker ps timed out"},
        "docker": facts["spark-1"].docker.model_copy(update={"containers": []})})
    facts = {**facts, "spark-1": blind}
    for mode in ("fail", "stop"):
        err = fail(config(preflight={"foreignContainers": mode}), facts)
        (finding,) = only(err, "foreign")
        assert finding.fact == ("the running containers cannot be judged: docker_ps unreadable "
                                "(docker ps timed out)")
    cfg = config(preflight={"foreignContainers": "ignore"}, vllm={"gpuMemoryUtilization": 0.15})
    plan = preflight.check(cfg, facts)
    assert not any(w.check == "foreign" for w in plan.warnings)
    stop_blind = {**facts, "spark-1": facts["spark-1"].model_copy(
        update={"unreadable": {"stopped": "ls: permission denied"}})}
    (finding,) = only(fail(config(preflight={"foreignContainers": "stop"}), stop_blind), "foreign")
    assert "stopped unreadable (ls: permission denied)" in finding.fact


# --------------------------------------------------------------------------- memory

def test_memory_below_budget_fails_with_the_formula():
    cfg = config(preflight={"foreignContainers": "ignore"})
    err = fail(cfg, seed_facts())
    (finding,) = only(err, "memory")
    assert finding.node == "spark-1"
    assert "usable by vLLM, below the budget" in finding.fact
    assert "max(0.8 x MemTotal 119.7 GiB)" in finding.fact


def test_memory_budget_from_the_model_share():
    # a 240 GB model over tp=2 needs 120 GB + 8 GiB reserve per node: more than a Spark has
    err = fail(config(), good_facts(disk="Avail\n900000000000"), model_bytes=240 * 10**9)
    findings = only(err, "memory")
    assert len(findings) == 2
    assert ("weights 111.8 GiB (model 223.5 GiB/(tp 2 x pp 1)) + KV cache not counted (model "
            "shape unknown: the model's config.json was not read) + osReserve 8.0 GiB"
            in findings[0].fact)


# -- what vLLM will actually get on unified memory: MemFree + what a page-cache drop reclaims.
# No /proc/meminfo of a GB10 is recorded (tests/fixtures/gb10/INDEX.md, Gaps): the inputs are
# built from free-kib-obrienlabs.txt (samples/meminfo-gb10-*.txt say how).

def with_meminfo(facts, node: str, name: str):
    """facts with `node`'s memory read from a meminfo sample (the full breakdown)."""
    from inspection.parsers import parse_meminfo

    mem = parse_meminfo(sample(name)).model_copy(update={"unified": True})
    return {**facts, node: facts[node].model_copy(update={"memory": mem})}


def test_memory_usable_is_memfree_plus_what_a_drop_reclaims_on_the_recorded_spark():
    facts = with_meminfo(good_facts(), "spark-2", "meminfo-gb10-from-free-kib.txt")
    plan = preflight.check(config(), facts, model_bytes=MODEL_BYTES)
    # MemFree 118621120 + Buffers 2048 + Cached 2398796 - Shmem 20596 - Mapped 300000
    # + SReclaimable 328000 (KiB)
    assert plan.usable_memory_bytes["spark-2"] == (118621120 + 2408248) * 1024  # 115.4 GiB
    assert plan.memory_budget_bytes["spark-2"] == int(0.8 * 125513720 * 1024)  # the claim


def test_a_full_page_cache_after_the_model_copy_counts_what_the_drop_frees():
    """Right after the 119 GB copy MemFree is 2.3 GiB; the drop the model commands run before
    vLLM starts (hostscripts/models.py drop_page_cache) gives the cache back, and the finding
    says so when the budget is still not met."""
    facts = with_meminfo(good_facts(), "spark-2", "meminfo-gb10-after-model-copy.txt")
    plan = preflight.check(config(), facts, model_bytes=MODEL_BYTES)
    assert plan.usable_memory_bytes["spark-2"] == (2410182 + 118619186) * 1024  # 115.4 GiB, as before the copy
    err = fail(config(vllm={"gpuMemoryUtilization": 0.99}), facts)
    (finding,) = [f for f in only(err, "memory") if f.node == "spark-2"]
    assert finding.fact.startswith(
        "memory: MemFree 2.3 GiB + 113.1 GiB a page-cache drop reclaims (Cached 113.1 GiB - "
        "Shmem 20 MiB - Mapped 293 MiB + Buffers 2 MiB + SReclaimable 320 MiB) = 115.4 GiB "
        "usable by vLLM, below the budget 118.5 GiB = max(0.99 x MemTotal 119.7 GiB)")


def test_page_cache_a_drop_cannot_free_is_not_usable():
    """Failing before, passing after: with a 60 GiB model file mmapped by an allowed foreign
    server, MemAvailable (what preflight counted before) still says 114.7 GiB, but the mapped
    cache stays after a drop and CUDA on GB10 cannot have it: vLLM gets 55.4 GiB, less than
    its 95.8 GiB claim."""
    facts = with_meminfo(good_facts(), "spark-2", "meminfo-gb10-mapped-model.txt")
    assert facts["spark-2"].memory.available_bytes >= int(0.8 * 125513720 * 1024)
    err = fail(config(), facts, model_bytes=MODEL_BYTES)
    (finding,) = only(err, "memory")
    assert finding.node == "spark-2"
    assert finding.fact.startswith(
        "memory: MemFree 53.1 GiB + 2.3 GiB a page-cache drop reclaims (Cached 62.3 GiB - Shmem "
        "20 MiB - Mapped 60.3 GiB + Buffers 2 MiB + SReclaimable 320 MiB) = 55.4 GiB usable by "
        "vLLM, below the budget 95.8 GiB")
    assert "Mapped 60.3 GiB (files mapped by processes) stay after a page-cache drop" in finding.fix


def test_without_the_breakdown_memavailable_is_the_fallback_and_says_so():
    err = fail(config(vllm={"gpuMemoryUtilization": 0.99}), good_facts())
    (finding, _) = only(err, "memory")
    assert finding.fact.startswith("memory: MemAvailable 114.8 GiB (the survey has no "
                                   "MemFree/Cached breakdown) = 114.8 GiB usable by vLLM")


def test_recon_keeps_the_page_cache_breakdown():
    facts = facts_of(assemble(spark_sections(1, meminfo=sample("meminfo-gb10-after-model-copy.txt"))),
                     names=("spark-1",))
    assert facts["spark-1"].memory.free_bytes == 2410182 * 1024


# -- the budget is KV-aware: weights per rank + the KV cache from the model's config.json

def qwen_shape():
    from inspection.memory_fit import shape_from_config
    from tests.unit.inspection.model_configs import QWEN35_122B_A10B_FP8

    return shape_from_config(QWEN35_122B_A10B_FP8)


STAGING_VLLM = {"maxModelLen": 65536, "maxNumSeqs": 4, "kvCacheDtype": "fp8",
                "speculativeConfig": {"method": "mtp", "num_speculative_tokens": 1}}


def test_the_122b_with_the_staging_settings_fits_the_claim():
    plan = preflight.check(config(vllm=STAGING_VLLM), good_facts(), model_bytes=MODEL_BYTES,
                           shape=qwen_shape())
    est = plan.memory_estimate
    assert est is not None and est.kv_bytes_per_token == 6656
    assert est.kv_cache_bytes == 1_744_830_464 and est.state_bytes == 927_203_328
    # weights 55.4 GiB + KV 2.5 GiB + osReserve 8 GiB = 65.9 GiB: the 95.8 GiB claim decides
    assert est.total_bytes == 59_500_000_000 + 2_672_033_792 + 8 * GIB
    assert plan.memory_budget_bytes["spark-1"] == int(0.8 * 125513720 * 1024)


def test_a_kv_cache_that_does_not_fit_fails_with_its_numbers():
    vllm = {**STAGING_VLLM, "maxModelLen": 262144, "maxNumSeqs": 64}
    err = fail(config(vllm=vllm), good_facts(), model_bytes=MODEL_BYTES, shape=qwen_shape())
    finding = only(err, "memory")[0]
    # 6656 B/token x 262144 x 64 = 104 GiB + 64 x 221.1 MiB of state = 13.8 GiB
    assert ("weights 55.4 GiB (model 110.8 GiB/(tp 2 x pp 1)) + KV cache 117.8 GiB (64 x 262144 "
            "tokens at fp8: 13 KV layers (incl. MTP) x 1 of 2 KV heads x 256 x 1 B (fp8) = 6656 "
            "B/token/rank; 262144 tokens x 64 seqs; 36 linear-attention layers keep 221.1 MiB "
            "state per sequence) + osReserve 8.0 GiB)" in finding.fact)
    assert "below the budget 181.2 GiB" in finding.fact


def test_kv_cache_memory_bytes_is_what_the_budget_counts():
    vllm = {**STAGING_VLLM, "kvCacheMemoryBytes": 20 * GIB, "gpuMemoryUtilization": 0.5}
    err = fail(config(vllm=vllm), good_facts(), model_bytes=240 * 10**9, shape=qwen_shape())
    assert "+ KV cache 20.0 GiB (vllm.kvCacheMemoryBytes) + osReserve 8.0 GiB" in \
        only(err, "memory")[0].fact


def test_an_unreadable_model_config_is_a_warning_and_the_kv_is_not_counted():
    from inspection.memory_fit import ModelShape

    shape = ModelShape(problem="config.json: no num_hidden_layers")
    plan = preflight.check(config(), good_facts(), model_bytes=MODEL_BYTES, shape=shape)
    (warning,) = plan.warnings
    assert warning.check == "memory" and warning.fact == (
        "the memory budget does not count the KV cache: model shape unknown: config.json: no "
        "num_hidden_layers")
    assert plan.memory_estimate is not None and plan.memory_estimate.kv_held_bytes == 0


def test_run_takes_the_bytes_and_shape_of_the_manifest_it_is_given(monkeypatch):
    from inspection import recon
    from inspection.hub import ModelManifest
    from tests.unit.conftest import COMMIT, MODEL_FILES

    manifest = ModelManifest("Qwen/Qwen3.5-122B-A10B-FP8", "main", COMMIT, MODEL_FILES,
                             qwen_shape())
    monkeypatch.setattr(recon, "survey_all", lambda cfg, key_path=None, **kw: good_facts())
    _, plan = preflight.run(config(vllm=STAGING_VLLM), model=lambda: manifest)
    assert plan.memory_estimate is not None and plan.memory_estimate.kv_bytes_per_token == 6656
    assert plan.memory_estimate.weights_bytes == manifest.total_bytes // 2
    # a manifest made elsewhere in the process is not picked up: nothing is remembered
    _, plan = preflight.run(config(vllm=STAGING_VLLM))
    assert plan.memory_estimate is None


def test_memory_held_by_the_stacks_own_containers_counts_as_usable():
    from tests.unit.inspection.recon_helpers import (
        SEED_HELD_KIB,
        SPARK_AVAILABLE_KIB,
        SPARK_TOTAL_KIB,
        meminfo,
    )
    worker = "ab12" * 16
    ours = (f'{{"ID":"{worker}","Names":"spark-vllm-dev-ray-worker","Image":"x","State":"running",'
            '"Labels":"spark-vllm.managed=true,spark-vllm.role=ray-worker"}')
    held = round(91.3 * 1024**3)  # what docker stats showed as 91.3GiB, read from the cgroup
    counters = f"{worker} v2 {held + 4096 * 1000} {4096 * 1000}"
    low = meminfo(SPARK_TOTAL_KIB, SPARK_AVAILABLE_KIB - SEED_HELD_KIB)
    preflight.check(config(), good_facts(docker_ps=ours, container_memory=counters, meminfo=low))
    err = fail(config(), good_facts(meminfo=low))
    assert only(err, "memory")


# --------------------------------------------------------------------------- disk

def test_disk_too_small_for_what_is_not_cached_yet():
    err = fail(config(), good_facts(disk="      Avail\n50000000000"), model_bytes=MODEL_BYTES)
    (finding,) = only(err, "disk")
    assert finding.node == "spark-2"
    assert finding.fact == ("disk: 46.6 GiB free at /root/.cache/huggingface, the model needs "
                            "73.6 GiB more (110.8 GiB total, 37.3 GiB already cached)")


def test_disk_enough_when_the_cache_already_holds_most():
    listing = spark_sections(2)["hf_cache"].replace("blobs\t40000000000", "blobs\t118000000000")
    plan = preflight.check(config(), good_facts(disk="Avail\n2000000000", hf_cache=listing),
                           model_bytes=MODEL_BYTES)
    assert plan.model_bytes_missing["spark-2"] == 1_000_000_000


# --------------------------------------------------------------------------- warnings

def test_clock_offset_warning():
    facts = facts_of(spark_output(1), spark_output(2))
    facts["spark-2"] = facts["spark-2"].model_copy(update={"clock_offset_seconds": -3.4})
    plan = preflight.check(config(), facts)
    (warning,) = plan.warnings
    assert warning.check == "clock" and "-3.4 s" in warning.fact
    facts["spark-2"] = facts["spark-2"].model_copy(update={"clock_offset_seconds": 1.5})
    assert preflight.check(config(), facts).warnings == []


def test_unreadable_sections_are_warnings():
    plan = preflight.check(config(), good_facts(docker_images="{not json"))
    (warning,) = plan.warnings
    assert warning.check == "survey" and "docker_images" in warning.fact


# --------------------------------------------------------------------------- run()

def test_run_surveys_and_checks_together():
    from tests.unit.inspection.test_recon import fake_runner
    cfg = config()
    runner = fake_runner({"10.77.0.11": spark_output(1, seed=True),
                          "10.77.0.12": (255, "ssh: connect to host 10.77.0.12 port 22: "
                                              "Connection refused")})
    with pytest.raises(PreflightError) as exc:
        preflight.run(cfg, runner=runner)
    checks = {f.check for f in exc.value.findings}
    assert {"unreachable", "foreign", "memory"} <= checks


def test_sizes_in_findings_stay_readable_for_small_containers():
    assert preflight.gib(68.2 * GIB) == "68.2 GiB"
    assert preflight.gib(312 * 1024**2) == "312 MiB"
    assert preflight.gib(0) == "0 B"


def stopped_seed_facts(label: str = "spark-vllm/dev"):
    """The seed scenario after an up with `stop`: the three are exited, each with its marker."""
    ps = sample("docker-ps-json-seed.txt")
    for name in ("vllm_node", "reranker", "vllm_embeddings"):
        ps = "\n".join(line.replace('"State":"running"', '"State":"exited"')
                       if f'"Names":"{name}"' in line else line for line in ps.splitlines())
    markers = "".join(f"marker\t{n}\t{label}\n" for n in ("vllm_node", "reranker", "vllm_embeddings"))
    return facts_of(spark_output(1, docker_ps=ps, stopped=markers), spark_output(2))


def test_containers_this_stack_stopped_stay_in_the_plan():
    """On the run after the stops they no longer run; without them in the plan the engine would
    delete the stop commands and start them again. The exited old_bench has no marker."""
    plan = preflight.check(config(preflight={"foreignContainers": "stop"}), stopped_seed_facts(),
                           model_bytes=MODEL_BYTES, stack_label="spark-vllm/dev")
    assert sorted(c.name for c in plan.stop_containers["spark-1"]) == [
        "reranker", "vllm_embeddings", "vllm_node"]
    # another stack's markers are not ours; allowlisted ones are left alone
    plan = preflight.check(config(preflight={"foreignContainers": "stop"}),
                           stopped_seed_facts("spark-vllm/staging"), stack_label="spark-vllm/dev")
    assert plan.stop_containers == {}
    plan = preflight.check(config(preflight={"foreignContainers": "stop",
                                             "allowContainers": ["reranker"]}),
                           stopped_seed_facts(), stack_label="spark-vllm/dev")
    assert sorted(c.name for c in plan.stop_containers["spark-1"]) == ["vllm_embeddings",
                                                                       "vllm_node"]


def test_stopped_containers_are_given_back_when_no_longer_in_stop_mode():
    """fail: stopped containers are not running, so nothing fails; they leave the plan (the
    engine deletes the stop commands, which start them again)."""
    plan = preflight.check(config(), stopped_seed_facts(), stack_label="spark-vllm/dev")
    assert plan.stop_containers == {}


# --------------------------------------------------------------------------- services

EMBED = {"name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8100,
         "gpuMemoryUtilization": 0.05}


def test_service_shares_that_overflow_a_node_are_refused_naming_each_share():
    cfg = config(services=[{**EMBED, "gpuMemoryUtilization": 0.30}])
    err = fail(cfg, good_facts(), model_bytes=MODEL_BYTES)
    (finding,) = [f for f in only(err, "memory") if "shares" in f.fact]
    assert finding.node == "spark-1"  # the service runs on the head only
    assert finding.fact.startswith("memory shares: the main model ")
    assert " + service embed 0.30 (35.9 GiB) + osReserve " in finding.fact
    assert "above MemTotal 119.7 GiB" in finding.fact
    assert "services" in finding.fix


def test_a_service_whose_model_outgrows_its_share_is_refused():
    from inspection.memory_fit import shape_from_config
    from tests.unit.inspection.model_configs import TINY_EMBED

    cfg = config(services=[{**EMBED, "gpuMemoryUtilization": 0.01, "maxModelLen": 4096,
                            "maxNumSeqs": 4}])
    models = {"embed": (2 * GIB, shape_from_config(TINY_EMBED))}
    err = fail(cfg, good_facts(), model_bytes=MODEL_BYTES, services=models)
    (finding,) = [f for f in only(err, "memory") if "service embed:" in f.fact]
    assert finding.fact.startswith("service embed: weights 2.0 GiB + KV cache ")
    assert "above its share 0.01 x MemTotal 119.7 GiB = 1.2 GiB" in finding.fact
    assert "services[0].gpuMemoryUtilization" in finding.fix
    # and the budget of the node counts it: the memory check names the service
    ok = preflight.check(config(services=[EMBED]), good_facts(), model_bytes=MODEL_BYTES,
                         services={"embed": (GIB, None)})
    alone = preflight.check(config(), good_facts(), model_bytes=MODEL_BYTES)
    assert ok.memory_budget_bytes["spark-1"] - alone.memory_budget_bytes["spark-1"] \
        == int(0.05 * 125513720 * 1024)
    assert ok.memory_budget_bytes["spark-2"] == alone.memory_budget_bytes["spark-2"]


def _container(name: str, stack: str = "other", **labels: str) -> str:
    """A `docker ps` line of a container of the stack `spark-vllm/<stack>` (labels by their
    short names: role, port, master_port, service)."""
    text = ",".join([f"spark-vllm.managed=true,spark-vllm.stack=spark-vllm/{stack}",
                     *(f"spark-vllm.{k.replace('_', '-')}={v}" for k, v in labels.items())])
    ident = hashlib.sha256(name.encode()).hexdigest()  # docker's IDs are unique
    return (f'{{"ID":"{ident}","Names":"{name}","Image":"x","State":"running",'
            f'"Labels":"{text}"}}')


def _other_stack(name: str, port: str | None = None) -> str:
    return _container(name, **({"port": port} if port else {}))


def test_a_name_or_port_held_by_another_stack_is_refused_before_any_change():
    # names are by stack, but `dev-ray`'s service `worker` would be dev's Ray worker
    facts = facts_of(spark_output(1), assemble(spark_sections(2, docker_ps=_container(
        "spark-vllm-dev-ray-worker", "dev-ray", role="vllm-service", service="worker"))))
    err = fail(config(), facts, stack_label="spark-vllm/dev")
    (finding,) = only(err, "other_stack")
    assert finding.node == "spark-2"
    assert finding.fact == ("container spark-vllm-dev-ray-worker (running) belongs to the stack "
                            "spark-vllm/dev-ray; this stack needs that name for Ray")
    facts = facts_of(assemble(spark_sections(
        1, docker_ps=_other_stack("spark-vllm-other-embed", "8100"))), spark_output(2))
    err = fail(config(services=[EMBED]), facts, stack_label="spark-vllm/dev")
    (finding,) = only(err, "other_stack")
    assert finding.fact == ("port 8100 is taken by spark-vllm-other-embed of the stack "
                            "spark-vllm/other; this stack listens there "
                            "(spark-vllm:services[0].port)")
    # the names each node needs: the main vLLM on the head only with Ray, on every node with mp;
    # the model seeder where a model is copied from
    names = StackNames("dev")
    assert preflight.wanted_containers(config(), "spark-2", names) == {
        "spark-vllm-dev-ray-worker": "Ray"}
    assert preflight.wanted_containers(config(), "spark-1", names) == {
        "spark-vllm-dev-serve": "the main vLLM", "spark-vllm-dev-ray-head": "Ray",
        "spark-vllm-dev-model-seeder": "the model seeder", "spark-vllm-dev-gateway": "the gateway"}
    assert "spark-vllm-dev-serve" in preflight.wanted_containers(
        config(vllm={**config().vllm.model_dump(by_alias=True), "executor": "mp"}), "spark-2",
        names)
    # the other stack's service container with a name and port of its own is no collision
    preflight.check(config(services=[{**EMBED, "port": 8200}]), facts,
                    stack_label="spark-vllm/dev")
    # another stack's gateway on the port this stack's gateway wants (every address of the head)
    facts = facts_of(assemble(spark_sections(
        1, docker_ps=_other_stack("spark-vllm-other-gateway", "8080"))), spark_output(2))
    err = fail(config(), facts, stack_label="spark-vllm/dev")
    (finding,) = only(err, "other_stack")
    assert finding.fact == ("port 8080 is taken by spark-vllm-other-gateway of the stack "
                            "spark-vllm/other; this stack listens there "
                            "(spark-vllm:gateway.port)")
    preflight.check(config(gateway={**config().gateway.model_dump(by_alias=True), "port": 8090}),
                    facts, stack_label="spark-vllm/dev")


def test_another_stacks_ray_on_a_node_this_stack_wants_ray_on_is_refused():
    """Ray's client server (10001) and dashboard agent (52365) listen on fixed ports whatever
    ray.port: two Rays on one node cannot both run."""
    facts = facts_of(spark_output(1), assemble(spark_sections(2, docker_ps=_container(
        "spark-vllm-other-ray-worker", role="ray-worker"))))
    err = fail(config(), facts, stack_label="spark-vllm/dev")
    (finding,) = only(err, "other_stack")
    assert finding.node == "spark-2"
    assert finding.fact.startswith("the stack spark-vllm/other runs Ray here "
                                   "(spark-vllm-other-ray-worker, running); this stack wants "
                                   "Ray on the node too")
    assert "10001" in finding.fact and "52365" in finding.fact
    assert "spark-vllm:vllm.executor: mp" in finding.fix and "other nodes" in finding.fix
    # without Ray this stack does not mind the other's
    preflight.check(config(vllm={"executor": "mp", "port": 8001}), facts,
                    stack_label="spark-vllm/dev")


def test_another_stacks_model_seeder_running_on_the_head_is_refused():
    """The model seeder listens on a fixed port (MODEL_SEED_PORT) and declares it."""
    seeder = _container("spark-vllm-other-model-seeder", role="model-seeder", port="18472")
    facts = facts_of(assemble(spark_sections(1, docker_ps=seeder)), spark_output(2))
    err = fail(config(vllm={"executor": "mp", "port": 8001}), facts,
               stack_label="spark-vllm/dev")
    (finding,) = only(err, "other_stack")
    assert finding.node == "spark-1"
    assert finding.fact == ("port 18472 is taken by spark-vllm-other-model-seeder of the stack "
                            "spark-vllm/other; this stack listens there (its model seeder, on "
                            "a fixed port)")
    assert "spark-vllm/other is copying a model" in finding.fix
    # one node: nothing to copy, no seeder
    one = config(nodes=raw_config()["nodes"][:1], vllm={"tensorParallelSize": 1})
    assert 18472 not in preflight.wanted_ports(one, "spark-1")


def _stack_containers(stack: str, cfg, node: str, **port_labels: str) -> list[str]:
    """The `docker ps` lines of what `stack` (config `cfg`) runs on `node` (wanted_containers,
    with each container's role and ports as the components label them)."""
    roles = {"the main vLLM": "vllm-serve", "Ray": "ray-head" if node == cfg.head.name
             else "ray-worker", "the gateway": "gateway"}
    out = []
    for name, what in preflight.wanted_containers(cfg, node, StackNames(stack)).items():
        if what == "the model seeder":
            continue  # only during an `up`
        labels = {"role": roles[what]}
        if what == "the main vLLM" and node == cfg.head.name:
            labels.update(port_labels)
        if what == "the gateway":
            labels["port"] = str(cfg.gateway.port)
        out.append(_container(name, stack, **labels))
    return out


def test_two_stacks_one_with_ray_one_with_mp_share_the_nodes():
    """Different stack names, vllm.port and masterPort: every container and file has a name of
    its own, so each stack passes beside the other's running containers (and the other way)."""
    ray_cfg = config()
    gateway = {"port": 8081}  # each stack's gateway on a port of its own
    mp_cfg = config(vllm={"executor": "mp", "port": 8001, "masterPort": 29600}, gateway=gateway)
    ray_ports = {"port": "8000"}
    mp_ports = {"port": "8001", "master_port": "29600"}

    def beside(stack: str, cfg, ports: dict[str, str]) -> dict:
        return facts_of(*(assemble(spark_sections(i + 1, docker_ps="\n".join(
            _stack_containers(stack, cfg, f"spark-{i + 1}", **ports)))) for i in range(2)))

    preflight.check(ray_cfg, beside("other", mp_cfg, mp_ports), stack_label="spark-vllm/dev")
    preflight.check(mp_cfg, beside("dev", ray_cfg, ray_ports), stack_label="spark-vllm/other")
    # the same vllm.port, or an mp stack's master port, is refused
    err = fail(config(vllm={"executor": "mp", "port": 8000}, gateway=gateway),
               beside("dev", ray_cfg, ray_ports), stack_label="spark-vllm/other")
    assert [f.fact.split(";")[0] for f in only(err, "other_stack")] == [
        "port 8000 is taken by spark-vllm-dev-serve of the stack spark-vllm/dev"]
    err = fail(config(vllm={"port": 8002, "masterPort": 29600, "executor": "mp"},
                      gateway={"port": 8082}),
               beside("other", mp_cfg, mp_ports), stack_label="spark-vllm/third")
    assert [f.fact for f in only(err, "other_stack")] == [
        "port 29600 is taken by spark-vllm-other-serve of the stack spark-vllm/other; this "
        "stack listens there (spark-vllm:vllm.masterPort)"]
    # the same gateway port is refused too
    err = fail(config(vllm={"executor": "mp", "port": 8001, "masterPort": 29600}),
               beside("dev", ray_cfg, ray_ports), stack_label="spark-vllm/other")
    assert [f.fact.split(";")[0] for f in only(err, "other_stack")] == [
        "port 8080 is taken by spark-vllm-dev-gateway of the stack spark-vllm/dev"]


def test_rdma_outside_dev_with_nccl_debug_below_info_is_refused_before_any_change():
    """Issue 32: the transport verdict fails closed; a debug level that hides NCCL's choice
    is refused at preflight instead of after vLLM was replaced."""
    err = fail(config(environment="staging", nccl={"rdma": True, "debug": "WARN"}), good_facts())
    (finding,) = only(err, "nccl")
    assert "nccl.debug is WARN" in finding.fact and "nccl.debug INFO" in finding.fix
    for ok in (config(environment="staging", nccl={"rdma": True, "debug": "INFO"}),
               config(environment="dev", nccl={"rdma": True, "debug": "WARN"}),  # dev: a warning
               config(environment="staging", nccl={"rdma": False, "debug": "WARN"})):
        try:
            preflight.check(ok, good_facts(), model_bytes=MODEL_BYTES)
        except PreflightError as exc:
            assert not only(exc, "nccl"), exc


# Issue 31, item 8: docker ps joins the labels with ',' and a value may hold one, so an image
# label `description=fast,spark-vllm.managed=true` made a foreign container count as the
# stack's and drop out of the foreign list. Labels are read as JSON (docker inspect) now.
FORGER = "5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
FORGER_PS = json.dumps({"ID": FORGER, "Image": "evil:latest", "Names": "forger",
                        "State": "running", "Status": "Up 1 hour",
                        "Labels": "description=fast,spark-vllm.managed=true,"
                                  "spark-vllm.stack=spark-vllm/dev"})
FORGER_LABELS = json.dumps({"ID": FORGER, "Labels": {
    "description": "fast,spark-vllm.managed=true,spark-vllm.stack=spark-vllm/dev"}})


def test_a_label_value_with_commas_cannot_make_a_container_the_stacks():
    out = assemble(spark_sections(1, docker_ps=FORGER_PS, docker_labels=FORGER_LABELS))
    (forger,) = recon.parse_recon_output("spark-1", out, nonce=NONCE).docker.containers
    assert forger.labels == {"description": "fast,spark-vllm.managed=true,"
                                            "spark-vllm.stack=spark-vllm/dev"}
    assert not forger.managed
    facts = facts_of(out, spark_output(2))
    (finding,) = only(fail(config(), facts, stack_label="spark-vllm/dev"), "foreign")
    assert finding.node == "spark-1" and "foreign container forger (image evil:latest)" in \
        finding.fact


# Issue 46, item 7: a container inherits its image's labels, so an image built with
# `LABEL spark-vllm.managed=true spark-vllm.stack=spark-vllm/dev` (or committed from a stack's
# container) ran as the stack's own: not foreign, its memory counted as the stack's.
HEIR = "6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"
HEIR_IMAGE = "sha256:" + "e" * 64
HEIR_LABELS = {"spark-vllm.managed": "true", "spark-vllm.stack": "spark-vllm/dev",
               "spark-vllm.role": "vllm-serve"}
HEIR_PS = json.dumps({"ID": HEIR, "Image": "committed:latest", "Names": "heir",
                      "State": "running", "Status": "Up 1 hour", "Labels": ""})


def test_a_container_whose_image_carries_the_stacks_labels_is_foreign():
    inherited = "\n".join([json.dumps({"ID": HEIR, "Image": HEIR_IMAGE, "Labels": HEIR_LABELS}),
                           json.dumps({"ImageID": HEIR_IMAGE, "Labels": HEIR_LABELS})])
    out = assemble(spark_sections(1, docker_ps=HEIR_PS, docker_labels=inherited))
    (heir,) = recon.parse_recon_output("spark-1", out, nonce=NONCE).docker.containers
    assert heir.labels == {} and not heir.managed
    facts = facts_of(out, spark_output(2))
    (finding,) = only(fail(config(), facts, stack_label="spark-vllm/dev"), "foreign")
    assert "foreign container heir (image committed:latest)" in finding.fact
    # the same labels set on the container itself (`docker run --label`, as the stack does)
    # and not by its image: the stack's
    own = "\n".join([json.dumps({"ID": HEIR, "Image": HEIR_IMAGE, "Labels": HEIR_LABELS}),
                     json.dumps({"ImageID": HEIR_IMAGE, "Labels": None})])
    out = assemble(spark_sections(1, docker_ps=HEIR_PS, docker_labels=own))
    (heir,) = recon.parse_recon_output("spark-1", out, nonce=NONCE).docker.containers
    assert heir.managed and heir.labels == HEIR_LABELS
    # an image named but not listed: its labels unknown, the section unreadable (fail closed)
    out = assemble(spark_sections(1, docker_ps=HEIR_PS, docker_labels=inherited.split("\n")[0]))
    parsed = recon.parse_recon_output("spark-1", out, nonce=NONCE)
    assert "were not read" in parsed.unreadable["docker_labels"]


def test_a_container_whose_labels_were_not_read_cannot_be_judged():
    """docker ps lists it, docker inspect gave no labels for it (removed in between, or the
    section failed): its labels are unknown, not empty, and preflight says so (fail closed)."""
    out = assemble(spark_sections(1, docker_ps=FORGER_PS, docker_labels=""))
    facts = facts_of(out, spark_output(2))
    assert "docker_labels:unmatched" in facts["spark-1"].unreadable
    for mode in ("fail", "stop"):
        (finding,) = only(fail(config(preflight={"foreignContainers": mode}), facts), "foreign")
        assert finding.fact.startswith("the running containers cannot be judged: "
                                       "docker_labels:unmatched unreadable (no labels read for "
                                       "forger")
    # and whose they are is unknown too, foreign containers ignored or not
    err = fail(config(preflight={"foreignContainers": "ignore"}), facts,
               stack_label="spark-vllm/dev")
    (finding,) = only(err, "other_stack")
    assert "labels are unreadable" in finding.fact


# --------------------------------------------------------------------------- the firewall

def test_a_node_without_nftables_is_refused_with_the_firewall_on():
    """Issue 45: the stack's table needs the node's nft; without it preflight refuses before
    any change (in every environment while firewall.enabled, which staging and prod cannot
    turn off)."""
    facts = good_facts(nft_version=("", 127, "nft: command not found"), firewall=("", 127))
    (finding,) = only(fail(config(), facts), "firewall")
    assert finding.node == "spark-2" and finding.fact.startswith(
        "nftables is not installed (no nft)") and "apt-get install nftables" in finding.fix
    dev = config(environment="dev")
    (finding,) = only(fail(dev, facts), "firewall")
    assert finding.node == "spark-2"
    off = config(environment="dev", firewall={"enabled": False})
    preflight.check(off, facts, model_bytes=MODEL_BYTES)


def test_a_table_that_cannot_be_read_fails_closed_outside_dev():
    facts = good_facts(firewall=("", 1, "Error: Operation not permitted"),
                       nft_version=sample("nft-version-debian12.txt"))
    (finding,) = only(fail(config(), facts), "firewall")
    assert "could not be read" in finding.fact and "Operation not permitted" in finding.fact
    plan = preflight.check(config(environment="dev"), facts, model_bytes=MODEL_BYTES)
    assert any(w.check == "survey" and "firewall" in w.fact for w in plan.warnings)


def test_the_port_block_must_lie_outside_the_ephemeral_ports_and_nft_be_recent():
    facts = good_facts(ephemeral_ports="20050\t60999",
                       nft_version=sample("nft-version-debian12.txt"),
                       firewall=sample("firewall-check-debian12.txt"))
    (finding,) = only(fail(config(), facts), "firewall")
    assert finding.fact.startswith("the stack's port block 20000-20199 (firewall.portBase) "
                                   "overlaps the node's ephemeral ports 20050-60999")
    assert "spark-vllm:firewall.portBase" in finding.fix
    preflight.check(config(firewall={"portBase": 10000}), facts, model_bytes=MODEL_BYTES)
    old = good_facts(nft_version="nftables v0.9.8 (E.D.S.)")
    (finding,) = only(fail(config(), old), "firewall")
    assert finding.fact == "nft 0.9.8 is older than 1.0"
    fine = good_facts(ephemeral_ports=sample("ip-local-port-range-debian12.txt"),
                      nft_version=sample("nft-version-debian12.txt"),
                      firewall=sample("firewall-check-debian12.txt"))
    assert preflight.check(config(), fine, model_bytes=MODEL_BYTES).warnings == []
# ------------------------------------------------- model.drafter (issue 44, item 4)
def test_a_drafters_bytes_count_with_the_models_in_memory_and_on_disk():
    """The drafter of another repo loads beside the model on every rank (its weights count in
    the budget) and is fetched into the same cache (its bytes not cached yet count on disk)."""
    cfg = config(model={"repo": "Qwen/Qwen3.5-122B-A10B-FP8",
                        "drafter": {"repo": "z-lab/Qwen3.5-122B-DFlash"}},
                 vllm={"speculativeConfig": {"method": "dflash",
                                             "model": "z-lab/Qwen3.5-122B-DFlash"}})
    err = fail(cfg, good_facts(disk="Avail\n900000000000"), model_bytes=200 * 10**9,
               drafter_bytes=40 * 10**9)
    (first, _second) = only(err, "memory")
    assert "weights 111.8 GiB (model and drafter 223.5 GiB/(tp 2 x pp 1))" in first.fact
    plan = preflight.check(cfg, good_facts(disk="Avail\n900000000000"), model_bytes=MODEL_BYTES,
                           drafter_bytes=3 * 10**9)
    without = preflight.check(config(), good_facts(disk="Avail\n900000000000"),
                              model_bytes=MODEL_BYTES)
    assert plan.model_bytes_missing["spark-1"] == without.model_bytes_missing["spark-1"] + 3 * 10**9
    # the model and the drafter share the disk: each fits alone, not both
    err = fail(cfg, good_facts(disk="Avail\n100000000000"), model_bytes=MODEL_BYTES,
               drafter_bytes=30 * 10**9)
    assert ("disk: 93.1 GiB free at /root/.cache/huggingface (73.6 GiB of it for the model), "
            "z-lab/Qwen3.5-122B-DFlash needs 27.9 GiB more (27.9 GiB total, 0 B already "
            "cached)") in [f.fact for f in only(err, "disk")]
