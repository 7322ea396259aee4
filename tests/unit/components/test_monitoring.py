"""The Monitoring component (components/monitoring.py, issue 35) under Pulumi mocks: where the
API key goes (only on stdin, into a root-only file Prometheus reads), where Prometheus and the
exporters listen (loopback or the fabric, never the management network), what the
configuration scrapes, what a change touches (a scrape interval, a threshold or a new service:
the configuration and its gate, never a container), what `destroy` keeps, and the config
checks that refuse a monitoring section before any resource exists."""

from __future__ import annotations

import json

import pulumi
import pytest

from config import ConfigError, validate_config
from hostscripts.paths import MONITORING_MOUNT, PROMETHEUS_DATA, StackNames
from inspection.facts import ContainerFacts
from tests.conftest import config_raw, gb10_facts, is_secret, reveal
from tests.unit.components.test_services import EMBED, with_services
from tests.unit.components.test_vllm_server import _changed, _registered
from tests.unit.conftest import API_KEY, settled

NAMES = StackNames("dev")
CONTAINER = "docker:index/container:Container"


def _monitoring(m: dict) -> dict:
    return {**config_raw(2)["monitoring"], **m}


def _mine(registered: dict[str, dict]) -> set[str]:
    return {n for n in registered if n.startswith("monitoring")}


@pulumi.runtime.test
def test_the_key_reaches_prometheus_only_on_stdin_into_a_root_only_file(build, mocks):
    h = build(2)

    def check(_):
        key = mocks.named("monitoring-key").inputs
        assert is_secret(key["stdin"]) and reveal(key["stdin"]) == API_KEY
        assert NAMES.monitoring_key_file in key["create"] and "umask 077" in key["create"]
        for r in mocks.resources:
            if r.name.startswith("monitoring") and r.name != "monitoring-key":
                text = json.dumps({k: reveal(v) for k, v in r.inputs.items()}, default=str)
                assert API_KEY not in text, r.name
        # Prometheus reads it as its credentials file, from the read-only mounted folder
        cfg = reveal(mocks.named("monitoring-config").inputs["create"])
        assert f'credentials_file: "{MONITORING_MOUNT}/secrets/api-key"' in cfg

    return settled(h).apply(check)


@pulumi.runtime.test
def test_prometheus_and_the_exporters_listen_on_loopback_or_the_fabric_only(build, mocks):
    h = build(2)

    def check(_):
        prom = mocks.named("monitoring-prometheus").inputs
        assert prom["name"] == NAMES.prometheus and prom["networkMode"] == "host"
        assert "--web.listen-address=127.0.0.1:9090" in prom["command"]
        assert not prom.get("ports") and prom["privileged"] is False
        mounts = {m["target"]: m for m in prom["mounts"]}
        assert mounts[MONITORING_MOUNT]["readOnly"] is True
        assert mounts[MONITORING_MOUNT]["source"] == NAMES.monitoring_dir
        assert mounts[PROMETHEUS_DATA]["source"] == NAMES.prometheus_data_dir
        listens = {n: next(a for a in mocks.named(f"monitoring-node-exporter-{n}")
                           .inputs["command"] if a.startswith("--web.listen-address="))
                   for n in ("spark-1", "spark-2")}
        assert listens == {"spark-1": "--web.listen-address=127.0.0.1:9100",
                           "spark-2": "--web.listen-address=192.168.177.12:9100"}
        for n in ("spark-1", "spark-2"):
            e = mocks.named(f"monitoring-node-exporter-{n}").inputs
            assert e["networkMode"] == "host" and not e.get("ports")
            assert e["privileged"] is False
            assert [(m["source"], m["target"], m["readOnly"]) for m in e["mounts"]] == [
                ("/", "/host", True)]
        props = next(r.inputs for r in mocks.resources
                     if r.typ == "spark-vllm:monitoring:Monitoring")
        assert props["listen"] == "127.0.0.1:9090" and props["authentication"] is False

    return settled(h).apply(check)


@pulumi.runtime.test
def test_listen_fabric_puts_prometheus_on_the_heads_fabric_address(build, mocks):
    h = build(2, monitoring=_monitoring({"listen": "fabric"}))

    def check(_):
        prom = mocks.named("monitoring-prometheus").inputs
        assert "--web.listen-address=192.168.177.11:9090" in prom["command"]
        assert "http://192.168.177.11:9090" in reveal(mocks.named("monitoring-health")
                                                     .inputs["create"])

    return settled(h).apply(check)


@pulumi.runtime.test
def test_every_model_is_scraped_through_the_gateway(build, mocks):
    h = build(raw=with_services(EMBED))

    def check(_):
        cfg = reveal(mocks.named("monitoring-config").inputs["create"])
        assert "127.0.0.1:8080" in cfg  # the gateway on the head's loopback
        for name in ("tiny-moe", "embed"):
            assert name in cfg, name
        assert ":8000" not in cfg and ":8100" not in cfg  # no vLLM port scraped directly

    return settled(h).apply(check)


def test_a_scrape_interval_a_threshold_or_a_service_changes_the_configuration_only(
        monkeypatch):
    """The change table (docs/design.md): Prometheus is reloaded by its configuration command,
    never replaced; the exporters and every other resource stay."""
    base = _registered(config_raw(2), monkeypatch)
    interval = _registered(config_raw(2, monitoring=_monitoring(
        {"scrapeIntervalSeconds": 30})), monkeypatch)
    assert _changed(base, interval) == {"monitoring", "monitoring-config", "monitoring-health"}
    threshold = _registered(config_raw(2, monitoring=_monitoring(
        {"alerts": {"kvCacheUsage": 0.8}})), monkeypatch)
    assert _changed(base, threshold) == {"monitoring-config", "monitoring-health"}
    with_embed = _registered(with_services(EMBED), monkeypatch)
    # a service: its replicas' targets, and Alertmanager's inhibition of them (a reload too)
    assert _changed({n: base[n] for n in _mine(base)}, {n: with_embed[n] for n in _mine(
        with_embed)}) == {"monitoring", "monitoring-config", "monitoring-alertmanager-config",
                          "monitoring-health"}


def test_disabled_registers_nothing_of_it(monkeypatch):
    off = _registered(config_raw(2, monitoring={"enabled": False}), monkeypatch)
    assert _mine(off) == set()
    on = _registered(config_raw(2), monkeypatch)
    assert {"monitoring-prometheus", "monitoring-node-exporter-spark-1",
            "monitoring-node-exporter-spark-2", "monitoring-config", "monitoring-key",
            "monitoring-data", "monitoring-health"} <= _mine(on)


@pytest.mark.parametrize("keep", [True, False])
@pulumi.runtime.test
def test_destroy_keeps_the_data_folder_unless_asked(build, mocks, keep):
    h = build(2, monitoring=_monitoring({"keepDataOnDestroy": keep}))

    def check(_):
        delete = mocks.named("monitoring-data").inputs["delete"]
        removes = f"rm -rf {NAMES.prometheus_data_dir}" in delete
        assert removes is (not keep), delete

    return settled(h).apply(check)


@pytest.mark.parametrize("monitoring,env,message", [
    ({"enabled": True, "prometheus": None}, "dev", "monitoring.enabled needs the image of "
     "prometheus"),
    ({"port": 8080}, "dev", "spark-vllm:monitoring.port: got 8080; expected a port other "
     "than spark-vllm:gateway.port"),
    ({"nodeExporterPort": 22}, "dev", "spark-vllm:monitoring.nodeExporterPort: got 22"),
    ({"nodeExporterPort": 9090}, "dev", "the same as monitoring.port"),
    ({}, "prod", "spark-vllm:monitoring.prometheus.ref: got '10.77.0.1:5000/spark-lab/"
     "prometheus:lab'; expected an image pinned by digest"),
    ({"listen": "all"}, "dev", "spark-vllm:monitoring.listen"),
])
def test_config_refuses_a_monitoring_section_that_cannot_run(monitoring, env, message):
    raw = config_raw(2, monitoring=_monitoring(monitoring))
    raw["environment"] = env
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize("gone, again", [
    ({"monitoring_files_present": False}, {"monitoring-key", "monitoring-config",
                                           "monitoring-alertmanager-config"}),
    ({"prometheus_data_present": False}, {"monitoring-data"}),
    ({"monitoring_files_present": False, "prometheus_data_present": False},
     {"monitoring-key", "monitoring-config", "monitoring-alertmanager-config",
      "monitoring-data"}),
    ({"monitoring_files_present": True, "prometheus_data_present": True}, set()),
    ({}, set()),  # not surveyed (an older recon): nothing is run again
])
@pulumi.runtime.test
def test_what_recon_found_gone_is_made_again_and_prometheus_replaced_with_it(
        build, mocks, gone, again):
    """The stack's folder wiped behind it (another stack's destroy on the same nodes): the
    commands that made what is gone run again (a fresh trigger), the others keep the state's
    value; the container's label names the IDs of the commands that made its mounts, so a
    command made again (a new ID) replaces it, while a new configuration (an update, the same
    ID) only reloads it."""
    facts = {f"spark-{i}": gb10_facts(f"spark-{i}", index=i) for i in (1, 2)}
    facts["spark-1"] = facts["spark-1"].model_copy(update=gone)
    h = build(2, facts=facts)

    def check(ids):
        for name in ("monitoring-key", "monitoring-config", "monitoring-alertmanager-config",
                     "monitoring-data"):
            cmd = mocks.named(name).inputs
            if name in again:
                assert cmd["triggers"][0].startswith("repair-"), (name, cmd["triggers"])
            else:
                assert cmd["triggers"] == ["intact"], (name, cmd["triggers"])
        labels = {x["label"]: x["value"]
                  for x in mocks.named("monitoring-prometheus").inputs["labels"]}
        assert labels["spark-vllm.mounts-made-by"] == " ".join(ids[:3])
        # Alertmanager's likewise: its configuration's and the data folders' commands
        labels = {x["label"]: x["value"]
                  for x in mocks.named("monitoring-alertmanager").inputs["labels"]}
        assert labels["spark-vllm.mounts-made-by"] == " ".join(ids[3:])
        # the exporters have no mount of the stack's: untouched
        for node in ("spark-1", "spark-2"):
            exporter = mocks.named(f"monitoring-node-exporter-{node}").inputs["labels"]
            assert "spark-vllm.mounts-made-by" not in {x["label"] for x in exporter}

    return settled(h).apply(lambda _: pulumi.Output.all(
        h.monitoring.key.id, h.monitoring.config.id, h.monitoring.data.id,
        h.monitoring.alertmanager_config.id, h.monitoring.data.id)).apply(check)


# --- issue 50: Alertmanager, per-replica targets, exporters started again -----------------

WEBHOOK_URL = "https://hooks.example.com/services/T000/B000/sEcReT-hook-token"
SMTP_PASSWORD = "smtp-pAssw0rd-never-in-plain"
RECEIVERS = {"alerting": {"receivers": [
    {"name": "oncall", "webhook": {"urlSecret": "oncall-url"}},
    {"name": "ops-mail", "email": {"to": ["ops@example.com"], "from": "spark@example.com",
                                   "smarthost": "smtp.example.com:587", "username": "spark",
                                   "passwordSecret": "smtp"}, "sendResolved": False}]}}
ALERTING_SECRETS = {"oncall-url": WEBHOOK_URL, "smtp": SMTP_PASSWORD}


@pulumi.runtime.test
def test_alertmanager_gets_the_receivers_secrets_only_on_stdin(build, mocks):
    """The webhook's URL and the SMTP password reach the head only as the secret stdin of
    `monitoring-alertmanager-config` (the whole alertmanager.yml, into a root-only folder); the
    command's text holds the configuration with placeholders, which is what a preview and the
    state show. No other input of any resource holds them."""
    h = build(2, monitoring=_monitoring(RECEIVERS), alerting=ALERTING_SECRETS)

    def check(_):
        cmd = mocks.named("monitoring-alertmanager-config").inputs
        assert is_secret(cmd["stdin"])
        real = reveal(cmd["stdin"])
        assert f'url: "{WEBHOOK_URL}"' in real and f'auth_password: "{SMTP_PASSWORD}"' in real
        create = reveal(cmd["create"])
        assert 'url: "https://redacted.invalid/"' in create
        assert 'auth_password: "redacted"' in create and "umask 077" in create
        assert "amtool" in create and "check-config" in create
        for r in mocks.resources:
            inputs = {k: v for k, v in r.inputs.items()
                      if not (r.name == "monitoring-alertmanager-config" and k == "stdin")}
            text = json.dumps({k: reveal(v) for k, v in inputs.items()}, default=str)
            assert WEBHOOK_URL not in text and SMTP_PASSWORD not in text, r.name
        props = next(r.inputs for r in mocks.resources
                     if r.typ == "spark-vllm:monitoring:Monitoring")
        assert props["receivers"] == [
            {"name": "oncall", "kind": "webhook", "sendResolved": True},
            {"name": "ops-mail", "kind": "email", "sendResolved": False}]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_alertmanager_listens_beside_prometheus_with_its_cluster_off(build, mocks):
    h = build(2)

    def check(_):
        am = mocks.named("monitoring-alertmanager").inputs
        assert am["name"] == NAMES.alertmanager and am["networkMode"] == "host"
        assert "--web.listen-address=127.0.0.1:9093" in am["command"]
        assert "--cluster.listen-address=" in am["command"]  # gossip (0.0.0.0:9094) off
        assert not am.get("ports") and am["privileged"] is False and am["user"] == "0"
        mounts = {m["target"]: (m["source"], m.get("readOnly")) for m in am["mounts"]}
        assert mounts == {"/etc/spark-vllm/alertmanager": (NAMES.alertmanager_dir, True),
                          "/alertmanager": (NAMES.alertmanager_data_dir, None)}
        # Prometheus sends its alerts there; the gate proves it does
        prom = reveal(mocks.named("monitoring-config").inputs["create"])
        assert 'alertmanagers:' in prom and '"127.0.0.1:9093"' in prom
        gate = reveal(mocks.named("monitoring-health").inputs["create"])
        assert '"alertmanager":"127.0.0.1:9093"' in gate
        assert "docker start spark-vllm-dev-alertmanager" in gate
        props = next(r.inputs for r in mocks.resources
                     if r.typ == "spark-vllm:monitoring:Monitoring")
        assert props["alertmanager"] == {"listen": "127.0.0.1:9093", "clusterListen": ""}

    return settled(h).apply(check)


@pulumi.runtime.test
def test_each_replica_of_a_service_is_its_own_target(build, mocks):
    """A service on two nodes: Prometheus scrapes each replica through the gateway's per-replica
    path, and Alertmanager's inhibition silences only the replica on a node that is down (the
    main model, one engine over every node, on either)."""
    h = build(raw=with_services({**EMBED, "nodes": ["spark-1", "spark-2"]}))

    def check(_):
        cfg = reveal(mocks.named("monitoring-config").inputs["create"])
        for model, replica in (("tiny-moe", "spark-1"), ("embed", "spark-1"),
                               ("embed", "spark-2")):
            assert f'model: "{model}"\n          replica: "{replica}"' in cfg, (model, replica)
        assert '"__param_replica"' in cfg
        am = reveal(mocks.named("monitoring-alertmanager-config").inputs["create"])
        assert '"model=\\"embed\\"", "replica=\\"spark-2\\""' in am
        assert '"model=\\"tiny-moe\\""]' in am  # the main model: every replica
        props = next(r.inputs for r in mocks.resources
                     if r.typ == "spark-vllm:monitoring:Monitoring")
        assert props["targets"]["replicas"] == {"tiny-moe": ["spark-1"],
                                                "embed": ["spark-1", "spark-2"]}

    return settled(h).apply(check)


@pulumi.runtime.test
def test_an_exporter_recon_found_stopped_is_started_by_its_nodes_command(build, mocks):
    """`docker stop` is a manual stop (Docker's policy leaves it stopped, and the next `up` did
    too): recon sees it and that node's start command runs again, nothing else."""
    stopped = ContainerFacts(id="c2", name="spark-vllm-dev-node-exporter", image="x",
                             state="exited",
                             labels={"spark-vllm.managed": "true",
                                     "spark-vllm.stack": "spark-vllm/dev",
                                     "spark-vllm.role": "node-exporter"})
    facts = {"spark-1": gb10_facts("spark-1", index=1),
             "spark-2": gb10_facts("spark-2", index=2, containers=[stopped])}
    h = build(2, facts=facts)

    def check(_):
        start = mocks.named("monitoring-node-exporter-start-spark-2").inputs
        assert start["triggers"][0].startswith("spark-vllm-dev-node-exporter is exited @")
        assert "docker start spark-vllm-dev-node-exporter" in reveal(start["create"])
        assert mocks.named("monitoring-node-exporter-start-spark-1").inputs["triggers"] == [
            "none"]
        assert mocks.named("monitoring-health").inputs["triggers"] == ["none"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_heads_exporter_reads_the_reconciles_textfile_folder(build, mocks):
    h = build(2)

    def check(_):
        head = mocks.named("monitoring-node-exporter-spark-1").inputs["command"]
        worker = mocks.named("monitoring-node-exporter-spark-2").inputs["command"]
        assert "--collector.textfile.directory=/host/var/lib/spark-vllm-textfile/dev" in head
        # the dev stack's guard is on: a worker's exporter reads the guard's own folder, the
        # head's a link to its count in the stack's folder (node_exporter 1.5 reads one folder)
        assert [a for a in worker if a.startswith("--collector.textfile")] == [
            "--collector.textfile.directory=/host/var/lib/spark-vllm/guard/metrics"]
        data = mocks.named("monitoring-data").inputs["create"]
        assert "/var/lib/spark-vllm-textfile/dev" in data
        assert ("ln -sfn ../../spark-vllm/guard/metrics/spark-vllm-oom.prom "
                "/var/lib/spark-vllm-textfile/dev/spark-vllm-oom.prom") in data
        assert NAMES.alertmanager_data_dir in data

    return settled(h).apply(check)
