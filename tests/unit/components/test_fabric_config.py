"""Issue 33: the stack configures the fabric it depends on (components/fabric.py), under mocks.

The nodes' facts are the recorded GB10 outputs of the unit fixtures (gb10_facts: each node's
two ConnectX-7 twins with the declared address and MTU 9000); a drift is made by editing them
as recon would see it. Proved: one command per declared interface with the declared state
(address with its subnet's prefix, fabric.mtu), in step = no diff (the state's trigger kept),
a drift (address gone, MTU changed, the stack's netplan file gone or edited) = a fresh trigger
on that interface's command only, replaced delete-first; the fabric check waits for every
configured interface and runs again when one ran; `fabric.manage: false` registers none of it.
"""

from __future__ import annotations

import pulumi
import pytest

from components import rerun
from components.fabric import drift
from hostscripts.fabric_config import InterfaceSpec, apply_script, netplan_sha256, remove_script
from tests.unit.conftest import settled

TWINS = ("enp1s0f1np1", "enP2p1s0f1np1")


def spec(node: str, iface: str, ip: str, mtu: int = 9000) -> InterfaceSpec:
    return InterfaceSpec(node=node, stack="dev", interface=iface, address=f"{ip}/24", mtu=mtu)


def drifted(facts, iface: str, **update):
    return facts.model_copy(update={"interfaces": [
        i.model_copy(update=update) if i.name == iface else i for i in facts.interfaces]})


@pytest.fixture
def two(gb10_facts):
    return {f"spark-{i}": gb10_facts(f"spark-{i}", index=i) for i in (1, 2)}


@pytest.fixture(autouse=True)
def fixed_trigger(monkeypatch):
    monkeypatch.setattr(rerun, "fresh_trigger", lambda now=None: "repair-test")


@pulumi.runtime.test
def test_each_declared_interface_is_one_command_with_its_declared_state(
        build, mocks, ignored_changes, deleted_before_replace):
    h = build(2)

    def check(_):
        for n, host in (("spark-1", 11), ("spark-2", 12)):
            for iface, net in zip(TWINS, (177, 178), strict=True):
                s = spec(n, iface, f"192.168.{net}.{host}")
                cmd = mocks.named(f"fabric-{n}-{iface}").inputs
                assert cmd["create"] == cmd["update"] == apply_script(s)
                assert cmd["delete"] == remove_script(s)
                assert f"addr=192.168.{net}.{host}/24; mtu=9000" in cmd["create"]
                # in step: the state's trigger is kept, nothing diffs
                assert cmd["triggers"] == ["intact"]
                assert ignored_changes[f"fabric-{n}-{iface}"] == ["triggers"]
                assert deleted_before_replace[f"fabric-{n}-{iface}"] is True
        props = mocks.named("fabric-spark-2").inputs
        assert props["managementInterface"] is None or isinstance(props["managementInterface"],
                                                                   str)
        assert props["mtu"] == 9000 and [i["address"] for i in props["interfaces"]] == [
            "192.168.177.12/24", "192.168.178.12/24"]

    return settled(h).apply(check)


@pytest.mark.parametrize("what", ["address", "mtu", "foreign-address"])
@pulumi.runtime.test
def test_a_drift_behind_the_stack_replaces_that_interface_only(
        build, mocks, ignored_changes, two, what):
    worker = two["spark-2"]
    if what == "address":
        worker = drifted(worker, TWINS[1], ipv4=[])
    elif what == "mtu":
        worker = drifted(worker, TWINS[1], mtu=1500)
    else:
        worker = drifted(worker, TWINS[1], ipv4=["192.168.178.12/24", "10.9.9.9/8"])
    h = build(2, facts={**two, "spark-2": worker})

    def check(_):
        for n in ("spark-1", "spark-2"):
            for iface in TWINS:
                name = f"fabric-{n}-{iface}"
                if (n, iface) == ("spark-2", TWINS[1]):
                    assert mocks.named(name).inputs["triggers"] == ["repair-test"]
                    assert ignored_changes[name] == []
                else:
                    assert mocks.named(name).inputs["triggers"] == ["intact"], name
        reason = {"address": "address 192.168.178.12/24 missing", "mtu": "MTU 1500, not 9000",
                  "foreign-address": "address 10.9.9.9/8 not the stack's"}[what]
        assert reason in drift(spec("spark-2", TWINS[1], "192.168.178.12"), worker)
        assert drift(spec("spark-2", TWINS[0], "192.168.177.12"), worker) == []

    return settled(h).apply(check)


@pytest.mark.parametrize("files,why", [
    ({}, "netplan file missing"),  # recon could not read them: each counts as missing
    ("changed", "netplan file changed"),
    ("absent", "netplan file missing"),
])
@pulumi.runtime.test
def test_the_stacks_netplan_file_gone_or_edited_is_drift(build, mocks, two, files, why):
    intact = {spec("spark-2", i, ip).path: netplan_sha256(spec("spark-2", i, ip))
              for i, ip in zip(TWINS, ("192.168.177.12", "192.168.178.12"), strict=True)}
    first = spec("spark-2", TWINS[0], "192.168.177.12").path
    if files == "changed":
        files = {**intact, first: "0" * 64}
    elif files == "absent":
        files = {**intact, first: None}
    worker = two["spark-2"].model_copy(update={"fabric_files": files})
    h = build(2, facts={**two, "spark-2": worker})

    def check(_):
        assert mocks.named(f"fabric-spark-2-{TWINS[0]}").inputs["triggers"] == ["repair-test"]
        assert mocks.named("fabric-spark-1-" + TWINS[0]).inputs["triggers"] == ["intact"]

    return settled(h).apply(check)


def applied(two):
    """The worker as the stack last applied it: running state and its own files agree."""
    files = {spec("spark-2", i, ip).path: netplan_sha256(spec("spark-2", i, ip))
             for i, ip in zip(TWINS, ("192.168.177.12", "192.168.178.12"), strict=True)}
    return {**two, "spark-2": two["spark-2"].model_copy(update={"fabric_files": files})}


@pytest.mark.parametrize("declared", [
    spec("spark-2", TWINS[1], "192.168.178.12", mtu=9216),  # another MTU
    spec("spark-2", TWINS[1], "192.168.178.22"),  # another address
])
def test_a_declared_change_from_the_applied_state_is_no_drift(two, declared):
    """From the applied state, a new declaration is not drift (an update validates first and
    keeps the working state when it fails); the same node with its MTU changed behind the stack
    (no longer as its file says) is."""
    worker = applied(two)["spark-2"]
    assert drift(declared, worker) == []
    assert f"MTU 1500, not {declared.mtu}" in drift(declared, drifted(worker, TWINS[1], mtu=1500))


@pulumi.runtime.test
def test_a_declared_mtu_change_updates_the_commands_in_place(build, mocks, two):
    """A replacement would run the removal first: a failed apply would then leave the interface
    without its address. The state's trigger is kept, the changed script updates in place."""
    h = build(2, facts=applied(two), fabric={"mtu": 9216}, nccl={"minMtu": 9000})

    def check(_):
        cmd = mocks.named(f"fabric-spark-2-{TWINS[1]}").inputs
        assert cmd["triggers"] == ["intact"]
        assert "mtu=9216" in cmd["update"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_netplan_files_in_step_are_no_drift(build, mocks, two):
    files = {spec("spark-2", i, ip).path: netplan_sha256(spec("spark-2", i, ip))
             for i, ip in zip(TWINS, ("192.168.177.12", "192.168.178.12"), strict=True)}
    h = build(2, facts={**two, "spark-2": two["spark-2"].model_copy(
        update={"fabric_files": files})})

    def check(_):
        assert [mocks.named(f"fabric-spark-2-{i}").inputs["triggers"] for i in TWINS] == [
            ["intact"], ["intact"]]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_fabric_check_waits_for_every_configured_interface_and_follows_them(
        build, mocks, dependencies):
    h = build(2)

    def check(_):
        configured = {f"fabric-{n}-{i}" for n in ("spark-1", "spark-2") for i in TWINS}
        for n in ("spark-1", "spark-2"):
            assert configured <= dependencies[f"nccl-fabric-{n}"]
            # each configured interface's ID and output: a run of one re-runs the check
            assert len(mocks.named(f"nccl-fabric-{n}").inputs["triggers"]) == 2 * len(configured)

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_declared_mtu_is_the_scripts_and_what_the_policies_see(build, mocks):
    h = build(2, fabric={"mtu": 9216}, nccl={"minMtu": 9000})

    def check(_):
        assert "mtu=9216" in mocks.named(f"fabric-spark-1-{TWINS[0]}").inputs["create"]
        nodes = mocks.named("nccl").inputs["nodes"]
        assert {f["mtu"] for n in nodes for f in n["fabric"]} == {9216}

    return settled(h).apply(check)


@pulumi.runtime.test
def test_check_only_registers_no_fabric_configuration(build, mocks, dependencies):
    h = build(2, fabric={"manage": False})

    def check(_):
        assert not [r for r in mocks.resources if r.name.startswith("fabric-")]
        assert "triggers" not in mocks.named("nccl-fabric-spark-1").inputs or \
            not mocks.named("nccl-fabric-spark-1").inputs["triggers"]
        nodes = mocks.named("nccl").inputs["nodes"]
        assert {f["mtu"] for n in nodes for f in n["fabric"]} == {9000}  # what recon saw

    return settled(h).apply(check)


def test_a_link_local_address_beside_the_declared_one_is_no_drift(two):
    worker = drifted(two["spark-2"], TWINS[1], ipv4=["192.168.178.12/24", "169.254.9.4/16"])
    assert drift(spec("spark-2", TWINS[1], "192.168.178.12"), worker) == []
