"""The Gateway component (components/gateway.py) under Pulumi mocks: where the key goes (only
its digest, only on stdin, into a root-only file), the configuration HAProxy is given (checked
here with the real `haproxy -c`), what a change replaces, and recon's repairs."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pulumi
import pytest

from hostscripts.gateway import LIVE_PATH, key_map
from hostscripts.paths import GATEWAY_MOUNT, StackNames
from tests.conftest import config_raw, gb10_facts, haproxy_binary, is_secret, reveal
from tests.unit.components.test_services import EMBED, RERANK, with_services
from tests.unit.components.test_vllm_server import _changed, _registered
from tests.unit.conftest import API_KEY, settled

CONTAINER = "docker:index/container:Container"
NAMES = StackNames("dev")


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=spark-vllm-test", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True)
    return crt.read_text(), key.read_text()


def _every_input_text(mocks) -> str:
    """Every input of every resource, secrets unwrapped, as one text."""
    return json.dumps([{k: reveal(v) for k, v in r.inputs.items()} for r in mocks.resources],
                      default=str)


@pulumi.runtime.test
def test_the_key_reaches_the_head_only_as_its_digest_on_stdin(build, mocks):
    h = build(2)
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()

    def check(_):
        key = mocks.named("gateway-key").inputs
        assert is_secret(key["stdin"]) and reveal(key["stdin"]) == key_map(API_KEY)
        assert reveal(key["stdin"]) == f"api-key {digest}\n"
        assert NAMES.gateway_key_file in key["create"] and "umask 077" in key["create"]
        assert key["delete"].startswith(f"rm -rf {NAMES.gateway_key_file}; rmdir ")
        # nowhere else: not the configuration, the container, the gate or any prop
        for name in ("gateway-config", "gateway-haproxy", "gateway-health", "gateway"):
            text = json.dumps([reveal(v) for v in mocks.named(name).inputs.values()],
                              default=str) if name != "gateway" else json.dumps(
                [r.inputs for r in mocks.resources if r.typ == "spark-vllm:gateway:Gateway"],
                default=str)
            assert API_KEY not in text and digest not in text, name
        c = mocks.named("gateway-haproxy").inputs
        assert "envs" not in c  # nothing in the container's environment
        # the gate reads the key on stdin from the main vLLM's root-only file
        assert f"< {NAMES.vllm_key_file}" in mocks.named("gateway-health").inputs["create"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_container_reads_its_folder_read_only_on_the_host_network(build, mocks, dependencies):
    h = build(2)

    def check(_):
        c = mocks.named("gateway-haproxy").inputs
        assert c["name"] == "spark-vllm-dev-gateway"
        assert c["entrypoints"] == ["haproxy"]
        assert c["command"] == ["-W", "-db", "-f", f"{GATEWAY_MOUNT}/conf/haproxy.cfg"]
        assert c["mounts"] == [{"source": NAMES.gateway_dir, "target": GATEWAY_MOUNT,
                                "type": "bind", "readOnly": True}]
        assert (c["networkMode"], c["restart"], c["privileged"], c["user"]) == (
            "host", "unless-stopped", False, "0")
        assert not c.get("capabilities") and not c.get("ports") and not c.get("devices")
        labels = {x["label"]: x["value"] for x in c["labels"]}
        assert labels["spark-vllm.role"] == "gateway" and labels["spark-vllm.port"] == "8080"
        provider = mocks.named("gateway-haproxy").provider
        assert provider.split("::")[-1].startswith("spark-1-docker")  # the head's
        # the image is the gateway's, pulled by digest on the head
        image = mocks.named("gateway-image").inputs["name"]
        assert image.startswith("10.77.0.1:5000/spark-lab/haproxy@sha256:")
        # order: the configuration before the container, the gate after both and after the
        # models' own gates
        assert "gateway-config" in dependencies["gateway-haproxy"]
        assert {"gateway-haproxy", "gateway-config", "vllm-health", "vllm-api-key"} <= \
            dependencies["gateway-health"]
        assert "gateway-key" in dependencies["gateway-config"]

    return settled(h).apply(check)


def test_a_routing_change_reloads_the_gateway_and_replaces_nothing(monkeypatch):
    """A service added or removed changes the configuration command (its update writes the new
    folder, checks it and reloads HAProxy) and the gate; never the container or the image."""
    one = _registered(with_services(EMBED), monkeypatch)
    two = _registered(with_services(EMBED, RERANK), monkeypatch)
    changed = {n for n in _changed(one, {k: two[k] for k in one}) if n.startswith("gateway")}
    assert changed == {"gateway", "gateway-config", "gateway-health"}, changed
    # a new port: the container too (its port label; the old one goes first)
    port = _registered(config_raw(2, gateway={"port": 8081}), monkeypatch)
    base = _registered(config_raw(2), monkeypatch)
    assert "gateway-haproxy" in _changed(base, {k: port[k] for k in base})


@pulumi.runtime.test
def test_the_configuration_the_head_gets_passes_haproxy_c(build, mocks, tmp_path):
    """The exact files the component hands to `gateway-config` (TLS, the main model, a service
    on the head and one on a worker), checked by the real HAProxy with their secrets beside
    them. The paths are the container's; here they point into a folder of the test."""
    haproxy = haproxy_binary()
    cert, key = _self_signed(tmp_path)
    raw = with_services(EMBED, RERANK)
    raw["gateway"] = {**raw["gateway"], "port": 8443, "certificate": cert}
    h = build(raw=raw, tls_key=key)

    def check(_):
        root = tmp_path / "gateway"
        for path, text in h.gateway.files.items():
            (root / "conf" / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "conf" / path).write_text(text.replace(GATEWAY_MOUNT, str(root)))
        (root / "secrets").mkdir()
        (root / "secrets" / "api-key.map").write_text(key_map(API_KEY))
        tls = reveal(mocks.named("gateway-tls").inputs["stdin"])
        assert tls.startswith(cert) and tls.endswith(key)  # the chain, then its key
        (root / "secrets" / "tls.pem").write_text(tls)
        done = subprocess.run([haproxy, "-c", "-f", str(root / "conf" / "haproxy.cfg")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        cfg = h.gateway.files["haproxy.cfg"]
        assert "bind *:8443 ssl crt /etc/spark-vllm/gateway/secrets/tls.pem" in cfg
        assert "server spark-1 127.0.0.1:8000" in cfg and "server spark-1 127.0.0.1:8100" in cfg
        assert "server spark-2 192.168.177.12:8101" in cfg
        assert h.gateway.files["models.map"] == ("tiny-moe model0-tiny-moe\nembed model1-embed\n"
                                                 "rerank model2-rerank\n")
        assert h.gateway.endpoint == "https://10.77.0.11:8443/v1"
        gate = mocks.named("gateway-health").inputs["create"]
        assert "https://127.0.0.1:8443" in gate and LIVE_PATH in gate
        assert '"name":"rerank","task":"score"' in gate

    return settled(h).apply(check)


@pulumi.runtime.test
def test_tls_without_its_key_is_refused(build, mocks):
    raw = config_raw(2)
    raw["gateway"] = {**raw["gateway"], "certificate":
                      "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}
    with pytest.raises(ValueError, match="gatewayTlsKey"):
        build(raw=raw)


@pulumi.runtime.test
def test_gateway_files_recon_found_gone_are_written_again(build, mocks):
    facts = {f"spark-{i}": gb10_facts(f"spark-{i}", index=i) for i in (1, 2)}
    facts["spark-1"] = facts["spark-1"].model_copy(update={"gateway_files_present": False})
    h = build(2, facts=facts)

    def check(_):
        for name in ("gateway-key", "gateway-config"):
            triggers = mocks.named(name).inputs["triggers"]
            assert triggers[0].startswith("repair-"), (name, triggers)
        assert mocks.named("vllm-api-key").inputs["triggers"] == ["intact"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_gateway_image_on_its_own_plain_http_registry(build, mocks):
    h = build(2, gateway={"image": {"ref": "10.77.0.1:5001/haproxy:lab",
                                    "plainHttpRegistry": True}})

    def check(_):
        for p in mocks.of_type("pulumi:providers:docker"):
            auth = json.loads(reveal(p.inputs["registryAuth"]))
            assert auth == [{"address": "http://10.77.0.1:5000", "authDisabled": True},
                            {"address": "http://10.77.0.1:5001", "authDisabled": True}], auth

    return settled(h).apply(check)


def _pack():
    import sys

    root = Path(__file__).resolve().parents[3]
    for folder in (root / "policies", root / "tests" / "policies"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    import policy_testkit

    import rules

    return rules, policy_testkit


@pytest.mark.parametrize("case", ["ray-services", "mp-services"])
@pulumi.runtime.test
def test_what_the_program_registers_passes_vllm_behind_gateway(build, mocks, case):
    """Rule 14 of the policy pack on the stack the program really registers (its props and
    containers as the mocks saw them): Ray with a service on each node, and mp on two nodes
    (the head's vLLM on its fabric address); the rendezvous port guarded is rule 13's, Ray's
    ports rule 7's and the firewalls themselves rule 18's (issue 45), run on the same
    resources."""
    raw = with_services(EMBED, RERANK)
    if case == "mp-services":
        raw["vllm"] = {**raw["vllm"], "executor": "mp"}
    h = build(raw=raw)
    rules, kit = _pack()

    def check(_):
        resources = [kit.res(r.typ, dict(r.inputs), r.name) for r in mocks.resources
                     if r.typ != "pulumi:pulumi:Stack"]
        for rule in (rules.vllm_behind_gateway, rules.mp_rendezvous_fabric_only,
                     rules.ray_not_exposed, rules.stack_ports_firewalled):
            assert kit.run(rule, kit.sargs(resources)) == [], rule.name
        # the firewalls are there, and judged: without them (as with firewall.enabled false)
        # the rendezvous is open, and outside dev every node wants one
        bare = [r for r in resources if r.resource_type != "spark-vllm:firewall:NodeFirewall"]
        if case == "mp-services":
            (msg,) = kit.run(rules.mp_rendezvous_fabric_only, kit.sargs(bare))
            assert "listens on port 29501 of spark-1, which has no firewall" in msg, msg
        assert kit.run(rules.stack_ports_firewalled, kit.sargs(bare)) == []  # dev
        staging = [kit.res(r.resource_type, {**dict(r.props), "environment": "staging"}
                           if r.resource_type == "spark-vllm:vllm_server:VllmServer"
                           else dict(r.props), r.name) for r in bare]
        assert len(kit.run(rules.stack_ports_firewalled, kit.sargs(staging))) == 2
        # and the same stack with the main vLLM on every address fails it
        server = next(r for r in mocks.resources if r.typ == "spark-vllm:vllm_server:VllmServer")
        opened = [kit.res(r.typ, {**dict(r.inputs), "host": "0.0.0.0"} if r is server
                          else dict(r.inputs), r.name)
                  for r in mocks.resources if r.typ != "pulumi:pulumi:Stack"]
        assert kit.run(rules.vllm_behind_gateway, kit.sargs(opened))

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_gate_runs_again_when_a_server_behind_a_route_is_new(build, mocks):
    """HAProxy's own checks see a replaced vLLM up only seconds after it answers (503 until
    then): the gate's script names the IDs of what serves every route, so a replaced container
    or a gate run again is a new script (an update that runs it): the up ends when the gateway
    itself routes to every model."""
    h = build(raw=with_services(EMBED, RERANK))

    def check(ids):
        marker = mocks.named("gateway-health").inputs["create"].split("\n")[1]
        assert marker.startswith("# gateway: '"), marker
        for i in ids:
            assert i in marker.split("'")[1].split(" "), (i, marker)

    return settled(h).apply(lambda _: pulumi.Output.all(
        h.vllm.serve.id, h.vllm.health.id,
        *(r.id for s in h.services.values()
          for r in (*s.containers.values(), *s.gates.values())))).apply(check)


def test_the_gate_marker_refuses_a_backend_id_that_is_not_plain():
    from hostscripts.gateway import gate_marker
    with pytest.raises(ValueError, match="plain"):
        gate_marker("ab" * 32, "gateway config 0123456789abcdef", ["x\nrm -rf /"])
    assert gate_marker("ab" * 32, "gateway config 0123456789abcdef", ["c1", "g1"]) == \
        f"{'ab' * 32} 0123456789abcdef c1 g1"
