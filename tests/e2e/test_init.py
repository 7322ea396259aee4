"""Day zero on the lab: `spark-vllm init -s trial <the lab's two nodes>` (tools/init_cli.py).

The operator's way in: nothing but the hosts' addresses, the ssh key and the host keys'
fingerprints, checked out of band (here: `ssh-keygen -lf` of the known_hosts file the lab wrote
when it made the nodes' keys, not init's own code). init surveys the nodes, writes
Pulumi.trial.yaml through Pulumi's CLI and runs preflight; the file it writes must hold the
nodes, fabric and host keys the lab's dev stack is made from, and `pulumi preview` of it must
pass preflight. The other settings come from a stack file next to it (--like): `side`, which
test_two_stacks shows can sit beside the shared stack (vLLM's mp executor, its own ports), so
the preview runs while the shared stack serves, untouched. Nothing is brought up.

A host key that is not the accepted one is refused before anything is surveyed or written.
(A host whose ConnectX-7 has no carrier is a unit test on the lab's recorded answer:
tests/unit/inspection/test_day_zero.py; cutting the fabric here would take the shared stack's
Ray cluster down.)
"""

from __future__ import annotations

import os
import re
import subprocess

import pulumi.automation as auto
import pytest
import yaml

from lab.deployments import ROOT, Deployment, new_deployment
from lab.layout import KNOWN_HOSTS, LAB_KEY

pytestmark = [pytest.mark.lab, pytest.mark.engine]


def lab_fingerprints() -> dict[str, str]:
    """host -> SHA256 fingerprint of its ed25519 key, as OpenSSH's ssh-keygen prints it."""
    out = subprocess.run(["ssh-keygen", "-l", "-f", KNOWN_HOSTS], capture_output=True,
                         text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.fullmatch(r"\d+ (SHA256:\S+) (\S+) \(ED25519\)", line.strip())
        if m:
            found[m.group(2)] = m.group(1)
    return found


@pytest.fixture(scope="module")
def workdir(stack, lab_cfg, tmp_path_factory):
    """A project folder with `side` (a second stack's settings that pass beside the shared
    one, test_two_stacks) and its own backend; init writes `trial` there."""
    side = new_deployment(tmp_path_factory.mktemp("e2e-init"), lab_cfg, stack_name="side")
    side.set("vllm.executor", "mp")
    side.set("vllm.port", 8010)
    side.set("vllm.masterPort", 29511)
    side.set("gateway.port", 8090)
    env = {**os.environ, "PULUMI_BACKEND_URL": f"file://{side.workdir / 'state'}",
           "PULUMI_CONFIG_PASSPHRASE": "spark-vllm-e2e"}
    env.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
    return side.workdir, env


def init(workdir, env, *args: str) -> subprocess.CompletedProcess:
    hosts = [n["host"] for n in yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())[
        "config"]["spark-vllm:nodes"]]
    argv = [str(ROOT / "venv" / "bin" / "spark-vllm"), "init", "-s", "trial", *hosts,
            "--key", LAB_KEY, "--like", "side", *args]
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=300)
    print(done.stdout, done.stderr)
    return done


def test_a_host_key_that_is_not_the_accepted_one_is_refused(workdir):
    work, env = workdir
    fps = lab_fingerprints()
    wrong = "SHA256:" + "A" * 43
    done = init(work, env, "--accept-host-key", wrong, "--accept-host-key",
                fps["10.77.0.12"], "--yes")
    assert done.returncode == 1
    assert f"10.77.0.11: its host key {fps['10.77.0.11']} is not one you accepted" in done.stderr
    assert "surveying" not in done.stdout
    assert not (work / "Pulumi.trial.yaml").exists()


def test_init_writes_the_dev_nodes_and_its_preview_passes_preflight(workdir, stack, lab_cfg):
    work, env = workdir
    fps = lab_fingerprints()
    before = stack.snapshot()
    done = init(work, env, "--accept-host-key", fps["10.77.0.11"],
                "--accept-host-key", fps["10.77.0.12"], "--yes")
    assert done.returncode == 0, done.stderr
    for host in ("10.77.0.11", "10.77.0.12"):
        assert f"{host}:22 presents ssh-ed25519 {fps[host]}" in done.stdout
    assert "preflight passed" in done.stdout
    assert done.stdout.rstrip().endswith("(then pulumi up -s trial)")
    doc = yaml.safe_load((work / "Pulumi.trial.yaml").read_text())["config"]
    want = [{k: n[k] for k in ("name", "host", "port", "user", "hostKey", "fabric")}
            for n in lab_cfg["nodes"]]
    got = [{k: n.get(k) for k in ("name", "host", "port", "user", "hostKey", "fabric")}
           for n in doc["spark-vllm:nodes"]]
    assert got == want
    assert doc["spark-vllm:ssh"]["privateKeyPath"] == LAB_KEY
    assert doc["spark-vllm:nccl"]["fabricSubnets"] == lab_cfg["fabricSubnets"]
    assert doc["spark-vllm:vllm"]["port"] == 8010  # --like side's

    trial = Deployment(stack=auto.select_stack(
        stack_name="trial", work_dir=str(work), opts=auto.LocalWorkspaceOptions(env_vars={
            k: env[k] for k in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE")})),
        workdir=work, cfg=lab_cfg)
    r = trial.run("preview")  # preflight runs first: a finding would raise here
    assert r.change_summary.get("create", 0) > 0 and set(r.change_summary) == {"create"}
    assert stack.snapshot() == before  # the shared stack untouched
