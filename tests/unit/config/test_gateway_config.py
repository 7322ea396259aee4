"""`spark-vllm:gateway` and where vLLM listens (config/gateway.py, config/listen.py): every bad
value named by key path, the secret TLS key, and the addresses the stack picks."""

from __future__ import annotations

import copy

import pulumi
import pytest

from config import ConfigError, load_secrets, validate_config
from config.listen import LOOPBACK, served_names, service_host, vllm_host
from tests.conftest import config_raw, monitoring_pinned

CERT = "-----BEGIN CERTIFICATE-----\nMIIBkTCB+wIJAKHB\n-----END CERTIFICATE-----\n"
CHAIN = CERT + "\n" + CERT.replace("MIIB", "MIIC")
KEY_PEM = "-----BEGIN " + "PRIVATE KEY-----\nMIIEvQ\n-----END PRIVATE KEY-----\n"
EMBED = {"name": "embed", "repo": "org/e", "task": "embed", "port": 8100,
         "gpuMemoryUtilization": 0.05}


def _raw(**edits):
    raw = config_raw(2)
    for path, value in edits.items():
        section, *rest = path.split(".")
        target = raw.setdefault(section, {})
        for p in rest[:-1]:
            target = target.setdefault(p, {})
        if rest:
            target[rest[-1]] = value
        else:
            raw[section] = value
    return raw


def _problem(raw, key: str) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    found = [p for p in err.value.problems if p.startswith(key + ":")]
    assert found, f"no problem names {key}: {err.value.problems}"
    return found[0]


BAD = [
    # (id, edits, key path, expected words)
    ("no-section", {"gateway": None}, "spark-vllm:gateway", "this key is required"),
    ("no-image", {"gateway": {"port": 8080}}, "spark-vllm:gateway.image", "required"),
    ("image-injection", {"gateway.image.ref": "reg:5000/haproxy:2.6;id"},
     "spark-vllm:gateway.image.ref", "expected an image reference"),
    ("port-zero", {"gateway.port": 0}, "spark-vllm:gateway.port", "between 1 and 65535"),
    ("port-string", {"gateway.port": "8080"}, "spark-vllm:gateway.port", "expected an integer"),
    ("port-of-vllm", {"gateway.port": 8000}, "spark-vllm:gateway.port",
     "a port other than spark-vllm:vllm.port"),
    ("port-of-ray", {"gateway.port": 6379}, "spark-vllm:gateway.port",
     "a port other than spark-vllm:ray.port"),
    ("port-of-sshd", {"gateway.port": 22}, "spark-vllm:gateway.port",
     "spark-vllm:nodes[0].port (sshd on spark-1)"),
    ("port-of-seeder", {"gateway.port": 18472}, "spark-vllm:gateway.port", "seeders'"),
    ("port-of-a-service-on-the-head", {"gateway.port": 8100, "services": [EMBED]},
     "spark-vllm:gateway.port", "spark-vllm:services[0].port"),
    ("port-of-mp-master", {"gateway.port": 29501, "vllm.executor": "mp"},
     "spark-vllm:gateway.port", "spark-vllm:vllm.masterPort"),
    ("unknown-key", {"gateway.host": "0.0.0.0"}, "spark-vllm:gateway.host", "unknown key"),
    ("body-too-small", {"gateway.maxBodyBytes": 1024}, "spark-vllm:gateway.maxBodyBytes",
     "greater than or equal to 65536"),
    ("body-too-large", {"gateway.maxBodyBytes": 2**30}, "spark-vllm:gateway.maxBodyBytes",
     "less than or equal to 67108864"),
    ("cert-garbage", {"gateway.certificate": "not a certificate"},
     "spark-vllm:gateway.certificate", "expected PEM certificates"),
    ("cert-with-its-key", {"gateway.certificate": CERT + KEY_PEM},
     "spark-vllm:gateway.certificate", "the private key is the secret spark-vllm:gatewayTlsKey"),
    ("cert-not-base64", {"gateway.certificate": CERT.replace("MIIB", "M!IB")},
     "spark-vllm:gateway.certificate", "expected PEM certificates"),
    # vLLM listens only where the gateway reaches it
    ("vllm-every-address", {"vllm.host": "0.0.0.0"}, "spark-vllm:vllm.host",
     "127.0.0.1 or a fabric address of the head"),
    ("vllm-management-address", {"vllm.host": "10.77.0.11"}, "spark-vllm:vllm.host",
     "which alone listens beyond the node"),
    ("vllm-a-workers-fabric", {"vllm.host": "192.168.177.12"}, "spark-vllm:vllm.host",
     "a fabric address of the head ['192.168.177.11', '192.168.178.11']"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_gateway_config_names_key_and_expected_form(case):
    _, edits, key, expected = case
    raw = _raw(**edits)
    if raw.get("gateway") is None:
        raw.pop("gateway")
    assert expected in _problem(raw, key)


def test_prod_pins_the_gateway_image_by_digest():
    raw = _raw(environment="prod", **{"image.ref": "reg:5000/v@sha256:" + "a" * 64,
                                      "model.revision": "b" * 40, "nccl.rdma": True})
    assert "expected an image pinned by digest" in _problem(raw, "spark-vllm:gateway.image.ref")
    raw["gateway"]["image"]["ref"] = "docker.io/library/haproxy@sha256:" + "c" * 64
    raw["monitoring"] = monitoring_pinned(raw["monitoring"])
    assert validate_config(raw).gateway.image.by_digest


def test_the_dev_gateway_and_its_defaults():
    cfg = validate_config(config_raw(2))
    g = cfg.gateway
    assert (g.port, g.tls, g.scheme, g.max_body_bytes) == (8080, False, "http", 2 * 1024 * 1024)
    assert g.image.ref == "10.77.0.1:5000/spark-lab/haproxy:lab" and g.image.plain_http_registry
    raw = config_raw(2)
    raw["gateway"] = {"image": {"ref": "haproxy:2.6"}}
    assert validate_config(raw).gateway.port == 8080


def test_a_certificate_chain_turns_tls_on():
    cfg = validate_config(_raw(**{"gateway.certificate": CHAIN, "gateway.port": 8443}))
    assert cfg.gateway.tls and cfg.gateway.scheme == "https"
    assert cfg.gateway.certificate is not None
    assert cfg.gateway.certificate.count("BEGIN CERTIFICATE") == 2


@pytest.mark.parametrize(("executor", "nodes", "host", "want"), [
    ("ray", 2, None, LOOPBACK),  # the gateway on the head reaches it on loopback
    ("mp", 1, None, LOOPBACK),  # mp on one node: nobody else watches it
    ("mp", 2, None, "192.168.177.11"),  # the other ranks watch the head's /health
    ("ray", 2, "127.0.0.2", "127.0.0.2"),
    ("ray", 2, "192.168.178.11", "192.168.178.11"),  # the head's second fabric twin
])
def test_where_the_main_vllm_listens(executor, nodes, host, want):
    raw = config_raw(nodes)
    raw["vllm"] = {**raw["vllm"], "executor": executor}
    if host is not None:
        raw["vllm"]["host"] = host
    assert vllm_host(validate_config(raw)) == want


def test_mp_on_two_nodes_refuses_a_loopback_host():
    raw = _raw(**{"vllm.executor": "mp", "vllm.host": "127.0.0.1"})
    with pytest.raises(ConfigError, match="leave it unset"):
        validate_config(raw)


def test_a_service_listens_on_loopback_on_the_head_and_its_fabric_address_elsewhere():
    raw = config_raw(2)
    raw["services"] = [{**EMBED, "nodes": ["spark-1", "spark-2"]}]
    cfg = validate_config(raw)
    assert service_host(cfg, "spark-1") == LOOPBACK
    assert service_host(cfg, "spark-2") == "192.168.177.12"
    assert served_names(cfg) == ["tiny-moe", "embed"]


@pulumi.runtime.test
def test_the_tls_key_is_a_secret_that_comes_with_the_certificate(mocks, set_config):
    plain = config_raw(2)
    tls = _raw(**{"gateway.certificate": CERT})
    cfg_plain, cfg_tls = validate_config(plain), validate_config(tls)
    set_config(tls, secrets={"sshPrivateKey": "KEY", "gatewayTlsKey": KEY_PEM})
    s = load_secrets(cfg_tls)
    assert isinstance(s.gateway_tls_key, pulumi.Output)
    # a certificate without its key, and a key without a certificate, are refused
    set_config(tls, secrets={"sshPrivateKey": "KEY"})
    with pytest.raises(ConfigError, match=r"spark-vllm:gatewayTlsKey: missing; expected the "
                                          r"secret private key of spark-vllm:gateway.certificate"):
        load_secrets(cfg_tls)
    set_config(plain, secrets={"sshPrivateKey": "KEY", "gatewayTlsKey": KEY_PEM})
    with pytest.raises(ConfigError, match=r"spark-vllm:gatewayTlsKey: set, but "
                                          r"spark-vllm:gateway.certificate is not"):
        load_secrets(cfg_plain)
    # in plaintext it is refused like every secret key
    set_config({**copy.deepcopy(tls), "gatewayTlsKey": KEY_PEM}, secrets={"sshPrivateKey": "K"})
    with pytest.raises(ConfigError, match=r"spark-vllm:gatewayTlsKey: set in plaintext"):
        load_secrets(cfg_tls)

    async def still_secret():
        assert s.gateway_tls_key is not None and await s.gateway_tls_key.is_secret()

    import asyncio

    return asyncio.ensure_future(still_secret())
