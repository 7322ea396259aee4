"""`spark-vllm rollback` (tools/rollback.py): the verified deployments read from a history Pulumi's
CLI printed (tests/fixtures/rollback), and its refusals with Pulumi's CLI replaced by a FAKE
(rollback.PULUMI, rollback.PULUMI_UP). The whole path with the real CLI: tests/engine/
test_rollback_cli.py; on the lab: tests/e2e/test_faults.py."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import ROOT
from tools import cli, rollback

HISTORY = json.loads((ROOT / "tests" / "fixtures" / "rollback" /
                      "history-stand-in.json").read_text())


def test_each_succeeded_update_is_verified_and_a_run_of_equal_configs_is_one_deployment():
    found = rollback.verified_deployments(HISTORY)
    assert [d.number for d in found] == [1, 2]
    newest, older = found
    assert newest.view["vllm"] == {"maxModelLen": 4096, "maxNumSeqs": 4}
    assert newest.updates == 1 and older.updates == 2  # two ups with the same config
    assert older.view["vllm"] == {"maxNumSeqs": 4}
    assert newest.view["nccl.extraEnv"] == {"NCCL_DEBUG_SUBSYS": "INIT"}
    assert newest.view["image"] == {"ref": "reg/vllm:one"}
    assert "vllmApiKey" not in json.dumps(newest.view)  # a secret is never part of it
    assert newest.notes == ["model.revision 'main' is a branch or tag: it is set back as such, "
                            "and serves the commit it names at the hub now"]


def test_what_differs_is_named_by_key_path():
    a = {"vllm": {"maxModelLen": 4096, "maxNumSeqs": 4}, "image": {"ref": "x"}}
    b = {"vllm": {"maxNumSeqs": 4}, "image": {"ref": "y"}, "services": [{"name": "e"}]}
    assert rollback.differences(a, b) == ["image.ref", "services", "vllm.maxModelLen"]


class FakePulumi:
    """FAKE Pulumi CLI: `stack history` answers the recorded history (or `history`), `config
    set-all` and `config rm` write the --config-file as Pulumi would (objects as YAML)."""

    def __init__(self, history=HISTORY):
        self.history = history
        self.calls: list[list[str]] = []
        self.ups: list[list[str]] = []

    def __call__(self, args):
        args = list(args)
        self.calls.append(args)
        out = ""
        if args[:2] == ["stack", "history"]:
            out = json.dumps(self.history if args[args.index("--page") + 1] == "1" else [])
        elif args[:2] in (["config", "set-all"], ["config", "rm"]):
            path = args[args.index("--config-file") + 1]
            doc = yaml.safe_load(open(path).read()) or {}
            if args[1] == "set-all":
                for k, v in json.loads(args[args.index("--json") + 1]).items():
                    doc["config"][k] = v["objectValue"]
            else:
                doc["config"].pop(args[-1], None)
            with open(path, "w") as fh:
                fh.write(yaml.safe_dump(doc, sort_keys=False))
        else:
            raise AssertionError(f"rollback called pulumi {args}")
        return subprocess.CompletedProcess(["pulumi", *args], 0, out, "")

    def up(self, args) -> int:
        self.ups.append(list(args))
        return 0


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.lab.yaml").write_text(yaml.safe_dump({"config": {
        "spark-vllm:image": {"ref": "reg/vllm:one"},
        "spark-vllm:model": {"repo": "org/m", "revision": "main"},
        "spark-vllm:vllm": {"maxNumSeqs": 4, "maxModelLen": 1048576},
        "spark-vllm:nccl": {"extraEnv": {"NCCL_DEBUG_SUBSYS": "INIT"}, "rdma": False},
        "spark-vllm:services": [{"name": "embed"}],
        "spark-vllm:vllmApiKey": {"secure": "v1:ZmFrZQ==:ZW5jcnlwdGVk"}}}, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    fake = FakePulumi()
    monkeypatch.setattr(rollback, "PULUMI", fake)
    monkeypatch.setattr(rollback, "PULUMI_UP", fake.up)
    return tmp_path, fake


def test_back_to_the_last_verified_one_then_up_with_the_given_arguments(folder):
    path, fake = folder
    result = CliRunner().invoke(cli.main, ["rollback", "-s", "lab", "--yes", "--",
                                           "--policy-pack", "policies"])
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((path / "Pulumi.lab.yaml").read_text())["config"]
    assert doc["spark-vllm:vllm"] == {"maxModelLen": 4096, "maxNumSeqs": 4}
    assert "spark-vllm:services" not in doc  # deployment 1 had none: `config rm`
    assert doc["spark-vllm:nccl"] == {"extraEnv": {"NCCL_DEBUG_SUBSYS": "INIT"}, "rdma": False}
    assert doc["spark-vllm:vllmApiKey"] == {"secure": "v1:ZmFrZQ==:ZW5jcnlwdGVk"}
    assert fake.ups == [["up", "--yes", "--stack", "lab", "--policy-pack", "policies"]]
    assert next(c for c in fake.calls if c[1] == "rm")[:5] == \
        ["config", "rm", "--stack", "lab", "--config-file"]
    assert "-    maxModelLen: 1048576" in result.output and "+    maxModelLen: 4096" in result.output


@pytest.mark.parametrize(("args", "code", "said"), [
    (["--to", "3", "--yes"], 2, "--to 3: the history holds 2 verified deployment(s)"),
    ([], 6, "not confirmed (pass --yes to go on without asking)"),  # no terminal to ask
    (["--dry-run"], 0, "dry run: nothing written"),
])
def test_refusals_and_the_dry_run_write_nothing_and_run_no_up(folder, args, code, said):
    path, fake = folder
    before = (path / "Pulumi.lab.yaml").read_text()
    result = CliRunner().invoke(cli.main, ["rollback", "-s", "lab", *args])
    assert result.exit_code == code, result.output
    assert said in result.output
    assert (path / "Pulumi.lab.yaml").read_text() == before and fake.ups == []


def test_a_stack_with_no_verified_deployment_is_refused(folder, monkeypatch):
    _, fake = folder
    fake.history = [e for e in HISTORY if e["result"] != "succeeded"]
    result = CliRunner().invoke(cli.main, ["rollback", "-s", "lab", "--yes"])
    assert result.exit_code == 3 and "has no verified deployment" in result.output
