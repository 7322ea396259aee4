"""__main__.py end to end under mocks: config -> recon -> preflight -> components -> exports."""

from __future__ import annotations

import runpy

import pulumi
import pytest

from config import ConfigError
from inspection import preflight
from tests.conftest import ROOT, config_raw, fake_image_id
from tests.unit.conftest import COMMIT, MODEL_FILES


class _Plan:
    stop_containers: dict = {}
    warnings: list = []


@pytest.fixture
def program(mocks, set_config, gb10_facts, monkeypatch, tmp_path):
    """Run __main__.py with recon + preflight replaced by fixture facts; returns the exports."""
    calls = {}

    def run_preflight(cfg, *, key_path=None, model=None, services=None):
        # the hub's answers are asked for once the nodes are surveyed (looked up meanwhile)
        assert callable(model) and callable(services)
        calls["preflight"] = ([n.name for n in cfg.nodes], key_path, model().total_bytes)
        # what preflight judges the nodes' containers against: this stack's own label
        calls["label"] = preflight._stack_label()
        calls["services"] = services()
        plan = _Plan()
        plan.warnings = calls.get("warnings", [])
        return {n.name: gb10_facts(n.name, index=i + 1) for i, n in enumerate(cfg.nodes)}, plan

    monkeypatch.setattr(preflight, "run", run_preflight)
    monkeypatch.setenv("HOME", str(tmp_path))  # the secret SSH key is materialized under ~/.cache
    exports: dict = {}
    monkeypatch.setattr(pulumi, "export", lambda k, v: exports.__setitem__(k, v))

    def run(raw, warnings=()):
        calls["warnings"] = list(warnings)
        set_config(raw, secrets={"sshPrivateKey": "KEY", "vllmApiKey": "sk-main"})
        runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
        return exports, calls

    return run


@pulumi.runtime.test
def test_main_exports(program):
    exports, calls = program(config_raw(2))
    nodes, key_path, model_bytes = calls["preflight"]
    assert nodes == ["spark-1", "spark-2"]
    # preflight runs in a thread beside the hub's lookup, in the program's context: it knows
    # the stack (a pool thread sees the settings' defaults: its own containers read as another
    # stack's)
    assert calls["label"] == f"{pulumi.get_project()}/{pulumi.get_stack()}" != "project/stack"
    # the secret key was written to a stable 0600 file for ssh, and preflight got the model size
    assert key_path.endswith("/.cache/spark-vllm/keys/project.dev") or key_path.endswith(".dev")
    assert oct(__import__("os").stat(key_path).st_mode & 0o777) == "0o600"
    assert model_bytes == sum(f.size for f in MODEL_FILES)
    assert set(exports) == {
        "endpoint", "vllmApiKey", "servedModelName", "modelCommit", "imageIds", "imageProbe",
        "fabricCheck", "nodes", "recon", "ncclTransport", "services", "models", "backends",
        "gateway", "monitoring",
    }
    assert exports["models"] == ["tiny-moe"]
    # Prometheus (monitoring on in the dev stack) where the head reaches it: its loopback
    assert exports["monitoring"]["url"] == "http://127.0.0.1:9090"
    # the direct address is for diagnosis on the node, never the endpoint
    assert exports["backends"] == {"tiny-moe": ["spark-1 http://127.0.0.1:8000"]}
    assert exports["services"] == {} and calls["services"] == {}
    assert exports["servedModelName"] == "tiny-moe"
    assert exports["recon"]["spark-2"]["gpu"] == "NVIDIA GB10"
    assert exports["recon"]["spark-2"]["memTotalBytes"] == 125513720 * 1024
    # the dev stack names a tag: the nodes pull the repository at the digest the registry gave
    tag = "10.77.0.1:5000/spark-lab/vllm-spark:lab"
    image_id = fake_image_id(f"10.77.0.1:5000/spark-lab/vllm-spark@{fake_image_id(tag)}")

    def check(values):
        endpoint, commit, ids, nodes, probe = values
        assert probe["spark-2"] == ("python 3.12.3, torch 2.13.0 (CUDA 13.0), vllm 0.32.0, "
                                    "ray 2.60.0, libibverbs yes")
        assert endpoint == "http://10.77.0.11:8080/v1"  # the gateway's, on the head
        assert commit == COMMIT
        assert ids == {"spark-1": image_id, "spark-2": image_id}
        assert nodes["spark-1"]["role"] == "head" and nodes["spark-2"]["role"] == "worker"
        assert nodes["spark-2"]["fabricIp"] == "192.168.177.12"
        assert nodes["spark-2"]["imageId"] == image_id

    return pulumi.Output.all(
        exports["endpoint"], exports["modelCommit"], exports["imageIds"], exports["nodes"],
        exports["imageProbe"],
    ).apply(check)


@pulumi.runtime.test
def test_main_stops_on_bad_config_before_recon(program):
    raw = config_raw(2)
    raw["vllm"]["gpuMemoryUtilization"] = 1.5
    with pytest.raises(ConfigError, match="gpuMemoryUtilization"):
        program(raw)


@pulumi.runtime.test
def test_preflights_warnings_are_shown_by_every_preview_and_up(program, monkeypatch):
    """Plan.warnings (a crash loop, a clock off, ...) reach the engine's diagnostics: before, they
    were computed and never printed."""
    from inspection.preflight import Finding

    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, *a, **k: said.append(msg))
    loop = Finding(node="spark-1", check="crash_loop", fact="spark-vllm-dev-serve is "
                   "crash-looping: 4 restarts in the last 300 s (more than 2)", fix="see logs")
    exports, _ = program(config_raw(2), warnings=[loop])
    # (other warnings may come too: the committed dev passphrase's, when make sets it)
    assert [m for m in said if m.startswith("preflight: ")] == [f"preflight: {loop}"]
    return exports["endpoint"]
