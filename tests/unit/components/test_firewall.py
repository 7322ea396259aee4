"""Issue 45: the node's firewall as code (components/firewall.py), under mocks.

Proved: one NodeFirewall per node with exactly the ports of config/ports.node_ports (Ray's
pinned into the block, vLLM's API and its own, the seeders', the monitoring's, a service's
from the head only), sshd and the gateway admitted; its one command applies, updates and
removes the table with the scripts of hostscripts/firewall.py (run for real in
tests/unit/hostscripts/test_firewall.py); every container of the stack, on every node, waits
for every node's table; recon's digests in step are no diff (the state's trigger kept), a
table deleted or edited by hand, its file or unit gone, the unit disabled are a fresh trigger
on that node's table only (replaced delete-first, the reasons logged); the vLLM containers (not
Ray's) carry the probe port their launcher checks; VLLM_PORT pins vLLM's own ports everywhere;
the node's ephemeral ports name the data plane; `firewall.enabled: false` (dev) registers
none of it.
"""

from __future__ import annotations

import pulumi
import pytest

from components import rerun
from components.firewall import drift, table_spec
from config.ports import node_ports
from hostscripts import firewall as fw
from hostscripts.paths import StackNames
from inspection.facts import FirewallFacts
from tests.conftest import config_raw
from tests.unit.conftest import settled, waits_for

NAMES = StackNames("dev")
FABRIC2 = ["192.168.177.11", "192.168.177.12", "192.168.178.11", "192.168.178.12"]
HEAD2 = ["192.168.177.11", "192.168.178.11"]
CONTAINER = "docker:index/container:Container"


@pytest.fixture
def two(gb10_facts):
    return {f"spark-{i}": gb10_facts(f"spark-{i}", index=i) for i in (1, 2)}


@pytest.fixture(autouse=True)
def fixed_trigger(monkeypatch):
    monkeypatch.setattr(rerun, "fresh_trigger", lambda now=None: "repair-test")


def _rules(props) -> dict[str, tuple[list, list]]:
    return {r["what"]: (r["ports"], r["sources"]) for r in props["rules"]}


EMBED = {"name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8001,
         "nodes": ["spark-2"], "gpuMemoryUtilization": 0.05}


@pulumi.runtime.test
def test_each_node_has_its_table_with_exactly_the_stacks_ports(build, mocks, ignored_changes,
                                                                deleted_before_replace):
    h = build(2, services=[EMBED])

    def check(_):
        head, worker = (mocks.named(f"firewall-spark-{i}").inputs for i in (1, 2))
        ray_head = [[6379, 6379], [20006, 20006], [20009, 20009], [20010, 20010],
                    *([[p, p] for p in range(20000, 20006)]), [20100, 20199]]
        assert _rules(head) == {
            "ray": (ray_head, FABRIC2),
            "vllm": ([[8000, 8000]], []),  # loopback only: the gateway's backend
            # the collective gate's rendezvous on the head (issue 51's gate beside issue 45)
            "collective": ([[29517, 29517]], FABRIC2),
            "vllm-internal": ([[20020, 20035]], FABRIC2),
            "seeders": ([[18471, 18471], [18472, 18472]], FABRIC2),
            "prometheus": ([[9090, 9090]], []),
            "node-exporter": ([[9100, 9100]], HEAD2),
        }
        assert _rules(worker) == {
            "ray": ([[p, p] for p in range(20000, 20006)] + [[20100, 20199]], FABRIC2),
            "vllm-internal": ([[20020, 20035]], FABRIC2),
            "service-embed": ([[8001, 8001]], HEAD2),  # a service admits the head only
            "seeders": ([[18471, 18471], [18472, 18472]], FABRIC2),
            "node-exporter": ([[9100, 9100]], HEAD2),
        }
        assert head["public"] == [8080] and worker["public"] == []
        assert head["sshPort"] == worker["sshPort"] == 22
        assert head["table"] == "inet spark-vllm-dev"
        assert head["unit"] == "spark-vllm-dev-firewall.service"
        assert worker["dataPlane"] == {"ports": [32768, 60999], "sources": FABRIC2}
        for i in (1, 2):
            node = h.nodes[f"spark-{i}"]
            cmd = mocks.named(f"firewall-spark-{i}-table").inputs
            spec = table_spec(h.firewalls[f"spark-{i}"].args)
            assert cmd["create"] == cmd["update"] == fw.apply_script(spec)
            assert cmd["delete"] == fw.remove_script(NAMES, f"spark-{i}")
            assert cmd["triggers"] == ["intact"]
            assert ignored_changes[f"firewall-spark-{i}-table"] == ["triggers"]
            assert deleted_before_replace[f"firewall-spark-{i}-table"] is True
            assert node.node.host in str(cmd["connection"])
        # the rules as the script loads them
        create = mocks.named("firewall-spark-2-table").inputs["create"]
        assert "tcp dport { 8001 } ip saddr @from1 accept comment \"service-embed\"" in create
        assert "tcp dport 22 accept comment \"sshd\"" in create

    return settled(h).apply(check)


@pulumi.runtime.test
def test_every_container_of_the_stack_waits_for_every_nodes_table(build, mocks, dependencies):
    h = build(2, services=[EMBED])

    def check(_):
        tables = {"firewall-spark-1-table", "firewall-spark-2-table"}
        containers = [r.name for r in mocks.resources if r.typ == CONTAINER]
        assert {"ray-head", "ray-worker-spark-2", "vllm-serve", "gateway-haproxy",
                "svc-embed-serve-spark-2", "monitoring-prometheus",
                "monitoring-node-exporter-spark-2"} <= set(containers), containers
        for c in containers:
            assert tables <= waits_for(dependencies, c), c
        for seeder in ("model-seed", "svc-embed-model-verify-spark-2"):
            assert tables <= waits_for(dependencies, seeder), seeder

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_launchers_check_the_table_and_vllm_port_pins_vllms_own(build, mocks):
    h = build(2, services=[EMBED])

    def check(_):
        def envs(name):
            return dict(e.split("=", 1) for e in mocks.named(name).inputs["envs"])

        for vllm in ("vllm-serve", "svc-embed-serve-spark-2"):
            assert envs(vllm)[fw.PROBE_ENV] == f"{fw.probe_address(NAMES)}:20008", vllm
            assert envs(vllm)["VLLM_PORT"] == "20020"
        for ray in ("ray-head", "ray-worker-spark-2"):
            assert fw.PROBE_ENV not in envs(ray) and envs(ray)["VLLM_PORT"] == "20020"
        # the Ray head's metrics servers no `ray start` flag pins (44217, 44227 otherwise)
        assert (envs("ray-head")["AUTOSCALER_METRIC_PORT"],
                envs("ray-head")["DASHBOARD_METRIC_PORT"]) == ("20009", "20010")
        assert "AUTOSCALER_METRIC_PORT" not in envs("ray-worker-spark-2")
        # the launcher runs the probe first
        ep = list(mocks.named("vllm-serve").inputs["entrypoints"])
        assert fw.probe_launcher() in ep[-2], ep[-2]

    return settled(h).apply(check)


def _facts(two, node, **fw_facts):
    return {**two, node: two[node].model_copy(update={"firewall": FirewallFacts(**fw_facts)})}


def _in_step(spec) -> dict:
    f, t = "f" * 64, "e" * 64
    return {"table": t, "file": f, "unit": fw.unit_sha256(spec.names), "enabled": True,
            "record": (f, t)}


@pytest.mark.parametrize(("what", "reason"), [
    ({"table": None}, "table inet spark-vllm-dev is not loaded (deleted by hand, or the node "
                      "booted without its unit)"),
    ({"table": "0" * 64}, "table inet spark-vllm-dev was changed by hand (not what the last "
                          "load listed)"),
    ({"file": None}, "its ruleset file is gone"),
    ({"file": "0" * 64}, "its ruleset file was changed"),
    ({"unit": None}, "the unit spark-vllm-dev-firewall.service is gone"),
    ({"unit": "0" * 64}, "the unit spark-vllm-dev-firewall.service was changed"),
    ({"enabled": False}, "the unit spark-vllm-dev-firewall.service is not enabled (the next "
                         "boot would not load the table before Docker)"),
    ({"record": None}, "no record of its last load"),
])
@pulumi.runtime.test
def test_a_table_deleted_or_edited_by_hand_replaces_that_nodes_table_only(
        build, mocks, ignored_changes, two, what, reason):
    spec = fw.TableSpec(stack="dev", node="spark-2", ssh_port=22, public=(), rules=(),
                        data_plane=None, probe=20008)
    facts = _facts(two, "spark-2", **{**_in_step(spec), **what})
    assert reason in drift(spec, facts["spark-2"])
    h = build(2, facts=facts)

    def check(_):
        assert mocks.named("firewall-spark-2-table").inputs["triggers"] == ["repair-test"]
        assert ignored_changes["firewall-spark-2-table"] == []
        assert mocks.named("firewall-spark-1-table").inputs["triggers"] == ["intact"]
        assert h.firewalls["spark-2"].drift and not h.firewalls["spark-1"].drift

    return settled(h).apply(check)


@pulumi.runtime.test
def test_in_step_is_no_drift_and_a_declared_change_is_an_update(build, mocks, two):
    """As the last load left it: no trigger; the rules then change (a service added) and the
    command's text with them: an update, never a replacement."""
    spec = fw.TableSpec(stack="dev", node="spark-2", ssh_port=22, public=(), rules=(),
                        data_plane=None, probe=20008)
    facts = _facts(two, "spark-2", **_in_step(spec))
    assert drift(spec, facts["spark-2"]) == []
    h = build(2, facts=facts)

    def check(_):
        assert mocks.named("firewall-spark-2-table").inputs["triggers"] == ["intact"]

    return settled(h).apply(check)


def test_what_each_executor_opens_on_a_worker():
    from config import validate_config

    ray = validate_config(config_raw(2))
    assert [r.what for r in node_ports(ray, "spark-2")] == [
        "ray", "vllm-internal", "seeders", "node-exporter"]
    mp = validate_config(config_raw(2, vllm={"executor": "mp"}))
    assert [r.what for r in node_ports(mp, "spark-1")] == [
        "vllm", "vllm-rendezvous", "collective", "vllm-internal", "seeders", "prometheus",
        "node-exporter"]
    assert [r.what for r in node_ports(mp, "spark-2")] == [
        "vllm-internal", "seeders", "node-exporter"]


@pulumi.runtime.test
def test_the_ephemeral_ports_recon_read_are_the_data_planes(build, mocks, two):
    odd = {**two, "spark-2": two["spark-2"].model_copy(update={"ephemeral_ports": (40000, 50000)})}
    h = build(2, facts=odd)

    def check(_):
        assert mocks.named("firewall-spark-2").inputs["dataPlane"]["ports"] == [40000, 50000]
        create = mocks.named("firewall-spark-2-table").inputs["create"]
        assert "tcp dport 40000-50000 ct state new ip saddr != @stack4 counter drop" in create
        assert "meta nfproto ipv6 tcp dport 40000-50000 ct state new counter drop" in create

    return settled(h).apply(check)


@pulumi.runtime.test
def test_firewall_off_registers_none_of_it(build, mocks):
    h = build(2, firewall={"enabled": False})

    def check(_):
        assert not [r for r in mocks.resources if "firewall" in r.name]
        envs = dict(e.split("=", 1) for e in mocks.named("vllm-serve").inputs["envs"])
        assert fw.PROBE_ENV not in envs and envs["VLLM_PORT"] == "20020"
        assert h.firewalls == {}

    return settled(h).apply(check)
