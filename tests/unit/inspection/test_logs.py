"""`spark-vllm logs`, the pure part (inspection/logs.py): which containers a stack's logs come
from, the node script's frames read back, and the merge in time order."""

from __future__ import annotations

from typing import Any

import pytest

from config import StackConfig, validate_config
from hostscripts.paths import StackNames
from inspection import logs
from tests.conftest import config_raw

NAMES = StackNames("dev")
SERVE, RAY_HEAD, RAY_WORKER, GATEWAY = NAMES.serve, NAMES.ray_head, NAMES.ray_worker, NAMES.gateway
EMBED = {"name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8100,
         "gpuMemoryUtilization": 0.05}
RERANK = {"name": "rerank", "repo": "Qwen/Qwen3-Reranker-0.6B", "task": "score", "port": 8101,
          "nodes": ["spark-2"], "gpuMemoryUtilization": 0.05, "servedModelName": "reranker"}


def stack(executor: str = "ray", services: tuple[dict[str, Any], ...] = ()) -> StackConfig:
    raw = config_raw(2)
    raw["vllm"] = {**raw["vllm"], "executor": executor}
    return validate_config({**raw, "services": list(services)})


def T(node: str, container: str) -> logs.Target:
    return logs.Target(node, container)

# --- selection ------------------------------------------------------------------------------


def test_ray_executor_reads_serve_and_ray_and_the_gateway_without_a_model():
    cfg = stack("ray", (EMBED, RERANK))
    assert logs.select_targets(cfg, NAMES) == [
        T("spark-1", SERVE), T("spark-1", RAY_HEAD), T("spark-1", NAMES.service("embed")),
        T("spark-1", GATEWAY), T("spark-2", RAY_WORKER), T("spark-2", NAMES.service("rerank"))]


def test_main_model_with_ray_is_its_serve_container_and_the_ray_containers():
    cfg = stack("ray", (EMBED,))
    assert logs.select_targets(cfg, NAMES, "tiny-moe") == [
        T("spark-1", SERVE), T("spark-1", RAY_HEAD), T("spark-2", RAY_WORKER)]


def test_main_model_with_mp_is_a_serve_container_on_every_node_and_no_ray():
    cfg = stack("mp")
    assert logs.select_targets(cfg, NAMES, "tiny-moe") == [T("spark-1", SERVE), T("spark-2", SERVE)]
    assert logs.select_targets(cfg, NAMES) == [
        T("spark-1", SERVE), T("spark-1", GATEWAY), T("spark-2", SERVE)]


def test_a_service_is_chosen_by_its_served_name_on_its_nodes():
    cfg = stack("ray", (EMBED, RERANK))
    assert logs.select_targets(cfg, NAMES, "embed") == [T("spark-1", NAMES.service("embed"))]
    assert logs.select_targets(cfg, NAMES, "reranker") == [T("spark-2", NAMES.service("rerank"))]


def test_node_keeps_one_nodes_containers():
    cfg = stack("ray", (EMBED,))
    assert logs.select_targets(cfg, NAMES, node="spark-2") == [T("spark-2", RAY_WORKER)]
    with pytest.raises(logs.SelectionError, match="nothing of embed runs on spark-2"):
        logs.select_targets(cfg, NAMES, "embed", node="spark-2")


def test_unknown_model_or_node_names_the_known_ones():
    cfg = stack("ray", (EMBED,))
    with pytest.raises(logs.SelectionError, match=r"no model 'qwen'.*tiny-moe, embed"):
        logs.select_targets(cfg, NAMES, "qwen")
    with pytest.raises(logs.SelectionError, match=r"no node 'spark-9'.*spark-1, spark-2"):
        logs.select_targets(cfg, NAMES, node="spark-9")


# --- the frames and the merge ---------------------------------------------------------------------


def test_stamps_parse_to_nanoseconds_with_zones():
    base = logs.parse_stamp("2026-01-01T00:00:00.000000001Z")
    assert base == 1767225600 * 10**9 + 1
    assert logs.parse_stamp("2026-01-01T02:00:00.000000001+02:00") == base
    assert logs.parse_stamp("2026-01-01T00:00:00.5Z") == 1767225600 * 10**9 + 500_000_000
    assert logs.parse_stamp("not-a-time") is None


def test_frames_join_pieces_per_container_and_keep_stray_output():
    asm = logs.Assembler("spark-1")
    feed = [b"P a-1 2026-01-01T00:00:00.000000001Z hel", b"P b-2 2026-01-01T00:00:00.000000002Z x",
            b"L a-1 lo", b"L b-2 y", b"S a-1", b"M a-1 2026-01-01T00:00:01.000000000Z gone",
            b"motd says hi"]
    out = [asm.feed(logs.parse_frame(f)) for f in feed]
    assert out[0] is None and out[1] is None
    assert out[2] == logs.Entry(1767225600 * 10**9 + 1, "spark-1", "a-1", "hello")
    assert out[3] == logs.Entry(1767225600 * 10**9 + 2, "spark-1", "b-2", "xy")
    assert out[4] == logs.Synced("spark-1", "a-1")
    assert out[5] == logs.Entry(1767225601 * 10**9, "spark-1", "a-1", "gone", "note")
    assert out[6] is not None and out[6].kind == "note" and "motd says hi" in out[6].text


def test_merge_orders_by_time_and_keeps_each_containers_order():
    a = logs.parse_output("spark-1", b"L c 2026-01-01T00:00:01.0Z a1\nL c 2026-01-01T00:00:03.0Z a3\n")
    b = logs.parse_output("spark-2", b"L c 2026-01-01T00:00:02.0Z b2\nL c 2026-01-01T00:00:03.0Z b3\n")
    assert [e.text for e in logs.merge([*a, *b])] == ["a1", "b2", "a3", "b3"]
    # stdout and stderr are stamped apart: Docker may write the later-stamped line first
    c = logs.parse_output("spark-1", b"L c 2026-01-01T00:00:02.9Z late\nL c 2026-01-01T00:00:02.8Z err\n")
    assert [e.text for e in logs.merge([*a, *c])] == ["a1", "err", "late", "a3"]
