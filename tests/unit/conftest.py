"""Unit-tier fixtures: no network, a fixed model manifest, and a `build` helper.

`build(...)` validates a config, makes GB10 facts for every node and runs
`components.stack.build_stack` under the `mocks` fixture, returning the handles.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pulumi
import pytest

from config import Secrets, validate_config
from hostscripts.models import ModelFile
from inspection import hub
from inspection.hub import ModelManifest
from inspection.memory_fit import shape_from_config
from inspection.preflight import Plan
from tests.unit.inspection.model_configs import CONFIGS

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL_FILES = (
    ModelFile(path="config.json", size=1234, etag="a" * 40),
    ModelFile(path="model-00001-of-00002.safetensors", size=5_000_000, etag="b" * 64),
    ModelFile(path="model-00002-of-00002.safetensors", size=4_000_000, etag="c" * 64),
    ModelFile(path="tokenizer/tokenizer.json", size=777, etag="d" * 40),
)
API_KEY = "sk-unit-test-api-key-0001"
# fake; the header is split so the repository's secret scan does not flag test data
SSH_KEY = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nunit-test\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Unit tests must not touch the network: any connect() fails the test."""

    def refuse(*_a, **_k):
        raise AssertionError("unit tests must not open network connections")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture(autouse=True)
def own_state_home(tmp_path_factory, monkeypatch):
    """Unit tests write no file of the operator's: the stack's known_hosts, key file and hub
    cache go under a folder of the test's own ($SPARK_VLLM_HOME, config/paths.py). Without
    this, tests that build the stack wrote their fake host keys into
    ~/.cache/spark-vllm/known_hosts/spark-vllm.dev, and the next `make demo` (its --refresh
    runs before the program rewrites the file) failed host-key checks."""
    monkeypatch.setenv("SPARK_VLLM_HOME", str(tmp_path_factory.mktemp("spark-vllm-home")))


def fake_manifest(repo: str, revision: str) -> ModelManifest:
    """The fixed manifest, with the shape of the repo's config.json when the tests know it
    (tests/unit/inspection/model_configs.py: the 122B and the lab's tiny model)."""
    config = CONFIGS.get(repo)
    shape = shape_from_config(config) if config is not None else None
    return ModelManifest(repo, revision, COMMIT, MODEL_FILES, shape)


@pytest.fixture(autouse=True)
def fixed_model(monkeypatch):
    """Replace the hub lookup with a fixed manifest; records the calls it got."""
    calls: list[tuple] = []

    def resolve(repo, revision, endpoint, token):
        calls.append((repo, revision, endpoint, token))
        return fake_manifest(repo, revision)

    monkeypatch.setattr(hub, "resolve_model", resolve)
    return calls


def secrets(api_key: str | None = API_KEY, hf_token: str | None = None,
            tls_key: str | None = None, alerting: dict[str, str] | None = None) -> Secrets:
    return Secrets(
        ssh_private_key=pulumi.Output.secret(SSH_KEY),
        hf_token=pulumi.Output.secret(hf_token) if hf_token else None,
        vllm_api_key=pulumi.Output.secret(api_key) if api_key else None,
        gateway_tls_key=pulumi.Output.secret(tls_key) if tls_key else None,
        alerting=pulumi.Output.secret(alerting) if alerting else None,
    )


@pytest.fixture
def build(mocks, gb10_facts, config_raw):
    """build(nodes=2, raw=None, facts=None, plan=None, api_key=..., **sections) -> StackHandles."""
    from components import stack

    def _build(
        nodes: int = 2,
        raw: dict[str, Any] | None = None,
        facts: dict | None = None,
        plan: Any = None,
        api_key: str | None = API_KEY,
        hf_token: str | None = None,
        tls_key: str | None = None,
        alerting: dict[str, str] | None = None,
        **overrides: Any,
    ):
        cfg = validate_config(raw if raw is not None else config_raw(nodes, **overrides))
        if facts is None:
            facts = {n.name: gb10_facts(n.name, index=i + 1) for i, n in enumerate(cfg.nodes)}
        manifest = fake_manifest(cfg.model.repo, cfg.model.revision)
        services = {s.name: fake_manifest(s.repo, s.revision) for s in cfg.services}
        d = cfg.model.drafter
        drafter = fake_manifest(d.repo, d.revision) if d is not None else None
        return stack.build_stack(cfg, facts, plan or Plan(),
                                 secrets(api_key, hf_token, tls_key, alerting),
                                 manifest=manifest, service_manifests=services,
                                 drafter_manifest=drafter)

    return _build


def _record_option(mocks, monkeypatch, read: Callable[[Any], Any]) -> dict[str, Any]:
    """Resource name -> `read(request)` of each RegisterResource request the mock monitor gets
    (mocks do not show resource options)."""
    seen: dict[str, Any] = {}
    original = mocks.monitor.RegisterResource

    def record(request):
        seen[request.name] = read(request)
        return original(request)

    monkeypatch.setattr(mocks.monitor, "RegisterResource", record)
    return seen


@pytest.fixture
def ignored_changes(mocks, monkeypatch) -> dict[str, list[str]]:
    """Resource name -> the ignore_changes it was registered with."""
    return _record_option(mocks, monkeypatch, lambda r: list(r.ignoreChanges))


@pytest.fixture
def retained(mocks, monkeypatch) -> dict[str, bool]:
    """Resource name -> whether it was registered with retain_on_delete (kept on destroy)."""
    return _record_option(mocks, monkeypatch, lambda r: bool(r.retainOnDelete))


@pytest.fixture
def deleted_before_replace(mocks, monkeypatch) -> dict[str, bool]:
    """Resource name -> whether it was registered with delete_before_replace."""
    return _record_option(mocks, monkeypatch, lambda r: bool(r.deleteBeforeReplace))


@pytest.fixture
def dependencies(mocks, monkeypatch) -> dict[str, set[str]]:
    """Resource name -> the names of what the engine is told it depends on, read from the
    RegisterResource requests the mock monitor receives (the components keep no such list).
    A component in depends_on reaches the engine as the component's children."""
    deps: dict[str, set[str]] = {}
    original = mocks.monitor.RegisterResource

    def record(request):
        deps[request.name] = {urn.split("::")[-1] for urn in request.dependencies}
        return original(request)

    monkeypatch.setattr(mocks.monitor, "RegisterResource", record)
    return deps


def waits_for(deps: dict[str, set[str]], name: str) -> set[str]:
    """Everything `name` waits for, directly or through what it waits for (`dependencies`)."""
    seen: set[str] = set()
    todo = list(deps.get(name, ()))
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo += deps.get(d, ())
    return seen


def settled(h, *outputs):
    """An Output that resolves once every leaf resource of the stack has registered.

    Assertions on `mocks.resources` must run after the registrations they inspect; returning
    this (or applying on it) guarantees that, whatever order the SDK registers in.
    """
    leaves = []
    for n in h.cluster.nodes:
        leaves += [n.provider, *n.stopped]
    leaves += [*h.image.images.values(), *h.image.copies.values()]
    leaves += [r for r in (*h.image.seeder, *h.model.seeder) if r is not None]
    leaves += [h.model.fetch, *h.model.syncs.values(), *h.model.verifies.values()]
    leaves += list(h.model.drops.values())
    if h.drafter is not None:
        d = h.drafter
        leaves += [r for r in d.seeder if r is not None]
        leaves += [d.fetch, *d.syncs.values(), *d.verifies.values(), *d.drops.values()]
    if h.ray is not None:
        leaves += [h.ray.head, *h.ray.workers.values(), h.ray.ready, *h.ray.tokens.values()]
    leaves += [h.vllm.serve, *h.vllm.headless.values(), *h.vllm.caches.values()]
    leaves += [f.table for f in h.firewalls.values()]
    leaves += [*h.nccl.fabric_checks.values(), *h.image.probes.values(), h.image.check]
    leaves += [*h.gate.ranks.values(), *h.gate.done]
    leaves += [h.vllm.api_key_file, h.vllm.health, h.vllm.nccl_log, h.vllm.transport_check]
    leaves += [h.vllm.deployment, *h.vllm.deployment_nodes.values()]
    for svc in h.services.values():
        m = svc.model
        leaves += [m.fetch, *m.syncs.values(), *m.verifies.values(), *m.drops.values()]
        leaves += [*svc.containers.values(), *svc.gates.values(), *svc.deployments.values()]
    g = h.gateway
    leaves += [g.image, g.key, g.config, g.container, g.gate, *([g.tls] if g.tls else [])]
    if h.monitoring is not None:
        mon = h.monitoring
        leaves += [mon.image, mon.key, mon.data, mon.config, mon.container, mon.gate,
                   *mon.exporter_containers.values()]
    return pulumi.Output.all(*[r.urn for r in leaves], *outputs).apply(
        lambda values: values[len(leaves):]
    )
