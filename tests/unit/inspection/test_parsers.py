"""Parsers on recorded real GB10 outputs (tests/fixtures/gb10) and on truncated/garbled variants,
which must raise ParseError with a readable message (never IndexError/KeyError)."""

from __future__ import annotations

import json

import pytest

from inspection import parsers as p
from inspection.parsers import ParseError
from tests.unit.inspection.recon_helpers import gb10, sample

GIB = 1024**3

NVIDIA_SMI = {
    "nvidia-smi-playbooks-cudf.txt": "580.82.09",
    "nvidia-smi-obrienlabs.txt": "580.95.05",
    "nvidia-smi-dwemer-skyrim.txt": "580.126.09",
    "nvidia-smi-code-monkeys-hutch.txt": "580.142",
    "nvidia-smi-jethac-pgx.txt": "580.159.03",
}


def assert_readable(exc: ParseError, *words: str) -> None:
    text = str(exc)
    assert text.startswith("cannot read the output of ")
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"


# --------------------------------------------------------------------------- nvidia-smi

@pytest.mark.parametrize("name,driver", sorted(NVIDIA_SMI.items()))
def test_nvidia_smi_table_on_real_gb10_outputs(name, driver):
    gpus = p.parse_nvidia_smi(gb10(name))
    assert len(gpus) == 1
    assert gpus[0].name == "NVIDIA GB10"
    assert gpus[0].driver_version == driver
    assert gpus[0].cuda_version == "13.0"
    assert gpus[0].memory_total_mib is None  # 'Not Supported' on GB10


def test_nvidia_smi_table_reads_memory_when_the_board_has_its_own():
    text = gb10("nvidia-smi-obrienlabs.txt").replace("| Not Supported          |",
                                                     "|   1234MiB /  81920MiB  |")
    assert p.parse_nvidia_smi(text)[0].memory_total_mib == 81920


def test_nvidia_smi_no_devices_is_an_empty_list():
    assert p.parse_nvidia_smi("No devices were found\n") == []


@pytest.mark.parametrize("cut", [3, 9])
def test_nvidia_smi_truncated_raises(cut):
    text = "\n".join(gb10("nvidia-smi-jethac-pgx.txt").splitlines()[:cut])
    with pytest.raises(ParseError) as exc:
        p.parse_nvidia_smi(text)
    assert_readable(exc.value, "nvidia-smi")


def test_nvidia_smi_failed_driver_raises_with_reason():
    with pytest.raises(ParseError) as exc:
        p.parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the "
                           "NVIDIA driver. Make sure that the latest NVIDIA driver is installed")
    assert_readable(exc.value, "could not talk to the driver")


def test_nvidia_smi_garbled_memory_line_raises():
    text = gb10("nvidia-smi-obrienlabs.txt").replace("| Not Supported          |",
                                                     "| ###garbled###          |")
    with pytest.raises(ParseError) as exc:
        p.parse_nvidia_smi(text)
    assert_readable(exc.value, "Memory-Usage")


def test_nvidia_smi_query_real_pgx():
    (gpu,) = p.parse_nvidia_smi_query(gb10("nvidia-smi-query-name-cc-driver-memtotal-jethac-pgx.txt"))
    assert gpu.name == "NVIDIA GB10"
    assert gpu.compute_capability == "12.1"
    assert gpu.driver_version == "580.159.03"
    assert gpu.memory_total_mib is None


def test_nvidia_smi_query_numeric_memory():
    (gpu,) = p.parse_nvidia_smi_query("NVIDIA H100 80GB HBM3, 9.0, 550.54.15, 81559 MiB\n")
    assert gpu.memory_total_mib == 81559


@pytest.mark.parametrize("text,words", [
    ("", ["empty"]),
    ("NVIDIA GB10, 12.1\n", ["4 comma-separated values", "got 2"]),
    ("NVIDIA GB10, twelve, 580.159.03, [N/A]\n", ["compute_cap"]),
    ("NVIDIA GB10, 12.1, 580.159.03, lots\n", ["memory.total"]),
])
def test_nvidia_smi_query_garbled(text, words):
    with pytest.raises(ParseError) as exc:
        p.parse_nvidia_smi_query(text)
    assert_readable(exc.value, *words)


@pytest.mark.parametrize("name,uuid", [
    ("nvidia-smi-L-code-monkeys-hutch.txt", "GPU-b0ec33a0-2589-53de-953c-0713d37d0794"),
    ("nvidia-smi-L-code-monkeys-starsky.txt", "GPU-b8712075-f818-6980-fc72-77f959a731fe"),
])
def test_nvidia_smi_list(name, uuid):
    (gpu,) = p.parse_nvidia_smi_list(gb10(name))
    assert (gpu.name, gpu.uuid) == ("NVIDIA GB10", uuid)


def test_nvidia_smi_list_garbled():
    with pytest.raises(ParseError) as exc:
        p.parse_nvidia_smi_list("GPU 0: NVIDIA GB10 (UUID: GPU-b0ec33a0")
    assert_readable(exc.value, "UUID")


def test_merge_query_and_table_gives_every_gpu_fact():
    query = p.parse_nvidia_smi_query(gb10("nvidia-smi-query-name-cc-driver-memtotal-jethac-pgx.txt"))
    table = p.parse_nvidia_smi(gb10("nvidia-smi-jethac-pgx.txt"))
    (gpu,) = p.merge_gpu_facts(query, table)
    assert (gpu.compute_capability, gpu.driver_version, gpu.cuda_version) == ("12.1", "580.159.03", "13.0")


# --------------------------------------------------------------------------- memory


def test_meminfo_real_format():
    mem = p.parse_meminfo(sample("meminfo-devbox.txt"))
    assert mem.total_bytes > 0 and 0 < mem.available_bytes <= mem.total_bytes


def test_meminfo_spark_values():
    mem = p.parse_meminfo("MemTotal:       127600748 kB\nMemFree:        119000000 kB\n"
                          "MemAvailable:   123315515 kB\n")
    assert mem.total_bytes == 127600748 * 1024
    assert mem.available_bytes == 123315515 * 1024


def test_meminfo_reads_the_page_cache_breakdown():
    mem = p.parse_meminfo(sample("meminfo-devbox.txt"))
    kib = 1024
    assert (mem.free_bytes, mem.buffers_bytes, mem.cached_bytes) == (
        20862720 * kib, 31188 * kib, 2758064 * kib)
    assert (mem.shmem_bytes, mem.mapped_bytes, mem.sreclaimable_bytes) == (
        8952 * kib, 52176 * kib, 399416 * kib)
    # Buffers + (Cached - Shmem - Mapped) + SReclaimable
    assert mem.drop_reclaimable_bytes == (31188 + 2758064 - 8952 - 52176 + 399416) * kib


def test_meminfo_without_the_breakdown_keeps_it_unknown():
    mem = p.parse_meminfo("MemTotal: 100 kB\nMemAvailable: 50 kB\n")
    assert not mem.has_breakdown and mem.free_bytes is None and mem.drop_reclaimable_bytes == 0


def test_gb10_meminfo_built_from_the_recorded_free_output_agrees_with_it():
    """No /proc/meminfo of a GB10 is recorded (fixtures/gb10/INDEX.md, Gaps): the test input is
    built from free-kib-obrienlabs.txt; its columns must come out of it again."""
    free = gb10("free-kib-obrienlabs.txt").splitlines()
    header, mem_row = free[0].split(), free[1].split()
    col = dict(zip(header, (int(v) for v in mem_row[1:]), strict=True))
    mem = p.parse_meminfo(sample("meminfo-gb10-from-free-kib.txt"))
    kib = 1024
    assert mem.total_bytes == col["total"] * kib == 125513720 * kib
    assert mem.free_bytes == col["free"] * kib and mem.available_bytes == col["available"] * kib
    assert mem.shmem_bytes == col["shared"] * kib
    assert (mem.buffers_bytes or 0) + (mem.cached_bytes or 0) + (mem.sreclaimable_bytes or 0) \
        == col["buff/cache"] * kib
    assert mem.drop_reclaimable_bytes == (2048 + 2398796 - 20596 - 300000 + 328000) * kib


@pytest.mark.parametrize("text", ["", "MemTotal:       127600748 kB\n", "MemTotal: lots\nMemAvailable: 1 kB"])
def test_meminfo_truncated(text):
    with pytest.raises(ParseError) as exc:
        p.parse_meminfo(text)
    assert_readable(exc.value, "/proc/meminfo", "MemTotal")


# --------------------------------------------------------------------------- OS identity

def test_os_release_real():
    values = p.parse_os_release(gb10("os-release-code-monkeys-hutch.txt"))
    assert values["ID"] == "ubuntu" and values["VERSION_ID"] == "24.04"
    assert values["PRETTY_NAME"] == "Ubuntu 24.04.4 LTS"


def test_dgx_release_real_keeps_last_ota_and_names_spark():
    values = p.parse_dgx_release(gb10("dgx-release-sionna-rk.txt"))
    assert values["DGX_NAME"] == "DGX Spark"
    assert values["DGX_PLATFORM"] == "DGX Server for KVM"
    assert values["DGX_OTA_VERSION"] == "7.3.1"
    assert values["DGX_OTA_DATE"] == "Wed Nov 19 05:05:30 PM CET 2025"


def test_dgx_release_absent_is_empty():
    assert p.parse_dgx_release("") == {}


def test_lsb_release_real():
    assert p.parse_key_value_file(gb10("lsb-release-file-sionna-rk.txt"), "lsb")["DISTRIB_RELEASE"] == "24.04"


@pytest.mark.parametrize("text,words", [
    ('DGX_NAME="DGX Spark\n', ["unterminated quote", "DGX_NAME"]),
    ("this is not a release file\n", ["KEY=value"]),
])
def test_dgx_release_garbled(text, words):
    with pytest.raises(ParseError) as exc:
        p.parse_dgx_release(text)
    assert_readable(exc.value, "/etc/dgx-release", *words)


def test_os_release_without_id():
    with pytest.raises(ParseError) as exc:
        p.parse_os_release('NAME="Ubuntu"\n')
    assert_readable(exc.value, "ID=")


@pytest.mark.parametrize("name,host,kernel", [
    ("uname-a-code-monkeys-hutch.txt", "hutch", "6.17.0-1014-nvidia"),
    ("uname-a-jethac-pgx.txt", "thinkstationpgx-00b4", "6.17.0-1021-nvidia"),
])
def test_uname_a_real(name, host, kernel):
    assert p.parse_uname(gb10(name)) == {"hostname": host, "kernel": kernel, "arch": "aarch64"}


def test_uname_a_without_processor_fields():
    line = "Linux lab-1 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22) x86_64 GNU/Linux"
    assert p.parse_uname(line)["arch"] == "x86_64"


def test_uname_r_and_m():
    assert p.parse_uname("6.17.0-1014-nvidia\n")["kernel"] == "6.17.0-1014-nvidia"
    assert p.parse_uname("aarch64\n")["arch"] == "aarch64"


@pytest.mark.parametrize("text", ["", "Linux hutch", "Darwin mac 23.1.0 Darwin Kernel arm64"])
def test_uname_garbled(text):
    with pytest.raises(ParseError) as exc:
        p.parse_uname(text)
    assert_readable(exc.value, "uname")


# --------------------------------------------------------------------------- RoCE

def test_ibdev2netdev_real_roce_p2_rows_first():
    roce = p.parse_ibdev2netdev(gb10("ibdev2netdev-playbooks-connect-two-sparks.txt"))
    assert [r.device for r in roce] == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    up = {r.device: r.netdev for r in roce if r.up}
    assert up == {"roceP2p1s0f1": "enP2p1s0f1np1", "rocep1s0f1": "enp1s0f1np1"}


@pytest.mark.parametrize("name,up", [
    ("ibdev2netdev-oshlabs.txt", {"rocep1s0f0", "roceP2p1s0f0"}),
    ("ibdev2netdev-playbooks-perfguide-spark-5c2d.txt", {"rocep1s0f0", "roceP2p1s0f0"}),
    ("ibdev2netdev-sean70653-gb10.txt", {"rocep1s0f0", "roceP2p1s0f0"}),
    ("ibdev2netdev-playbooks-three-sparks-all-up.txt",
     {"rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"}),
])
def test_ibdev2netdev_real_up_sets(name, up):
    roce = p.parse_ibdev2netdev(gb10(name))
    assert len(roce) == 4
    assert {r.device for r in roce if r.up} == up


def test_ibdev2netdev_empty_and_garbled():
    assert p.parse_ibdev2netdev("") == []
    with pytest.raises(ParseError) as exc:
        p.parse_ibdev2netdev("rocep1s0f0 port 1 ==> enp1s0f0np0")
    assert_readable(exc.value, "ibdev2netdev", "(Up|Down)")


def test_rdma_link_real():
    roce = p.parse_rdma_link(gb10("rdma-link-sean70653-gb10.txt"))
    assert {r.device: r.up for r in roce} == {
        "rocep1s0f0": True, "rocep1s0f1": False, "roceP2p1s0f0": True, "roceP2p1s0f1": False}
    assert roce[0].netdev == "enp1s0f0np0" and roce[0].port == 1


@pytest.mark.parametrize("text", ["link rocep1s0f0 state ACTIVE", "link rocep1s0f0/1 physical_state LINK_UP"])
def test_rdma_link_garbled(text):
    with pytest.raises(ParseError) as exc:
        p.parse_rdma_link(text)
    assert_readable(exc.value, "rdma link")


# --------------------------------------------------------------------------- interfaces


def test_ip_json_addr_real_format_devbox():
    ifaces = {i.name: i for i in p.parse_ip_json_addr(sample("ip-j-addr-devbox.txt"))}
    assert ifaces["lo"].ipv4 == ["127.0.0.1/8"] and ifaces["lo"].mtu == 65536


def test_ip_json_addr_spark_sample():
    ifaces = {i.name: i for i in p.parse_ip_json_addr(sample("ip-j-addr-spark.txt"))}
    assert ifaces["enp1s0f1np1"].ipv4 == ["192.168.177.11/24"]
    assert ifaces["enp1s0f1np1"].mtu == 9000 and ifaces["enp1s0f1np1"].carrier
    assert not ifaces["enp1s0f0np0"].carrier


@pytest.mark.parametrize("text,words", [
    ('[{"ifindex":1,"ifname":"lo"', ["not JSON"]),
    ('{"ifname":"lo"}', ["JSON list"]),
    ('[{"ifindex":1}]', ["no ifname"]),
])
def test_ip_json_addr_garbled(text, words):
    with pytest.raises(ParseError) as exc:
        p.parse_ip_json_addr(text)
    assert_readable(exc.value, "ip -j addr", *words)


@pytest.mark.parametrize("name,speed", [
    ("ethtool-grep-speed-100g-playbooks-switch.txt", 100000),
    ("ethtool-grep-speed-200g-playbooks-switch.txt", 200000),
])
def test_ethtool_speed_real(name, speed):
    assert p.parse_ethtool_speed(gb10(name)) == speed


def test_ethtool_speed_unknown_and_sysfs():
    assert p.parse_ethtool_speed("\tSpeed: Unknown!\n") is None
    assert p.parse_ethtool_speed("-1\n") is None
    assert p.parse_ethtool_speed("200000\n") == 200000


@pytest.mark.parametrize("text", ["", "\tDuplex: Full\n"])
def test_ethtool_speed_garbled(text):
    with pytest.raises(ParseError) as exc:
        p.parse_ethtool_speed(text)
    assert_readable(exc.value, "ethtool")


# --------------------------------------------------------------------------- docker


def test_docker_info_json_spark_sample():
    info = p.parse_docker_info_json(sample("docker-info-json-spark.txt"))
    assert (info.version, info.cgroup_driver, info.gpu_support) == ("29.2.1", "systemd", False)


def test_docker_info_json_nvidia_runtime():
    info = p.parse_docker_info_json(sample("docker-info-json-nvidia-runtime.txt"))
    assert info.gpu_support and "nvidia" in info.runtimes and info.version == "20.10.7"


def test_docker_info_json_daemon_down_real_capture():
    with pytest.raises(ParseError) as exc:
        p.parse_docker_info_json(sample("docker-info-json-daemon-down-devbox.txt"))
    assert_readable(exc.value, "docker info", "daemon did not answer")


def test_docker_info_json_server_errors_are_quoted():
    with pytest.raises(ParseError) as exc:
        p.parse_docker_info_json('{"ServerVersion":"","ServerErrors":["permission denied while '
                                 'trying to connect to the Docker daemon socket"]}')
    assert_readable(exc.value, "permission denied")


@pytest.mark.parametrize("text", ["", '{"ServerVersion": "29.2.1", "Runt', "[]"])
def test_docker_info_json_garbled(text):
    with pytest.raises(ParseError) as exc:
        p.parse_docker_info_json(text)
    assert_readable(exc.value, "docker info")



def test_docker_ps_json_seed():
    containers = {c.name: c for c in p.parse_docker_ps_json(sample("docker-ps-json-seed.txt"))}
    assert set(containers) == {"vllm_node", "reranker", "vllm_embeddings", "spark-vllm-ray-head",
                               "old_bench"}
    # docker ps's Labels column is not read (a ',' in a value cannot be told from the next
    # label): labels come from the docker_labels section, as JSON
    assert all(c.labels == {} for c in containers.values())
    labels = p.parse_docker_labels_json(sample("docker-labels-json-seed.txt"))
    assert set(labels) == {c.id for c in containers.values()}
    assert labels[containers["reranker"].id] == {
        "com.example.team": "search", "purpose": "rerank",
        "org.opencontainers.image.description": "vLLM, reranker build"}
    assert labels[containers["spark-vllm-ray-head"].id]["spark-vllm.managed"] == "true"
    assert labels[containers["vllm_node"].id] == {}  # Labels null: none
    assert containers["old_bench"].state == "exited"
    assert containers["vllm_node"].image == "vllm-node:latest"


@pytest.mark.parametrize("text,words", [
    ('{"ID":"abc","Names":"x","Image":"y"}\n{"ID":"ab', ["not JSON"]),
    ('{"ID":"abc","Image":"y"}', ["no Names"]),
    ('["abc"]', ["JSON object"]),
])
def test_docker_ps_json_garbled(text, words):
    with pytest.raises(ParseError) as exc:
        p.parse_docker_ps_json(text)
    assert_readable(exc.value, "docker ps", *words)


def test_docker_images_json_seed_merges_tags():
    images = {i.id: i for i in p.parse_docker_images_json(sample("docker-images-json-seed.txt"))}
    node = images["sha256:9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9"]
    assert node.repo_tags == ["vllm-node:latest", "vllm-node:2026-11-19"]
    assert node.size_bytes == 26_100_000_000  # docker images uses decimal GB
    ngc = images["sha256:cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"]
    assert ngc.repo_digests == ["nvcr.io/nvidia/vllm@sha256:" + "ab" * 32]
    dangling = images["sha256:" + "ef" * 32]
    assert dangling.repo_tags == [] and dangling.size_bytes == 742_000_000


def test_docker_images_json_garbled():
    with pytest.raises(ParseError) as exc:
        p.parse_docker_images_json('{"Repository":"x"}')
    assert_readable(exc.value, "docker images", "no ID")


def test_gpu_runtime_probe():
    assert p.parse_gpu_runtime("hook /usr/bin/nvidia-container-runtime-hook\ncdi /etc/cdi/nvidia.yaml\n") == [
        "hook /usr/bin/nvidia-container-runtime-hook", "cdi /etc/cdi/nvidia.yaml"]
    assert p.parse_gpu_runtime("") == []
    with pytest.raises(ParseError):
        p.parse_gpu_runtime("something else\n")


# --------------------------------------------------------------------------- HF cache, df, clock, keys

def test_hf_cache_listing():
    repos = {r.repo_id: r for r in p.parse_hf_cache(sample("hf-cache-listing.txt"))}
    qwen = repos["Qwen/Qwen3.5-122B-A10B-FP8"]
    assert qwen.refs == {"main": "4b1f1c0ffee0ddba11c0ffee0ddba11c0ffee0dd"}
    assert qwen.size_bytes == 40_000_000_000
    llama = repos["meta-llama/Llama-3.1-8B-Instruct"]
    assert llama.refs["refs/pr/12"] == "1" * 40 and len(llama.snapshots) == 2
    assert qwen.snapshot_files is None  # the recorded listing names no repo of a stack


def test_hf_cache_listing_with_a_stacks_files():
    c, d = "c" * 40, "d" * 40
    [repo] = p.parse_hf_cache(f"repo\tmodels--a--b\nlisted\nsnapshot\t{c}\n"
                              f"file\t{c}\tconfig.json\t20\nfile\t{c}\tsub/w.safetensors\t9\n"
                              f"snapshot\t{d}\nblobs\t29\n")
    assert repo.snapshot_files == {c: {"config.json": 20, "sub/w.safetensors": 9}, d: {}}


@pytest.mark.parametrize("text,words", [
    ("ref\tmain\tabc\n", ["before any 'repo'"]),
    ("repo\tdatasets--x\n", ["models--"]),
    ("repo\tmodels--a--b\nblobs\tlots\n", ["tab-separated"]),
    # a file of a repo not listed, before its snapshot, of no size, listed twice; listed late
    ("repo\tmodels--a--b\nsnapshot\tcccccccccccccccccccccccccccccccccccccccc\nfile\tcccccccccccccccccccccccccccccccccccccccc\tx\t1\n", ["a file after its snapshot"]),
    ("repo\tmodels--a--b\nlisted\nfile\tcccccccccccccccccccccccccccccccccccccccc\tx\t1\nsnapshot\tcccccccccccccccccccccccccccccccccccccccc\n", ["tab-separated"]),
    ("repo\tmodels--a--b\nlisted\nsnapshot\tcccccccccccccccccccccccccccccccccccccccc\nfile\tcccccccccccccccccccccccccccccccccccccccc\tx\tbig\n", ["tab-separated"]),
    ("repo\tmodels--a--b\nlisted\nsnapshot\tcccccccccccccccccccccccccccccccccccccccc\nfile\tcccccccccccccccccccccccccccccccccccccccc\tx\t1\nfile\tcccccccccccccccccccccccccccccccccccccccc\tx\t1\n",
     ["listed twice"]),
    ("repo\tmodels--a--b\nsnapshot\tcccccccccccccccccccccccccccccccccccccccc\nlisted\n", ["tab-separated"]),
])
def test_hf_cache_garbled(text, words):
    with pytest.raises(ParseError) as exc:
        p.parse_hf_cache(text)
    assert_readable(exc.value, "HF cache", *words)


def test_df_avail_real_format():
    assert p.parse_df_avail(sample("df-avail-devbox.txt")) > 0
    assert p.parse_df_avail("      Avail\n80656420864\n") == 80656420864


@pytest.mark.parametrize("text", ["", "      Avail\n", "Filesystem 1K-blocks\n/dev/sda 1\n", "Avail\n12G\n"])
def test_df_avail_garbled(text):
    with pytest.raises(ParseError) as exc:
        p.parse_df_avail(text)
    assert_readable(exc.value, "df")


def test_epoch_and_host_keys():
    assert p.parse_epoch("1764480000.123456789\n") == pytest.approx(1764480000.123456789)
    with pytest.raises(ParseError):
        p.parse_epoch("Mon Nov 30\n")
    keys = p.parse_host_keys("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB root@spark-1\n"
                             "ecdsa-sha2-nistp256 AAAAE2VjZHNh= root@spark-1\n")
    assert keys == ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB", "ecdsa-sha2-nistp256 AAAAE2VjZHNh="]
    with pytest.raises(ParseError):
        p.parse_host_keys("cat: /etc/ssh/ssh_host_ed25519_key.pub: Permission denied\n")


def test_sizes():
    assert p.parse_size("121Gi") == 121 * GIB
    assert p.parse_size("0B") == 0
    assert p.parse_size("26.1GB", decimal_units=True) == 26_100_000_000
    with pytest.raises(ParseError):
        p.parse_size("")


def test_stopped_markers():
    assert p.parse_stopped_markers("marker\tvllm_node\tspark-vllm/dev\n"
                                   "marker\treranker\tspark-vllm/dev\n") == {
        "vllm_node": "spark-vllm/dev", "reranker": "spark-vllm/dev"}
    assert p.parse_stopped_markers("") == {}
    with pytest.raises(p.ParseError):
        p.parse_stopped_markers("marker\tvllm_node\n")


# --------------------------------------------------------------------------- exact formats only

def test_lines_break_only_at_newline():
    """str.splitlines also breaks at \\r, \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028, \\u2029: a
    name holding one of them became two records. Only '\\n' ends a line (what bash prints)."""
    for sep in ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"):
        text = f"repo\tmodels--a--b{sep}snapshot\t{'c' * 40}\nblobs\t1\n"
        with pytest.raises(ParseError):
            p.parse_hf_cache(text)
        with pytest.raises(ParseError):
            p.parse_stopped_markers(f"marker\tvllm_node{sep}marker\tevil\tspark-vllm/dev\n")


@pytest.mark.parametrize("text", [
    "repo\tmodels--a--b\x1b[2J\n",                     # an escape sequence in a name
    "repo\tmodels--a--b\nsnapshot\tc\td\n",             # an extra field
    "repo\tmodels--a--b\nsnapshot\t\n",                 # an empty name
    "repo\tmodels--a--b\nref\tmain\t" + "a" * 40 + "\tx\n",
    "repo\tmodels--a--b\nblobs\t-1\n",
    "repo\tmodels--a--b\nmystery\tx\n",
    "skip\tunquoted\x01\n",
])
def test_hf_cache_refuses_what_is_not_its_exact_format(text):
    with pytest.raises(ParseError):
        p.parse_hf_cache(text)


def test_hf_cache_skip_records_are_read_and_left_out():
    text = "skip\t$'models--a\\nb'\nrepo\tmodels--a--b\nskip\t$'x\\ty'\nblobs\t5\n"
    (repo,) = p.parse_hf_cache(text)
    assert (repo.repo_id, repo.size_bytes) == ("a/b", 5)
    assert p.skipped_names(text) == ["$'models--a\\nb'", "$'x\\ty'"]


@pytest.mark.parametrize("text", [
    "MemTotal: 100 kB\nMemAvailable: 50 kB\ngarbage line\n",           # not 'Key: value'
    "MemTotal: 100 kB\nMemAvailable: 50 kB\nMemTotal: 999999999 kB\n",  # a second MemTotal
])
def test_meminfo_refuses_lines_it_does_not_know_the_shape_of(text):
    with pytest.raises(ParseError):
        p.parse_meminfo(text)


@pytest.mark.parametrize("parser,text", [
    (p.parse_df_avail, "      Avail\n80656420864\n12\n"),
    (p.parse_epoch, "1764480000.1\n1764480999.9\n"),
    (p.parse_ethtool_speed, "\tSpeed: 200000Mb/s\nsomething else\n"),
    (p.parse_host_keys, "ssh-ed25519\u2028AAAAC3NzaC1lZDI1NTE5AAAAIB\n"),
    (p.parse_stopped_markers, "vllm_node\tspark-vllm/dev\n"),  # the old, untagged form
    (p.parse_stopped_markers, "marker\tbad name\tspark-vllm/dev\n"),
    (p.parse_stopped_markers, "marker\tvllm_node\tspark-vllm/dev\x1b[2J\n"),
    (p.parse_gpu_runtime, "hook /usr/bin/x\x1b[2J\n"),
])
def test_parsers_refuse_lines_outside_their_exact_format(parser, text):
    with pytest.raises(ParseError):
        parser(text)


def test_stopped_markers_tagged_form_and_skips():
    text = "marker\tvllm_node\tspark-vllm/dev\nskip\t$'x\\nevil'\nmarker\treranker\tspark-vllm/dev\n"
    assert p.parse_stopped_markers(text) == {"vllm_node": "spark-vllm/dev",
                                             "reranker": "spark-vllm/dev"}
    assert p.skipped_names(text) == ["$'x\\nevil'"]


@pytest.mark.parametrize("parser,text", [
    (p.parse_docker_ps_json, '{"ID": 1, "Names": ["x"], "Image": "i"}'),
    (p.parse_docker_ps_json, '{"ID": "a", "Names": "x", "Image": "i", "Labels": 5}'),
    (p.parse_docker_ps_json, '{"ID": "a", "Names": "x", "Image": "i", "State": {"x": 1}}'),
    (p.parse_docker_images_json, '{"ID": ["x"], "Repository": "r"}'),
    (p.parse_docker_images_json, '{"ID": "x", "Repository": "r", "Size": 5}'),
    (p.parse_docker_info_json, '{"ServerVersion": "1", "Runtimes": ["runc"]}'),
    (p.parse_docker_info_json, '{"ServerVersion": 29}'),
    (p.parse_docker_info_json, '{"ServerErrors": "down"}'),
    (p.parse_ip_json_addr, '[{"ifname": "eth0", "mtu": "big"}]'),
    (p.parse_ip_json_addr, '[{"ifname": "eth0", "mtu": 1500, "flags": "UP"}]'),
    (p.parse_ip_json_addr, '[{"ifname": ["eth0"]}]'),
    (p.parse_ip_json_addr, '[{"ifname": "eth0", "addr_info": [{"family": "inet", "local": 5, "prefixlen": "x"}]}]'),
])
def test_json_of_the_wrong_types_is_a_parse_error_not_a_traceback(parser, text):
    with pytest.raises(ParseError):
        parser(text)


@pytest.mark.parametrize("text,words", [
    ('{"ID":"abc","Labels":{}}', ["ID", "64 hex"]),
    (json.dumps({"ID": "a" * 64, "Labels": ["a=b"]}), ["not a mapping"]),
    (json.dumps({"ID": "a" * 64, "Labels": {"a": 1}}), ["not a mapping"]),
    (json.dumps({"ID": "a" * 64, "Labels": None}) * 2, ["not JSON"]),
    ("\n".join([json.dumps({"ID": "a" * 64, "Labels": None})] * 2), ["twice"]),
    ('{"ID":"' + "a" * 64 + '","Lab', ["not JSON"]),
])
def test_docker_labels_json_garbled(text, words):
    with pytest.raises(ParseError) as exc:
        p.parse_docker_labels_json(text)
    assert_readable(exc.value, "docker labels", *words)
