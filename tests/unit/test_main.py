"""__main__.py end to end under mocks: config -> recon -> preflight -> components -> exports."""

from __future__ import annotations

import runpy

import pulumi
import pytest

from components import preflight, recon
from components.config import ConfigError
from tests.conftest import ROOT, config_raw, fake_image_id
from tests.unit.conftest import COMMIT


class _Plan:
    stop_containers: dict = {}


@pytest.fixture
def program(mocks, set_config, gb10_facts, monkeypatch):
    """Run __main__.py with recon/preflight replaced by fixture facts; returns the exports."""
    calls = {}

    def survey(cfg):
        calls["survey"] = [n.name for n in cfg.nodes]
        return {n.name: gb10_facts(n.name, index=i + 1) for i, n in enumerate(cfg.nodes)}

    def check(cfg, facts):
        calls["check"] = sorted(facts)
        return _Plan()

    monkeypatch.setattr(recon, "survey", survey)
    monkeypatch.setattr(preflight, "check", check)
    exports: dict = {}
    monkeypatch.setattr(pulumi, "export", lambda k, v: exports.__setitem__(k, v))

    def run(raw):
        set_config(raw, secrets={"sshPrivateKey": "KEY", "vllmApiKey": "sk-main"})
        runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__")
        return exports, calls

    return run


@pulumi.runtime.test
def test_main_exports(program):
    exports, calls = program(config_raw(2))
    assert calls == {"survey": ["spark-1", "spark-2"], "check": ["spark-1", "spark-2"]}
    assert set(exports) == {
        "endpoint", "servedModelName", "modelCommit", "imageIds", "nodes", "recon"
    }
    assert exports["servedModelName"] == "tiny-moe"
    assert exports["recon"]["spark-2"]["gpu"] == "NVIDIA GB10"
    assert exports["recon"]["spark-2"]["memTotalBytes"] == 125513720 * 1024
    image_id = fake_image_id("10.77.0.1:5000/spark-vllm-lab:latest")

    def check(values):
        endpoint, commit, ids, nodes = values
        assert endpoint == "http://10.77.0.11:8000/v1"
        assert commit == COMMIT
        assert ids == {"spark-1": image_id, "spark-2": image_id}
        assert nodes["spark-1"]["role"] == "head" and nodes["spark-2"]["role"] == "worker"
        assert nodes["spark-2"]["fabricIp"] == "192.168.177.12"
        assert nodes["spark-2"]["imageId"] == image_id

    return pulumi.Output.all(
        exports["endpoint"], exports["modelCommit"], exports["imageIds"], exports["nodes"]
    ).apply(check)


@pulumi.runtime.test
def test_main_stops_on_bad_config_before_recon(program):
    raw = config_raw(2)
    raw["vllm"]["gpuMemoryUtilization"] = 1.5
    with pytest.raises(ConfigError, match="gpuMemoryUtilization"):
        program(raw)
