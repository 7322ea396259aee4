"""Which NCCL runs on each node, in recon, preflight and recon's report (issue 51): the host's
libnccl (recon's `nccl_host` section, payloads/nccl_library.py) and the image probe's records in
the stack's folder (`image_nccl`: the NCCL each image's vLLM loads), and the collective gate's
record on the head (`collective_record`: whether it stopped an up). Inputs are the lab's real
outputs (tests/fixtures/collective/INDEX.md) in the recon frame."""

from __future__ import annotations

import json

import pytest

from inspection import preflight, recon, report
from inspection.facts import ContainerFacts
from tests.unit.inspection.recon_helpers import (
    NAMES,
    NONCE,
    config,
    fixture,
    parse,
    spark_output,
)

IMAGE = "sha256:" + "14638ee059096d69deb74203c6810104f71c1606f8f3201ffde99461b14009cb"
LABEL = "spark-vllm/dev"
PROBE = fixture("collective/image-probe-lab-spark-1.txt").strip()
HOST_NONE = fixture("collective/nccl-host-lab-spark-2.txt")
HOST_SYSTEM = json.dumps({"libraries": [{
    "path": "/lib/aarch64-linux-gnu/libnccl.so.2",
    "realPath": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9", "size": 190000000,
    "build": "c0db9360" + "1" * 32, "version": "2.28.9", "source": "system",
    "package": "libnccl2", "packageVersion": "2.28.9-1+cuda13.0"}]})


def test_recon_reads_the_hosts_nccl_the_probe_records_and_the_gates_record():
    cfg = config()
    head = recon.recon_script(cfg, cfg.nodes[0], NONCE, NAMES)
    worker = recon.recon_script(cfg, cfg.nodes[1], NONCE, NAMES)
    for script in (head, worker):
        assert "\nsv_bg nccl_host 10 python3 -c " in script and script.count(" host\n") >= 1
        assert "\nsv_bg image_nccl 10 bash -c " in script
        assert " _ /var/lib/spark-vllm/stacks/dev/image-probe\n" in script
    assert " _ /var/lib/spark-vllm/stacks/dev/collective-gate.json\n" in head
    assert "collective_record" not in worker


def test_the_sections_parse_into_facts():
    record = f"{IMAGE.removeprefix('sha256:')}\t{PROBE}"
    facts = parse(spark_output(1, nccl_host=HOST_SYSTEM, image_nccl=record,
                               collective_record='{"verdict": "below threshold", '
                                                 '"stopped": true}'))
    assert facts.nccl_host is not None and facts.nccl_host[0].package == "libnccl2"
    found = facts.image_nccl[IMAGE]
    assert found.vllm is not None and found.vllm.package == "nvidia-nccl-cu13"
    assert (facts.collective_record_present, facts.collective_stopped) == (True, True)
    assert parse(spark_output(1, collective_record="absent")).collective_record_present is False
    # none of it surveyed (an older survey): None, nothing made up
    facts = parse(spark_output(1))
    assert facts.nccl_host is None and facts.image_nccl == {}
    assert facts.collective_record_present is None
    # no python3 on the node: a missing tool, not a failure
    facts = parse(spark_output(1, nccl_host=("", 127)))
    assert facts.nccl_host is None and "python3" in facts.missing_tools


@pytest.mark.parametrize(("section", "text"), [
    ("nccl_host", "not json"), ("nccl_host", '{"libraries": 3}'),
    ("image_nccl", "nothex\t{}"), ("image_nccl", "ab" * 32 + "\tnot json"),
    ("collective_record", "{}"), ("collective_record", "a\nb"),
])
def test_unreadable_sections_are_named(section, text):
    assert section in parse(spark_output(1, **{section: text})).unreadable


def _facts(n: int, image_nccl: str | None = None, host: str = HOST_NONE, serving: bool = True):
    sections = {"nccl_host": host}
    if image_nccl is not None:
        sections["image_nccl"] = image_nccl
    f = parse(spark_output(n, **sections), node=f"spark-{n}")
    if serving:
        c = ContainerFacts(id="c" * 64, name="spark-vllm-dev-ray-head", image=IMAGE,
                           state="running", labels={"spark-vllm.stack": LABEL,
                                                    "spark-vllm.role": "ray-head"})
        assert f.docker is not None
        f = f.model_copy(update={"docker": f.docker.model_copy(update={"containers": [c]})})
    return f


def test_preflight_says_which_nccl_runs_and_the_hosts():
    record = f"{IMAGE.removeprefix('sha256:')}\t{PROBE}"
    facts = {"spark-1": _facts(1, record), "spark-2": _facts(2, record, host=HOST_SYSTEM)}
    errors, lines = preflight.check_nccl(facts, LABEL)
    assert errors == []
    assert lines["spark-1"].startswith("vLLM loads NCCL 2.29.7 (pip's nvidia-nccl-cu13, build ")
    assert lines["spark-1"].endswith("; the host's: none (not what the containers load)")
    assert lines["spark-2"].endswith("; the host's: NCCL 2.28.9 (the system's libnccl2, build "
                                     "c0db93601111) (not what the containers load)")
    # not probed yet (a first up): said so, no guess
    errors, lines = preflight.check_nccl({"spark-1": _facts(1, serving=False)}, LABEL)
    assert lines["spark-1"].startswith("not probed yet (the up's image probe reports it)")


def test_preflight_refuses_nodes_whose_same_image_loads_different_builds():
    probe = json.loads(PROBE)
    other = json.loads(PROBE)
    other["nccl"]["vllm"]["build"] = "0" * 40
    facts = {"spark-1": _facts(1, f"{IMAGE[7:]}\t{json.dumps(probe)}"),
             "spark-2": _facts(2, f"{IMAGE[7:]}\t{json.dumps(other)}")}
    errors, _ = preflight.check_nccl(facts, LABEL)
    assert [e.node for e in errors] == ["spark-2"] and errors[0].check == "nccl"
    assert "vLLM here loads NCCL 2.29.7 (pip's nvidia-nccl-cu13, build 000000000000), on " \
           "spark-1 NCCL 2.29.7" in errors[0].fact
    # through check(): the whole preflight fails with it
    cfg = config()
    with pytest.raises(preflight.PreflightError, match="spark-2: vLLM here loads NCCL"):
        preflight.check(cfg, facts, stack_label=LABEL)


def test_recons_report_shows_the_nccl_of_every_node():
    record = f"{IMAGE.removeprefix('sha256:')}\t{PROBE}"
    facts = {"spark-1": _facts(1, record), "spark-2": _facts(2, record, host=HOST_SYSTEM)}
    table = report.render_table(facts, stack_label=LABEL)
    vllm_row = next(ln for ln in table.splitlines() if "nccl (vLLM)" in ln)
    assert not vllm_row.startswith("!")  # the same build on both
    assert vllm_row.split()[2:6] == ["2.29.7", "pip", "nvidia-nccl-cu13", vllm_row.split()[5]]
    host_row = next(ln for ln in table.splitlines() if "nccl (host)" in ln)
    assert host_row.startswith("!") and "2.28.9 system libnccl2 c0db9360" in host_row
    summary = report.summary(facts, stack_label=LABEL)
    assert summary["nodes"]["spark-2"]["nccl"]["vllm"]["package"] == "nvidia-nccl-cu13"
    assert summary["nodes"]["spark-2"]["nccl"]["host"][0]["package"] == "libnccl2"


def test_the_serving_image_is_what_docker_ps_reports_or_a_tag_found_among_the_images():
    """The stack creates its containers by image ID, which `docker ps` reports as their Image
    (tests/fixtures/status); a container created from a tag is found through the node's images."""
    from inspection.facts import ImageFacts

    f = _facts(1)
    assert preflight.serving_image(f, LABEL) == IMAGE
    assert preflight.serving_image(f, "spark-vllm/other") is None
    assert f.docker is not None
    tagged = f.docker.containers[0].model_copy(update={"image": "registry:5000/vllm:lab"})
    docker = f.docker.model_copy(update={"containers": [tagged], "images": [
        ImageFacts(id=IMAGE, repo_tags=["registry:5000/vllm:lab"])]})
    assert preflight.serving_image(f.model_copy(update={"docker": docker}), LABEL) == IMAGE
    docker = docker.model_copy(update={"images": []})
    assert preflight.serving_image(f.model_copy(update={"docker": docker}), LABEL) is None
