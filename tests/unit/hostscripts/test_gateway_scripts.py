"""hostscripts/gateway.py as text: what its scripts refuse before a shell sees it, what the
rendered configuration holds and never holds (the key), and the gate's marker."""

from __future__ import annotations

import hashlib

import pytest

from hostscripts.common import RemoteValueError
from hostscripts.gateway import (
    GatewaySpec,
    Route,
    Server,
    backend_name,
    command,
    config_write,
    gate_marker,
    gate_script,
    key_map,
    render,
)
from hostscripts.paths import GATEWAY_MOUNT, StackNames

NAMES = StackNames("dev")
IMAGE = "sha256:" + "a" * 64
MAIN = Route("tiny-moe", "generate", "spark-lab/tiny-moe", (Server("spark-1", "127.0.0.1", 8000),))


def _spec(*routes: Route, tls: bool = False) -> GatewaySpec:
    return GatewaySpec(port=8080, tls=tls, max_body_bytes=2 * 1024 * 1024,
                       routes=(MAIN, *routes))


def test_the_key_map_holds_only_the_keys_digest():
    text = key_map("sk-a-key")
    assert text == f"api-key {hashlib.sha256(b'sk-a-key').hexdigest()}\n"
    assert "sk-a-key" not in text


def test_the_configuration_reads_the_digest_from_its_file_and_holds_no_secret():
    files = render(_spec())
    cfg = files["haproxy.cfg"]
    assert f"map({GATEWAY_MOUNT}/secrets/api-key.map)" in cfg
    assert "secure_memcmp(txn.want)" in cfg and "http_auth_bearer,sha2(256),hex,lower" in cfg
    assert "sk-" not in "".join(files.values())
    # the one rule before the key's: the liveness path, answered by HAProxy itself
    rules = [ln.strip() for ln in cfg.splitlines() if ln.strip().startswith("http-request")]
    assert rules[0].endswith("string ok if { path /gateway/live }")
    assert "unless authorized" in rules[3]
    assert "option http-no-delay" in cfg and "option abortonclose" in cfg
    assert "ssl" not in cfg  # no certificate: plain HTTP
    assert f"ssl crt {GATEWAY_MOUNT}/secrets/tls.pem alpn h2,http/1.1" in \
        render(_spec(tls=True))["haproxy.cfg"]


def test_the_connections_at_once_keep_the_buffers_within_a_gib():
    from hostscripts.gateway import maxconn

    assert maxconn(2 * 1024 * 1024) == 512
    assert maxconn(64 * 1024) == 4096  # capped
    assert maxconn(64 * 1024 * 1024) == 16
    assert "    maxconn 512\n    tune.bufsize 2097152\n" in render(_spec())["haproxy.cfg"]


def test_backends_and_the_model_map():
    rerank = Route("org/re-rank.v2", "score", "org/r", (Server("spark-1", "127.0.0.1", 8101),
                                                        Server("spark-2", "192.168.177.12",
                                                               8101)))
    files = render(_spec(rerank))
    assert backend_name(1, rerank) == "model1-org_re-rank.v2"
    assert files["models.map"] == "tiny-moe model0-tiny-moe\norg/re-rank.v2 model1-org_re-rank.v2\n"
    assert "    server spark-2 192.168.177.12:8101" in files["haproxy.cfg"]
    assert "default_backend model0-tiny-moe" in files["haproxy.cfg"]
    assert command() == ["-W", "-db", "-f", f"{GATEWAY_MOUNT}/conf/haproxy.cfg"]


@pytest.mark.parametrize("routes", [
    (),  # no main model
    (MAIN, MAIN),  # a name twice
    (Route("a b", "generate", "o/r", (Server("n", "127.0.0.1", 1),)),),  # not a served name
    (Route("x", "generate", "o/r", ()),),  # nobody serves it
])
def test_a_spec_that_cannot_be_rendered_is_refused(routes):
    with pytest.raises(ValueError):
        GatewaySpec(port=8080, tls=False, max_body_bytes=65536, routes=routes)


def test_config_write_refuses_what_is_not_an_image_id_or_a_gateway_file():
    files = render(_spec())
    for bad in ("", "sha256:x; reboot", "haproxy:2.6", IMAGE + "\n"):
        with pytest.raises(RemoteValueError):
            config_write(NAMES, files, bad, {})
    with pytest.raises(ValueError, match="not a gateway file name"):
        config_write(NAMES, {**files, "../etc/passwd": "x"}, IMAGE, {})
    script = config_write(NAMES, files, IMAGE, {"spark-vllm.managed": "true"})
    assert "--label spark-vllm.role=gateway-check" in script and "--network none" in script
    assert f"mv -T {NAMES.gateway_dir}/conf.link {NAMES.gateway_dir}/conf" in script


def test_the_gate_marker_takes_the_container_id_and_the_configs_hash():
    cid = "c" * 64
    assert gate_marker(cid, "gateway reloaded\ngateway config 0123456789abcdef\n") == \
        f"{cid} 0123456789abcdef"
    with pytest.raises(ValueError):  # the hash's checks: test_daemon.py
        gate_marker(cid, "ok")
    with pytest.raises(RemoteValueError):
        gate_marker("not-an-id;", "gateway config 0123456789abcdef")
    script = gate_script(NAMES, f"{cid} 0123456789abcdef", "http://127.0.0.1:8080", [MAIN], 60)
    assert f"< {NAMES.vllm_key_file}" in script and "docker start spark-vllm-dev-gateway" in script


def test_a_new_key_or_certificate_reloads_the_gateway_from_its_own_command():
    """The secret files' commands reload a running gateway themselves, so nothing derived from a
    secret (not even a hash: a weak configured key could be guessed from one) is in the
    configuration's text."""
    from hostscripts.gateway import key_write, tls_write

    for script, path in ((key_write(NAMES), NAMES.gateway_key_file),
                         (tls_write(NAMES), NAMES.gateway_tls_file)):
        assert f"cat > {path}.new" in script and "umask 077" in script
        # the reload from the host to HAProxy's master: never Docker's kill API, which marks the
        # container manually stopped (then not started again when dockerd restarts)
        assert "pid=$(docker inspect -f '{{.State.Pid}}' spark-vllm-dev-gateway)" in script
        assert 'kill -USR2 "$pid"' in script and "docker kill" not in script
        assert script.index("mv ") < script.index('kill -USR2')  # the file first
    assert "secrets" not in config_write(NAMES, render(_spec()), IMAGE, {}).split("mkdir")[0]
