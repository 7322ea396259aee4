"""The recon summary (stack output) and the side-by-side table."""

from __future__ import annotations

import json

import pytest

from config import ConfigError
from inspection import recon, report
from inspection.preflight import Plan
from tests.unit.inspection.recon_helpers import (
    NONCE,
    assemble,
    config,
    spark_output,
    spark_sections,
)


def two_nodes(**override_2):
    return {"spark-1": recon.parse_recon_output("spark-1", spark_output(1, seed=True), nonce=NONCE),
            "spark-2": recon.parse_recon_output("spark-2", assemble(spark_sections(2, **override_2)), nonce=NONCE)}


def test_summary_is_json_and_has_the_facts():
    facts = two_nodes()
    plan = Plan(stop_containers={"spark-1": facts["spark-1"].foreign_containers()})
    out = json.loads(json.dumps(report.summary(facts, plan)))
    head = out["nodes"]["spark-1"]
    assert head["gpus"][0] == {"name": "NVIDIA GB10", "computeCapability": "12.1",
                               "driver": "580.159.03", "cuda": "13.0",
                               "uuid": "GPU-b0ec33a0-2589-53de-953c-0713d37d0794"}
    assert head["unifiedMemory"] is True and head["memTotalBytes"] == 125513720 * 1024
    assert {c["name"] for c in head["docker"]["containers"] if not c["managed"]} >= {
        "vllm_node", "reranker", "vllm_embeddings"}
    assert [i["name"] for i in head["interfaces"]][:2] == ["enP7s7", "enp1s0f0np0"]
    assert [c["name"] for c in out["plan"]["stopContainers"]["spark-1"]] == [
        "vllm_node", "reranker", "vllm_embeddings"]


def test_summary_of_an_unreachable_node():
    cfg = config()
    err = recon.classify_ssh_failure(cfg.nodes[1], 255, "root@10.77.0.12: Permission denied (publickey).")
    out = report.summary({"spark-2": err})
    assert out["nodes"]["spark-2"]["kind"] == "auth" and out["nodes"]["spark-2"]["fix"]


def test_table_has_one_column_per_node_and_no_marks_when_equal():
    table = report.render_table(two_nodes())
    header = table.splitlines()[0]
    assert "spark-1" in header and "spark-2" in header
    assert "NVIDIA GB10" in table and "vllm_node 68.2 GiB" in table
    assert not any(line.startswith("!") for line in table.splitlines())
    assert "\033[" not in table


def test_table_marks_mismatches_and_colours_them_on_a_tty():
    table_text = spark_sections(1)["nvidia_smi"].replace("580.159.03", "580.95.05")
    query = spark_sections(1)["nvidia_smi_query"].replace("580.159.03", "580.95.05")
    facts = two_nodes(nvidia_smi=table_text, nvidia_smi_query=query)
    plain = report.render_table(facts)
    marked = [line for line in plain.splitlines() if line.startswith("! ")]
    assert len(marked) == 1 and "driver" in marked[0] and "580.95.05" in marked[0]
    assert "rows marked ! differ between nodes: 1" in plain
    # per-node values (IPs, available memory) differ but are not marked
    assert not any("ipv4" in line for line in marked)
    coloured = report.render_table(facts, color=True)
    assert "\033[31m" in coloured


def test_table_shows_why_a_node_was_not_surveyed():
    cfg = config()
    facts = two_nodes()
    facts["spark-2"] = recon.classify_ssh_failure(
        cfg.nodes[1], 255, "ssh: connect to host 10.77.0.12 port 22: Connection refused")
    table = report.render_table(facts)
    assert "NOT SURVEYED (unreachable)" in table
    assert table.rstrip().splitlines()[-1].startswith("spark-2: unreachable")


def test_recon_report_loads_the_stack_file(tmp_path):
    import yaml

    from tests.unit.inspection.recon_helpers import raw_config
    from tools import recon_report as module

    raw = raw_config()
    doc = {"config": {f"spark-vllm:{k}": v for k, v in raw.items()}}
    doc["config"]["spark-vllm:sshPrivateKey"] = {"secure": "v1:abc"}
    (tmp_path / "Pulumi.t.yaml").write_text(yaml.safe_dump(doc))
    cfg = module.load_stack_config("t", tmp_path)
    assert [n.name for n in cfg.nodes] == ["spark-1", "spark-2"]
    assert module.main(["--stack", "does-not-exist"]) == 2
    # a list or mapping the CLI stored as a JSON string is read as the program reads it
    # (Config.get_object), as the Automation API's set_config writes `services`
    doc["config"]["spark-vllm:nodes"] = json.dumps(raw["nodes"])
    (tmp_path / "Pulumi.t.yaml").write_text(yaml.safe_dump(doc))
    assert module.load_stack_config("t", tmp_path).nodes == cfg.nodes
    doc["config"]["spark-vllm:nodes"] = "[not json"
    (tmp_path / "Pulumi.t.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="spark-vllm:nodes"):
        module.load_stack_config("t", tmp_path)


def test_last_up_shows_fabric_image_and_transport_side_by_side():
    outputs = {
        "fabricCheck": {
            "spark-1": ["ok spark-1 enp1s0f1np1 -> spark-2 192.168.177.12 at MTU 9000",
                        "ok spark-1 enP2p1s0f1np1 -> spark-2 192.168.178.12 at MTU 9000"],
            "spark-2": ["ok spark-2 enp1s0f1np1 -> spark-1 192.168.177.11 at MTU 9000"]},
        "imageProbe": {"spark-1": "python 3.12.3, ray 2.60.0", "spark-2": "python 3.12.3"},
        "ncclTransport": {"spark-1": "192.168.177.11: IB gdr=off"},
    }
    text = report.render_last_up(["spark-1", "spark-2"], outputs)
    lines = text.splitlines()
    assert lines[0].split() == ["last", "up", "spark-1", "spark-2"]
    assert "2 pairs ok at MTU 9000" in lines[2] and "1 pairs ok at MTU 9000" in lines[2]
    assert lines[3].split()[0] == "image"
    assert "python 3.12.3, ray 2.60.0" in lines[3]
    assert "192.168.177.11: IB gdr=off" in lines[4] and lines[4].rstrip().endswith("-")
    # a stack never brought up (or outputs of another shape) shows dashes, no traceback
    empty = report.render_last_up(["spark-1"], {"fabricCheck": "x", "imageProbe": None})
    assert [ln.split()[-1] for ln in empty.splitlines()[2:5]] == ["-", "-", "-"]
    # the transport of a stack where NCCL logged nothing applies to every node
    unknown = report.render_last_up(["a", "b"], {"ncclTransport": {"all": "unknown: none"}})
    assert unknown.splitlines()[4].count("unknown: none") == 2
