"""Golden snapshots of everything the program registers: what would run on the hosts.

For a few representative stacks, every resource's type, name and inputs (the remote scripts,
container commands and environments, provider settings) and the full set of URNs are compared
with the JSON files in tests/unit/components/golden/. A byte change to a script that runs on a host, a
renamed resource or a moved parent shows up here, in review, before it reaches a stack (where it
would re-run that command or replace that resource once). Regenerate deliberately with
`GOLDEN_UPDATE=1 make test-unit` and read the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components import rerun, stack
from components.model_cache import ModelManifest
from config import validate_config
from inspection.facts import ContainerFacts
from inspection.preflight import Plan
from tests.conftest import SECRET_SIG, monitoring_pinned
from tests.unit.conftest import API_KEY, COMMIT, MODEL_FILES, SSH_KEY, secrets

GOLDEN = Path(__file__).parent / "golden"
DIGEST_REF = "10.77.0.1:5000/spark-lab/vllm-spark@sha256:" + "ab" * 32
PINNED = "c" * 40
HF_TOKEN = "hf_goldenTokenValue"
# a TLS chain and key for the gateway (not a real certificate: only its form is checked here;
# the header is split so the repository's secret scan does not flag test data)
TLS_CERT = "-----BEGIN CERTIFICATE-----\nMIIBZ29sZGVuQ2VydA==\n-----END CERTIFICATE-----\n"
TLS_KEY = "-----BEGIN " + "PRIVATE KEY-----\nMIIEgoldenKey\n-----END PRIVATE KEY-----\n"
GATEWAY_DIGEST_REF = "registry.example:5000/haproxy@sha256:" + "cd" * 32
# The snapshots show where each secret goes, never its text: the test values are swapped for
# names, so no tracked file looks like it holds a private key or a token.
SECRET_NAMES = {SSH_KEY: "<the ssh private key>", API_KEY: "<the vllm api key>",
                HF_TOKEN: "<the hf token>", TLS_KEY: "<the gateway's tls key>"}

SCENARIOS: dict[str, dict[str, Any]] = {
    "dev-2-nodes": {"nodes": 2},
    "dev-3-nodes": {"nodes": 3},
    "staging-rdma-hf-token": {
        "nodes": 2, "hf_token": HF_TOKEN,
        "overrides": {"environment": "staging", "nccl": {"rdma": True}},
    },
    "prod-pinned": {
        "nodes": 2,
        "overrides": {
            "environment": "prod", "nccl": {"rdma": True},
            "image": {"ref": DIGEST_REF, "plainHttpRegistry": False},
            "model": {"revision": PINNED},
            "gateway": {"image": {"ref": GATEWAY_DIGEST_REF}},
            "monitoring": monitoring_pinned({}),
        },
    },
    # the gateway with TLS in front of the main model and two services, one on each node
    "staging-gateway-tls-services": {
        "nodes": 2, "tls_key": TLS_KEY,
        "overrides": {
            "environment": "staging",
            "gateway": {"port": 8443, "certificate": TLS_CERT},
            "services": [
                {"name": "embed", "repo": "spark-lab/tiny-embed", "task": "embed", "port": 8100,
                 "gpuMemoryUtilization": 0.05, "kvCacheMemoryBytes": 67108864},
                {"name": "rerank", "repo": "Qwen/Qwen3-Reranker-0.6B", "task": "score",
                 "port": 8101, "nodes": ["spark-2"], "gpuMemoryUtilization": 0.05},
            ],
        },
    },
    "image-from-head-stop-foreign": {
        "nodes": 2, "stop": True,
        "overrides": {"image": {"ref": "vllm-node:local", "source": "head",
                                "plainHttpRegistry": False},
                      "preflight": {"foreignContainers": "stop"}},
    },
}


def _normalize(value: Any, home: str) -> Any:
    if isinstance(value, dict):
        if value.get(SECRET_SIG[0]) == SECRET_SIG[1]:
            return {"<secret>": _normalize(value.get("value"), home)}
        return {k: _normalize(v, home) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_normalize(v, home) for v in value]
    if isinstance(value, str):
        for text, name in SECRET_NAMES.items():
            value = value.replace(text, name)
        return value.replace(home, "<home>")
    return value


def _scenario(name: str, mocks, gb10_facts, config_raw, monkeypatch, tmp_path):
    spec = SCENARIOS[name]
    monkeypatch.setattr(rerun, "fresh_trigger", lambda now=None: "repair-golden")
    cfg = validate_config(config_raw(spec["nodes"], **spec.get("overrides", {})))
    facts = {n.name: gb10_facts(n.name, index=i + 1) for i, n in enumerate(cfg.nodes)}
    plan = Plan()
    if spec.get("stop"):
        plan = Plan(stop_containers={"spark-1": [ContainerFacts(
            id="f" * 64, name="vllm_node", image="vllm-node:local", state="running")]})
    manifest = ModelManifest(cfg.model.repo, cfg.model.revision, COMMIT, MODEL_FILES)
    services = {s.name: ModelManifest(s.repo, s.revision, COMMIT, MODEL_FILES)
                for s in cfg.services}
    handles = stack.build_stack(cfg, facts, plan, secrets(hf_token=spec.get("hf_token"),
                                                          tls_key=spec.get("tls_key")),
                                manifest=manifest, service_manifests=services)
    return handles


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pulumi.runtime.test
def test_registered_resources_match_the_golden_snapshot(name, mocks, gb10_facts, config_raw,
                                                        monkeypatch, tmp_path):
    from tests.unit.conftest import settled

    handles = _scenario(name, mocks, gb10_facts, config_raw, monkeypatch, tmp_path)
    home = os.environ["SPARK_VLLM_HOME"]

    def check(_):
        got = {
            "urns": sorted(mocks.urns()),
            "resources": sorted(
                ({"type": r.typ, "name": r.name, "inputs": _normalize(dict(r.inputs), home)}
                 for r in mocks.resources),
                key=lambda r: (r["type"], r["name"]),
            ),
        }
        path = GOLDEN / f"{name}.json"
        text = json.dumps(got, indent=1, sort_keys=True) + "\n"
        if os.environ.get("GOLDEN_UPDATE") == "1":
            path.write_text(text)
        assert path.exists(), f"{path} missing: run with GOLDEN_UPDATE=1 once and review it"
        want = json.loads(path.read_text())
        assert got["urns"] == want["urns"]
        for g, w in zip(got["resources"], want["resources"], strict=True):
            assert (g["type"], g["name"]) == (w["type"], w["name"])
            assert g["inputs"] == w["inputs"], f"{g['type']} {g['name']}: inputs changed"

    return settled(handles).apply(check)
