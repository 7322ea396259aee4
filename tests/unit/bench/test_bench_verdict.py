"""The benchmark's verdicts against the design's change table (bench/bench.py), without a lab:
a verdict that could not fail would make docs/benchmarks.md's "within" column worthless."""

from __future__ import annotations

import pytest

from bench.bench import paper, verdict

CLEAN = {"ray_restarted": [], "vllm_restarted": False, "hub_bytes": 0, "new_image_ids": 0}


def cost(**kw):
    return {**CLEAN, **kw}


def test_nothing_is_within_only_when_nothing_happened():
    assert verdict("nothing", {}, cost(), {}) == []
    assert verdict("nothing", {"vllm-serve": "update"}, cost(), {}) == ["something ran or restarted"]
    assert verdict("nothing", {}, cost(vllm_restarted=True), {}) == ["something ran or restarted"]
    assert verdict("nothing", {}, cost(hub_bytes=1), {}) == ["bytes were pulled"]


def test_vllm_flag_may_restart_vllm_but_not_workers_image_or_model():
    ok = verdict("vLLM serve flag", {"vllm-serve": "update"}, cost(vllm_restarted=True), {})
    assert ok == []
    bad = verdict("vLLM serve flag", {"image-spark-2": "update", "model-sync-spark-2": "update"},
                  cost(ray_restarted=["spark-2/spark-vllm-dev-ray-worker"]), {})
    assert bad == ["image pull", "model transfer", "worker replaced"]


def test_nccl_env_may_restart_ray_but_not_pull():
    c = cost(ray_restarted=["spark-1/spark-vllm-dev-ray-head", "spark-2/spark-vllm-dev-ray-worker"],
             vllm_restarted=True)
    assert verdict("NCCL env", {"ray-head": "replace"}, c, {}) == []
    assert verdict("NCCL env", {}, cost(new_image_ids=1), {}) == ["image pull"]


def test_model_revision_may_move_only_the_changed_bytes_and_never_restart_ray():
    assert verdict("model revision", {"model-fetch": "update"}, cost(hub_bytes=500),
                   {"changed_bytes": 500}) == []
    bad = verdict("model revision", {}, cost(hub_bytes=501, ray_restarted=["x/spark-vllm-dev-ray-head"]),
                  {"changed_bytes": 500})
    assert bad == ["Ray restart", "hub moved more than changed"]


def test_image_and_add_node_must_not_move_the_model_from_the_hub():
    assert verdict("image", {"image-spark-1": "update"}, cost(new_image_ids=2), {"sync_bytes_moved": 0}) == []
    assert verdict("image", {}, cost(), {"sync_bytes_moved": 10}) == ["model bytes moved"]
    assert verdict("add a node", {}, cost(hub_bytes=1), {}) == ["re-download from the hub"]


@pytest.mark.parametrize("row,takes", [
    ("hub download on a 1 Gb/s uplink", "15.9 min"),        # 119e9 B * 8 / 1e9 b/s = 952 s
    ("one CX-7 twin, RDMA", "9 s"),                          # 119e9 * 8 / 111.7e9 = 8.5 s
    ("loading into vLLM", "2.1 min"),                        # 3 s x 42 shards = 126 s
])
def test_paper_numbers(row, takes):
    line = next(ln for ln in paper().splitlines() if row in ln)
    assert f"| {takes} |" in line, line


def _result(no_op_ratio=2.0, violations=()):
    row = {"ops": {}, "ray_restarted": [], "vllm_restarted": False, "new_image_ids": 0,
           "hub_bytes": 0, "fabric_rx_bytes": 10, "mgmt_rx_bytes": 20, "wall_s": 1.0,
           "violations": list(violations)}
    changes = [{**row, "change": c} for c in
               ("nothing", "vLLM serve flag", "NCCL env", "model revision", "image", "add a node")]
    changes[3].update(changed_bytes=668, model_bytes=536184)
    changes[4].update(sync_bytes_moved=0)
    return {
        "started": "2026-11-30 06:37 UTC", "duration_min": 10.0, "model_bytes": 536184,
        "env": {"cpus": 2, "mem_gib": 23.5, "kernel": "6.x", "pulumi": "v3.274.1"},
        "noop": {"ratio": no_op_ratio, "stack_median_s": 2.0 * no_op_ratio, "empty_median_s": 2.0,
                 "reps": 3, "empty_s": [2.0], "stack_s": [4.0], "recon_median_s": 1.0,
                 "hub_median_s": 0.1, "ssh_per_node": {"spark-1": [1], "spark-2": [1]}},
        "idle_fabric_bps": 14000,
        "changes": changes,
        "fanout": {"size_bytes": 2 << 30, "reps": 3, "product_s": [4.0], "raw_s": [3.0],
                   "fixed_s": [1.0], "product_gbit": 4.3, "raw_gbit": 5.7,
                   "ratio": 0.75},
        "scaling": [{"nodes": 2, "wall_s": 80.0, "steps": 23, "hub_bytes": 536184, "serves": True,
                     "destroy_s": 6.0, "keep_images": False,
                     "per_node_spans": {"image-spark-1": [0, 30], "image-spark-2": [0, 31]}},
                    {"nodes": 3, "wall_s": 88.0, "steps": 29, "hub_bytes": 536184, "serves": True,
                     "destroy_s": 6.0, "keep_images": False},
                    {"nodes": 2, "wall_s": 40.0, "steps": 23, "hub_bytes": 536184, "serves": True,
                     "destroy_s": 6.0, "keep_images": True},
                    {"nodes": 3, "wall_s": 60.0, "steps": 29, "hub_bytes": 536184, "serves": True,
                     "destroy_s": 6.0, "keep_images": True}],
    }


def test_report_states_every_goal_and_marks_misses(tmp_path):
    from bench.bench import report

    out = tmp_path / "b.md"
    report(_result(), out)
    text = out.read_text()
    goals = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.endswith(("| met |", "| **missed** |"))]
    assert len(goals) == 6 and all(ln.endswith("| met |") for ln in goals[:5]), goals
    assert "| 3-node converge at most 1.3x the 2-node, from empty | 1.1x (88.0 s vs 80.0 s) | met |" in text
    assert "| the same, with the image already on every node | 1.5x (60.0 s vs 40.0 s) | **missed** |" in text
    assert "image-spark-1 0-30, image-spark-2 0-31" in text
    report(_result(no_op_ratio=3.5, violations=["image pull"]), out)
    text = out.read_text()
    assert ("| no-op preview at most 2.0x an empty program's (run alike: the Python language "
            "host) | 3.5x") in text
    assert text.count("**missed**") == 3 and "| image pull |" in text


def test_report_names_both_baselines_and_the_run_that_measured_kept_sections(tmp_path):
    from bench.bench import report

    res = _result()
    res["noop"].update(empty_inline_median_s=0.5, empty_inline_s=[0.5], ratio_inline=8.0)
    res["kept"] = {"sections": ["scaling"], "started": "2026-11-29 10:00 UTC", "duration_min": 20}
    out = tmp_path / "b.md"
    report(res, out)
    text = out.read_text()
    assert "4.0 s vs 2.0 s; 8.0x an inline empty program's) | met |" in text
    assert "| empty program, inline | 0.5 s | 0.5 |" in text
    assert "Kept from the run of 2026-11-29 10:00 UTC (this one did not re-run them): scaling." in text


def test_service_rows_forbid_any_step_of_the_main_model():
    added = {"svc-embed-serve-spark-1": "create", "svc-embed-model-fetch": "create", "vllm": "update"}
    assert verdict("add a service", added, cost(hub_bytes=900), {}) == []
    assert verdict("add a service", {**added, "vllm-serve": "replace"}, cost(vllm_restarted=True),
                   {}) == ["main model touched"]
    flag = {"svc-embed-serve-spark-1": "replace", "svc-embed-health-spark-1": "replace"}
    assert verdict("service flag", flag, cost(), {}) == []
    assert verdict("service flag", {**flag, "svc-embed-model-verify-spark-1": "update"}, cost(),
                   {}) == ["service files moved"]
    assert verdict("service flag", flag, cost(ray_restarted=["spark-2/ray-worker"]), {}) == \
        ["main model touched"]
    rev = {**flag, "svc-embed-model-fetch": "update"}
    assert verdict("service revision", rev, cost(hub_bytes=360), {"changed_bytes": 360}) == []
    assert verdict("service revision", rev, cost(hub_bytes=361), {"changed_bytes": 360}) == \
        ["hub moved more than changed"]
    assert verdict("remove a service", {"svc-embed-serve-spark-1": "delete", "vllm": "update"},
                   cost(), {}) == []
    # the gateway's routing changes with the set of services (reloaded, never replaced)
    routing = {"gateway": "update", "gateway-config": "update", "gateway-health": "update"}
    assert verdict("add a service", {**added, **routing}, cost(hub_bytes=900), {}) == []
    assert verdict("remove a service", {"svc-embed-serve-spark-1": "delete", **routing}, cost(),
                   {}) == []
    assert verdict("add a service", {**added, "gateway-haproxy": "replace"}, cost(hub_bytes=9),
                   {}) == ["main model touched"]
    assert verdict("remove a service", {"model-verify-spark-2": "update"}, cost(hub_bytes=1),
                   {}) == ["main model touched", "bytes were pulled"]


def test_a_fabric_address_change_may_restart_ray_and_vllm_but_moves_no_bytes():
    """Issue 33's row: the worker's twin moves address; its fabric command updates, the Ray
    and vLLM containers follow; an image pull or a model transfer would be a violation."""
    ops = {"fabric-spark-2-enP2p1s0f1np1": "update", "nccl-fabric-spark-1": "replace",
           "ray-worker-spark-2": "replace", "vllm-serve": "replace"}
    restarted = cost(ray_restarted=["spark-2/ray-worker"], vllm_restarted=True)
    assert verdict("fabric address", ops, restarted, {}) == []
    assert verdict("fabric address", {**ops, "image-spark-2": "update"}, restarted, {}) == \
        ["image pull"]
    assert verdict("fabric address", {**ops, "model-sync-spark-2": "update"}, restarted, {}) == \
        ["model transfer"]


def test_every_row_of_the_change_table_has_its_allowed_text_and_its_limits():
    """The report prints ALLOWED[change] for every measured row: a row without it would end a
    one-hour `make bench` with a KeyError (the fabric row had none)."""
    from bench.bench import ALLOWED, MUST_NOT
    assert set(ALLOWED) == set(MUST_NOT)


def test_monitoring_may_reload_its_configuration_never_replace_prometheus_or_an_exporter():
    reload = {"monitoring": "update", "monitoring-config": "update",
              "monitoring-health": "update"}
    assert verdict("monitoring scrape interval", reload, cost(), {}) == []
    assert verdict("monitoring scrape interval",
                   {**reload, "monitoring-prometheus": "replace",
                    "monitoring-node-exporter-spark-2": "replace"}, cost(), {}) == [
        "monitoring touched beyond its configuration"]
    assert verdict("monitoring scrape interval", {**reload, "vllm-serve": "replace"},
                   cost(vllm_restarted=True), {}) == ["main model touched"]
    # a service added: its own steps, the gateway's routing, its Prometheus targets and its
    # inhibition in Alertmanager's configuration (issue 50: a reload)
    added = {"svc-embed-serve-spark-1": "create", "gateway-config": "update",
             "gateway-health": "update", "monitoring-alertmanager-config": "update", **reload}
    assert verdict("add a service", added, cost(), {}) == []
    assert verdict("add a service", {**added, "monitoring-alertmanager": "replace"}, cost(),
                   {}) == ["monitoring touched beyond its configuration"]
    assert verdict("add a service", {**added, "monitoring-prometheus": "replace"}, cost(),
                   {}) == ["monitoring touched beyond its configuration"]


def _gateway_runs(gw_p50: float, gw_rps: float):
    from bench.gateway import Run

    runs = []
    for rep in range(3):
        runs.append(Run("direct", "plain", 16, 700 * 10, 10.0, 21.5 + rep * 0.01, 26.0, 0))
        runs.append(Run("gateway", "plain", 16, int(gw_rps * 10), 10.0, gw_p50 + rep * 0.01,
                        27.0, 0))
        runs.append(Run("gateway-tls", "plain", 16, int(gw_rps * 10), 10.0, gw_p50, 27.5, 1))
    return runs


def test_gateway_figures_are_medians_against_direct_and_the_goal_is_judged_per_row():
    from bench.gateway import summarize, table

    res = summarize(_gateway_runs(gw_p50=21.7, gw_rps=693), seconds=10, reps=3, delay_ms=20)
    plain, tls = res["rows"]
    assert (plain["target"], plain["p50_added_ms"], plain["p99_added_ms"]) == ("gateway", 0.2, 1.0)
    assert plain["throughput_ratio"] == 0.99 and plain["meets_goal"]
    assert tls["errors"] == 3 and not tls["meets_goal"]  # an error misses the goal whatever else
    res = summarize(_gateway_runs(gw_p50=22.0, gw_rps=693), seconds=10, reps=3, delay_ms=20)
    assert res["rows"][0]["p50_added_ms"] == 0.5 and not res["rows"][0]["meets_goal"]
    text = table(res)
    assert "| 16 | plain | plain | 700 | 693 | 0.990 | 21.51 ms | +0.500 ms | +1.000 ms | 0 | NOT met |" in text


def test_report_has_the_gateway_goal_and_section_when_measured(tmp_path):
    from bench.bench import report
    from bench.gateway import summarize

    res = _result()
    res["gateway"] = summarize(_gateway_runs(gw_p50=21.7, gw_rps=693), seconds=10, reps=3,
                               delay_ms=20)
    out = tmp_path / "b.md"
    report(res, out)
    text = out.read_text()
    assert ("worst p50 added +0.200 ms, worst throughput 0.990 of direct | **missed** |") in text
    assert "## 5. The gateway's own cost" in text and "## 6. On paper" in text
    report(_result(), out)  # a run without the section: no row, no section
    assert "gateway's own cost" not in out.read_text()
