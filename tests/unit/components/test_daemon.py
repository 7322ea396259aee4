"""A configured daemon on the head as resources (components/daemon.py), once for the gateway,
Prometheus and Alertmanager: each container recon found stopped is started by its own gate and
nothing else runs again; each container is the head daemon's (host network, restart
`unless-stopped`, root, never privileged), the node exporter as its image's user."""

from __future__ import annotations

import pulumi
import pytest

from inspection.facts import ContainerFacts
from tests.conftest import gb10_facts
from tests.unit.conftest import settled

# (container name, its role label, its gate, the other gates that must keep their marker)
STOPPED = [
    ("spark-vllm-dev-gateway", "gateway", "gateway-health", ["monitoring-health", "vllm-health"]),
    ("spark-vllm-dev-prometheus", "prometheus", "monitoring-health", ["gateway-health"]),
    ("spark-vllm-dev-alertmanager", "alertmanager", "monitoring-health", ["gateway-health"]),
]


@pytest.mark.parametrize(("container", "role", "gate", "others"), STOPPED)
@pulumi.runtime.test
def test_a_daemon_recon_found_stopped_is_started_by_its_gate(build, mocks, container, role,
                                                             gate, others):
    stopped = ContainerFacts(id="c1", name=container, image="x", state="exited",
                             labels={"spark-vllm.managed": "true",
                                     "spark-vllm.stack": "spark-vllm/dev",
                                     "spark-vllm.role": role})
    facts = {"spark-1": gb10_facts("spark-1", index=1, containers=[stopped]),
             "spark-2": gb10_facts("spark-2", index=2)}
    h = build(2, facts=facts)

    def check(_):
        inputs = mocks.named(gate).inputs
        assert inputs["triggers"][0].startswith(f"{container} is exited @")
        assert f"docker start {container}" in inputs["create"]
        for other in others:  # nothing else runs again
            assert mocks.named(other).inputs["triggers"] == ["none"], other
        for config in ("gateway-config", "monitoring-config", "monitoring-alertmanager-config"):
            assert mocks.named(config).inputs["triggers"] == ["intact"], config

    return settled(h).apply(check)


@pulumi.runtime.test
def test_each_daemon_container_is_the_head_daemons_and_running_ones_keep_their_markers(
        build, mocks):
    h = build(2)

    def check(_):
        for gate in ("gateway-health", "monitoring-health", "monitoring-node-exporter-start-spark-1",
                     "monitoring-node-exporter-start-spark-2"):
            # ignore_changes keeps the state's
            assert mocks.named(gate).inputs["triggers"] == ["none"], gate
        for name in ("gateway-haproxy", "monitoring-prometheus", "monitoring-alertmanager",
                     "monitoring-node-exporter-spark-1", "monitoring-node-exporter-spark-2"):
            inputs = mocks.named(name).inputs
            assert (inputs["networkMode"], inputs["restart"], inputs["privileged"]) == \
                ("host", "unless-stopped", False), name
            # root: each reads its root-only files; the exporter reads what anyone may
            assert inputs.get("user") == (None if "exporter" in name else "0"), name
        # its configuration folder read-only, its data folder (Prometheus's, Alertmanager's)
        # written
        for name, data in (("gateway-haproxy", False), ("monitoring-prometheus", True),
                           ("monitoring-alertmanager", True)):
            mounts = mocks.named(name).inputs["mounts"]
            assert [m.get("readOnly") for m in mounts] == [True, *([None] if data else [])], name
        for image in ("gateway-image", "monitoring-prometheus-image",
                      "monitoring-alertmanager-image", "monitoring-node-exporter-image-spark-2"):
            assert mocks.named(image).inputs["keepLocally"] is True, image

    return settled(h).apply(check)
