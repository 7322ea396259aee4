"""`spark-vllm recon` (tools/recon_report.py), which `spark-vllm init` ends with: preflight with
the inputs `pulumi preview` gives it. Before: it ran without the stack's label and without the
model's size, so init said "preflight passed" for a stack whose first preview then refused four
collisions with another stack on the same nodes, and it never said what it had not checked."""

from __future__ import annotations

import hashlib

import pytest
import yaml

from inspection import hub, recon
from tests.unit.inspection.recon_helpers import assemble, raw_config, spark_output, spark_sections
from tests.unit.inspection.test_preflight import facts_of
from tools import recon_report


def _other_gateway() -> str:
    """A `docker ps` line: the gateway of the stack spark-vllm/other on the head's port 8080."""
    labels = ("spark-vllm.managed=true,spark-vllm.stack=spark-vllm/other,"
              "spark-vllm.role=gateway,spark-vllm.port=8080")
    ident = hashlib.sha256(b"gw").hexdigest()
    return (f'{{"ID":"{ident}","Names":"spark-vllm-other-gateway","Image":"x",'
            f'"State":"running","Labels":"{labels}"}}')


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with Pulumi.yaml and Pulumi.t.yaml; recon answers with `facts`."""
    (tmp_path / "Pulumi.yaml").write_text("name: spark-vllm\nruntime: python\n")
    doc = {"config": {f"spark-vllm:{k}": v for k, v in raw_config().items()}}
    (tmp_path / "Pulumi.t.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(recon_report, "pin_host_keys", lambda cfg: cfg)
    answers: dict = {"facts": facts_of(spark_output(1), spark_output(2))}
    monkeypatch.setattr(recon, "survey_all", lambda cfg, **kw: answers["facts"])
    return answers


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = recon_report.main(["-s", "t", "--no-last-up", "--color", "never", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_another_stacks_gateway_on_the_port_is_refused_as_the_preview_refuses_it(project, capsys):
    project["facts"] = facts_of(assemble(spark_sections(1, docker_ps=_other_gateway())),
                                spark_output(2))
    rc, out, err = run(capsys)
    assert rc == 1
    assert ("port 8080 is taken by spark-vllm-other-gateway of the stack spark-vllm/other; "
            "this stack listens there (spark-vllm:gateway.port)") in err
    assert "preflight passed" not in out


def test_every_check_ran_says_so(project, capsys, fixed_model):
    rc, out, _ = run(capsys)
    assert rc == 0, out
    assert "preflight passed (every check `pulumi preview` runs)" in out
    assert "skipped" not in out
    assert [c[0] for c in fixed_model] == ["Qwen/Qwen3.5-122B-A10B-FP8"]  # the hub was asked


def test_what_could_not_be_checked_is_named(project, capsys, monkeypatch):
    def unreachable(repo, revision, endpoint, token):
        raise hub.ModelResolutionError(f"cannot resolve {repo}@{revision}: no network")

    monkeypatch.setattr(hub, "resolve_model", unreachable)
    rc, out, _ = run(capsys)
    assert rc == 0
    assert "preflight passed\n" in out
    assert ("skipped: the memory fit and the disk (cannot resolve "
            "Qwen/Qwen3.5-122B-A10B-FP8@main: no network)") in out
    rc, out, _ = run(capsys, "--no-hub")
    assert "skipped: the memory fit and the disk (--no-hub)" in out


def test_a_project_folder_without_a_name_is_a_usage_error(project, capsys, tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("runtime: python\n")
    rc, _, err = run(capsys)
    assert rc == 2
    assert "Pulumi.yaml: no project name" in err
