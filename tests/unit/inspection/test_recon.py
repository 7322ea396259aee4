"""The survey: script text, output parsing, ssh failure classification, parallelism and time
bounds. No network, no ssh: the ssh round trip is replaced by a fake runner; one test runs the
generated script through the local bash to prove it is valid and read-only-safe."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from inspection import recon
from inspection.facts import NodeFacts
from inspection.recon import ReconError, SshResult, SurveyError
from tests.unit.inspection.recon_helpers import (
    KEY_1,
    NAMES,
    NONCE,
    SEED_HELD_KIB,
    SPARK_AVAILABLE_KIB,
    SPARK_TOTAL_KIB,
    assemble,
    config,
    nonce_of,
    parse,
    spark_output,
    spark_sections,
)

# --------------------------------------------------------------------------- script

def test_recon_script_is_pure_and_has_every_section():
    cfg = config()
    node = cfg.nodes[0]
    script = recon.recon_script(cfg, node, NONCE, NAMES)
    assert script == recon.recon_script(cfg, node, NONCE, NAMES)
    for section in ("clock_start", "os_release", "dgx_release", "uname", "meminfo",
                    "nvidia_smi_query", "nvidia_smi", "nvidia_smi_list", "ip_addr",
                    "speed:enp1s0f1np1", "speed:enP2p1s0f1np1", "ibdev2netdev", "rdma_link",
                    "docker_info", "docker_ps", "container_memory", "docker_images", "gpu_runtime",
                    "stopped", "hf_cache", "disk", "ray_token", "vllm_key", "compile_cache",
                    "host_keys", "clock_end"):
        # the clock readings bracket the run; everything between runs concurrently
        launcher = "sv_run" if section.startswith("clock_") else "sv_bg"
        assert f"\n{launcher} {section} " in script, section
    assert "timeout -k 2" in script and "</dev/null" in script
    lines = script.splitlines()
    assert lines.index("wait") < lines.index('cat "$SV_DIR"/out.*') < next(
        i for i, ln in enumerate(lines) if ln.startswith("sv_run clock_end"))
    assert script.rstrip().endswith("main\nexit 0")
    # the stack's own files, in its folder (a second stack's are not this stack's)
    assert " _ /var/lib/spark-vllm/stacks/dev/ray/auth-token\n" in script
    assert " _ /var/lib/spark-vllm/stacks/dev/vllm/api-key\n" in script
    assert " _ /var/lib/spark-vllm/stacks/dev/compile-cache\n" in script


def test_recon_looks_for_the_gateways_files_on_the_head_only():
    cfg = config()
    head = recon.recon_script(cfg, cfg.nodes[0], NONCE, NAMES)
    assert ("sv_bg gateway_files 10 bash -c " in head
            and " _ /var/lib/spark-vllm/stacks/dev/gateway/conf/haproxy.cfg "
                "/var/lib/spark-vllm/stacks/dev/gateway/secrets/api-key.map\n" in head)
    assert "gateway" not in recon.recon_script(cfg, cfg.nodes[1], NONCE, NAMES)
    # with TLS its file too
    tls = config(gateway={"certificate": "-----BEGIN CERTIFICATE-----\nMIIB\n"
                                         "-----END CERTIFICATE-----\n"})
    assert "/secrets/tls.pem\n" in recon.recon_script(tls, tls.nodes[0], NONCE, NAMES)


@pytest.mark.parametrize(("section", "field"), [("gateway_files", "gateway_files_present"),
                                               ("compile_cache", "compile_cache_present"),
                                               ("monitoring_files", "monitoring_files_present"),
                                               ("prometheus_data", "prometheus_data_present")])
def test_the_gateways_files_are_read_as_presence(section, field):
    for text, want in (("present", True), ("absent", False)):
        facts = parse(spark_output(1, **{section: text}))
        assert getattr(facts, field) is want
    assert getattr(parse(spark_output(1)), field) is None  # not surveyed
    assert section in parse(spark_output(1, **{section: "maybe"})).unreadable


def test_the_head_looks_for_prometheus_files_only_with_monitoring():
    image = {"ref": "registry.example:5000/prometheus@sha256:" + "3" * 64}
    cfg = config(monitoring={"enabled": True, "prometheus": image, "nodeExporter": image,
                             "alertmanager": image})
    head = recon.recon_script(cfg, cfg.nodes[0], NONCE, NAMES)
    assert ("sv_bg monitoring_files 10 bash -c " in head
            and " _ /var/lib/spark-vllm/stacks/dev/monitoring/conf/prometheus.yml "
                "/var/lib/spark-vllm/stacks/dev/monitoring/secrets/api-key "
                "/var/lib/spark-vllm/stacks/dev/alertmanager/conf/alertmanager.yml\n" in head)
    assert "sv_bg prometheus_data 10 bash -c " in head
    assert (" _ /var/lib/spark-vllm/stacks/dev/prometheus-data "
            "/var/lib/spark-vllm/stacks/dev/alertmanager-data\n") in head
    assert "monitoring" not in recon.recon_script(cfg, cfg.nodes[1], NONCE, NAMES)
    off = config()  # the reference config: monitoring off (its default)
    assert not off.monitoring.enabled
    assert "monitoring" not in recon.recon_script(off, off.nodes[0], NONCE, NAMES)


def test_recon_without_a_stack_does_not_look_for_stack_files():
    cfg = config()
    script = recon.recon_script(cfg, cfg.nodes[0], NONCE, None)
    assert "sv_bg ray_token" not in script and "sv_bg vllm_key" not in script
    assert "sv_bg compile_cache" not in script
    assert "/var/lib/spark-vllm/stacks" not in script


def test_recon_script_quotes_config_values():
    """Config validation refuses such a cacheDir today; the script quotes it all the same."""
    cfg = config()
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"cache_dir": "/data/hf;rm"})})
    script = recon.recon_script(cfg, cfg.nodes[0], NONCE, NAMES)
    assert "'/data/hf;rm'" in script


def test_recon_script_runs_in_local_bash_and_parses():
    """The generated script is valid bash: run it here (no ssh) and parse what it prints."""
    cfg = config(cache_dir="/nonexistent/spark-vllm-test/hf")
    script = recon.recon_script(cfg, cfg.nodes[0], NONCE, NAMES)
    sent = time.time()
    proc = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, timeout=60)
    received = time.time()
    assert proc.returncode == 0, proc.stderr
    # concurrent sections: each printed once, whole (its end marker after its start marker)
    sections = recon.split_sections(proc.stdout, NONCE)
    assert len(sections) == script.count("\nsv_bg ") + 2
    for name, section in sections.items():
        assert proc.stdout.count(f"=== spark-vllm:{NONCE}:section:{name} ===") == 1, name
        assert section.rc is not None, f"{name}: no end marker"
        assert section.problem is None, (name, section.problem)
    facts = parse(proc.stdout, sent_at=sent, received_at=received)
    assert facts.memory.total_bytes > 0
    assert facts.os.kernel and facts.os.arch
    assert facts.disk_free_bytes > 0  # df walked up to an existing parent
    assert abs(facts.clock_offset_seconds) < 2
    assert facts.hf_cache == []


# --------------------------------------------------------------------------- parsing

def test_parse_recon_output_from_recorded_gb10_outputs():
    facts = parse(spark_output(1, seed=True), pinned_host_key=KEY_1)
    assert facts.node == "spark-1" and facts.hostname == "spark-1"
    assert facts.os.id == "ubuntu" and facts.os.kernel == "6.17.0-1014-nvidia"
    assert facts.os.arch == "aarch64" and facts.os.is_dgx_spark
    (gpu,) = facts.gpus
    assert (gpu.name, gpu.compute_capability, gpu.driver_version, gpu.cuda_version) == (
        "NVIDIA GB10", "12.1", "580.159.03", "13.0")
    assert gpu.uuid == "GPU-b0ec33a0-2589-53de-953c-0713d37d0794"
    assert facts.memory.unified
    assert facts.memory.total_bytes == SPARK_TOTAL_KIB * 1024
    assert facts.memory.available_bytes == (SPARK_AVAILABLE_KIB - SEED_HELD_KIB) * 1024
    fabric = facts.interface("enp1s0f1np1")
    assert fabric.ipv4 == ["192.168.177.11/24"] and fabric.mtu == 9000 and fabric.carrier
    assert fabric.speed_mbps == 200000
    assert facts.interface("enP2p1s0f1np1").speed_mbps == 200000
    assert facts.roce_device("rocep1s0f1").up and not facts.roce_device("rocep1s0f0").up
    assert facts.docker.version == "29.2.1" and facts.docker.gpu_support  # via the CDI spec
    names = {c.name: c for c in facts.foreign_containers()}
    assert set(names) == {"vllm_node", "reranker", "vllm_embeddings"}
    assert names["vllm_node"].memory_bytes == round(68.2 * 1024**3)
    assert facts.hf_repo("Qwen/Qwen3.5-122B-A10B-FP8").size_bytes == 40_000_000_000
    assert facts.disk_free_bytes == 500_000_000_000
    assert facts.host_key == KEY_1 and len(facts.host_keys) == 2
    assert facts.missing_tools == [] and facts.unreadable == {}


def test_clock_offset_is_the_last_node_reading_against_the_receipt():
    # node read 1764480000.9 last; the answer arrived at local 1764479997.9 -> 3 s ahead, however
    # long the ssh handshake before the script took (sent_at is 2 s earlier here)
    facts = parse(spark_output(1), sent_at=1764479995.9,
                                     received_at=1764479997.9)
    assert facts.clock_offset_seconds == pytest.approx(3.0)
    cut = spark_output(1).split(f"=== spark-vllm:{NONCE}:section:clock_end")[0]
    facts = parse(cut, sent_at=1764479997.0, received_at=1764479999.0)
    assert facts.clock_offset_seconds == pytest.approx(3.1)  # start - sent_at


def test_missing_tools_become_empty_facts():
    missing = ("", 127, "nvidia-smi: command not found")
    sections = spark_sections(1, nvidia_smi_query=missing, nvidia_smi=missing,
                              nvidia_smi_list=missing, ibdev2netdev=("", 127),
                              rdma_link=("", 127), docker_info=("", 127), docker_ps=("", 127),
                              container_memory=("", 127), docker_images=("", 127))
    facts = parse(assemble(sections))
    assert facts.gpus == [] and facts.roce == [] and facts.docker is None
    assert facts.memory.unified is False
    assert set(facts.missing_tools) == {"nvidia-smi", "ibdev2netdev", "rdma", "docker"}


def test_rdma_link_stands_in_for_a_missing_ibdev2netdev():
    facts = parse(assemble(spark_sections(1, ibdev2netdev=("", 127))))
    assert facts.roce_device("rocep1s0f0").up
    assert "ibdev2netdev" not in facts.missing_tools


def test_timeouts_garbage_and_daemon_errors_are_recorded_not_raised():
    sections = spark_sections(
        1, nvidia_smi=("", 124), ip_addr='[{"ifname": "enp1', docker_info=(
            "", 1, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                   "Is the docker daemon running?"))
    facts = parse(assemble(sections))
    assert "timed out" in facts.unreadable["nvidia_smi"]
    assert "not JSON" in facts.unreadable["ip_addr"] and facts.interfaces == []
    assert "Cannot connect to the Docker daemon" in facts.unreadable["docker_info"]
    assert facts.docker is None
    assert facts.gpus[0].compute_capability == "12.1"  # the query still answered


def test_output_cut_short_keeps_what_came():
    text = spark_output(1)
    cut = text[: text.index(f"=== spark-vllm:{NONCE}:section:docker_info ===") + 60]
    facts = parse(cut)
    assert facts.gpus and facts.docker is None
    assert "cut short" in facts.unreadable["docker_info"]
    assert "cut short" in facts.unreadable["clock_end"]


def test_absent_dgx_release_is_not_an_error():
    facts = parse(assemble(spark_sections(
        1, dgx_release=("", 1, "cat: /etc/dgx-release: No such file or directory"))))
    assert facts.os.dgx_release == {} and "dgx_release" not in facts.unreadable


def test_unreadable_meminfo_is_a_recon_error():
    with pytest.raises(ReconError) as exc:
        parse(assemble(spark_sections(1, meminfo="MemTotal: 1 kB\n")))
    assert exc.value.node == "spark-1" and "/proc/meminfo" in str(exc.value)
    with pytest.raises(ReconError):
        parse("")


# --------------------------------------------------------------------------- ssh

def test_ssh_argv_pins_the_host_key_and_bounds_the_connect():
    cfg = config()
    argv = recon.ssh_argv(cfg, cfg.nodes[1], key_path="/k", known_hosts="/tmp/kh")
    joined = " ".join(argv)
    for option in ("-i /k", "-p 22", "BatchMode=yes", "StrictHostKeyChecking=yes",
                   "UserKnownHostsFile=/tmp/kh", "ConnectTimeout=5",
                   "HostKeyAlias=spark-vllm-spark-2"):
        assert option in joined
    assert argv[-2:] == ["root@10.77.0.12", "bash -s"]
    assert recon.known_hosts_line(cfg.nodes[1]).startswith("spark-vllm-spark-2 ssh-ed25519 ")


HOST_KEY_CHANGED = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Host key for spark-vllm-spark-1 has changed and you have requested strict checking.
Host key verification failed.
"""


@pytest.mark.parametrize("stderr,kind,words", [
    ("ssh: connect to host 10.77.0.11 port 22: Connection refused\n", "unreachable",
     ["unreachable", "Connection refused", "sshd listens on port 22"]),
    ("ssh: connect to host 10.77.0.11 port 22: Connection timed out\n", "unreachable",
     ["Connection timed out"]),
    ("ssh: connect to host 10.77.0.11 port 22: No route to host\n", "unreachable", ["No route"]),
    ("root@10.77.0.11: Permission denied (publickey).\n", "auth",
     ["authentication refused", "authorized_keys"]),
    (HOST_KEY_CHANGED, "host_key", ["host key mismatch", "ssh-keyscan", "hostKey"]),
    ("No ED25519 host key is known for spark-vllm-spark-1 and you have requested strict "
     "checking.\nHost key verification failed.\n", "host_key", ["host key mismatch"]),
    ("kex_exchange_identification: read: Connection reset by peer\n", "unreachable",
     ["unreachable"]),
    ("something new\n", "ssh", ["exit code 255", "-v"]),
])
def test_ssh_failures_are_told_apart(stderr, kind, words):
    cfg = config()
    err = recon.classify_ssh_failure(cfg.nodes[0], 255, stderr, "/k")
    assert err.kind == kind and err.node == "spark-1" and err.fix
    for word in words:
        assert word in str(err), f"{word!r} not in {err}"


def fake_runner(outputs: dict, delay: float = 0.0, calls: list | None = None):
    """A runner that answers per host: str (stdout) | (rc, stderr) | Exception."""

    def run(argv, script, timeout):
        host = argv[-2].split("@", 1)[1]
        if calls is not None:
            calls.append((host, argv, script, timeout))
        time.sleep(delay)
        answer = outputs[host]
        if isinstance(answer, BaseException):
            raise answer
        now = time.time()
        if isinstance(answer, tuple):
            return SshResult(answer[0], "", answer[1], now - delay, now)
        return SshResult(0, answer.replace(NONCE, nonce_of(script)), "", now - delay, now)

    return run


def test_survey_runs_nodes_in_parallel_with_one_round_trip_each():
    cfg = config()
    calls: list = []
    runner = fake_runner({"10.77.0.11": spark_output(1), "10.77.0.12": spark_output(2)},
                         delay=0.5, calls=calls)
    start = time.time()
    facts = recon.survey(cfg, names=NAMES, runner=runner)
    assert time.time() - start < 0.9  # two 0.5 s round trips, concurrently
    assert list(facts) == ["spark-1", "spark-2"] and len(calls) == 2
    assert facts["spark-2"].interface("enp1s0f1np1").ipv4 == ["192.168.177.12/24"]
    assert all(isinstance(f, NodeFacts) for f in facts.values())
    assert calls[0][3] == cfg.preflight.recon_timeout_seconds


def test_survey_collects_every_node_error_and_keeps_the_rest():
    cfg = config()
    runner = fake_runner({"10.77.0.11": spark_output(1),
                          "10.77.0.12": (255, "root@10.77.0.12: Permission denied (publickey).")})
    results = recon.survey_all(cfg, names=NAMES, runner=runner)
    assert isinstance(results["spark-1"], NodeFacts)
    assert isinstance(results["spark-2"], ReconError) and results["spark-2"].kind == "auth"
    with pytest.raises(SurveyError) as exc:
        recon.survey(cfg, names=NAMES, runner=runner)
    assert "spark-2: authentication refused" in str(exc.value)
    assert "spark-1" in exc.value.facts


def test_survey_timeout_names_the_node():
    cfg = config(preflight={"reconTimeoutSeconds": 7})
    runner = fake_runner({"10.77.0.11": subprocess.TimeoutExpired("ssh", 7),
                          "10.77.0.12": spark_output(2)})
    results = recon.survey_all(cfg, names=NAMES, runner=runner)
    err = results["spark-1"]
    assert isinstance(err, ReconError) and err.kind == "timeout"
    assert "within 7 s" in err.reason and "reconTimeoutSeconds" in err.fix


def test_survey_is_bounded_even_if_a_runner_hangs(monkeypatch):
    """The overall bound (reconTimeoutSeconds + 5 s) holds even when a round trip never returns;
    the test shrinks that bound by patching recon.wait."""
    import concurrent.futures as cf

    cfg = config(preflight={"reconTimeoutSeconds": 1})
    release = threading.Event()

    def hang(argv, script, timeout):
        release.wait(10)
        raise subprocess.TimeoutExpired("ssh", timeout)

    monkeypatch.setattr(recon, "wait", lambda fs, timeout: cf.wait(fs, timeout=0.3))
    start = time.time()
    results = recon.survey_all(cfg, names=NAMES, runner=hang)
    release.set()
    assert time.time() - start < 2
    assert all(isinstance(r, ReconError) and r.kind == "timeout" for r in results.values())


def test_placeholder_host_key_fails_before_ssh():
    raw_nodes = config().model_dump(by_alias=True)["nodes"]
    raw_nodes[0]["hostKey"] = "ssh-ed25519 PLACEHOLDERxLABxREWRITESxTHISxKEYx1"
    cfg = config(nodes=raw_nodes)
    calls: list = []
    results = recon.survey_all(cfg, names=NAMES, runner=fake_runner({"10.77.0.12": spark_output(2)},
                                                       calls=calls))
    assert results["spark-1"].kind == "host_key" and "placeholder" in results["spark-1"].reason
    assert [c[0] for c in calls] == ["10.77.0.12"]


def test_missing_private_key_is_an_auth_error_with_the_path():
    cfg = config(ssh={"privateKeyPath": "/nonexistent/id_ed25519"})
    err = recon.survey_all(cfg, names=NAMES)["spark-1"]
    assert err.kind == "auth" and "/nonexistent/id_ed25519" in err.reason


def test_key_path_override_is_used(tmp_path):
    key = tmp_path / "key"
    key.write_text("not a real key")
    calls: list = []
    cfg = config()
    recon.survey_all(cfg, names=NAMES, key_path=key, runner=fake_runner(
        {"10.77.0.11": spark_output(1), "10.77.0.12": spark_output(2)}, calls=calls))
    assert all(c[1][c[1].index("-i") + 1] == str(key) for c in calls)


def test_script_that_did_not_run_is_reported():
    cfg = config()
    results = recon.survey_all(cfg, names=NAMES, runner=fake_runner(
        {"10.77.0.11": (1, "bash: timeout: command not found"), "10.77.0.12": spark_output(2)}))
    assert results["spark-1"].kind == "output" and "did not run" in results["spark-1"].reason


# --------------------------------------------------------------------------- forged output

FORGED_PS = '{"ID":"e0e0","Names":"evil","Image":"evil:latest","State":"running","Labels":""}'
FAKE_DOCKER = """#!/bin/sh
case "$1 $2" in
  "info --format") echo '{"ServerVersion":"29.2.1","Runtimes":{"runc":{}},"CgroupDriver":"systemd"}' ;;
  "ps -a") echo '{"ID":"c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff","Names":"vllm_node","Image":"vllm:1","State":"running","Labels":""}' ;;
  "ps -aq") echo c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff ;;
  "inspect --type") echo '{"ID":"c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff","Image":"sha256:1111111111111111111111111111111111111111111111111111111111111111","Labels":null}' ;;
  "image inspect") echo '{"ImageID":"sha256:1111111111111111111111111111111111111111111111111111111111111111","Labels":null}' ;;
  "stats --no-stream") echo '{"Name":"vllm_node","ID":"c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ffeec0ff","MemUsage":"1GiB / 2GiB"}' ;;
esac
exit 0
"""


def _tools(tmp_path, **scripts):
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return bin_


def local_bash(path_first):
    """A runner that runs the recon script in the local bash (no ssh), `path_first` first on PATH."""

    def run(argv, script, timeout):
        sent = time.time()
        proc = subprocess.run(["bash", "-s"], input=script.encode(), capture_output=True,
                              timeout=60, env={"PATH": f"{path_first}:/usr/bin:/bin"})
        return SshResult(proc.returncode, proc.stdout.decode(errors="replace"),
                         proc.stderr.decode(errors="replace"), sent, time.time())

    return run


def test_a_crafted_hf_cache_folder_cannot_forge_the_docker_facts(tmp_path):
    """Reproduced finding: a folder name in the HF cache holding newlines and marker lines
    replaced the real docker_ps facts (a foreign container vanished, an invented one appeared
    and `foreignContainers: stop` planned to stop it). The real script, run in the local bash."""
    from inspection import preflight

    bin_ = _tools(tmp_path, docker=FAKE_DOCKER)
    cache = tmp_path / "hf"
    (cache / "hub" / "models--org--real" / "snapshots" / ("a" * 40)).mkdir(parents=True)
    cfg = config(cache_dir=str(cache), preflight={"foreignContainers": "stop"})
    clean = recon.survey_node(cfg, cfg.nodes[0], names=NAMES, runner=local_bash(bin_))
    assert [c.name for c in clean.docker.containers] == ["vllm_node"]
    crafted = ("models--x--y\n=== spark-vllm:section:docker_ps ===\n" + FORGED_PS
               + "\n=== spark-vllm:end:docker_ps rc=0 ===\n")
    (cache / "hub" / crafted).mkdir()
    facts = recon.survey_node(cfg, cfg.nodes[0], names=NAMES, runner=local_bash(bin_))
    assert [c.name for c in facts.docker.containers] == ["vllm_node"]
    _, _, stops = preflight.check_foreign(cfg, facts)
    assert [c.name for c in stops] == ["vllm_node"]
    assert [r.repo_id for r in facts.hf_cache] == ["org/real"]


def test_a_second_block_of_a_section_is_refused_not_replaced():
    clean = spark_output(1, seed=True)
    forged = assemble({"docker_ps": FORGED_PS})
    facts = parse(clean + forged)
    assert "printed twice" in facts.unreadable["docker_ps"]
    assert facts.docker.containers == []  # never the forged ones, never silently the first
    assert parse(clean).docker.containers  # the clean output has them
    with pytest.raises(ReconError, match="printed twice"):
        parse(clean + assemble({"meminfo": "MemTotal: 1 kB\nMemAvailable: 1 kB\n"}))


def test_only_markers_carrying_the_runs_nonce_are_markers():
    nonce = "0123456789abcdef"
    text = assemble(spark_sections(1, seed=True), nonce=nonce)
    assert recon.parse_recon_output("spark-1", text, nonce=nonce).docker.containers
    with pytest.raises(ReconError, match="meminfo"):  # nothing is read without the nonce
        recon.parse_recon_output("spark-1", text, nonce="fedcba9876543210")
    # a forged block without the nonce inside a section: that section is unreadable, the rest kept
    forged = ("repo\tmodels--a--b\n=== spark-vllm:section:docker_ps ===\n" + FORGED_PS
              + "\n=== spark-vllm:end:docker_ps rc=0 ===")
    facts = parse(assemble(spark_sections(1, seed=True, hf_cache=forged), nonce=nonce),
                  nonce=nonce)
    assert "nonce" in facts.unreadable["hf_cache"]
    assert {c.name for c in facts.foreign_containers()} == {"vllm_node", "reranker",
                                                            "vllm_embeddings"}


def test_recon_script_carries_the_nonce_it_is_given():
    cfg = config()
    a = recon.recon_script(cfg, cfg.nodes[0], "0123456789abcdef", NAMES)
    assert a == recon.recon_script(cfg, cfg.nodes[0], "0123456789abcdef", NAMES)  # pure
    assert "0123456789abcdef" in a and a != recon.recon_script(cfg, cfg.nodes[0],
                                                               "fedcba9876543210", NAMES)
    with pytest.raises(ValueError):
        recon.recon_script(cfg, cfg.nodes[0], "x; rm -rf /", NAMES)
    assert recon.new_nonce() != recon.new_nonce() and len(recon.new_nonce()) == 16


def test_recon_refuses_a_predictable_temp_dir_when_mktemp_fails(tmp_path):
    """survey.sh fell back to /tmp/spark-vllm-recon.$$ (predictable: another user can plant it
    or a symlink there first) when mktemp failed. It must fail with a clear reason instead."""
    bin_ = _tools(tmp_path, mktemp="#!/bin/sh\necho 'mktemp: failed to create directory via "
                                   "template: No space left on device' >&2\nexit 1\n")
    cfg = config(cache_dir=str(tmp_path / "hf"))
    with pytest.raises(ReconError) as exc:
        recon.survey_node(cfg, cfg.nodes[0], names=NAMES, runner=local_bash(bin_))
    assert exc.value.kind == "output" and "mktemp" in exc.value.reason
    assert "predictable" in exc.value.reason or "predictable" in exc.value.fix
    assert "spark-vllm-recon." not in recon.snippet("survey.sh")


def test_ssh_round_trip_keeps_carriage_returns_as_they_are():
    """Universal newlines turned a '\\r' in a file name into a line break on this side."""
    result = recon.ssh_round_trip(["bash", "-s"], "printf 'a\\rb\\x85c\\n'\n", 30)
    assert result.rc == 0 and result.stdout == "a\rb\ufffdc\n"


def test_the_firewall_sections_become_facts():
    """Issue 45: the stack's table as the node's nft lists it, its file, unit and last load
    (hostscripts/firewall.check_script's real output), nft's version, the ephemeral ports."""
    from tests.unit.inspection.recon_helpers import assemble, sample, spark_sections

    out = assemble(spark_sections(1, firewall=sample("firewall-check-debian12.txt"),
                                  nft_version=sample("nft-version-debian12.txt"),
                                  ephemeral_ports=sample("ip-local-port-range-debian12.txt")))
    facts = recon.parse_recon_output("spark-1", out, nonce=NONCE)
    fw = facts.firewall
    assert fw is not None and fw.enabled and fw.record == (fw.file, fw.table)
    assert fw.unit == "4528f4571dbf404f5d7b40dc95b3434e8bd73289b830857d8dc31700fc22a600"
    from hostscripts.firewall import unit_sha256
    assert fw.unit == unit_sha256(NAMES)  # the unit the program renders, byte for byte
    assert facts.nft_version == "1.0.6" and facts.ephemeral_ports == (32768, 60999)
    assert not facts.unreadable and not facts.missing_tools
    # not surveyed (an older recon, firewall off): None, and nothing unreadable
    plain = recon.parse_recon_output("spark-1", assemble(spark_sections(1)), nonce=NONCE)
    assert (plain.firewall, plain.nft_version, plain.ephemeral_ports) == (None, None, None)
    # no nft on the node: a missing tool (preflight's finding), not an unreadable section
    gone = recon.parse_recon_output("spark-1", assemble(spark_sections(
        1, firewall=("", 127), nft_version=("", 127, "nft: command not found"))), nonce=NONCE)
    assert gone.firewall is None and "nft" in gone.missing_tools and not gone.unreadable
    # a line that is not the check's: unreadable, never guessed
    bad = recon.parse_recon_output("spark-1", assemble(spark_sections(
        1, firewall="table absent\nfile maybe\n")), nonce=NONCE)
    assert bad.firewall is None and "firewall" in bad.unreadable


def test_recon_reads_the_firewall_only_with_it_on():
    on = config()
    off = config(environment="dev", firewall={"enabled": False})
    for node in (0, 1):
        script = recon.recon_script(on, on.nodes[node], NONCE, NAMES)
        assert "sv_bg firewall " in script and "nft -s list table inet spark-vllm-dev" in script
        assert "sv_bg nft_version " in script and "ip_local_port_range" in script
        assert "sv_bg firewall " not in recon.recon_script(off, off.nodes[node], NONCE, NAMES)


@pytest.mark.parametrize("make,want", [(True, "present"), (False, "absent")])
def test_the_compile_cache_check_sees_a_folder_and_nothing_else(tmp_path, make, want):
    """DIR_PRESENCE run by bash as recon runs it: a folder is present; no folder, or a file
    where the folder should be, is absent (the bind mount would fail on either)."""
    import subprocess
    folder = tmp_path / "compile-cache"
    if make:
        folder.mkdir()
    out = subprocess.run(["bash", "-c", recon.DIR_PRESENCE, "_", str(folder)],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == want
    if not make:
        folder.write_text("x")
        out = subprocess.run(["bash", "-c", recon.DIR_PRESENCE, "_", str(folder)],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == "absent"


def test_recon_lists_the_files_of_the_stacks_repos_only():
    """hf_cache.sh gets the cache folder, the stack's record folder (what its verify hashed:
    its own root-only folder, never the cache), then the folder of every repo the stack serves
    (the main model's, each service's, once): their snapshots' files are listed, no other
    repo's."""
    from config import validate_config
    from tests.unit.components.test_services import EMBED, with_services

    cfg = validate_config(with_services(EMBED, {**EMBED, "name": "embed2", "port": 8101}))
    assert recon.stack_repos(cfg) == [cfg.model.repo, "spark-lab/tiny-embed"]
    script = recon.recon_script(cfg, cfg.nodes[0], NONCE, NAMES)
    section = script[script.index("sv_bg hf_cache "):]
    section = section[:section.index("\nsv_bg ")]  # the quoted snippet spans lines
    folder = "models--" + cfg.model.repo.replace("/", "--")
    assert section.endswith(f"' _ {cfg.model.cache_dir} {NAMES.model_record_dir} {folder} "
                            "models--spark-lab--tiny-embed")
