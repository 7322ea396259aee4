"""Config validation: every bad value is named by key path, value and expected form."""

from __future__ import annotations

import asyncio
import copy

import pulumi
import pytest
import yaml

from config import ConfigError, load_config, load_secrets, plain_value, validate_config
from tests.conftest import ROOT, config_raw, monitoring_pinned


def _set(raw, path, value):
    """Set raw[path] where path is like 'nodes.1.fabric.0.ip'; value DELETE removes the key."""
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    target = raw
    for p in parts[:-1]:
        target = target[p]
    if value is DELETE:
        del target[parts[-1]]
    else:
        target[parts[-1]] = value


DELETE = object()
PLACE = "ssh-ed25519 PLACEHOLDERxREPLACEME"
DIGEST = "reg:5000/vllm@sha256:" + "a" * 64
GATEWAY_DIGEST = "reg:5000/haproxy@sha256:" + "c" * 64
COMMIT = "b" * 40

BAD = [
    # (id, environment, edits, key path in message, expected form in message)
    # issue 45: the node's firewall, and the block Ray's and vLLM's own ports are pinned to
    ("firewall-off-in-staging", "dev", {"firewall": {"enabled": False}, "environment": "staging"},
     "spark-vllm:firewall.enabled", "expected true in staging"),
    ("firewall-off-in-prod", "prod", {"firewall": {"enabled": False}},
     "spark-vllm:firewall.enabled", "expected true in prod"),
    ("port-block-holds-the-gateway", "dev", {"firewall": {"portBase": 8000}},
     "spark-vllm:firewall.portBase", "(spark-vllm:vllm.port is 8000)"),
    ("port-block-holds-sshd", "dev", {"firewall": {"portBase": 2200}, "nodes.1.port": 2222},
     "spark-vllm:firewall.portBase", "(spark-vllm:nodes[1].port (sshd on spark-2) is 2222)"),
    ("port-block-past-65535", "dev", {"firewall": {"portBase": 65400}},
     "spark-vllm:firewall.portBase", "less than or equal to 65336"),
    ("port-block-below-1024", "dev", {"firewall": {"portBase": 80}},
     "spark-vllm:firewall.portBase", "greater than or equal to 1024"),
    # issue 48: the node's guard
    ("guard-unknown-killer", "dev", {"guard.killer": "oomd"}, "spark-vllm:guard.killer",
     "'earlyoom' or 'systemd-oomd'"),
    ("guard-sshd-unkillable", "dev", {"guard.protectScoreAdj": -1000},
     "spark-vllm:guard.protectScoreAdj", "greater than or equal to -999"),
    ("guard-vllm-protected", "dev", {"guard.vllmScoreAdj": -1},
     "spark-vllm:guard.vllmScoreAdj", "greater than or equal to 0"),
    ("guard-unknown-key", "dev", {"guard.reserve": 1},
     "spark-vllm:guard.reserve", "unknown key; expected one of: enabled, killer, install"),
    ("guard-install-not-bool", "dev", {"guard.install": "maybe"},
     "spark-vllm:guard.install", "expected"),
    ("fabric-ip", "dev", {"nodes.1.fabric.0.ip": "300.1.1.1"},
     "spark-vllm:nodes[1].fabric[0].ip", "expected an IPv4 address"),
    ("fabric-ip-outside-subnet", "dev", {"nodes.1.fabric.0.ip": "10.9.9.9"},
     "spark-vllm:nodes[1].fabric[0].ip", "inside spark-vllm:nccl.fabricSubnets"),
    # issue 33: what the stack's own fabric configuration needs
    ("fabric-mtu-below-floor", "dev", {"fabric": {"mtu": 1500}},
     "spark-vllm:fabric.mtu", "expected at least spark-vllm:nccl.minMtu 9000"),
    ("twins-in-one-subnet", "dev", {"nodes.1.fabric.1.ip": "192.168.177.22"},
     "spark-vllm:nodes[1].fabric[1].ip", "in a subnet of its own"),
    ("management-inside-the-fabric", "dev", {"nodes.1.host": "192.168.178.50"},
     "spark-vllm:nodes[1].host", "outside spark-vllm:nccl.fabricSubnets"),
    ("duplicate-name", "dev", {"nodes.1.name": "spark-1"},
     "spark-vllm:nodes[1].name", "expected a unique node name"),
    ("name-not-dns", "dev", {"nodes.0.name": "Spark_1"},
     "spark-vllm:nodes[0].name", "expected a DNS-safe name"),
    ("no-nodes", "dev", {"nodes": []}, "spark-vllm:nodes", "expected at least 1 item"),
    ("host-key-form", "dev", {"nodes.0.hostKey": "AAAAC3Nza"},
     "spark-vllm:nodes[0].hostKey", "expected '<type> <base64>'"),
    ("host-key-rsa", "dev", {"nodes.0.hostKey": "ssh-rsa AAAAB3NzaC1yc2E"},
     "spark-vllm:nodes[0].hostKey", "an ssh-rsa pin cannot be verified"),
    ("unknown-node-key", "dev", {"nodes.0.hostkey": "x"},
     "spark-vllm:nodes[0].hostkey",
     "unknown key; expected one of: name, host, port, user, hostKey"),
    ("ssh-port", "dev", {"nodes.0.port": 70000}, "spark-vllm:nodes[0].port", "between 1 and 65535"),
    ("tp-pp-mismatch", "dev", {"vllm.tensorParallelSize": 4},
     "spark-vllm:vllm.tensorParallelSize", "expected the product to equal the GPUs in the cluster"),
    ("util-too-high", "dev", {"vllm.gpuMemoryUtilization": 1.0},
     "spark-vllm:vllm.gpuMemoryUtilization", "strictly between 0 and 1"),
    ("util-zero", "dev", {"vllm.gpuMemoryUtilization": 0},
     "spark-vllm:vllm.gpuMemoryUtilization", "strictly between 0 and 1"),
    ("vllm-port", "dev", {"vllm.port": 0}, "spark-vllm:vllm.port", "between 1 and 65535"),
    ("ray-port-type", "dev", {"ray.port": "six"}, "spark-vllm:ray.port", "expected an integer"),
    ("environment", "dev", {"environment": "production"},
     "spark-vllm:environment", "expected one of 'dev', 'staging' or 'prod'"),
    ("foreign-containers", "dev", {"preflight.foreignContainers": "kill"},
     "spark-vllm:preflight.foreignContainers", "expected one of 'fail', 'stop' or 'ignore'"),
    ("subnet-form", "dev", {"nccl.fabricSubnets": ["192.168.177.1/24"]},
     "spark-vllm:nccl.fabricSubnets", "CIDR form"),
    ("image-source", "dev", {"image.source": "build"},
     "spark-vllm:image.source", "expected one of 'registry' or 'head'"),
    ("repo-form", "dev", {"model.repo": "tiny-moe"}, "spark-vllm:model.repo", "'<org>/<name>'"),
    ("cache-dir-relative", "dev", {"model.cacheDir": "cache"},
     "spark-vllm:model.cacheDir", "expected an absolute path"),
    ("missing-image", "dev", {"image": DELETE}, "spark-vllm:image", "this key is required"),
    ("nofile-too-low", "dev", {"ray.nofile": 10},
     "spark-vllm:ray.nofile", "greater than or equal to 1024"),
    ("unknown-section-key", "dev", {"ray.objectStore": 1},
     "spark-vllm:ray.objectStore", "objectStoreBytes"),
    ("prod-image-tag", "prod", {"image.ref": "reg:5000/vllm:latest"},
     "spark-vllm:image.ref", "expected an image pinned by digest"),
    ("prod-revision-branch", "prod", {"model.revision": "main"},
     "spark-vllm:model.revision", "expected a 40-hex commit in prod"),
    ("prod-placeholder-key", "prod", {"nodes.1.hostKey": PLACE},
     "spark-vllm:nodes[1].hostKey", "expected the real host key"),
    ("prod-rdma-off", "prod", {"nccl.rdma": False},
     "spark-vllm:nccl.rdma", "expected true in prod"),
]

# What a review found config would silently accept (issue "values from one host reach another
# host's root shell" / "config that silently weakens the stack"): each is refused by key path.
WEAKENING = [
    ("revision-traversal", {"model.revision": "../../../../x"},
     "spark-vllm:model.revision", "contains '..'"),
    ("revision-control", {"model.revision": "main\n$(id)"},
     "spark-vllm:model.revision", "control character"),
    ("cache-root", {"model.cacheDir": "/"}, "spark-vllm:model.cacheDir", "dedicated root"),
    ("cache-etc", {"model.cacheDir": "/etc"}, "spark-vllm:model.cacheDir", "dedicated root"),
    ("cache-dotdot", {"model.cacheDir": "/root/../etc"},
     "spark-vllm:model.cacheDir", "normalised path (this one means /etc)"),
    ("cache-colon", {"model.cacheDir": "/data/a:b"},
     "spark-vllm:model.cacheDir", "letters, digits and ._-/"),
    ("endpoint-credentials", {"model.endpoint": "http://u:p@mirror:8090"},
     "spark-vllm:model.endpoint", "without credentials"),
    ("endpoint-injection", {"model.endpoint": "http://mirror x\n$(id)"},
     "spark-vllm:model.endpoint", "expected an http(s) URL"),
    ("env-hf-token", {"nccl.extraEnv": {"HF_TOKEN": "hf_" + "a" * 34}},
     "spark-vllm:nccl.extraEnv", "no secrets in plain environment (HF_TOKEN)"),
    ("env-api-key", {"nccl.extraEnv": {"VLLM_API_KEY": "x"}},
     "spark-vllm:nccl.extraEnv", "no secrets in plain environment (VLLM_API_KEY)"),
    ("env-token-value", {"nccl.extraEnv": {"FOO": "sk-" + "b" * 24}},
     "spark-vllm:nccl.extraEnv", "no secrets in plain environment (FOO)"),
    ("args-host", {"vllm.extraArgs": ["--host", "0.0.0.0"]},
     "spark-vllm:vllm.extraArgs", "--host is owned by spark-vllm:vllm.host"),
    ("args-api-key", {"vllm.extraArgs": ["--api-key=x"]},
     "spark-vllm:vllm.extraArgs", "the secret spark-vllm:vllmApiKey"),
    ("args-port", {"vllm.extraArgs": ["--port", "9"]},
     "spark-vllm:vllm.extraArgs", "spark-vllm:vllm.port"),
    ("args-trust-remote-code", {"vllm.extraArgs": ["--trust-remote-code"]},
     "spark-vllm:vllm.extraArgs", "owned by spark-vllm:vllm.trustRemoteCode (set that key"),
    ("trust-remote-code-unpinned", {"vllm.trustRemoteCode": True},
     "spark-vllm:model.revision", "got 'main'; expected a 40-hex commit with trustRemoteCode"),
    # the spellings vLLM's parser reads as those flags (tests/e2e/test_vllm_flags.py shows it)
    ("args-api-key-underscore", {"vllm.extraArgs": ["--api_key=x"]},
     "spark-vllm:vllm.extraArgs", "--api-key (as '--api_key') is owned by the secret"),
    ("args-host-abbreviated", {"vllm.extraArgs": ["--hos", "0.0.0.0"]},
     "spark-vllm:vllm.extraArgs", "--host (as '--hos') is owned by spark-vllm:vllm.host"),
    ("args-trust-abbreviated", {"vllm.extraArgs": ["--trust_remote"]},
     "spark-vllm:vllm.extraArgs", "--trust-remote-code (as '--trust_remote') is owned by "
                                  "spark-vllm:vllm.trustRemoteCode"),
    # issue 46, item 2: attached short options, and the flags that open a door or load code
    ("args-nnodes-attached", {"vllm.extraArgs": ["-n2"]},
     "spark-vllm:vllm.extraArgs", "-n (as '-n2') is owned by the stack"),
    ("args-node-rank-attached", {"vllm.extraArgs": ["-r1"]},
     "spark-vllm:vllm.extraArgs", "-r (as '-r1') is owned by the stack"),
    ("args-kv-transfer", {"vllm.extraArgs": ["--kv-transfer-config", '{"kv_connector":"x"}']},
     "spark-vllm:vllm.extraArgs", "--kv-transfer-config imports the KV connector module"),
    ("args-data-parallel", {"vllm.extraArgs": ["-dp", "2"]},
     "spark-vllm:vllm.extraArgs", "-dp starts data-parallel replicas"),
    ("args-data-parallel-address", {"vllm.extraArgs": ["--data-parallel-addr=10.0.0.1"]},
     "spark-vllm:vllm.extraArgs", "--data-parallel-address (as '--data-parallel-addr') starts"),
    ("args-otlp", {"vllm.extraArgs": ["--otlp-traces-endpoint", "http://x:4317"]},
     "spark-vllm:vllm.extraArgs", "--otlp-traces-endpoint sends every request's traces"),
    ("args-local-media", {"vllm.extraArgs": ["--allowed_local_media_path=/"]},
     "spark-vllm:vllm.extraArgs", "--allowed-local-media-path (as '--allowed_local_media_path') "
                                  "lets a request read files of the node"),
    ("args-spec-model", {"vllm.extraArgs": ["--spec-model", "org/drafter"]},
     "spark-vllm:vllm.extraArgs", "--spec-model is owned by spark-vllm:vllm.speculativeConfig"),
    ("args-dotted-key", {"vllm.extraArgs": ["--speculative-config.revision", "main"]},
     "spark-vllm:vllm.extraArgs", "--speculative-config (as '--speculative-config.revision') is "
                                  "owned by spark-vllm:vllm.speculativeConfig"),
    ("max-model-len-huge", {"vllm.maxModelLen": 2**62},
     "spark-vllm:vllm.maxModelLen", "less than or equal to 16777216"),
    ("max-num-seqs-huge", {"vllm.maxNumSeqs": 10**9},
     "spark-vllm:vllm.maxNumSeqs", "less than or equal to 65536"),
    ("max-num-batched-tokens-huge", {"vllm.maxNumBatchedTokens": 2**40},
     "spark-vllm:vllm.maxNumBatchedTokens", "less than or equal to 16777216"),
    ("kv-cache-bytes-huge", {"vllm.kvCacheMemoryBytes": 2**62},
     "spark-vllm:vllm.kvCacheMemoryBytes", "less than or equal to 549755813888"),
    ("served-name-long", {"vllm.servedModelName": "m" * 200},
     "spark-vllm:vllm.servedModelName", "at most 128 characters"),
    ("args-config-file", {"vllm.extraArgs": ["--config", "/tmp/flags.yaml"]},
     "spark-vllm:vllm.extraArgs", "--config reads flags from a file the stack cannot check"),
    ("drafter-not-declared", {"vllm.speculativeConfig": {"method": "eagle3",
                                                         "model": "org/eagle3-head"}},
     "spark-vllm:vllm.speculativeConfig.model",
     "declare it as spark-vllm:model.drafter {repo: org/eagle3-head"),
    ("drafter-unused", {"model.drafter": {"repo": "org/eagle3-head"}},
     "spark-vllm:model.drafter", "expected spark-vllm:vllm.speculativeConfig.model to name it"),
    ("port-seeder", {"vllm.port": 18472}, "spark-vllm:vllm.port", "the stack's seeders'"),
    ("ray-port-seeder", {"ray.port": 18471}, "spark-vllm:ray.port", "the stack's seeders'"),
    ("port-bool", {"ray.port": True}, "spark-vllm:ray.port", "expected an integer"),
    ("port-string", {"nodes.0.port": "22"}, "spark-vllm:nodes[0].port", "expected an integer"),
    ("duplicate-host", {"nodes.1.host": "10.77.0.11"},
     "spark-vllm:nodes[1].host", "a management address of its own"),
    ("interface-twice", {"nodes.0.fabric.1.interface": "enp1s0f1np1"},
     "spark-vllm:nodes[0].fabric[1].interface", "each fabric interface once"),
    ("loopback-fabric", {"nodes.0.fabric.0.interface": "lo"},
     "spark-vllm:nodes[0].fabric[0].interface", "not the loopback"),
    ("subnet-everything", {"nccl.fabricSubnets": ["0.0.0.0/0"]},
     "spark-vllm:nccl.fabricSubnets", "/16 or narrower"),
    ("object-store-huge", {"ray.objectStoreBytes": 2**50},
     "spark-vllm:ray.objectStoreBytes", "less than or equal to"),
    ("shm-removed", {"ray.shmBytes": 2**30}, "spark-vllm:ray.shmBytes",
     "the key was removed, it never took effect"),
    ("allow-wildcard", {"preflight.allowContainers": ["*"]},
     "spark-vllm:preflight.allowContainers", "exact container names"),
    ("ipv6-host", {"nodes.0.host": "fd00::11"},
     "spark-vllm:nodes[0].host", "IPv6 management addresses are not supported"),
    ("image-ref-injection", {"image.ref": "reg:5000/x:tag;id"},
     "spark-vllm:image.ref", "expected an image reference"),
]


@pytest.mark.parametrize("case", WEAKENING, ids=[c[0] for c in WEAKENING])
def test_config_that_would_weaken_the_stack_is_refused(case):
    _, edits, key, expected = case
    raw = config_raw(2)
    for path, value in edits.items():
        _set(raw, path, value)
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    problem = next((p for p in err.value.problems if p.startswith(key + ":")), None)
    assert problem is not None, f"no problem names {key}: {err.value.problems}"
    assert expected in problem, problem


def test_long_values_are_cut_in_messages():
    raw = config_raw(2)
    raw["vllm"]["servedModelName"] = "x" * 5000 + "!"
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    assert len(err.value.problems[0]) < 400 and "(5003 chars)" in err.value.problems[0]


def prod_ready(raw):
    raw["environment"] = "prod"
    raw["image"]["ref"] = DIGEST
    raw["model"]["revision"] = COMMIT
    raw["nccl"]["rdma"] = True
    raw["gateway"] = {**raw["gateway"], "image": {"ref": GATEWAY_DIGEST}}
    raw["monitoring"] = monitoring_pinned(raw["monitoring"])
    return raw


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_config_names_key_and_expected_form(case):
    _, env, edits, key, expected = case
    raw = config_raw(2)
    if env == "prod":
        prod_ready(raw)
    for path, value in edits.items():
        _set(raw, path, value)
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    problem = next((p for p in err.value.problems if p.startswith(key + ":")), None)
    assert problem is not None, f"no problem names {key}: {err.value.problems}"
    assert expected in problem
    assert isinstance(err.value, pulumi.RunError)  # the CLI prints the message, no traceback


def test_bad_value_is_quoted_in_the_message():
    raw = config_raw(2)
    raw["nodes"][1]["fabric"][0]["ip"] = "300.1.1.1"
    with pytest.raises(ConfigError, match=r"nodes\[1\]\.fabric\[0\]\.ip: got '300\.1\.1\.1'"):
        validate_config(raw)


def test_prod_ready_config_passes_and_defaults_follow_gb10_notes():
    raw = prod_ready(config_raw(2))
    for section in ("ray", "preflight", "health"):
        raw.pop(section)
    raw["vllm"].pop("gpuMemoryUtilization")
    cfg = validate_config(raw)
    assert cfg.vllm.gpu_memory_utilization == 0.80
    assert cfg.ray.object_store_bytes == 1024**3
    assert cfg.ray.dashboard is False
    assert cfg.ray.nofile == 1048576  # sharded checkpoints under Ray need many open files
    assert cfg.preflight.foreign_containers == "fail"
    assert cfg.tensor_parallel_size * cfg.vllm.pipeline_parallel_size == 2
    # a hung vLLM is restarted after at most 4 x (15 + 30) s: the 122B answers a 1-token
    # request in well under the probe's 30 s, and 4 probes ride out a slow minute
    live = cfg.health.liveness
    assert (live.enabled, live.interval_seconds, live.probe_timeout_seconds, live.failures) == \
        (True, 15, 30, 4)


@pytest.mark.parametrize(("liveness", "message"), [
    ({"intervalSeconds": 1}, r"health\.liveness\.intervalSeconds"),
    ({"probeTimeoutSeconds": 0}, r"health\.liveness\.probeTimeoutSeconds"),
    ({"failures": 0}, r"health\.liveness\.failures"),
    ({"enabled": "sometimes"}, r"health\.liveness\.enabled"),
    ({"restartAfter": 3}, r"health\.liveness\.restartAfter"),
])
def test_bad_liveness_settings_are_refused_by_key_path(liveness, message):
    raw = config_raw(2)
    raw["health"] = {**raw.get("health", {}), "liveness": liveness}
    with pytest.raises(ConfigError, match=message):
        validate_config(raw)


def test_gpus_per_node_overrides_the_tp_rule():
    raw = config_raw(2)
    raw["vllm"]["tensorParallelSize"] = 4
    raw["ray"] = {**raw["ray"], "gpusPerNode": 2}
    assert validate_config(raw).cluster_gpus == 4


def test_stack_files():
    def load(stack):
        data = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
        return {k.split(":", 1)[1]: v for k, v in data.items()}

    dev = validate_config(load("dev"))
    assert [n.name for n in dev.nodes] == ["spark-1", "spark-2"] and not dev.nccl.rdma
    staging = validate_config(load("staging"))
    assert staging.nccl.rdma and staging.nodes[0].host.startswith("192.0.2.")
    with pytest.raises(ConfigError) as err:  # prod refuses its placeholders until filled in
        validate_config(load("prod"))
    keys = {p.split(":")[1].split(":")[0] for p in err.value.problems}
    assert keys == {"image.ref", "model.revision", "nodes[0].hostKey", "nodes[1].hostKey",
                    "services[0].revision", "services[1].revision", "gateway.image.ref"}
    assert [s.name for s in staging.services] == [s["name"] for s in load("prod")["services"]]


@pulumi.runtime.test
def test_load_config_reads_pulumi_config_and_rejects_unknown_top_level_keys(mocks, set_config):
    raw = config_raw(2)
    set_config(raw)
    cfg = load_config()
    assert cfg.head.name == "spark-1" and cfg.model.repo == "spark-lab/tiny-moe"
    set_config({**raw, "vllmm": {"port": 1}})
    with pytest.raises(ConfigError, match=r"spark-vllm:vllmm: unknown key"):
        load_config()


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("vllm", '{"maxModelLen": 4096}', {"maxModelLen": 4096}),  # the Automation API's JSON text
    ("nodes", [{"name": "spark-1"}], [{"name": "spark-1"}]),   # a YAML object as it is
    ("vllm", "{not json", "{not json"),                       # left for validation to refuse
    ("environment", "123", "123"),                            # Config.get: always text
    ("model", "123", 123),
])
def test_the_cli_reads_a_plain_stack_value_as_the_program_does(key, value, expected):
    """tools/ (recon, init, promote, reconcile, rollback) read stack files through this one
    rule; `environment` stays text as load_config's Config.get keeps it."""
    got = plain_value(value, key)
    assert got == expected and type(got) is type(expected)


@pulumi.runtime.test
def test_secrets_must_be_secret_and_stay_outputs(mocks, set_config):
    raw = config_raw(2)
    cfg = validate_config(raw)
    set_config(raw, secrets={"vllmApiKey": "sk-x", "sshPrivateKey": "KEY"})
    s = load_secrets(cfg)
    assert isinstance(s.vllm_api_key, pulumi.Output) and s.hf_token is None
    # a secret key set in plaintext is refused
    set_config({**raw, "hfToken": "hf_plain"}, secrets={"sshPrivateKey": "KEY"})
    with pytest.raises(ConfigError, match=r"spark-vllm:hfToken: set in plaintext"):
        load_secrets(cfg)
    # outside dev the vLLM API key is required
    staging = validate_config({**copy.deepcopy(raw), "environment": "staging"})
    set_config(raw, secrets={"sshPrivateKey": "KEY"})
    with pytest.raises(ConfigError, match=r"spark-vllm:vllmApiKey: missing"):
        load_secrets(staging)
    # an HF token never goes to a plain-http mirror outside dev
    mirror = validate_config({**copy.deepcopy(raw), "environment": "staging",
                              "model": {**raw["model"], "endpoint": "http://mirror:8090"}})
    set_config(raw, secrets={"sshPrivateKey": "KEY", "vllmApiKey": "sk-x",
                             "hfToken": "hf_" + "t" * 34})
    with pytest.raises(ConfigError, match=r"spark-vllm:model.endpoint: got 'http://mirror:8090'; "
                                          r"expected an https URL when"):
        load_secrets(mirror)

    async def still_secret():
        assert await s.vllm_api_key.is_secret()
        assert await s.ssh_private_key.is_secret()

    return asyncio.ensure_future(still_secret())


def test_speculative_drafter_from_another_repo_or_with_its_own_revision_is_refused():
    raw = config_raw(2)
    raw["vllm"]["speculativeConfig"] = {"method": "draft_model", "model": "other/drafter"}
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    assert "spark-vllm:vllm.speculativeConfig.model: got 'other/drafter'; expected the served " \
           "repo 'spark-lab/tiny-moe', no model (MTP) or the declared drafter (declare it as " \
           "spark-vllm:model.drafter {repo: other/drafter, revision: <40-hex commit>})" \
           in str(err.value)
    # declared, it is the stack's to fetch and pin (issue 44, item 4)
    raw["model"] = {**raw["model"], "drafter": {"repo": "other/drafter"}}
    cfg = validate_config(raw)
    assert cfg.model.drafter is not None and cfg.model.drafter.revision == "main"
    drafter = cfg.drafter_model()
    assert drafter is not None and (drafter.repo, drafter.cache_dir) == (
        "other/drafter", cfg.model.cache_dir)
    # with the drafter's code run (trustRemoteCode), the drafter is pinned too
    raw["model"]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    raw["vllm"]["trustRemoteCode"] = True
    with pytest.raises(ConfigError, match=r"spark-vllm:model.drafter.revision: got 'main'; "
                                          "expected a 40-hex commit with trustRemoteCode"):
        validate_config(raw)
    raw["model"]["drafter"]["revision"] = "89abcdef0123456789abcdef0123456789abcdef"
    assert validate_config(raw).vllm.trust_remote_code is True
    raw["vllm"]["trustRemoteCode"] = False
    raw["model"].pop("drafter")
    raw["vllm"]["speculativeConfig"] = {"method": "mtp", "revision": "main"}
    with pytest.raises(ConfigError, match=r"speculativeConfig\.revision: got 'main'; expected no "
                                          "revision"):
        validate_config(raw)
    raw["vllm"]["speculativeConfig"] = {"method": "mtp", "num_speculative_tokens": 1}
    assert validate_config(raw).vllm.speculative_config == {"method": "mtp",
                                                           "num_speculative_tokens": 1}


@pytest.mark.parametrize("arg", ["--moe-backend", "--chat-template-content-format=string",
                                 "--reasoning-parser-x", "--tokenizer-revision", "-O3",
                                 "--enable", "main", "-"])
def test_flags_the_stack_does_not_own_pass_extra_args(arg):
    """Longer flags that start like an owned one, a value, and an abbreviation that is
    ambiguous among the owned flags (vLLM refuses that one itself) are not owned."""
    from config.serve import owned_flag

    assert owned_flag(arg) is None


# Issue 31, item 7: patterns checked with `.match` and `^...$` let a trailing newline through
# (`$` matches before a final newline); every pattern is a fullmatch now.
NEWLINE_KEYS = [("nodes", 0, "fabric", 0, "interface"), ("nodes", 0, "fabric", 0, "hca"),
                ("nodes", 0, "host"), ("nodes", 0, "hostKey"), ("nodes", 0, "name"),
                ("nodes", 0, "user"), ("model", "repo"), ("model", "revision"),
                ("model", "cacheDir"), ("image", "ref"), ("vllm", "servedModelName"),
                ("preflight", "minDockerVersion")]


@pytest.mark.parametrize("where", NEWLINE_KEYS, ids=lambda w: ".".join(map(str, w)))
def test_a_trailing_newline_is_refused_everywhere(where):
    raw = config_raw(2)
    raw["nodes"][0]["host"] = "spark-1.lab.example"  # the hostname form, not an IPv4
    raw["nodes"][0]["hostKey"] = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHn0deKeyOne"
    node = raw
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = node.get(where[-1], "x") + "\n"
    try:
        cfg = validate_config(raw)
    except ConfigError as exc:
        assert any(p.startswith("spark-vllm:" + where[0]) for p in exc.problems), exc.problems
        return
    # or normalised without it (a pasted host key's line end is stripped)
    assert "\\n" not in cfg.model_dump_json(), where


def test_a_secret_in_extra_args_or_env_is_refused_and_never_printed():
    """`vllm.extraArgs` holds no secret (a command line is seen by every process on the node and
    is in the state): a secret-named flag or a token-shaped value is refused, and the error's
    `got` shows neither; likewise a secret in `nccl.extraEnv`. `--max-num-batched-tokens` and
    `--tokenizer` are not secret flags."""
    from config.forms import secret_flag

    token = "hf_" + "Zz9Yy8Xx7W" * 4
    for extra in (["--hf-token", token], ["--db-password=hunter2hunter2"], ["--seed", token]):
        raw = config_raw()
        raw["vllm"] = {**raw["vllm"], "extraArgs": extra}
        with pytest.raises(ConfigError) as info:
            validate_config(raw)
        text = str(info.value)
        assert "expected no secret on vLLM's command line" in text, text
        assert token not in text and "hunter2" not in text and "<secret, not shown>" in text
    raw = config_raw()
    raw["nccl"] = {**raw.get("nccl", {}), "extraEnv": {"NCCL_X": token, "HF_TOKEN": "abc123"}}
    with pytest.raises(ConfigError) as info:
        validate_config(raw)
    assert token[:12] not in str(info.value) and "abc123" not in str(info.value)
    assert not secret_flag("--max-num-batched-tokens") and not secret_flag("--tokenizer")
    assert secret_flag("--hf-token") and secret_flag("--API-KEY=x")
