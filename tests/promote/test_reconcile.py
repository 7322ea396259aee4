"""tools/reconcile.py against a stack on a file backend (the fake program: reconcile_fake.py),
through the real engine and CLI: the run compares the stack file with the config of the last
successful update, previews with a refresh and a policy pack, repairs drift in its classes with
an `up`, reports the rest without applying it, and records each run (line, metrics).

Needs the `pulumi` CLI and the dynamic provider's binary (make setup), like tests/promote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.promote.conftest import ROOT, _need_engine
from tests.promote.fakestack import Project, dev_config
from tests.promote.reconcile_fake import FABRIC, GUARD, MODEL, program_for, write_pack
from tools import reconcile
from tools.reconcile_report import RunResult

STACK = "rec"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    _need_engine()
    return Project(tmp_path_factory.mktemp("reconcile"), ROOT, sys.executable)


@pytest.fixture(scope="module")
def deployed(project):
    """The `rec` stack: the lab's dev config, one successful `up` of the fake program."""
    import pulumi.automation as auto

    project.write_config(STACK, dev_config(ROOT))
    folder = project.dir / "files"
    folder.mkdir()
    program = program_for(folder)
    stack = auto.create_or_select_stack(
        stack_name=STACK, project_name="spark-vllm", program=program,
        opts=auto.LocalWorkspaceOptions(work_dir=str(project.dir), env_vars=project.env))
    assert stack.up().summary.result == "succeeded"
    return stack, folder, program


class Delivered(list):
    """A FAKE head: what the run would have written into the head exporter's folder."""

    def __call__(self, cfg, r: RunResult, text: str) -> str | None:
        self.append((cfg.head.name, r.result, text))
        return None


def _options(project, program, tmp_path, **over) -> reconcile.Options:
    lines: list[str] = []
    o = reconcile.Options(stack=STACK, work_dir=project.dir, every=60, env=dict(project.env),
                          program=program, state_dir=tmp_path / "state", out=lines.append,
                          deliver=Delivered())
    for k, v in over.items():
        setattr(o, k, v)
    return o


def _content(folder: Path, name: str) -> str:
    return (folder / f"{name}.txt").read_text()


def test_a_stack_as_applied_is_clean_and_its_metrics_reach_the_head(project, deployed,
                                                                     tmp_path):
    _, _, program = deployed
    o = _options(project, program, tmp_path)
    r = reconcile.run(o)
    print(r.line())
    assert r.result == "clean", r.line()
    assert r.saw == {} and r.unrepaired == [] and r.did == [] and "preview" in r.phases
    # the metrics: on the control machine and (monitoring on in the dev config) the head's
    local = (tmp_path / "state" / "reconcile" / f"{STACK}.prom").read_text()
    assert 'spark_vllm_reconcile_result{result="clean"} 1' in local
    ((head, result, text),) = o.deliver
    assert (head, result, text) == ("spark-1", "clean", local)
    assert " reconcile rec: clean | saw no change | in " in r.line()


def test_drift_in_its_classes_is_repaired_by_an_up(project, deployed, tmp_path):
    """The fabric interface's file edited and the guard's removed behind the stack: the
    preview's refresh sees both (an update, a create), both are in a repair class, the `up`
    writes them back; the model check, in no class, was not touched."""
    _, folder, program = deployed
    (folder / f"{FABRIC}.txt").write_text("address flushed; mtu 1500")
    (folder / f"{GUARD}.txt").unlink()
    r = reconcile.run(_options(project, program, tmp_path))
    print(r.line())
    assert r.result == "repaired", r.line()
    assert r.saw == {"fabric": [f"{FABRIC} update"], "guard": [f"{GUARD} create"]}
    assert sorted(r.did) == sorted([f"{FABRIC} update", f"{GUARD} create"]) and not r.notes
    assert _content(folder, FABRIC) == f"declared {FABRIC}"
    assert _content(folder, GUARD) == f"declared {GUARD}"
    assert set(r.phases) == {"preview", "up"}
    local = (tmp_path / "state" / "reconcile" / f"{STACK}.prom").read_text()
    assert 'spark_vllm_reconcile_result{result="repaired"} 1' in local
    assert 'spark_vllm_reconcile_changes{class="fabric"} 1' in local
    assert "spark_vllm_reconcile_last_repair_timestamp_seconds" in local
    # and the next run finds nothing
    assert reconcile.run(_options(project, program, tmp_path)).result == "clean"


def test_drift_outside_its_classes_is_reported_not_applied(project, deployed, tmp_path):
    """The model check's file edited and the fabric's too: the model's repair is in no class,
    so nothing is applied (not even the fabric's) and the run names both."""
    _, folder, program = deployed
    (folder / f"{MODEL}.txt").write_text("one byte changed")
    (folder / f"{FABRIC}.txt").write_text("mtu 1500")
    try:
        r = reconcile.run(_options(project, program, tmp_path))
        print(r.line())
        assert r.result == "refused", r.line()
        assert r.unrepaired == [f"{MODEL} update"] and r.saw == {"fabric": [f"{FABRIC} update"]}
        assert "changes outside the classes the stack repairs by itself" in r.why
        assert r.did == [] and "up" not in r.phases
        assert _content(folder, MODEL) == "one byte changed"
        assert _content(folder, FABRIC) == "mtu 1500"
        assert reconcile.EXIT[r.result] == reconcile.EXIT_REFUSED
        line = r.line()
        assert f"not repaired: {MODEL} update" in line and "fabric: " in line
    finally:
        for name in (MODEL, FABRIC):
            (folder / f"{name}.txt").write_text(f"declared {name}")


def test_an_edited_stack_file_is_refused_before_any_preview(project, deployed, tmp_path):
    """vllm.maxNumSeqs edited in Pulumi.rec.yaml and not `up`-ed: refused naming the key (never
    its value), nothing previewed or applied; the file put back, the run is clean again."""
    _, folder, program = deployed
    path = project.file(STACK)
    before = path.read_text()
    (folder / f"{FABRIC}.txt").write_text("drifted")
    project.write_config(STACK, dev_config(ROOT, vllm={"maxNumSeqs": 7}))
    try:
        r = reconcile.run(_options(project, program, tmp_path))
        print(r.line())
        assert r.result == "refused", r.line()
        assert "Pulumi.rec.yaml differs from the config of the last successful update" in r.why
        assert "spark-vllm:vllm" in r.why and "maxNumSeqs" not in r.why
        assert r.phases == {} and r.saw == {}  # not even previewed
        assert _content(folder, FABRIC) == "drifted"  # not repaired either
        assert _content(folder, "serve") != json.dumps({"maxNumSeqs": 7})
    finally:
        path.write_text(before)
    r = reconcile.run(_options(project, program, tmp_path))
    assert r.result == "repaired" and r.saw == {"fabric": [f"{FABRIC} update"]}, r.line()


def test_a_second_run_while_one_holds_the_lock_is_skipped(project, deployed, tmp_path):
    _, _, program = deployed
    o = _options(project, program, tmp_path)
    with reconcile.run_lock(reconcile.lock_path(o)) as held:
        assert held
        r = reconcile.run(o)
    assert r.result == "skipped" and "another reconcile of rec runs" in r.why
    assert reconcile.EXIT[r.result] == 0
    assert reconcile.run(o).result == "clean"  # the lock released


def test_a_policy_violation_is_reported_not_applied(project, deployed, tmp_path):
    _, folder, program = deployed
    policies_venv = ROOT / "policies" / "venv"
    assert (policies_venv / "bin" / "python").exists(), "make venv builds policies/venv"
    pack = write_pack(tmp_path / "pack", policies_venv)
    (folder / f"{FABRIC}.txt").write_text("drifted")
    try:
        r = reconcile.run(_options(project, program, tmp_path, policy_pack=pack,
                                   env={**project.env, "RECONCILE_TEST_VIOLATION": "1"}))
        print(r.line())
        assert r.result == "refused", r.line()
        assert r.why.startswith("policy violation: reconcile-test-violation")
        assert _content(folder, FABRIC) == "drifted"
    finally:
        (folder / f"{FABRIC}.txt").write_text(f"declared {FABRIC}")


def test_a_preview_that_fails_is_a_failed_run(project, deployed, tmp_path):
    _, folder, program = deployed
    (folder / "FAIL").write_text("x")
    try:
        r = reconcile.run(_options(project, program, tmp_path))
    finally:
        (folder / "FAIL").unlink()
    print(r.line())
    assert r.result == "failed" and r.why.startswith("the preview failed: "), r.line()
    assert "fails on purpose" in r.why
    assert reconcile.EXIT[r.result] == reconcile.EXIT_FAILED
