"""`spark-vllm reconcile`'s parts without an engine (issue 50): the table of repair classes
(tools/drift.py: a test per class, and what falls in none), the steps read back from engine
events, the interval, the config comparison, the run's line and metrics (checked with
Debian's promtool), the head's script, the loop, and the systemd units (checked with
systemd-analyze) with their install and removal. The engine's part runs in the promote tier
(tests/promote/test_reconcile.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from tools import cli, drift, reconcile, reconcile_timer
from tools.drift import COMMAND, CONTAINER, Change, classify
from tools.reconcile_report import RunResult, head_script, last_repair_of, metrics_text

IMAGE = "docker:index/remoteImage:RemoteImage"
DYNAMIC = "pulumi-python:dynamic:Resource"
NODE_FABRIC = "spark-vllm:fabric:NodeFabric"


def _class(kind: str, name: str, op: str, *diffs: str) -> str | None:
    c = classify(Change(kind, name, op, tuple(diffs)))
    return c.name if c else None


# --- the repair classes, one test each ------------------------------------------------------


def test_fabric():
    """An interface's command (and its NodeFabric), the MTU checks that run again after it."""
    assert _class(COMMAND, "fabric-spark-2-enP2p1s0f1np1", "replace", "triggers") == "fabric"
    assert _class(COMMAND, "fabric-spark-2-enp1s0f1np1", "create") == "fabric"
    assert _class(COMMAND, "nccl-fabric-spark-1", "replace", "create") == "fabric"
    assert _class(NODE_FABRIC, "fabric-spark-2", "update", "interfaces") == "fabric"
    # the collective gate measures the changed fabric again (seen on the lab: a twin's address
    # flushed -> collective-rank-<node> replace, collective-check update)
    assert _class(COMMAND, "collective-rank-spark-1", "replace", "triggers") == "fabric"
    assert _class(COMMAND, "collective-check", "update", "create") == "fabric"
    assert _class(IMAGE, "collective-check", "update") is None
    assert _class(COMMAND, "fabric-spark-2-enp1s0f1np1", "delete") is None  # never a delete


def test_firewall():
    """The NodeFirewall's resources (named `firewall-*` on its branch) and mp's rendezvous
    guard (gone after a reboot)."""
    assert _class("spark-vllm:firewall:NodeFirewall", "firewall-spark-1", "update") == "firewall"
    assert _class(COMMAND, "firewall-spark-1-input", "replace", "triggers") == "firewall"
    assert _class(COMMAND, "vllm-master-guard", "replace", "triggers") == "firewall"
    assert _class(COMMAND, "firewall-spark-1-input", "delete") is None


def test_guard():
    assert _class("spark-vllm:guard:NodeGuard", "guard-spark-1", "update") == "guard"
    assert _class(COMMAND, "guard-spark-2-rules", "create") == "guard"
    assert _class(COMMAND, "guards-spark-2", "create") is None


def test_monitoring_files():
    for name in ("monitoring-key", "monitoring-config", "monitoring-data",
                 "monitoring-alertmanager-config"):
        assert _class(COMMAND, name, "replace", "triggers") == "monitoring files", name
    assert _class(COMMAND, "monitoring-config", "update", "create") == "monitoring files"
    # not a container's image, not another type of that name
    assert _class(IMAGE, "monitoring-prometheus-image", "replace", "name") is None
    assert _class(DYNAMIC, "monitoring-config", "update") is None


def test_gateway_configuration():
    for name in ("gateway-config", "gateway-key", "gateway-tls"):
        assert _class(COMMAND, name, "replace", "triggers") == "gateway configuration", name
    assert _class(IMAGE, "gateway-image", "replace", "name") is None


def test_stopped_or_missing_container():
    """A container of the stack made again as it was (a refresh drops a stopped one: a
    create), one replaced only because a label names a container or command made again, and
    the gates that start and prove them; never one replaced for a new image, command,
    environment or mount."""
    cls = "stopped or missing container"
    assert _class(CONTAINER, "monitoring-node-exporter-spark-2", "create") == cls
    assert _class(CONTAINER, "ray-worker-spark-2", "create") == cls
    assert _class(CONTAINER, "vllm-serve", "replace", "labels") == cls
    assert _class(CONTAINER, "monitoring-prometheus", "replace", "labels") == cls
    for gate in ("vllm-health", "gateway-health", "monitoring-health", "ray-ready",
                 "svc-embed-health-spark-1", "monitoring-node-exporter-start-spark-2",
                 "vllm-ranks-restart", "vllm-nccl-log", "vllm-transport"):
        assert _class(COMMAND, gate, "replace", "triggers") == cls, gate
    assert _class(COMMAND, "vllm-health", "update", "create") == cls
    for diffs in (("image",), ("image", "labels"), ("command",), ("envs",), ("mounts",),
                  ("labels", "uploads")):
        assert _class(CONTAINER, "vllm-serve", "replace", *diffs) is None, diffs
    assert _class(CONTAINER, "vllm-serve", "delete") is None
    assert _class(COMMAND, "vllm-health", "replace", "environment") is None


def test_what_falls_in_no_class():
    """Reported, never applied: the model's cache, the image, the serve check (a new argv or
    image), the Ray token and key files, a component's props, a delete."""
    for kind, name, op, diffs in (
            (COMMAND, "model-verify-spark-2", "replace", ("triggers",)),
            (COMMAND, "model-sync-spark-2", "replace", ("triggers",)),
            (IMAGE, "image-spark-1", "replace", ("name",)),
            (COMMAND, "vllm-serve-check-spark-1", "replace", ("create",)),
            (COMMAND, "ray-token-spark-2", "replace", ("triggers",)),
            (COMMAND, "vllm-api-key", "replace", ("triggers",)),
            ("spark-vllm:vllm_server:VllmServer", "vllm", "update", ("maxModelLen",)),
            (COMMAND, "svc-embed-model-fetch", "create", ()),
            (CONTAINER, "svc-embed-serve-spark-1", "delete", ())):
        assert _class(kind, name, op, *diffs) is None, name
    v = drift.verdict([Change(COMMAND, "fabric-spark-2-enp1s0f1np1", "replace"),
                       Change(IMAGE, "image-spark-1", "replace", ("name",)),
                       Change(drift.STACK, "spark-vllm-dev", "update")])
    assert not v.repairable and v.changes == 2  # the stack's outputs are no change on a host
    assert [str(c) for c in v.unsafe] == ["image-spark-1 replace"]
    assert {k: [str(c) for c in cs] for k, cs in v.safe.items()} == {
        "fabric": ["fabric-spark-2-enp1s0f1np1 replace"]}


def test_every_class_is_documented_and_no_class_takes_a_delete():
    names = {c.name for c in drift.CLASSES}
    assert names == {"fabric", "firewall", "guard", "monitoring files", "gateway configuration",
                     "stopped or missing container"}
    for c in drift.CLASSES:
        assert c.why and "delete" not in c.ops, c.name


# --- the engine's events read back --------------------------------------------------------


def _pre(op: str, name: str, kind: str = COMMAND, diffs=None):
    urn = f"urn:pulumi:dev::spark-vllm::spark-vllm:fabric:NodeFabric${kind}::{name}"
    meta = SimpleNamespace(op=SimpleNamespace(value=op), urn=urn, type=kind, diffs=diffs)
    return SimpleNamespace(resource_pre_event=SimpleNamespace(metadata=meta))


def test_changes_of_a_previews_events():
    events = [
        _pre("refresh", "vllm-serve", CONTAINER), _pre("same", "gateway-config"),
        _pre("delete-replaced", "fabric-spark-2-enP2p1s0f1np1", diffs=["triggers"]),
        _pre("create-replacement", "fabric-spark-2-enP2p1s0f1np1", diffs=["triggers"]),
        _pre("replace", "fabric-spark-2-enP2p1s0f1np1", diffs=["triggers"]),
        _pre("create", "monitoring-node-exporter-spark-2", CONTAINER),
        _pre("update", "spark-vllm-dev", drift.STACK),
        SimpleNamespace(resource_pre_event=None, policy_event=None),
    ]
    assert drift.changes_of(events) == [
        Change(COMMAND, "fabric-spark-2-enP2p1s0f1np1", "replace", ("triggers",)),
        Change(CONTAINER, "monitoring-node-exporter-spark-2", "create"),
        Change(drift.STACK, "spark-vllm-dev", "update")]


def test_policy_findings_name_the_policy_and_its_last_line():
    ev = SimpleNamespace(policy_event=SimpleNamespace(
        policy_name="monitoring-not-exposed", enforcement_level="mandatory",
        message="Prometheus ...\nnode spark-1: Prometheus listens on 0.0.0.0:9090"))
    assert drift.policy_findings([ev, ev, SimpleNamespace(policy_event=None)]) == [
        "monitoring-not-exposed (mandatory): node spark-1: Prometheus listens on 0.0.0.0:9090"]


@pytest.mark.parametrize("text, result, why", [
    ("preflight failed with 1 problem(s); nothing was changed:\n"
     "  - spark-2: unreachable: root@10.77.0.12:22 (Connection refused) — check that ...",
     "refused", "a node is unreachable (spark-2: unreachable: root@10.77.0.12:22 (Connection "
                "refused) — check that ...)"),
    ("preflight failed with 1 problem(s); nothing was changed:\n  - spark-1: docker 19.03 — x",
     "refused", "preflight failed (spark-1: docker 19.03 — x)"),
    ("error: something else broke\nexit status 255", "failed",
     "the preview failed: error: something else broke / exit status 255"),
])
def test_why_a_preview_failed(text, result, why):
    assert reconcile._why_preview_failed(RuntimeError(text), []) == (result, why)
    assert reconcile._why_preview_failed(RuntimeError(text), ["p (mandatory): x"]) == (
        "refused", "policy violation: p (mandatory): x")


# --- the interval, the config comparison, the project copy --------------------------------


def test_parse_interval():
    assert [reconcile.parse_interval(t) for t in ("5m", "30s", "1h", "1h30m", "90s")] == [
        300, 30, 3600, 5400, 90]
    for bad in ("", "5", "5x", "m", "0s", "-5m", "5 m"):
        with pytest.raises(reconcile.Usage):
            reconcile.parse_interval(bad)


def test_config_differences_names_keys_never_values():
    cv = SimpleNamespace
    applied = {"spark-vllm:vllm": cv(value='{"maxNumSeqs": 4, "port": 8000}', secret=False),
               "spark-vllm:vllmApiKey": cv(value="sk-1", secret=True),
               "spark-vllm:environment": cv(value="dev", secret=False)}
    same = {"spark-vllm:vllm": cv(value='{"port": 8000, "maxNumSeqs": 4}', secret=False),
            "spark-vllm:vllmApiKey": cv(value="sk-1", secret=True),
            "spark-vllm:environment": cv(value="dev", secret=False)}
    assert reconcile.config_differences(applied, same) == []
    edited = {**same, "spark-vllm:vllmApiKey": cv(value="sk-2", secret=True),
              "spark-vllm:fabric": cv(value='{"mtu": 1500}', secret=False)}
    del edited["spark-vllm:environment"]
    assert reconcile.config_differences(applied, edited) == [
        "spark-vllm:environment", "spark-vllm:fabric", "spark-vllm:vllmApiKey"]
    plain = {**same, "spark-vllm:vllmApiKey": cv(value="sk-1", secret=False)}
    assert reconcile.config_differences(applied, plain) == ["spark-vllm:vllmApiKey"]


def test_the_project_copy_runs_the_same_program_with_the_stack_file_as_read(tmp_path):
    work = tmp_path / "my checkout"
    work.mkdir()
    (work / "Pulumi.yaml").write_text("name: spark-vllm\nruntime:\n  name: python\n  options:\n"
                                      "    toolchain: pip\n    virtualenv: venv\n")
    (work / "Pulumi.dev.yaml").write_bytes(b"config:\n  spark-vllm:environment: dev\n")
    dest = tmp_path / "copy"
    dest.mkdir()
    data = reconcile.scratch_project(work, "dev", dest)
    import yaml

    doc = yaml.safe_load((dest / "Pulumi.yaml").read_text())
    assert doc["main"] == str(work) and doc["runtime"]["options"]["virtualenv"] == str(
        work / "venv")
    assert (dest / "Pulumi.dev.yaml").read_bytes() == data
    with pytest.raises(reconcile.Usage, match=r"Pulumi\.prod\.yaml does not exist"):
        reconcile.scratch_project(work, "prod", dest)


# --- the line and the metrics ---------------------------------------------------------------


def _promtool() -> str:
    path = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(path, os.X_OK):
        pytest.fail("promtool is missing: make setup (scripts/host_packages.sh) installs "
                    "Debian's prometheus", pytrace=False)
    return path


def _result(**over) -> RunResult:
    values = dict(stack="dev", result="repaired", started=1_765_000_000.0, seconds=23.4,
                  saw={"fabric": ["fabric-spark-2-enP2p1s0f1np1 replace",
                                  "nccl-fabric-spark-1 replace"]},
                  did=["fabric-spark-2-enP2p1s0f1np1 replace", "nccl-fabric-spark-1 replace"],
                  phases={"preview": 12.1, "up": 11.0})
    values.update(over)
    return RunResult(**values)


def test_one_line_per_run():
    line = _result().line()
    assert "\n" not in line
    assert line == (
        "2025-12-06T05:46:40Z reconcile dev: repaired | saw fabric: "
        "fabric-spark-2-enP2p1s0f1np1 replace, nccl-fabric-spark-1 replace | did "
        "fabric-spark-2-enP2p1s0f1np1 replace, nccl-fabric-spark-1 replace | in 23.4 s "
        "(preview 12.1 s, up 11.0 s)")
    refused = _result(result="refused", did=[], unrepaired=["image-spark-1 replace"],
                      why="changes outside ...\nsecond line", phases={"preview": 3.0})
    assert "not repaired: image-spark-1 replace | why changes outside ... second line" in \
        refused.line()
    with pytest.raises(ValueError):
        _result(result="ok")


def test_the_metrics_are_prometheus_text_and_say_the_result(tmp_path):
    text = metrics_text(_result(unrepaired=["image-spark-1 replace"]), 300, 1_765_000_000.0)
    path = tmp_path / "reconcile.prom"
    path.write_text(text)
    done = subprocess.run([_promtool(), "check", "metrics"], input=text, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = text.splitlines()
    assert 'spark_vllm_reconcile_result{result="repaired"} 1' in lines
    assert 'spark_vllm_reconcile_result{result="refused"} 0' in lines
    assert "spark_vllm_reconcile_interval_seconds 300" in lines
    assert 'spark_vllm_reconcile_changes{class="fabric"} 2' in lines
    assert 'spark_vllm_reconcile_changes{class="unrepaired"} 1' in lines
    assert last_repair_of(text) == 1_765_000_000.0
    assert last_repair_of(metrics_text(_result(result="clean", saw={}), 300, None)) is None


def test_the_heads_script_writes_the_file_whole_and_readable(tmp_path):
    """Run for real in a folder of this test (the head's is hostscripts/monitoring
    textfile_dir): the file is there, 0644 for the exporter (which runs as nobody), no
    temporary left."""
    folder = tmp_path / "textfile dir"
    text = metrics_text(_result(), 300, None)
    done = subprocess.run(["bash", "-s"], input=head_script(str(folder), text),
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "written\n", done.stderr
    path = folder / "reconcile.prom"
    assert path.read_text() == text
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in folder.iterdir()] == ["reconcile.prom"]


# --- the loop and the lock ------------------------------------------------------------------


def test_the_loop_runs_every_interval_until_asked_to_stop(monkeypatch, tmp_path):
    """A run, a wait of the interval less the run's own time, a run, ...; SIGTERM
    (`systemctl stop`) ends it after the run in progress. With --once: one run, its code."""
    runs: list[str] = []

    def run(o):
        runs.append(o.stack)
        return _result(result="refused" if len(runs) == 2 else "clean", seconds=10.0)

    waits: list[float] = []
    monkeypatch.setattr(reconcile, "run", run)
    monkeypatch.setattr(reconcile, "wait", lambda s: waits.append(s) or len(waits) == 3)
    lines: list[str] = []
    o = reconcile.Options(stack="dev", every=60, out=lines.append, state_dir=tmp_path)
    assert reconcile.loop(o, once=False, as_json=False) == 0  # the last run's code
    assert len(runs) == 3 and waits == [50.0, 50.0, 50.0]
    assert [ln.split(" | ")[0].split(": ")[-1] for ln in lines] == ["clean", "refused", "clean"]
    runs.clear()
    assert reconcile.loop(o, once=True, as_json=False) == 0 and len(runs) == 1


def test_the_lock_is_held_by_one_run_at_a_time(tmp_path):
    path = tmp_path / "reconcile" / "dev.lock"
    with reconcile.run_lock(path) as first, reconcile.run_lock(path) as second:
        assert first and not second
    with reconcile.run_lock(path) as again:
        assert again


# --- the systemd units ----------------------------------------------------------------------

ENV = {"PULUMI_BACKEND_URL": "file:///home/op/.spark-vllm/state",
       "PULUMI_CONFIG_PASSPHRASE_FILE": "/home/op/.spark-vllm/passphrase",
       "PATH": "/home/op/.cache/spark-vllm/toolchain/bin:/usr/bin:/bin"}


def _units(tmp_path: Path, **over):
    exe = tmp_path / "venv" / "bin" / "spark-vllm"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    values = dict(exe=str(exe), work_dir=str(tmp_path / "my stacks"), every_seconds=300,
                  env=ENV)
    values.update(over)
    return reconcile_timer.render("dev", **values)


def test_the_units_pass_systemd_analyze(tmp_path):
    """systemd's own check of the unit files (systemd-analyze verify: the syntax, the timer's
    unit, the executable); the service runs `reconcile --once` in the stack file's folder with
    the environment it needs and no secret, the timer every interval."""
    units = _units(tmp_path)
    (tmp_path / "my stacks").mkdir()
    d = tmp_path / "units"
    d.mkdir()
    (d / "spark-vllm-reconcile-dev.service").write_text(units.service)
    (d / "spark-vllm-reconcile-dev.timer").write_text(units.timer)
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing (Debian's systemd package)", pytrace=False)
    done = subprocess.run([analyze, "verify", str(d / "spark-vllm-reconcile-dev.timer"),
                           str(d / "spark-vllm-reconcile-dev.service")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'ExecStart="{tmp_path}/venv/bin/spark-vllm" reconcile -s dev --once --every ' \
           "300s" in units.service
    assert f"WorkingDirectory={tmp_path}/my stacks\n" in units.service
    assert 'Environment="PULUMI_CONFIG_PASSPHRASE_FILE=/home/op/.spark-vllm/passphrase"' in \
        units.service
    assert "OnUnitActiveSec=300s" in units.timer and "WantedBy=timers.target" in units.timer
    # the check can fail: a unit with a key systemd does not know
    (d / "spark-vllm-reconcile-dev.timer").write_text(units.timer.replace("[Timer]",
                                                                          "[Timer]\nOnBogus=1"))
    done = subprocess.run([analyze, "verify", str(d / "spark-vllm-reconcile-dev.timer")],
                          capture_output=True, text=True)
    assert "OnBogus" in done.stdout + done.stderr


def test_the_units_refuse_a_passphrase_and_odd_values(tmp_path):
    with pytest.raises(reconcile_timer.InstallError, match="passphrase itself"):
        _units(tmp_path, env={**ENV, "PULUMI_CONFIG_PASSPHRASE": "x"})
    with pytest.raises(reconcile_timer.InstallError, match="not an absolute path"):
        _units(tmp_path, work_dir="/a\nExecStartPre=/bin/rm")
    with pytest.raises(reconcile_timer.InstallError, match="line break"):
        _units(tmp_path, exe="/a\nExecStartPre=/bin/rm")
    with pytest.raises(reconcile_timer.InstallError, match="at least 1m"):
        _units(tmp_path, every_seconds=30)
    with pytest.raises(reconcile_timer.InstallError, match="not a stack name"):
        reconcile_timer.unit_name("dev/../x")
    with pytest.raises(reconcile_timer.InstallError, match="must not hold the passphrase"):
        reconcile_timer.environment("dev", {"PULUMI_BACKEND_URL": "file:///s",
                                            "PULUMI_CONFIG_PASSPHRASE": "secret"})
    env = reconcile_timer.environment("dev", {"PULUMI_BACKEND_URL": "file:///s",
                                              "PULUMI_CONFIG_PASSPHRASE_FILE": "/p",
                                              "HF_TOKEN": "hf_x", "PATH": "/usr/bin"})
    assert {k: v for k, v in env.items() if k != "PATH"} == {
        "PULUMI_BACKEND_URL": "file:///s", "PULUMI_CONFIG_PASSPHRASE_FILE": "/p"}
    assert env["PATH"].endswith("/usr/bin")  # the toolchain's bin before it, when there is one


def test_install_and_uninstall_with_the_users_manager(tmp_path):
    calls: list[list[str]] = []

    def systemctl(argv):
        calls.append(argv)
        return 0, ""

    out: list[str] = []
    d = tmp_path / "systemd" / "user"
    assert reconcile_timer.install("dev", _units(tmp_path), unit_dir=d, run=systemctl,
                                   out=out.append) == 0
    assert calls == [["daemon-reload"], ["enable", "--now", "spark-vllm-reconcile-dev.timer"]]
    for suffix in ("service", "timer"):
        assert stat.S_IMODE((d / f"spark-vllm-reconcile-dev.{suffix}").stat().st_mode) == 0o644
    calls.clear()
    assert reconcile_timer.uninstall("dev", unit_dir=d, run=systemctl, out=out.append) == 0
    assert calls[0] == ["disable", "--now", "spark-vllm-reconcile-dev.timer"]
    assert calls[-1] == ["daemon-reload"] and not list(d.iterdir())
    # no user manager (a container, an ssh session without one): the units stay, it says how
    assert reconcile_timer.install("dev", _units(tmp_path), unit_dir=d,
                                   run=lambda argv: (1, "Failed to connect to bus"),
                                   out=out.append) == 1
    assert "once a user manager runs: systemctl --user daemon-reload" in out[-1]
    assert len(list(d.iterdir())) == 2


def test_the_cli_subcommand(tmp_path, monkeypatch):
    runner = CliRunner()
    result = runner.invoke(cli.main, ["reconcile", "--help"])
    assert result.exit_code == 0 and "--install" in result.output and "--once" in result.output
    result = runner.invoke(cli.main, ["reconcile", "-s", "dev", "--every", "5x"])
    assert result.exit_code == 2 and "expected a duration" in result.output
    result = runner.invoke(cli.main, ["reconcile", "-s", "dev", "--install", "--uninstall"])
    assert result.exit_code == 2 and "not both" in result.output
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli.main, ["reconcile", "-s", "dev", "--install"])
    assert result.exit_code == 2 and "Pulumi.dev.yaml is not in this folder" in result.output
