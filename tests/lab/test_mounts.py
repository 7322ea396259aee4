"""`lab.py up` checks every running node's private mounts and rebuilds a node whose mounts are
wrong: here spark-2 loses its own /dev/shm (it would share the host's) and spark-1's HF cache is
covered by a folder every node can see (nodes would silently share one cache)."""
import os
import shutil
import subprocess

import pytest

from tests.lab.conftest import configure_fabric

pytestmark = pytest.mark.lab
LAB_STATE = "/var/lib/spark-vllm-lab"
HF = "/root/.cache/huggingface"


def _holder(node: str) -> str:
    with open(f"{LAB_STATE}/{node}/holder.pid") as f:
        return f.read().strip()


def _nsenter(node: str, *argv: str) -> None:
    subprocess.run(["nsenter", f"--target={_holder(node)}", "--mount", "--", *argv], check=True)


def test_up_repairs_a_node_without_its_own_dev_shm_or_hf_cache(lab):
    a, b = list(lab.nodes)[:2]
    shared = f"{LAB_STATE}/test-shared-folder"  # visible from every node and the host
    os.makedirs(shared, exist_ok=True)
    try:
        lab.ssh(a, f"mkdir -p {HF}/hub && echo mine > {HF}/hub/lab-a-probe")
        holders = {a: _holder(a), b: _holder(b)}
        _nsenter(b, "umount", "/dev/shm")          # b now sees the host's /dev/shm
        _nsenter(a, "mount", "--bind", shared, HF)  # a's HF cache is a folder others see
        assert lab.ssh(b, "stat -c %d /dev/shm").stdout.strip() == str(os.stat("/dev/shm").st_dev)
        up = lab.cli("up", "--nodes", str(len(lab.nodes)))
        out = up.stdout + up.stderr
        assert f"{b}: rebuilding, its mounts are wrong: /dev/shm is not the node's own tmpfs" \
            in out, out
        assert f"{a}: rebuilding, its mounts are wrong: {HF} is a mount" in out, out
        # rebuilt: new namespaces, same host keys (ssh pins), docker data kept
        assert _holder(a) != holders[a] and _holder(b) != holders[b]
        for n in (a, b):
            assert lab.ssh(n, "stat -f -c %T /dev/shm").stdout.strip() == "tmpfs"
            assert lab.ssh(n, f"docker image inspect {lab.image} >/dev/null && echo ok").stdout \
                .strip() == "ok", "the node's docker data (pulled image) must survive a rebuild"
        devs = {lab.ssh(n, "stat -c %d /dev/shm").stdout.strip() for n in lab.nodes}
        assert len(devs) == len(lab.nodes) and str(os.stat("/dev/shm").st_dev) not in devs
        # a's own cache is back (the probe written before the break), b cannot see it
        assert lab.ssh(a, f"cat {HF}/hub/lab-a-probe").stdout.strip() == "mine"
        assert lab.ssh(b, f"cat {HF}/hub/lab-a-probe", check=False).returncode != 0
        lab.ssh(b, "echo b > /dev/shm/lab-b-probe")
        try:
            assert lab.ssh(a, "cat /dev/shm/lab-b-probe", check=False).returncode != 0
            assert not os.path.exists("/dev/shm/lab-b-probe")
        finally:
            lab.ssh(b, "rm -f /dev/shm/lab-b-probe")
        # and a second `up` finds nothing to repair
        again = lab.cli("up", "--nodes", str(len(lab.nodes)))
        assert "rebuilding" not in again.stdout + again.stderr
    finally:
        lab.ssh(a, f"rm -f {HF}/hub/lab-a-probe", check=False)
        shutil.rmtree(shared, ignore_errors=True)
        # a rebuilt node starts with its fabric ports unconfigured (its netplan files kept, as
        # after a reboot that nothing applied them at): the later lab tests need the fabric
        configure_fabric(lab)


def test_the_stacks_own_folder_is_private_per_node(lab):
    """/var/lib/spark-vllm (the Ray token, the compile caches, the records of stopped
    containers) is each node's own, as on separate machines: shared, three nodes writing the
    Ray token at once raced."""
    a, b = list(lab.nodes)[:2]
    probe = "/var/lib/spark-vllm/lab-private-probe"
    lab.ssh(a, f"echo {a} > {probe}")
    try:
        assert lab.ssh(a, f"cat {probe}").stdout.strip() == a
        assert lab.ssh(b, f"test -e {probe} && echo shared || echo own").stdout.strip() == "own"
        assert not os.path.exists(probe), "the host sees a node's /var/lib/spark-vllm"
    finally:
        lab.ssh(a, f"rm -f {probe}")
