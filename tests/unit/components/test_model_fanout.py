"""Issue 20 (part 3): the model fan-out uses every carrier-up twin the head and a worker share.

The seeder listens on each head twin a worker pairs with; each worker's manifest lists those
addresses with its own twin in the same fabric subnet. Twins recon saw without carrier are left
out at plan time (the sync's own fallback covers a twin that dies later:
tests/unit/hostscripts/test_model_copy_scripts.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pulumi

from components.model_cache import seeder_binds, seeds_for
from config import validate_config
from hostscripts.models import Seed
from tests.conftest import config_raw, gb10_facts, reveal
from tests.unit.conftest import settled

SUBNETS = ("192.168.177.0/24", "192.168.178.0/24")
TWIN2 = "enP2p1s0f1np1"


def _down(facts, iface: str):
    return facts.model_copy(update={"interfaces": [
        i.model_copy(update={"carrier": False}) if i.name == iface else i
        for i in facts.interfaces]})


def _node(cfg, i: int, facts=None):
    """What seeds_for reads of a SparkNode: its config, its recon facts, its primary address."""
    node = cfg.nodes[i]
    return SimpleNamespace(node=node, facts=facts or gb10_facts(node.name, index=i + 1),
                           fabric_ip=node.primary.ip)


def test_each_head_twin_is_paired_with_the_workers_twin_in_the_same_subnet():
    cfg = validate_config(config_raw(2))
    head, worker = _node(cfg, 0), _node(cfg, 1)
    assert seeds_for(head, worker, SUBNETS) == [Seed("192.168.177.11", "192.168.177.12"),
                                                Seed("192.168.178.11", "192.168.178.12")]


def test_pairing_follows_the_subnet_not_the_position():
    raw = config_raw(2)
    raw["nodes"][1]["fabric"].reverse()  # the worker lists its 178 twin first
    cfg = validate_config(raw)
    seeds = seeds_for(_node(cfg, 0), _node(cfg, 1), SUBNETS)
    assert seeds == [Seed("192.168.178.11", "192.168.178.12"),
                     Seed("192.168.177.11", "192.168.177.12")]
    assert seeder_binds(_node(cfg, 0), [seeds]) == ["192.168.177.11", "192.168.178.11"]


def test_without_known_subnets_twins_pair_by_index():
    cfg = validate_config(config_raw(2))
    assert seeds_for(_node(cfg, 0), _node(cfg, 1)) == [
        Seed("192.168.177.11", "192.168.177.12"), Seed("192.168.178.11", "192.168.178.12")]


def test_a_twin_without_carrier_on_either_side_is_left_out():
    cfg = validate_config(config_raw(2))
    head = _node(cfg, 0)
    worker_down = _node(cfg, 1, _down(gb10_facts("spark-2", index=2), TWIN2))
    assert seeds_for(head, worker_down, SUBNETS) == [Seed("192.168.177.11", "192.168.177.12")]
    head_down = _node(cfg, 0, _down(gb10_facts("spark-1", index=1), TWIN2))
    assert seeds_for(head_down, _node(cfg, 1), SUBNETS) == [
        Seed("192.168.177.11", "192.168.177.12")]
    assert seeder_binds(head_down, [seeds_for(head_down, _node(cfg, 1), SUBNETS)]) == [
        "192.168.177.11"]


def test_no_pair_at_all_falls_back_to_the_head_primary():
    cfg = validate_config(config_raw(2))
    facts = gb10_facts("spark-2", index=2)
    for iface in ("enp1s0f1np1", TWIN2):
        facts = _down(facts, iface)
    assert seeds_for(_node(cfg, 0), _node(cfg, 1, facts), SUBNETS) == [Seed("192.168.177.11")]


@pulumi.runtime.test
def test_the_seeder_listens_where_some_worker_pulls_and_each_manifest_lists_its_pairs(build,
                                                                                      mocks):
    # spark-2's second twin has no carrier; spark-3 has both
    facts = {"spark-1": gb10_facts("spark-1", index=1),
             "spark-2": _down(gb10_facts("spark-2", index=2), TWIN2),
             "spark-3": gb10_facts("spark-3", index=3)}
    h = build(3, facts=facts)

    def check(_):
        seed = mocks.named("model-seed").inputs["create"]
        assert " 192.168.177.11,192.168.178.11 18472 " in seed, seed
        stop = mocks.named("model-seed-stop").inputs["create"]
        assert "on: 192.168.177.11,192.168.178.11" in stop  # the stop runs again with the start
        s2 = json.loads(reveal(mocks.named("model-sync-spark-2").inputs["stdin"]))
        s3 = json.loads(reveal(mocks.named("model-sync-spark-3").inputs["stdin"]))
        assert s2["seeds"] == [{"ip": "192.168.177.11", "via": "192.168.177.12"}]
        assert s3["seeds"] == [{"ip": "192.168.177.11", "via": "192.168.177.13"},
                               {"ip": "192.168.178.11", "via": "192.168.178.13"}]
        assert s2["chunkBytes"] > 0 and s2["streamsPerSeed"] >= 1

    return settled(h).apply(check)
