"""`spark-vllm init` writing the stack file through Pulumi's own CLI (tools/init_cli.py).

The real `pulumi` (`make setup`'s toolchain) with a file backend in a temporary folder; the
hosts are the lab's two nodes as they answered init's survey (tests/fixtures/init, recorded on
the lab): FAKES replace ssh-keyscan (the nodes' real keys), the ssh round trip (the recorded
outputs) and the closing preflight (tools/recon_report.main, which would reach the nodes).
What is real: `pulumi stack init`, `pulumi config set-all --json` into the scratch copy, the
secret through stdin, the file init then puts in place, and the program's own reading of it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from inspection import recon
from tests.conftest import ROOT
from tools import cli, init_cli, recon_report

pytestmark = pytest.mark.engine

FIXTURES = ROOT / "tests" / "fixtures" / "init"
NONCE = "5eed5eed5eed5eed"
KEYS = {
    "10.77.0.11": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPykkYzPvHrVjEDRoWCY0vynXHUvfbCJFpaFuAhGr90L",
    "10.77.0.12": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAzciBTDgFfru/NcREI8UuDkm3ihu7lliKeTKf+k8ZJL",
}
FINGERPRINTS = ["SHA256:9+sb7PHUVMRwBjmPfNEfCzeu+S3Xi1GQQ/t19YxEkcA",
                "SHA256:iFjp5G0dhMxbLS30xg4SjVFXmxKKkkknentZ65fFM+U"]
KEY_TEXT = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nnot-a-real-key-for-the-test\n" \
           "-----END OPENSSH " + "PRIVATE KEY-----\n"


@pytest.fixture
def project(tmp_path, monkeypatch, pulumi_bin):
    """A project folder (Pulumi.yaml, the dev stack file to start --like from), a file backend
    of its own, the recorded lab nodes behind the fakes."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    shutil.copy(ROOT / "Pulumi.dev.yaml", tmp_path / "Pulumi.dev.yaml")
    (tmp_path / "state").mkdir()
    key = tmp_path / "id_ed25519"
    key.write_text(KEY_TEXT)
    key.chmod(0o600)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path / 'state'}")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "init-test")
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE_FILE", raising=False)
    monkeypatch.setenv("PULUMI_SKIP_UPDATE_CHECK", "true")

    # FAKE ssh-keyscan: the lab nodes' real ed25519 keys
    monkeypatch.setattr(init_cli, "KEYSCAN", lambda host, port, timeout: f"{host} {KEYS[host]}\n")

    # FAKE ssh round trip: each node's recorded survey output, given the script's nonce
    def round_trip(argv, script, timeout):
        host = next(a.split("@", 1)[1] for a in argv if "@" in a)
        name = {"10.77.0.11": "spark-1", "10.77.0.12": "spark-2"}[host]
        nonce = re.search(r"^SV_NONCE=([0-9a-f]+)$", script, re.M).group(1)
        text = (FIXTURES / f"lab-{name}-fresh.txt").read_text().replace(NONCE, nonce)
        return recon.SshResult(0, text, "", 0.0, 0.0)

    monkeypatch.setattr(init_cli, "RUNNER", round_trip)
    # FAKE closing preflight (it surveys the nodes again): records what it was asked
    asked: list[list[str]] = []
    monkeypatch.setattr(recon_report, "main", lambda argv: asked.append(argv) or 0)
    return tmp_path, key, asked


def run_init(*extra: str, key: Path) -> object:
    args = ["init", "-s", "trial", "10.77.0.11", "10.77.0.12", "--key", str(key),
            "--accept-host-key", FINGERPRINTS[0], "--accept-host-key", FINGERPRINTS[1], *extra]
    return CliRunner().invoke(cli.main, args)


def stacks() -> list[str]:
    done = subprocess.run(["pulumi", "stack", "ls", "--json"], capture_output=True, text=True,
                          check=True)
    return [s["name"] for s in yaml.safe_load(done.stdout)]


def test_init_writes_a_stack_file_the_program_reads_as_the_dev_nodes(project):
    work, key, asked = project
    result = run_init("--like", "dev", "--yes", key=key)
    assert result.exit_code == 0, result.output
    assert "trial" in stacks()
    text = (work / "Pulumi.trial.yaml").read_text()
    doc = yaml.safe_load(text)
    # typed values (a list of maps, ints, bools), not JSON strings
    assert isinstance(doc["config"]["spark-vllm:nodes"], list)
    assert doc["config"]["spark-vllm:vllm"]["tensorParallelSize"] == 2
    assert doc["config"]["spark-vllm:vllm"]["enforceEager"] is True
    assert doc["encryptionsalt"].startswith("v1:")
    cfg = recon_report.load_stack_config("trial", work)  # as the program validates it
    dev = recon_report.load_stack_config("dev", ROOT)
    assert [(n.name, n.host, n.port, n.user, n.fabric) for n in cfg.nodes] == \
        [(n.name, n.host, n.port, n.user, n.fabric) for n in dev.nodes]
    assert [n.host_key for n in cfg.nodes] == [KEYS["10.77.0.11"], KEYS["10.77.0.12"]]
    assert cfg.ssh.known_hosts_file is None and cfg.ssh.private_key_path == str(key)
    assert cfg.nccl.fabric_subnets == dev.nccl.fabric_subnets
    assert cfg.model == dev.model and cfg.vllm.recipe == dev.vllm.recipe
    # the diff was shown before the file was put in place, and preflight ran on it
    assert "+++ Pulumi.trial.yaml (proposed)" in result.output
    assert "+  spark-vllm:nodes:" in result.output
    assert asked == [["-s", "trial", "--key", str(key), "--no-last-up"]]
    assert result.output.rstrip().endswith("(then pulumi up -s trial)")
    # nothing of the scratch copy is left behind
    assert sorted(p.name for p in work.glob("*.yaml")) == [
        "Pulumi.dev.yaml", "Pulumi.trial.yaml", "Pulumi.yaml"]


def test_the_key_as_a_secret_is_encrypted_in_the_file_and_never_on_a_command_line(
        project, monkeypatch):
    work, key, _ = project
    argvs: list[list[str]] = []
    real = init_cli.pulumi

    def recording(args, *, stdin=None):  # the real CLI, its command lines recorded
        argvs.append(list(args))
        return real(args, stdin=stdin)

    monkeypatch.setattr(init_cli, "PULUMI", recording)
    result = run_init("--like", "dev", "--yes", "--key-secret", key=key)
    assert result.exit_code == 0, result.output
    last = argvs[-1]  # the secret's own `pulumi config set --secret` (its value on stdin)
    assert last[:2] == ["config", "set"] and "--secret" in last
    assert not any("not-a-real-key" in a for argv in argvs for a in argv)
    text = (work / "Pulumi.trial.yaml").read_text()
    assert "not-a-real-key" not in text and "not-a-real-key" not in result.output
    assert "secure:" in yaml.safe_dump(yaml.safe_load(text)["config"]["spark-vllm:sshPrivateKey"])
    got = subprocess.run(["pulumi", "config", "get", "spark-vllm:sshPrivateKey", "-s", "trial"],
                         capture_output=True, text=True, check=True, cwd=work)
    assert got.stdout.rstrip("\n") == KEY_TEXT.rstrip("\n")


def test_declining_the_diff_leaves_no_file_and_no_stack(project):
    work, key, asked = project
    result = run_init("--like", "dev", key=key)  # no --yes, and no terminal to ask
    assert result.exit_code == 1, result.output
    assert "Pulumi.trial.yaml not written (no terminal to ask: pass --yes)" in result.output
    assert not (work / "Pulumi.trial.yaml").exists()
    assert "trial" not in stacks() and asked == []


def test_force_replaces_a_file_whose_stack_is_gone(project):
    work, key, _ = project
    old = ("encryptionsalt: v1:qRwEk2gHmms=:v1:AAAAAAAAAAAAAAAA:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\n"
           "config:\n  spark-vllm:environment: prod\n  spark-vllm:leftover: 1\n")
    (work / "Pulumi.trial.yaml").write_text(old)
    refused = run_init("--like", "dev", "--yes", key=key)
    assert refused.exit_code == 2 and "--force" in refused.output
    assert (work / "Pulumi.trial.yaml").read_text() == old
    # declined (no terminal to ask): the real `pulumi stack init` ran in a scratch project, the
    # file is byte for byte what it was and the stack is gone again (issue 46, item 9)
    declined = run_init("--like", "dev", "--force", key=key)
    assert declined.exit_code == 1 and "not written" in declined.output
    assert (work / "Pulumi.trial.yaml").read_text() == old and "trial" not in stacks()
    result = run_init("--like", "dev", "--yes", "--force", key=key)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((work / "Pulumi.trial.yaml").read_text())
    assert "spark-vllm:leftover" not in doc["config"]
    assert doc["config"]["spark-vllm:environment"] == "dev"  # --like dev's
    assert "-  spark-vllm:leftover: 1" in result.output  # the diff showed what goes
