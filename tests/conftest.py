"""Shared fixtures: GB10-shaped node facts and a Pulumi mocks harness.

`gb10_facts(name, ...)` builds NodeFacts with the values of the recorded real GB10 outputs in
tests/fixtures/gb10 (copied, not invented): nvidia-smi query (NVIDIA GB10, 12.1, 580.159.03,
[N/A] memory), `free` in KiB on spark-7d19 (125513720 total, 120425308 available), DGX OS
release file, Ubuntu 24.04.4 / kernel 6.17.0-1014-nvidia aarch64, Docker 29.2.1 with cgroup v2
and no nvidia runtime (CDI), and ibdev2netdev from the connect-two-sparks playbook (port 1 Up on
both twins, port 0 Down).

`mocks` installs a recording `pulumi.runtime.Mocks` per test with `preview=False` (so applies
run), on a fresh event loop whose default executor is synchronous (pulumi/pulumi#7663), and
restores everything afterwards so tests cannot bleed into each other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from inspection.facts import (
    ContainerFacts,
    DockerFacts,
    GpuFacts,
    InterfaceFacts,
    MemoryFacts,
    NodeFacts,
    OsFacts,
    RoceFacts,
)
from tests import reporting

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "spark-vllm"
KIB = 1024

# --- values copied from tests/fixtures/gb10 ---------------------------------------------------
DGX_RELEASE = {  # dgx-release-sionna-rk.txt (first block)
    "DGX_NAME": "DGX Spark",
    "DGX_PRETTY_NAME": "NVIDIA DGX Spark",
    "DGX_SWBUILD_DATE": "2025-09-10-13-50-03",
    "DGX_SWBUILD_VERSION": "7.2.3",
    "DGX_COMMIT_ID": "833b4a7",
    "DGX_PLATFORM": "DGX Server for KVM",
    "DGX_SERIAL_NUMBER": "XXXXXXXXXXXX",
    "DGX_OTA_VERSION": "7.3.1",
    "DGX_OTA_DATE": "Wed Nov 19 05:05:30 PM CET 2025",
}
MEM_TOTAL = 125513720 * KIB  # free-kib-obrienlabs.txt
MEM_AVAILABLE = 120425308 * KIB
IBDEV2NETDEV = [  # ibdev2netdev-playbooks-connect-two-sparks.txt (roceP2* rows first)
    ("roceP2p1s0f0", "enP2p1s0f0np0", "Down"),
    ("roceP2p1s0f1", "enP2p1s0f1np1", "Up"),
    ("rocep1s0f0", "enp1s0f0np0", "Down"),
    ("rocep1s0f1", "enp1s0f1np1", "Up"),
]


def gb10_facts(
    name: str,
    *,
    index: int = 1,
    mtu: int = 9000,
    roce_state: dict[str, str] | None = None,
    containers: list[ContainerFacts] | None = None,
    hostname: str | None = None,
) -> NodeFacts:
    """NodeFacts of a GB10 Spark cabled on port 1; fabric IPs 192.168.177/178.(10+index)."""
    states = {dev: state for dev, _, state in IBDEV2NETDEV}
    states.update(roce_state or {})
    host = 10 + index
    return NodeFacts(
        node=name,
        hostname=hostname or name,
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests",
        os=OsFacts(
            id="ubuntu",
            version_id="24.04",
            pretty_name="Ubuntu 24.04.4 LTS",
            kernel="6.17.0-1014-nvidia",
            arch="aarch64",
            dgx_release=DGX_RELEASE,
        ),
        gpus=[
            GpuFacts(
                name="NVIDIA GB10",
                compute_capability="12.1",
                driver_version="580.159.03",
                cuda_version="13.0",
                memory_total_mib=None,
            )
        ],
        memory=MemoryFacts(total_bytes=MEM_TOTAL, available_bytes=MEM_AVAILABLE, unified=True),
        # Linux's default net.ipv4.ip_local_port_range (the data plane's rule names it)
        ephemeral_ports=(32768, 60999),
        docker=DockerFacts(
            version="29.2.1",
            runtimes=["io.containerd.runc.v2", "runc"],
            gpu_support=True,
            cgroup_driver="systemd",
            containers=containers or [],
        ),
        interfaces=[
            InterfaceFacts(name="enP7s7", ipv4=[f"10.77.0.{host}/24"], mtu=1500, carrier=True),
            InterfaceFacts(
                name="enp1s0f1np1",
                ipv4=[f"192.168.177.{host}/24"],
                mtu=mtu,
                carrier=True,
                speed_mbps=200000,
            ),
            InterfaceFacts(
                name="enP2p1s0f1np1",
                ipv4=[f"192.168.178.{host}/24"],
                mtu=mtu,
                carrier=True,
                speed_mbps=200000,
            ),
            InterfaceFacts(name="enp1s0f0np0", mtu=1500, carrier=False),
            InterfaceFacts(name="enP2p1s0f0np0", mtu=1500, carrier=False),
        ],
        roce=[
            RoceFacts(device=dev, port=1, netdev=netdev, state=states[dev])
            for dev, netdev, _ in IBDEV2NETDEV
        ],
        disk_free_bytes=2 * 1024**4,
    )


@pytest.fixture(name="gb10_facts")
def gb10_facts_fixture():
    return gb10_facts


# --- config -------------------------------------------------------------------------------------


def dev_config_raw() -> dict[str, Any]:
    """Pulumi.dev.yaml as a mapping of top-level keys (without the namespace)."""
    data = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    return {k.split(":", 1)[1]: v for k, v in data.items()}


# Two ed25519 host keys of the right form (OpenSSH's format; no host holds them).
TEST_HOST_KEYS = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPykkYzPvHrVjEDRoWCY0vynXHUvfbCJFpaFuAhGr90L",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAzciBTDgFfru/NcREI8UuDkm3ihu7lliKeTKf+k8ZJL",
)


def dev_project(folder: Path, **sections: dict[str, Any]) -> Path:
    """`folder` as a project for the CLI's dev stack: Pulumi.yaml and Pulumi.dev.yaml (each
    `sections[key]` updating spark-vllm:<key>), its nodes' host keys pinned through a
    known_hosts file in `folder`. Pulumi.dev.yaml names the lab's known_hosts, which exists only
    once a lab was brought up on this machine: a test that read it passed or failed with the
    machine's history (and raced the lab tier's bring-up in `make test`)."""
    data = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    config = data["config"]
    for key, values in sections.items():
        config[f"spark-vllm:{key}"].update(values)
    hosts = [n["host"] for n in config["spark-vllm:nodes"]]
    known_hosts = folder / "known_hosts"
    known_hosts.write_text("".join(f"{h} {k}\n" for h, k in zip(hosts, TEST_HOST_KEYS,
                                                                strict=True)))
    config["spark-vllm:ssh"]["knownHostsFile"] = str(known_hosts)
    (folder / "Pulumi.dev.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    shutil.copy(ROOT / "Pulumi.yaml", folder / "Pulumi.yaml")
    return folder


def node_raw(i: int) -> dict[str, Any]:
    host = 10 + i
    return {
        "name": f"spark-{i}",
        "host": f"10.77.0.{host}",
        "port": 22,
        "user": "root",
        "hostKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests",
        "fabric": [
            {"interface": "enp1s0f1np1", "ip": f"192.168.177.{host}", "hca": "rocep1s0f1"},
            {"interface": "enP2p1s0f1np1", "ip": f"192.168.178.{host}", "hca": "roceP2p1s0f1"},
        ],
    }


def monitoring_pinned(raw_monitoring: dict[str, Any]) -> dict[str, Any]:
    """The dev monitoring section with every image pinned by digest (what prod wants)."""
    return {**raw_monitoring,
            "prometheus": {"ref": "registry.example:5000/prometheus@sha256:" + "e" * 64},
            "nodeExporter": {"ref": "registry.example:5000/node-exporter@sha256:" + "f" * 64},
            "alertmanager": {"ref": "registry.example:5000/alertmanager@sha256:" + "d" * 64}}


def config_raw(nodes: int = 2, **overrides: Any) -> dict[str, Any]:
    """The dev config with `nodes` nodes (tp = nodes) and top-level sections patched."""
    raw = dev_config_raw()
    raw["nodes"] = [node_raw(i) for i in range(1, nodes + 1)]
    raw["vllm"] = {**raw["vllm"], "tensorParallelSize": nodes}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return raw


def set_config(raw: dict[str, Any], secrets: dict[str, str] | None = None) -> None:
    """Install stack config the way the CLI does: JSON strings under `spark-vllm:<key>`."""
    values = {
        f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()
    }
    secrets = secrets or {}
    values.update({f"{PROJECT}:{k}": v for k, v in secrets.items()})
    pulumi.runtime.set_all_config(values, secret_keys=[f"{PROJECT}:{k}" for k in secrets])


@pytest.fixture(name="config_raw")
def config_raw_fixture():
    return config_raw


@pytest.fixture(name="set_config")
def set_config_fixture():
    return set_config


# --- mocks --------------------------------------------------------------------------------------


SECRET_SIG = ("4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270")


def is_secret(value: Any) -> bool:
    """True when a mock input arrived wrapped as a Pulumi secret."""
    return isinstance(value, dict) and value.get(SECRET_SIG[0]) == SECRET_SIG[1]


def reveal(value: Any) -> Any:
    """The plain value of a (possibly secret-wrapped) mock input."""
    return value["value"] if is_secret(value) else value


HAPROXY_MISSING = (
    "the haproxy binary is missing: the unit tier runs the gateway's configuration with Debian's "
    "HAProxy 2.6 (the package the lab's gateway image is built from). Install it as root: "
    "`make setup` (scripts/host_packages.sh), or `apt-get update && apt-get install -y "
    "--no-install-recommends haproxy`")


def haproxy_binary() -> str:
    """Debian's haproxy (on PATH, or in /usr/sbin, which a user's PATH may lack); without it the
    test fails saying how to install it, it never skips (docs/testing.md, the fast tier)."""
    path = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/sbin/haproxy") if os.access(p, os.X_OK)), None)
    if path is None:
        pytest.fail(HAPROXY_MISSING, pytrace=False)
    return path


def fake_image_id(ref: str) -> str:
    return "sha256:" + hashlib.sha256(ref.encode()).hexdigest()


# What hostscripts/payloads/image_probe.py prints for a serving image (a CUDA build on GB10).
PROBE_STDOUT = ('{"libibverbs": true, "python": "3.12.3", "ray": "2.60.0", "torch": "2.13.0", '
                '"torchCuda": "13.0", "vllm": "0.32.0"}')


class RecordingMocks(pulumi.runtime.Mocks):
    """Records every registration; returns known fake outputs so applies run."""

    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []
        # a command's stdout by resource name (e.g. a recorded NCCL log for `vllm-nccl-log`)
        self.stdouts: dict[str, str] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outputs = dict(args.inputs)
        if args.typ == "docker:index/remoteImage:RemoteImage":
            outputs["imageId"] = fake_image_id(args.inputs["name"])
            outputs["repoDigest"] = args.inputs["name"]
        elif args.typ in ("command:remote:Command", "command:local:Command"):
            outputs["stdout"] = self.stdouts.get(args.name) or (
                PROBE_STDOUT if "-probe-" in args.name
                # a seeder's start prints the run's token (hostscripts.common.MAKE_TOKEN)
                else hashlib.sha256(args.name.encode()).hexdigest() + "\n"
                if args.name.endswith("-seed")
                # what hostscripts/gateway.config_write prints last: the configuration's hash
                else "gateway config " + hashlib.sha256(str(args.inputs.get("create")).encode())
                .hexdigest()[:16] if args.name.endswith("gateway-config")
                # and hostscripts/monitoring.config_write: Prometheus's configuration's hash
                else "monitoring config " + hashlib.sha256(
                    str(args.inputs.get("create")).encode()).hexdigest()[:16]
                if args.name.endswith("monitoring-config")
                # a vLLM health gate that passed (payloads/deployment.py `gate`): the probe's
                # answer and the new deployment's id
                else json.dumps({"health": "ok", "models": ["m"], "smoke": "hi",
                                 "seconds": 1.0, "smokeSeconds": 0.1,
                                 "deployment": hashlib.sha256(args.name.encode()).hexdigest()[:16],
                                 "at": "2026-12-06T00:00:00Z"}, sort_keys=True) + "\n"
                if re.fullmatch(r"vllm-health|svc-.+-health-.+", args.name)
                # and hostscripts/alertmanager.config_write: the redacted text's hash
                else "alertmanager config " + hashlib.sha256(
                    str(args.inputs.get("create")).encode()).hexdigest()[:16]
                if args.name.endswith("alertmanager-config")
                else f"{args.name}: ok")
            outputs["stderr"] = ""
        if args.typ == "docker:index/container:Container":  # the daemon's 64-hex container ID
            return hashlib.sha256(args.name.encode()).hexdigest(), outputs
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        if args.token == "docker:index/getRegistryImage:getRegistryImage":
            # the registry's answer for a tag: a digest derived from the ref
            return {"name": args.args["name"], "sha256Digest": fake_image_id(args.args["name"])}
        return {}

    # helpers for assertions
    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]

    def urns(self) -> list[str]:
        return list(self.monitor.get_registered_resources())

    def named(self, name: str) -> pulumi.runtime.MockResourceArgs:
        found = [r for r in self.resources if r.name == name]
        assert len(found) == 1, f"expected one resource named {name}, got {len(found)}"
        return found[0]


class _SyncExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs submitted work inline: avoids the SDK's thread-pool hangs under pytest.

    (asyncio only accepts ThreadPoolExecutor instances as the default executor; no thread is
    ever started because `submit` never reaches the pool.)
    """

    def submit(self, fn, /, *args, **kwargs):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine
            fut.set_exception(exc)
        return fut


@pytest.fixture
def mocks(tmp_path, monkeypatch):
    """A fresh runtime per test: event loop with a synchronous executor, mocks, empty config."""
    from pulumi.runtime import settings

    monkeypatch.setenv("SPARK_VLLM_HOME", str(tmp_path / "home"))
    loop = asyncio.new_event_loop()
    loop.set_default_executor(_SyncExecutor())
    asyncio.set_event_loop(loop)
    settings.ROOT.set(None)
    recorder = RecordingMocks()
    recorder.monitor = pulumi.runtime.mocks.MockMonitor(recorder)
    pulumi.runtime.set_mocks(
        recorder, project=PROJECT, stack="dev", preview=False, monitor=recorder.monitor
    )
    pulumi.runtime.set_all_config({}, secret_keys=[])
    try:
        yield recorder
    finally:
        pulumi.runtime.set_all_config({}, secret_keys=[])
        settings.ROOT.set(None)
        asyncio.set_event_loop(None)
        loop.close()


# --- the run's own rules and reports ---------------------------------------------------------
# SPARK_VLLM_STRICT_SKIPS=1 (scripts/run_tests.py sets it for `make test`) or CI=true: a skipped
# test fails the run. A tier that skips proves nothing, and pytest alone exits 0 on skips.


def _strict_skips() -> bool:
    return os.environ.get("SPARK_VLLM_STRICT_SKIPS") == "1" or \
        os.environ.get("CI", "").lower() == "true"


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or not _strict_skips():
        return  # an xdist worker: the controller judges the whole run
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and reporter.stats.get("skipped") and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped") or []
    if skipped and _strict_skips():
        terminalreporter.section("skipped tests fail this run", sep="=", red=True, bold=True)
        terminalreporter.line(
            f"{len(skipped)} test(s) skipped (reasons above, -rs): under CI=true or "
            "SPARK_VLLM_STRICT_SKIPS=1 a skip is a failure; fix what the reason names")
    reported = reporting.collected()
    if reported:
        terminalreporter.section("measured by the tests (tests/reporting.py)", sep="=")
        for line in reported:
            terminalreporter.line(line)
