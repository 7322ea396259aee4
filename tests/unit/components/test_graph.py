"""The resource graph: what exists for N nodes, who parents whom, which provider each uses."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter

import pulumi
import pytest

from tests.conftest import is_secret, reveal
from tests.unit.conftest import settled

CONTAINER = "docker:index/container:Container"
IMAGE = "docker:index/remoteImage:RemoteImage"
COMMAND = "command:remote:Command"
LOCAL = "command:local:Command"
PROVIDER = "pulumi:providers:docker"
COMPONENTS = {
    "spark-vllm:stack_secrets:StackSecrets",
    "spark-vllm:spark_node:SparkNode",
    "spark-vllm:nccl:NcclEnvironment",
    "spark-vllm:fabric:NodeFabric",
    "spark-vllm:firewall:NodeFirewall",
    "spark-vllm:vllm_image:VllmImage",
    "spark-vllm:model_cache:ModelCache",
    "spark-vllm:ray_cluster:RayCluster",
    "spark-vllm:vllm_server:VllmServer",
    "spark-vllm:gateway:Gateway",
    "spark-vllm:monitoring:Monitoring",
    "spark-vllm:collective:CollectiveGate",
    "spark-vllm:guard:NodeGuard",
}


def expected_counts(n: int) -> Counter:
    return Counter(
        {
            "spark-vllm:spark_node:SparkNode": n,
            "spark-vllm:stack_secrets:StackSecrets": 1,
            # the Ray cluster token and the label key, made once (the API key is configured in
            # these stacks)
            LOCAL: 2,
            "spark-vllm:nccl:NcclEnvironment": 1,
            "spark-vllm:fabric:NodeFabric": n,  # fabric.manage (the default)
            "spark-vllm:firewall:NodeFirewall": n,  # firewall.enabled (the default)
            "spark-vllm:vllm_image:VllmImage": 1,
            "spark-vllm:model_cache:ModelCache": 1,
            "spark-vllm:ray_cluster:RayCluster": 1,
            "spark-vllm:vllm_server:VllmServer": 1,
            "spark-vllm:gateway:Gateway": 1,
            "spark-vllm:monitoring:Monitoring": 1,  # monitoring.enabled (the dev stack's)
            "spark-vllm:collective:CollectiveGate": 1,
            "spark-vllm:guard:NodeGuard": n,  # guard.enabled (the default)
            PROVIDER: n,
            # the serving image and the node exporter's on every node, the gateway's,
            # Prometheus's and Alertmanager's on the head
            IMAGE: 2 * n + 3,
            # a Ray container and a node exporter per node, the vLLM container, the gateway,
            # Prometheus and Alertmanager on the head
            CONTAINER: 2 * n + 4,
            # model: fetch + seed + seed-stop + (n-1) syncs + n verifies; n Ray token files;
            # ray ready; vLLM's API key file + health gate + NCCL log + transport check; the
            # verified deployment's step on every node (issue 49); n fabric checks; n image probes + the image check; n page-cache drops; n
            # compile-cache folders; n serve checks (the serve command in the image's vLLM);
            # the gateway's key digest file, configuration and gate (no TLS here); the fabric's
            # configuration, one per interface (two twins per node); Prometheus's key file,
            # data folder, configuration and gate; the collective gate's rank per node and its
            # check; the firewall's table, one per node; per node the guard's install (the dev
            # stack installs earlyoom), records, daemons and earlyoom; the verified
            # deployment's step per node; Alertmanager's configuration, and an exporter's start
            # per node
            COMMAND: 3 + (n - 1) + n + n + 1 + 4 + n + n + 1 + n + n + n + 3 + 2 * n + 4
            + n + 1 + n + 4 * n + n + 1 + n,
        }
    )


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_resource_counts_by_type(build, mocks, n):
    h = build(n)

    def check(_):
        counts = Counter(r.typ for r in mocks.resources if r.typ != "pulumi:pulumi:Stack")
        assert counts == expected_counts(n)
        names = [r.name for r in mocks.resources]
        assert len(names) == len(set((r.typ, r.name) for r in mocks.resources)), "duplicate names"

    return settled(h).apply(check)


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_parent_chains(build, mocks, n):
    h = build(n)
    workers = [f"spark-{i}" for i in range(2, n + 1)]

    def check(_):
        urns = mocks.urns()

        def parent_type(name: str) -> str:
            found = [u for u in urns if u.endswith("::" + name)]
            assert len(found) == 1, (name, found)
            qualified = found[0].split("::")[2]
            return qualified.split("$")[0]

        for comp in ["secrets", "nccl", "image", "model", "ray", "vllm", "spark-1", "gateway",
                     "fabric-spark-1", "collective", "guard-spark-1",
                     *(f"firewall-spark-{i}" for i in range(1, n + 1))]:
            assert parent_type(comp) == "pulumi:pulumi:Stack"
            if comp.startswith("firewall-"):
                assert parent_type(f"{comp}-table") == "spark-vllm:firewall:NodeFirewall"
        assert parent_type("collective-check") == "spark-vllm:collective:CollectiveGate"
        for node in ("spark-1", *workers):
            for what in ("install", "records", "daemons", "earlyoom"):
                assert parent_type(f"guard-{node}-{what}") == "spark-vllm:guard:NodeGuard"
        for iface in ("enp1s0f1np1", "enP2p1s0f1np1"):
            assert parent_type(f"fabric-spark-2-{iface}") == "spark-vllm:fabric:NodeFabric"
        for child in ("gateway-image", "gateway-key", "gateway-config", "gateway-haproxy",
                      "gateway-health"):
            assert parent_type(child) == "spark-vllm:gateway:Gateway", child
        assert parent_type("monitoring") == "pulumi:pulumi:Stack"
        for child in ("monitoring-prometheus-image", "monitoring-key", "monitoring-data",
                      "monitoring-config", "monitoring-prometheus", "monitoring-health",
                      *(f"monitoring-node-exporter-{x}" for x in ("spark-1", *workers)),
                      *(f"monitoring-node-exporter-image-{x}" for x in ("spark-1", *workers))):
            assert parent_type(child) == "spark-vllm:monitoring:Monitoring", child
        assert parent_type("secrets-ray-token") == "spark-vllm:stack_secrets:StackSecrets"
        for i in range(1, n + 1):
            node = f"spark-{i}"
            assert parent_type(f"{node}-docker") == "spark-vllm:spark_node:SparkNode"
            assert parent_type(f"image-{node}") == "spark-vllm:vllm_image:VllmImage"
            assert parent_type(f"model-verify-{node}") == "spark-vllm:model_cache:ModelCache"
            assert parent_type(f"ray-token-{node}") == "spark-vllm:ray_cluster:RayCluster"
            assert parent_type(f"collective-rank-{node}") == "spark-vllm:collective:CollectiveGate"
        for w in workers:
            assert parent_type(f"ray-worker-{w}") == "spark-vllm:ray_cluster:RayCluster"
            assert parent_type(f"model-sync-{w}") == "spark-vllm:model_cache:ModelCache"
        assert parent_type("ray-head") == "spark-vllm:ray_cluster:RayCluster"
        assert parent_type("ray-ready") == "spark-vllm:ray_cluster:RayCluster"
        assert parent_type("model-fetch") == "spark-vllm:model_cache:ModelCache"
        assert parent_type("vllm-serve") == "spark-vllm:vllm_server:VllmServer"
        # every custom resource has a component parent (nothing hangs off the stack directly)
        for u in urns:
            typ = u.split("::")[2]
            if typ.split("$")[-1] not in COMPONENTS and "$" in typ:
                assert typ.split("$")[0] in COMPONENTS, u

    return settled(h).apply(check)


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_every_container_and_image_on_its_own_nodes_provider(build, mocks, n):
    h = build(n)

    def check(_):
        providers = {r.name: r for r in mocks.of_type(PROVIDER)}
        for i in range(1, n + 1):
            node = f"spark-{i}"
            prov = providers[f"{node}-docker"]
            assert prov.inputs["host"] == f"ssh://root@10.77.0.{10 + i}:22"
            ref_suffix = f"::{node}-docker::{node}-docker-id"
            cname = "ray-head" if i == 1 else f"ray-worker-{node}"
            assert mocks.named(cname).provider.endswith(ref_suffix)
            assert mocks.named(f"image-{node}").provider.endswith(ref_suffix)
        # and no container or image uses the default provider
        for r in mocks.of_type(CONTAINER) + mocks.of_type(IMAGE):
            assert r.provider and "pulumi:providers:docker" in r.provider

    return settled(h).apply(check)


@pulumi.runtime.test
def test_docker_provider_pins_the_host_key(build, mocks, tmp_path):
    h = build(2)

    def check(_):
        prov = mocks.named("spark-2-docker").inputs
        # provider config reaches the engine JSON-encoded
        opts = json.loads(prov["sshOpts"]) if isinstance(prov["sshOpts"], str) else prov["sshOpts"]
        joined = " ".join(opts)
        # the same option set recon's ssh uses (config/ssh.py): only the pinned key is trusted
        for opt in ("StrictHostKeyChecking=yes", "BatchMode=yes", "IdentitiesOnly=yes",
                    "GlobalKnownHostsFile=/dev/null", "HostKeyAlias=spark-vllm-spark-2",
                    "CheckHostIP=no"):
            assert opt in joined, opt
        assert opts[opts.index("-i") + 1] == "/root/.cache/spark-vllm/lab/id_ed25519"
        kh = next(o.split("=", 1)[1] for o in opts if o.startswith("UserKnownHostsFile="))
        lines = open(kh).read().splitlines()
        key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests"
        assert lines == [f"spark-vllm-spark-1 {key}", f"10.77.0.11 {key}",
                         f"spark-vllm-spark-2 {key}", f"10.77.0.12 {key}"]
        # OpenSSH finds the pin under the alias and, for provider settings kept in the state by
        # a release before the alias (what `up --refresh` uses), under the address
        for name in ("spark-vllm-spark-2", "10.77.0.12"):
            found = subprocess.run(["ssh-keygen", "-F", name, "-f", kh], capture_output=True,
                                   text=True, check=False)
            assert found.returncode == 0 and key in found.stdout, (name, found)
        assert oct(os.stat(kh).st_mode & 0o777) == "0o600"
        # remote commands pin the same key, and carry the private key only as a secret
        raw_conn = mocks.named("ray-ready").inputs["connection"]
        assert is_secret(raw_conn)  # the private key makes the whole connection secret
        conn = reveal(raw_conn)
        assert conn["hostKey"] == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests"
        assert conn["host"] == "10.77.0.11"

    return settled(h).apply(check)


@pulumi.runtime.test
def test_image_source_head_copies_over_the_fabric(build, mocks):
    h = build(3, image={"source": "head"})

    def check(_):
        names = {r.name for r in mocks.of_type(COMMAND)}
        expected = {"image-seed", "image-seed-stop", "image-copy-spark-2", "image-copy-spark-3"}
        assert expected <= names
        seed = mocks.named("image-seed").inputs["create"]
        assert "192.168.177.11 18471" in seed  # bound to the head's fabric address
        copy = mocks.named("image-copy-spark-3").inputs["create"]
        assert "http://192.168.177.11:18471/" in copy and "docker load" in copy
        conn = reveal(mocks.named("image-copy-spark-3").inputs["connection"])
        assert conn["host"] == "10.77.0.13"

    return settled(h).apply(check)


@pulumi.runtime.test
def test_no_command_asks_sshd_for_variables_it_refuses(build, mocks):
    """sshd accepts only its AcceptEnv names (Ubuntu: LANG LC_*); the provider's
    PULUMI_COMMAND_STDOUT/STDERR would be refused with a warning on every update, and no script
    reads them. The only variable a command sets is vllm-serve's LC_ restart marker."""
    h = build(3)

    def check(_):
        commands = [r for r in mocks.resources if r.typ == "command:remote:Command"]
        assert len(commands) >= 10
        for r in commands:
            assert r.inputs.get("addPreviousOutputInEnv") is False, r.name
            for name in (r.inputs.get("environment") or {}):
                assert name.startswith("LC_"), (r.name, name)

    return settled(h).apply(check)


@pytest.mark.parametrize("n", [2, 3])
@pulumi.runtime.test
def test_no_remote_command_passes_environment_over_ssh(build, mocks, n):
    """pulumi-command fails a remote command whose variables sshd's AcceptEnv does not list
    (tests/engine/test_command_plugin.py), and a node's sshd config is not the stack's to set."""
    h = build(n)

    def check(_):
        commands = mocks.of_type(COMMAND)
        assert commands
        assert [c.name for c in commands if c.inputs.get("environment")] == []

    return settled(h).apply(check)
