"""Issue 48: the node's guard (components/guard.py), under mocks.

The nodes' facts are the recorded GB10 outputs of the unit fixtures (gb10_facts) with the guard
section as recon reads it when the stack's files are in step (the digests of what the stack
writes); a drift is made by editing them as recon would see it. Proved: per node the guard's
records, daemons and killer commands (and install with guard.install) with the scripts of
hostscripts/guard.py; in step, no diff (the state's trigger kept); a drop-in changed or gone, the
killer stopped, the folder gone, the killer's program gone = a fresh trigger on that command
only, replaced delete-first; a re-made folder replaces the API vLLM containers that mount it;
`guard.enabled: false` registers none of it and vLLM keeps its score.
"""

from __future__ import annotations

import pulumi
import pytest

from components import rerun
from components.guard import spec_of
from hostscripts import guard as g
from hostscripts import vllm
from inspection.facts import GuardFacts
from tests.unit.conftest import settled

NODES = ("spark-1", "spark-2")


def in_step(spec: g.GuardSpec, **update) -> GuardFacts:
    """The guard as recon reads it on a node where the stack's files are as it writes them."""
    facts = GuardFacts(
        tools={"earlyoom": g.EARLYOOM, "systemctl": "/usr/bin/systemctl",
               "apt-get": "/usr/bin/apt-get", "systemd-oomd": None},
        active={"earlyoom.service": "active", "systemd-oomd.service": "inactive"},
        records_present=True,
        files={p: g.sha256(t) for p, t in {**g.daemon_files(spec),
                                           **g.killer_files(spec)}.items()})
    return facts.model_copy(update=update)


def _spec(node: str) -> g.GuardSpec:
    # the dev stack file's guard and reserve (Pulumi.dev.yaml)
    return g.GuardSpec(node=node, stack="dev", killer="earlyoom", reserve_bytes=1 << 30,
                       protect_score_adj=-900)


@pytest.fixture
def facts(gb10_facts):
    return {n: gb10_facts(n, index=i + 1).model_copy(update={"guard": in_step(_spec(n))})
            for i, n in enumerate(NODES)}


@pytest.fixture(autouse=True)
def fixed_trigger(monkeypatch):
    monkeypatch.setattr(rerun, "fresh_trigger", lambda now=None: "repair-test")


GUARD = ("install", "records", "daemons", "earlyoom")


@pulumi.runtime.test
def test_each_node_has_its_guard_and_in_step_nothing_diffs(build, mocks, facts, ignored_changes,
                                                           deleted_before_replace):
    h = build(facts=facts)

    def check(_):
        for n in NODES:
            spec = _spec(n)
            props = mocks.named(f"guard-{n}").inputs
            assert props["killer"] == "earlyoom" and props["install"] is True
            assert props["reserveBytes"] == 1 << 30
            assert props["termBelowBytes"] == 1 << 30 and props["killBelowBytes"] == 1 << 29
            assert props["protected"] == {"ssh.service": -900, "docker.service": -900}
            assert props["prefer"] == g.PREFER and props["avoid"] == g.AVOID
            assert props["vllmScoreAdj"] == 1000
            cmds = {w: mocks.named(f"guard-{n}-{w}").inputs for w in GUARD}
            assert cmds["records"]["create"] == g.records_script(spec)
            assert cmds["records"]["delete"] == g.records_remove(spec)
            assert cmds["daemons"]["create"] == cmds["daemons"]["update"] == g.daemons_script(spec)
            assert cmds["daemons"]["delete"] == g.daemons_remove(spec)
            assert cmds["earlyoom"]["create"] == g.killer_script(spec)
            assert cmds["earlyoom"]["delete"] == g.killer_remove(spec)
            assert cmds["install"]["create"] == g.install_script(spec)
            assert "delete" not in cmds["install"]  # the stack never removes a package
            for w in GUARD:
                assert cmds[w]["triggers"] == ["intact"], (n, w)
                assert ignored_changes[f"guard-{n}-{w}"] == ["triggers"]
                assert deleted_before_replace[f"guard-{n}-{w}"] is True

    return settled(h).apply(check)


DRIFTS = {
    "a drop-in edited": ("daemons", lambda s: {"files": {
        **in_step(s).files, s.names.guard_dropin("ssh.service"): "0" * 64}}),
    "a drop-in removed": ("earlyoom", lambda s: {"files": {
        **in_step(s).files, s.names.guard_dropin("earlyoom.service"): None}}),
    "earlyoom stopped": ("earlyoom", lambda s: {"active": {"earlyoom.service": "inactive"}}),
    "the folder wiped": ("records", lambda s: {"records_present": False}),
    "earlyoom uninstalled": ("install", lambda s: {"tools": {
        **in_step(s).tools, "earlyoom": None}}),
}


@pytest.mark.parametrize("what", sorted(DRIFTS))
@pulumi.runtime.test
def test_a_drift_behind_the_stack_runs_that_command_again_and_only_it(build, mocks, facts, what):
    command, change = DRIFTS[what]
    spec = _spec("spark-2")
    facts["spark-2"] = facts["spark-2"].model_copy(
        update={"guard": in_step(spec, **change(spec))})
    h = build(facts=facts)

    def check(_):
        for n in NODES:
            for w in GUARD:
                fresh = n == "spark-2" and w == command
                assert mocks.named(f"guard-{n}-{w}").inputs["triggers"] == (
                    ["repair-test"] if fresh else ["intact"]), (what, n, w)

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_remade_folder_replaces_the_containers_that_mount_it(build, mocks, facts):
    """The API vLLM containers mount the guard's folder read-only for their watchdog, and carry
    the ID of the command that made it: made again, they are replaced with it."""
    h = build(facts=facts)

    def check(_):
        serve = mocks.named("vllm-serve").inputs
        assert {"target": "/run/spark-vllm-guard", "type": "bind",
                "source": "/var/lib/spark-vllm/guard", "readOnly": True} in serve["mounts"]
        labels = {x["label"]: x["value"] for x in serve["labels"]}
        assert labels["spark-vllm.guard-records"] == "guard-spark-1-records-id"
        # the Ray containers run no watchdog: no mount
        for name in ("ray-head", "ray-worker-spark-2"):
            assert not any(m["target"] == "/run/spark-vllm-guard"
                           for m in mocks.named(name).inputs["mounts"])

    return settled(h).apply(check)


@pulumi.runtime.test
def test_without_the_guard_nothing_of_it_and_vllm_keeps_its_score(build, mocks):
    h = build(guard={"enabled": False})

    def check(outputs):
        assert not [r for r in mocks.resources if r.name.startswith("guard-")]
        serve = mocks.named("vllm-serve").inputs
        ep = list(serve["entrypoints"])
        assert ep[15:18] == ["-", g.PREFER, "2"]  # no kill records; liveness's own backoff
        assert ep[18:] == vllm.serve_entrypoint() and "oom_score_adj" not in ep[20]
        assert not any(m["target"] == "/run/spark-vllm-guard" for m in serve["mounts"])
        # the node exporters do not read the guard's count either
        for n in NODES:
            cmd = list(mocks.named(f"monitoring-node-exporter-{n}").inputs["command"])
            assert not any("guard" in c for c in cmd), cmd  # the guard's count: no folder

    return settled(h).apply(check)


@pulumi.runtime.test
def test_systemd_oomd_instead_is_its_own_command_and_no_install_unless_asked(build, mocks,
                                                                            facts):
    h = build(facts=facts, guard={"killer": "systemd-oomd", "install": False})

    def check(_):
        names = {r.name for r in mocks.resources if r.name.startswith("guard-spark-1-")}
        assert names == {"guard-spark-1-records", "guard-spark-1-daemons",
                         "guard-spark-1-systemd-oomd"}
        spec = g.GuardSpec("spark-1", "dev", "systemd-oomd", 1 << 30, -900)
        assert mocks.named("guard-spark-1-systemd-oomd").inputs["create"] == \
            g.killer_script(spec)
        props = mocks.named("guard-spark-1").inputs
        assert props.get("prefer") is None and props.get("termBelowBytes") is None
        assert sorted(props["files"]) == sorted({**g.daemon_files(spec),
                                                 **g.killer_files(spec)})
        # the files recon read were earlyoom's: the killer is applied as a first one
        assert mocks.named("guard-spark-1-systemd-oomd").inputs["triggers"] == ["repair-test"]

    return settled(h).apply(check)


def test_spec_of_takes_the_config(gb10_facts):
    from config.guard import GuardConfig

    class Node:
        name = "spark-1"

    s = spec_of(Node(), GuardConfig(protect_score_adj=-500), 8 << 30, "prod")  # type: ignore[arg-type]
    assert (s.node, s.stack, s.killer, s.reserve_bytes, s.protect_score_adj) == (
        "spark-1", "prod", "earlyoom", 8 << 30, -500)
