"""`spark-vllm init` end to end (click's CliRunner on tools.cli.main) with its three outside
calls replaced by fakes: ssh-keyscan (init_cli.KEYSCAN), the survey's ssh round trip
(init_cli.RUNNER, answering with the outputs the lab's simulated Sparks recorded for init's
survey script, tests/fixtures/init/lab-spark-*.txt, re-nonced) and Pulumi's CLI (init_cli.PULUMI);
preflight (tools.recon_report.main) is faked too. Each test runs in its own folder holding a copy
of the project's Pulumi.yaml (and Pulumi.dev.yaml where --like dev is used).

Proved: a host key is pinned only when its fingerprint is accepted (--accept-host-key, or
confirmed at a terminal), and a refusal surveys nothing, calls no Pulumi and writes nothing; an
existing stack file, a missing Pulumi.yaml, malformed --accept-host-key and HOST forms are usage
errors; the no-carrier survey stops init; the fresh pair with --like dev writes the stack file
through `pulumi stack init` + `pulumi config set-all` (typed JSON, no secret, no knownHostsFile
carried), the SSH key as a secret only through stdin, runs preflight and ends with the next
command; node names come from the hosts' hostnames unless NAME= is given.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from inspection import recon
from tests.conftest import ROOT, dev_project
from tools import cli, init_cli

INIT = ROOT / "tests" / "fixtures" / "init"
RECORDED_NONCE = "5eed5eed5eed5eed"
HOST_1, HOST_2 = "10.77.0.11", "10.77.0.12"
KEY_1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPykkYzPvHrVjEDRoWCY0vynXHUvfbCJFpaFuAhGr90L"
KEY_2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAzciBTDgFfru/NcREI8UuDkm3ihu7lliKeTKf+k8ZJL"
FP_1 = "SHA256:9+sb7PHUVMRwBjmPfNEfCzeu+S3Xi1GQQ/t19YxEkcA"
FP_2 = "SHA256:iFjp5G0dhMxbLS30xg4SjVFXmxKKkkknentZ65fFM+U"
HOST_KEYS = {HOST_1: KEY_1, HOST_2: KEY_2}
FRESH = {HOST_1: "lab-spark-1-fresh", HOST_2: "lab-spark-2-fresh"}
KEY_TEXT = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nZHVtbXkgdGVzdCBrZXk=\n" \
           "-----END OPENSSH " + "PRIVATE KEY-----\n"


class Fakes:
    """The outside world of one init run, and what init asked of it."""

    def __init__(self, outputs: dict[str, str | Path], keys: dict[str, str] | None = None):
        self.outputs = outputs  # host -> recorded fixture name (or a file of the test's)
        self.keys = keys or HOST_KEYS
        self.scanned: list[tuple[str, int]] = []
        self.surveyed: list[str] = []
        self.pinned: dict[str, str] = {}  # host -> the known_hosts the survey's ssh was given
        self.pulumi: list[tuple[list[str], str | None]] = []
        self.preflight: list[list[str]] = []
        self.stack_init_fails = False
        self.init_saw: dict[str, str] = {}  # the real folder's stack files when `stack init` ran

    def keyscan(self, host: str, port: int, timeout: float) -> str:
        """FAKE ssh-keyscan: the lab node's ed25519 key line (and an ssh-rsa one init must
        not pin), as `ssh-keyscan -t ...` prints them."""
        self.scanned.append((host, port))
        return (f"# {host}:{port} SSH-2.0-OpenSSH_9.2p1\n"
                f"{host} ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQDnotpinnable\n"
                f"{host} {self.keys[host]}\n")

    def runner(self, argv: list[str], script: str, timeout: float) -> recon.SshResult:
        """FAKE ssh round trip: the host is read from the argv's user@host; the answer is that
        host's recorded survey output with the recorded nonce replaced by the script's."""
        host = next(a.split("@", 1)[1] for a in argv if re.fullmatch(r"[a-z_][\w-]*@[\w.-]+", a))
        self.surveyed.append(host)
        known = next(a.split("=", 1)[1] for a in argv if a.startswith("UserKnownHostsFile="))
        self.pinned[host] = Path(known).read_text()
        nonce = re.search(r"^SV_NONCE=([0-9a-f]+)$", script, re.M).group(1)
        name = self.outputs[host]
        text = name.read_text() if isinstance(name, Path) else (INIT / f"{name}.txt").read_text()
        return recon.SshResult(0, text.replace(RECORDED_NONCE, nonce), "", 1000.0, 1000.2)

    def pulumi_cli(self, args, *, stdin=None) -> subprocess.CompletedProcess[str]:
        """FAKE Pulumi CLI: no stack exists; `stack init` succeeds; `config set-all` and
        `config set --secret` write what Pulumi would into the --config-file they are given."""
        args = list(args)
        self.pulumi.append((args, stdin))
        out = ""
        cwd = Path.cwd()
        if args[:1] == ["--cwd"]:
            cwd, args = Path(args[1]), args[2:]
        if args == ["stack", "ls", "--json"]:
            out = "[]"
        elif args[:2] == ["stack", "init"]:
            if self.stack_init_fails:
                return subprocess.CompletedProcess(["pulumi", *args], 255, "",
                                                   "error: the backend said no")
            # as Pulumi's passphrase provider does: the new stack's salt into the stack file
            # of the project it runs in
            self.init_saw = {p.name: p.read_text() for p in Path.cwd().glob("Pulumi.*.yaml")}
            f = cwd / f"Pulumi.{args[2]}.yaml"
            doc = (yaml.safe_load(f.read_text()) if f.exists() else None) or {}
            doc["encryptionsalt"] = "v1:ZmFrZSBzYWx0:v1:fake"
            f.write_text(yaml.safe_dump(doc, sort_keys=False))
        elif args[:2] == ["stack", "rm"]:
            pass
        elif args[:2] == ["config", "set-all"]:
            path = Path(args[args.index("--config-file") + 1])
            values = json.loads(args[args.index("--json") + 1])
            doc = yaml.safe_load(path.read_text()) or {}
            doc["config"] = {k: v.get("objectValue", v["value"]) for k, v in values.items()}
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
        elif args[:2] == ["config", "set"] and "--secret" in args:
            path = Path(args[args.index("--config-file") + 1])
            doc = yaml.safe_load(path.read_text())
            doc["config"][args[-1]] = {"secure": "v1:ZmFrZQ==:ZW5jcnlwdGVk"}  # never the key
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
        else:
            raise AssertionError(f"init called pulumi {args}")
        return subprocess.CompletedProcess(["pulumi", *args], 0, out, "")

    def recon_report(self, argv: list[str]) -> int:
        """FAKE preflight (tools.recon_report.main): records its argv, passes."""
        self.preflight.append(list(argv))
        return 0

    def calls(self, *head: str) -> list[tuple[list[str], str | None]]:
        return [c for c in self.pulumi if c[0][:len(head)] == list(head)]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A project folder (Pulumi.yaml, Pulumi.dev.yaml) as the current directory, with a key."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    shutil.copy(ROOT / "Pulumi.dev.yaml", tmp_path / "Pulumi.dev.yaml")
    (tmp_path / "id_test").write_text(KEY_TEXT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def install(monkeypatch, outputs: dict[str, str | Path] | None = None) -> Fakes:
    fakes = Fakes(outputs or FRESH)
    monkeypatch.setattr(init_cli, "KEYSCAN", fakes.keyscan)
    monkeypatch.setattr(init_cli, "RUNNER", fakes.runner)
    monkeypatch.setattr(init_cli, "PULUMI", fakes.pulumi_cli)
    monkeypatch.setattr("tools.recon_report.main", fakes.recon_report)
    return fakes


def init(folder: Path, *args: str, input: str | None = None):
    return CliRunner().invoke(cli.main, ["init", "--key", str(folder / "id_test"), *args],
                              input=input)


ACCEPT = ["--accept-host-key", FP_1, "--accept-host-key", FP_2]


def stack_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*Pulumi.*yaml*"))


def set_all_values(fakes: Fakes) -> dict:
    ((args, stdin),) = fakes.calls("config", "set-all")
    assert stdin is None
    return json.loads(args[args.index("--json") + 1])


def decoded(values: dict) -> dict:
    return {k.split(":", 1)[1]: json.loads(v["value"]) if "objectValue" in v else v["value"]
            for k, v in values.items()}


# --------------------------------------------------------------------------- host keys

def test_a_fingerprint_not_accepted_is_refused_before_anything_else(folder, monkeypatch):
    fakes = install(monkeypatch)
    other = "SHA256:" + "A" * 43
    result = init(folder, "-s", "trial", HOST_1, HOST_2, "--accept-host-key", other)
    assert result.exit_code == 1, result.output
    assert f"{HOST_1}: its host key {FP_1} is not one you accepted" in result.output
    assert f"presents ssh-ed25519 {FP_1}" in result.output
    assert fakes.surveyed == [] and fakes.pulumi == []
    assert not (folder / "Pulumi.trial.yaml").exists()


def test_without_accept_and_without_a_terminal_init_refuses(folder, monkeypatch):
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", HOST_1, HOST_2, "--like", "dev", "--yes")
    assert result.exit_code == 1, result.output
    assert "(no terminal)" in result.output
    assert f"--accept-host-key {FP_1}" in result.output
    assert fakes.surveyed == [] and fakes.pulumi == [] and fakes.preflight == []
    assert stack_files(folder) == ["Pulumi.dev.yaml", "Pulumi.yaml"]


class _Terminal:
    """FAKE terminal on stdin, for init's `sys.stdin.isatty()` only: the answers themselves are
    read by click from CliRunner's input."""

    def isatty(self) -> bool:
        return True


class _SysWithTerminal:
    """init_cli's view of `sys` (FAKE): stdin is a terminal, everything else the real sys."""

    stdin = _Terminal()

    def __getattr__(self, name):
        import sys

        return getattr(sys, name)


def test_keys_confirmed_at_a_terminal_are_pinned(folder, monkeypatch):
    fakes = install(monkeypatch)
    monkeypatch.setattr(init_cli, "sys", _SysWithTerminal())
    result = init(folder, "-s", "trial", HOST_1, HOST_2, "--like", "dev", "--yes",
                  input="y\ny\n")
    assert result.exit_code == 0, result.output
    assert result.output.count("Pin it") == 2
    nodes = decoded(set_all_values(fakes))["nodes"]
    assert [n["hostKey"] for n in nodes] == [KEY_1, KEY_2]
    # the survey's own ssh already trusted the confirmed key, and only it
    assert KEY_1 in fakes.pinned[HOST_1] and KEY_2 not in fakes.pinned[HOST_1]


def test_a_key_not_confirmed_at_the_terminal_is_refused(folder, monkeypatch):
    fakes = install(monkeypatch)
    monkeypatch.setattr(init_cli, "sys", _SysWithTerminal())
    result = init(folder, "-s", "trial", HOST_1, HOST_2, "--like", "dev", "--yes", input="n\n")
    assert result.exit_code == 1, result.output
    assert f"{HOST_1}: host key not confirmed: nothing written" in result.output
    assert fakes.surveyed == [] and fakes.pulumi == []
    assert not (folder / "Pulumi.trial.yaml").exists()


# --------------------------------------------------------------------------- usage errors

def test_an_existing_stack_file_without_force_is_a_usage_error(folder, monkeypatch):
    fakes = install(monkeypatch)
    before = (folder / "Pulumi.dev.yaml").read_bytes()
    result = init(folder, "-s", "dev", HOST_1, HOST_2, *ACCEPT)
    assert result.exit_code == 2, result.output
    assert "Pulumi.dev.yaml exists" in result.output and "--force" in result.output
    assert (folder / "Pulumi.dev.yaml").read_bytes() == before
    assert fakes.scanned == [] and fakes.surveyed == [] and fakes.pulumi == []


def test_outside_the_project_folder_is_a_usage_error(folder, monkeypatch):
    fakes = install(monkeypatch)
    (folder / "Pulumi.yaml").unlink()
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT)
    assert result.exit_code == 2, result.output
    assert "no Pulumi.yaml here" in result.output
    assert fakes.scanned == [] and fakes.pulumi == []


@pytest.mark.parametrize("bad", ["MD5:" + "A" * 46, FP_1[:-1]])
def test_a_malformed_accept_host_key_is_a_usage_error(folder, monkeypatch, bad):
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", HOST_1, HOST_2, "--accept-host-key", bad)
    assert result.exit_code == 2, result.output
    assert repr(bad) in result.output and "--accept-host-key" in result.output
    assert fakes.scanned == []


@pytest.mark.parametrize(("bad", "why"), [
    ("name=", "host"),
    ("a@b:xyz", "the port after ':' is not a number"),
    ("fe80::1", "'fe80::1'"),
])
def test_malformed_hosts_are_usage_errors_that_quote_them(folder, monkeypatch, bad, why):
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", HOST_1, bad, *ACCEPT)
    assert result.exit_code == 2, result.output
    assert repr(bad) in result.output and why in result.output
    assert fakes.scanned == [] and fakes.pulumi == []


def test_a_malformed_subnet_is_a_usage_error(folder, monkeypatch):
    """--subnet is the operator's text: a value that is no IPv4 CIDR (octet 300) is refused as a
    usage error quoting it, like a bad HOST or --accept-host-key, never a traceback."""
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes",
                  "--subnet", "192.168.300.0/24")
    assert result.exit_code == 2, (result.output, result.exception)
    assert "192.168.300.0/24" in result.output
    assert fakes.pulumi == []
    assert not (folder / "Pulumi.trial.yaml").exists()


# --------------------------------------------------------------------------- surveys

def test_the_nocarrier_survey_stops_init_and_writes_nothing(folder, monkeypatch):
    fakes = install(monkeypatch, {HOST_1: "lab-spark-1-fresh", HOST_2: "lab-spark-2-nocarrier"})
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes")
    assert result.exit_code == 1, result.output
    assert sorted(fakes.surveyed) == [HOST_1, HOST_2]
    assert re.search(r"^error: spark-2: no ConnectX-7 interface has a carrier", result.output,
                     re.M), result.output
    assert "finding(s) above stop init: nothing written" in result.output
    assert fakes.pulumi == [] and fakes.preflight == []
    assert not (folder / "Pulumi.trial.yaml").exists()


def test_the_fresh_pair_like_dev_writes_the_stack_through_pulumi(folder, monkeypatch):
    fakes = install(monkeypatch)
    key = str(folder / "id_test")
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes")
    assert result.exit_code == 0, (result.output, result.exception)
    assert sorted(fakes.surveyed) == [HOST_1, HOST_2]
    commands = [args for args, _ in fakes.pulumi]
    assert commands[0] == ["stack", "ls", "--json"]
    # in a scratch project (its salt into a scratch stack file), never in the real folder
    assert commands[1][0] == "--cwd" and Path(commands[1][1]).parent != folder
    assert commands[1][2:] == ["stack", "init", "trial", "--no-select"]
    assert not Path(commands[1][1]).exists()  # gone after
    assert len(commands) == 3
    scratch = commands[2][commands[2].index("--config-file") + 1]
    assert commands[2][:6] == ["config", "set-all", "--stack", "trial", "--config-file", scratch]
    assert Path(scratch).parent == folder and not Path(scratch).exists()  # a scratch copy, gone
    values = set_all_values(fakes)
    assert all(v["secret"] is False for v in values.values())
    raw = decoded(values)
    dev = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    assert raw["nodes"] == [{**n, "hostKey": k}
                            for n, k in zip(dev["spark-vllm:nodes"], (KEY_1, KEY_2), strict=True)]
    assert raw["ssh"] == {"privateKeyPath": key, "connectTimeoutSeconds": 10}  # no knownHostsFile
    assert raw["nccl"]["fabricSubnets"] == ["192.168.177.0/24", "192.168.178.0/24"]
    assert raw["vllm"]["tensorParallelSize"] == 2
    assert raw["environment"] == "dev"  # --like's, the stack's name is none of dev/staging/prod
    assert raw["image"] == dev["spark-vllm:image"] and raw["model"] == dev["spark-vllm:model"]
    # the stack file is what Pulumi wrote into the scratch copy
    written = yaml.safe_load((folder / "Pulumi.trial.yaml").read_text())
    assert written["config"]["spark-vllm:nodes"] == raw["nodes"]
    assert "Pulumi.trial.yaml (proposed)" in result.output  # the diff was shown
    assert fakes.preflight == [["-s", "trial", "--key", key, "--no-last-up"]]
    assert result.output.rstrip().splitlines()[-1].startswith("next: pulumi preview -s trial")


def test_key_secret_reaches_pulumi_only_on_stdin(folder, monkeypatch):
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes",
                  "--key-secret")
    assert result.exit_code == 0, (result.output, result.exception)
    ((args, stdin),) = fakes.calls("config", "set", "--stack")
    assert args[-2:] == ["--secret", "spark-vllm:sshPrivateKey"]
    assert stdin == KEY_TEXT
    for argv, _ in fakes.pulumi:
        assert not any("PRIVATE KEY" in a or "ZHVtbXkgdGVzdCBrZXk=" in a for a in argv), argv
    assert fakes.preflight and "ZHVtbXkgdGVzdCBrZXk=" not in result.output
    text = (folder / "Pulumi.trial.yaml").read_text()
    assert "secure" in yaml.safe_load(text)["config"]["spark-vllm:sshPrivateKey"]
    assert "ZHVtbXkgdGVzdCBrZXk=" not in text


def test_node_names_come_from_the_hostnames_unless_given(folder, monkeypatch):
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes")
    assert result.exit_code == 0, result.output
    assert [n["name"] for n in decoded(set_all_values(fakes))["nodes"]] == ["spark-1", "spark-2"]
    assert f"spark-1 (head, root@{HOST_1}:22)" in result.output

    (folder / "Pulumi.trial.yaml").unlink()
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", f"a={HOST_1}", f"b={HOST_2}", *ACCEPT, "--like", "dev",
                  "--yes")
    assert result.exit_code == 0, result.output
    nodes = decoded(set_all_values(fakes))["nodes"]
    assert [(n["name"], n["host"]) for n in nodes] == [("a", HOST_1), ("b", HOST_2)]
    assert f"b (worker, root@{HOST_2}:22)" in result.output


def test_a_failing_preflight_keeps_the_file_and_exits_with_its_code(folder, monkeypatch):
    fakes = install(monkeypatch)
    monkeypatch.setattr("tools.recon_report.main", lambda argv: fakes.preflight.append(argv) or 3)
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes")
    assert result.exit_code == 3, result.output
    assert (folder / "Pulumi.trial.yaml").exists()
    assert "fix what preflight says" in result.output and "next:" not in result.output


# --------------------------------------------------------------------------- terminal escapes

# What a node's answers may carry to the operator's terminal (issue 46, item 8): OSC 0 retitles
# the window, OSC 8 plants a hyperlink, CSI 2J clears the screen, a bidirectional override
# makes text read backwards.
ESCAPES = ["\x1b]0;pwned\x07", "\x1b]8;;http://evil/\x1b\\", "\x1b[2J", "\u202e"]


def _forged(tmp_path: Path) -> Path:
    """spark-1's recorded seeded survey with escapes in what the node says: its os-release
    name, a foreign container's name and image (docker ps JSON escapes them, json decodes
    them back), as a forged or odd node could answer."""
    text = (INIT / "lab-spark-1-seeded.txt").read_text()
    text = text.replace('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
                        'PRETTY_NAME="Debian' + "".join(ESCAPES) + '-tail 12"')
    esc = json.dumps("".join(ESCAPES) + "-tail")[1:-1]
    text = text.replace('"Image":"vllm-node"', f'"Image":"vllm-node{esc}"', 1)
    out = tmp_path / "forged.txt"
    out.write_text(text)
    return out


def test_init_prints_nothing_a_terminal_acts_on(folder, monkeypatch, tmp_path):
    install(monkeypatch, {HOST_1: _forged(tmp_path), HOST_2: "lab-spark-2-fresh"})
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes")
    # what the node said is shown, without the sequences
    assert "Debian-tail 12" in result.output and "(vllm-node-tail)" in result.output, \
        result.output
    assert not any(c in result.output for c in "\x1b\x07\u202e"), repr(result.output)


def test_recon_prints_nothing_a_terminal_acts_on(tmp_path, monkeypatch, capsys):
    """`spark-vllm recon`: the table (its cells and row names escaped as status escapes them)
    and preflight's findings and plan (sanitized as `logs` prints log lines)."""
    from tools import recon_report

    forged = _forged(tmp_path).read_text()
    nonce_of: dict[str, str] = {}

    def survey_all(cfg, names=None, key_path=None):
        out = {}
        for node in cfg.nodes:
            nonce = "5eed5eed5eed5eed"
            nonce_of[node.name] = nonce
            text = forged if node.name == "spark-1" else \
                (INIT / "lab-spark-2-fresh.txt").read_text()
            out[node.name] = recon.parse_recon_output(node.name, text, nonce=nonce)
        return out

    (tmp_path / "project").mkdir()
    monkeypatch.chdir(dev_project(tmp_path / "project"))
    monkeypatch.setattr(recon, "survey_all", survey_all)
    rc = recon_report.main(["-s", "dev", "--no-last-up", "--color", "always"])
    out, err = capsys.readouterr()
    assert rc == 1, err  # the seeded node's foreign containers fail preflight
    assert "Debian\\x1b]0;pwned\\x07" in out  # the table shows the node's value escaped
    assert "vllm-node-tail" in err  # preflight's finding, the sequences removed
    for text in (out, err):
        assert "\x07" not in text and "\u202e" not in text and "\x1b]" not in text, repr(text)
        assert "\x1b[2J" not in text, repr(text)


# --------------------------------------------------------------------------- --force

OLD_FILE = ("encryptionsalt: v1:qRwEk2gHmms=:v1:AAAAAAAAAAAAAAAA:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\n"
            "config:\n  spark-vllm:environment: prod\n  spark-vllm:leftover: 1\n")


def test_force_on_a_stack_gone_from_the_backend_leaves_the_file_if_stack_init_fails(
        folder, monkeypatch):
    """Issue 46, item 9: init --force removed `config` and `encryptionsalt` from the real stack
    file before `pulumi stack init`, and nothing put them back when it failed. It edits a
    scratch copy only now."""
    (folder / "Pulumi.trial.yaml").write_text(OLD_FILE)
    fakes = install(monkeypatch)
    fakes.stack_init_fails = True
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--yes",
                  "--force")
    assert result.exit_code == 1 and "pulumi stack init trial failed" in result.output
    assert (folder / "Pulumi.trial.yaml").read_text() == OLD_FILE
    assert stack_files(folder) == ["Pulumi.dev.yaml", "Pulumi.trial.yaml", "Pulumi.yaml"]


def test_force_edits_nothing_before_the_answer_and_nothing_when_declined(folder, monkeypatch):
    (folder / "Pulumi.trial.yaml").write_text(OLD_FILE)
    fakes = install(monkeypatch)
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--force")
    assert result.exit_code == 1 and "Pulumi.trial.yaml not written" in result.output
    assert fakes.init_saw["Pulumi.trial.yaml"] == OLD_FILE  # as `stack init` ran
    assert (folder / "Pulumi.trial.yaml").read_text() == OLD_FILE
    assert [a for a, _ in fakes.calls("stack", "rm")] == [
        ["stack", "rm", "--yes", "--preserve-config", "trial"]]
    # the diff showed the old file against the new salt and config, from the scratch copy
    assert "-encryptionsalt: v1:qRwEk2gHmms=" in result.output
    assert "+encryptionsalt: v1:ZmFrZSBzYWx0:v1:fake" in result.output
    assert "-  spark-vllm:leftover: 1" in result.output
    # confirmed, the file is what the scratch copy held
    result = init(folder, "-s", "trial", HOST_1, HOST_2, *ACCEPT, "--like", "dev", "--force",
                  "--yes")
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((folder / "Pulumi.trial.yaml").read_text())
    assert written["encryptionsalt"] == "v1:ZmFrZSBzYWx0:v1:fake"
    assert "spark-vllm:leftover" not in written["config"]
