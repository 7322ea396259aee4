"""spark-vllm:monitoring.alerting (config/monitoring.py) and the secret spark-vllm:alertingSecrets
(config/load.py, issue 50): the receivers a stack declares, what is refused with its key path,
and the secret values: read only as secrets, checked for what they are taken as, never named by
value in a message."""

from __future__ import annotations

import asyncio
import json

import pulumi
import pytest

from config import ConfigError, load_secrets, validate_config
from tests.conftest import config_raw

URL = "https://hooks.example.com/services/T0/B0/sEcReT-token"
PASSWORD = "pAss w0rd-sEcReT"
WEBHOOK = {"name": "oncall", "webhook": {"urlSecret": "oncall-url"}}
MAIL = {"name": "ops-mail", "email": {"to": ["ops@example.com"], "from": "spark@example.com",
                                      "smarthost": "smtp.example.com:587", "username": "spark",
                                      "passwordSecret": "smtp"}}


def _raw(*receivers: dict, **alerting: object) -> dict:
    raw = config_raw(2)
    raw["monitoring"] = {**raw["monitoring"],
                         "alerting": {"receivers": list(receivers), **alerting}}
    return raw


def _problems(raw: dict) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    return str(err.value)


def test_receivers_and_their_timings_are_read():
    cfg = validate_config(_raw(WEBHOOK, MAIL, groupWaitSeconds=10, repeatIntervalSeconds=600))
    al = cfg.monitoring.alerting
    assert [r.name for r in al.receivers] == ["oncall", "ops-mail"]
    assert al.receivers[0].webhook is not None and al.receivers[0].send_resolved is True
    email = al.receivers[1].email
    assert email is not None and email.from_ == "spark@example.com" and email.require_tls
    assert al.group_wait_seconds == 10 and al.repeat_interval_seconds == 600
    assert al.secret_names == ["oncall-url", "smtp"]
    # the defaults, and no receiver at all
    empty = validate_config(config_raw(2)).monitoring
    assert empty.alertmanager_port == 9093
    assert (empty.alerting.group_interval_seconds, empty.alerting.repeat_interval_seconds) == (
        10, 3600)  # Pulumi.dev.yaml's quick lab timings


@pytest.mark.parametrize(("receivers", "alerting", "message"), [
    ([{"name": "x"}], {}, "expected exactly one of webhook or email"),
    ([{**WEBHOOK, "email": MAIL["email"]}], {}, "expected exactly one of webhook or email"),
    ([WEBHOOK, WEBHOOK], {}, "receiver names must be unique: oncall"),
    ([{**WEBHOOK, "name": "On Call"}], {}, "spark-vllm:monitoring.alerting.receivers[0].name"),
    # a URL where its secret's name goes: refused by form (and it would be plain text)
    ([{"name": "x", "webhook": {"urlSecret": URL}}], {},
     "spark-vllm:monitoring.alerting.receivers[0].webhook.urlSecret"),
    ([{"name": "x", "webhook": {"url": URL}}], {}, "receivers[0].webhook.url"),
    ([{**MAIL, "email": {**MAIL["email"], "password": PASSWORD}}], {},
     "receivers[0].email.password"),
    ([{**MAIL, "email": {**MAIL["email"], "to": ["Ops <ops@example.com>"]}}], {},
     "receivers[0].email.to[0]"),
    ([{**MAIL, "email": {**MAIL["email"], "smarthost": "smtp.example.com"}}], {},
     "receivers[0].email.smarthost"),
    ([{**MAIL, "email": {**MAIL["email"], "username": None}}], {},
     "email.username and email.passwordSecret come together"),
    ([], {"repeatIntervalSeconds": 5}, "spark-vllm:monitoring.alerting.repeatIntervalSeconds"),
    ([], {"groupIntervalSeconds": 0}, "spark-vllm:monitoring.alerting.groupIntervalSeconds"),
])
def test_a_receiver_that_cannot_work_is_refused_by_key(receivers, alerting, message):
    text = _problems(_raw(*receivers, **alerting))
    assert message in text, text
    assert PASSWORD not in text


@pytest.mark.parametrize(("monitoring", "env", "message"), [
    ({"alertmanager": None}, "dev", "monitoring.enabled needs the image of alertmanager"),
    ({"alertmanagerPort": 9090}, "dev", "the same as monitoring.port"),
    ({"alertmanagerPort": 8080}, "dev", "spark-vllm:monitoring.alertmanagerPort: got 8080; "
     "expected a port other than spark-vllm:gateway.port"),
    ({}, "prod", "spark-vllm:monitoring.alertmanager.ref: got '10.77.0.1:5000/spark-lab/"
     "alertmanager:lab'; expected an image pinned by digest"),
])
def test_alertmanagers_image_and_port(monitoring, env, message):
    raw = config_raw(2)
    raw["monitoring"] = {**raw["monitoring"], **monitoring}
    raw["environment"] = env
    assert message in _problems(raw)


def _load(mocks, set_config, raw: dict, secrets: dict[str, str]):
    cfg = validate_config(raw)
    set_config(raw, secrets={"sshPrivateKey": "KEY", **secrets})
    return load_secrets(cfg)


@pulumi.runtime.test
def test_the_receivers_secrets_are_read_as_secrets_and_checked(mocks, set_config):
    raw = _raw(WEBHOOK, MAIL)
    s = _load(mocks, set_config, raw, {"alertingSecrets": json.dumps(
        {"oncall-url": URL, "smtp": PASSWORD, "unused": "x"})})
    assert s.alerting is not None
    # missing, a name missing, a value of the wrong form: refused naming the key, never the value
    for secrets, message in (
            ({}, "spark-vllm:alertingSecrets: missing; expected a secret object holding "
                 "oncall-url, smtp"),
            ({"alertingSecrets": json.dumps({"oncall-url": URL})},
             "spark-vllm:alertingSecrets.smtp: missing; expected the SMTP password"),
            ({"alertingSecrets": json.dumps({"oncall-url": "ftp://x/" + PASSWORD,
                                             "smtp": PASSWORD})},
             "spark-vllm:alertingSecrets.oncall-url: expected an http(s) URL"),
            ({"alertingSecrets": json.dumps({"oncall-url": URL, "smtp": "a\nb" + PASSWORD})},
             "spark-vllm:alertingSecrets.smtp: expected at most 1024 characters without "
             "control characters"),
            ({"alertingSecrets": "not json " + PASSWORD},
             "spark-vllm:alertingSecrets: expected a secret object")):
        with pytest.raises(ConfigError) as err:
            _load(mocks, set_config, raw, secrets)
        assert message in str(err.value), str(err.value)
        assert PASSWORD not in str(err.value) and "sEcReT" not in str(err.value)
    # in plaintext it is refused like every secret key
    set_config({**raw, "alertingSecrets": {"oncall-url": URL, "smtp": PASSWORD}},
               secrets={"sshPrivateKey": "K"})
    with pytest.raises(ConfigError, match=r"spark-vllm:alertingSecrets: set in plaintext"):
        load_secrets(validate_config(raw))

    async def values() -> None:
        assert s.alerting is not None and await s.alerting.is_secret()
        # only the values a receiver names
        assert await s.alerting.future() == {"oncall-url": URL, "smtp": PASSWORD}

    return asyncio.ensure_future(values())


@pulumi.runtime.test
def test_no_receiver_with_a_secret_needs_none(mocks, set_config):
    assert _load(mocks, set_config, _raw(), {}).alerting is None
    no_login = {**MAIL, "email": {k: v for k, v in MAIL["email"].items()
                                  if k not in ("username", "passwordSecret")}}
    assert _load(mocks, set_config, _raw(no_login), {}).alerting is None
