"""hostscripts/alertmanager.py, checked and run: the rendered configuration through Debian's own
`amtool` (bookworm's Alertmanager 0.25, what the lab's image is built from), its routes through
`amtool config routes test`, a real `prometheus-alertmanager` with the rendered file delivering
to a stand-in webhook on loopback (grouping by stack and model, repeat and resolve
notifications, inhibition by a node down), and the head's script run for real with a stand-in
`docker` that runs the real amtool.

Needs the `amtool` and `prometheus-alertmanager` binaries (Debian's prometheus-alertmanager
package: `make setup` as root installs it, scripts/host_packages.sh); without them this module
fails saying so, it does not skip (make test fails on skips anyway).
"""

from __future__ import annotations

import datetime
import http.server
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hostscripts import alertmanager as am
from hostscripts.alertmanager import AlertingSpec, Email, Placement, Receiver, Webhook
from hostscripts.common import RemoteValueError
from hostscripts.paths import ALERTMANAGER_DATA, ALERTMANAGER_MOUNT, StackNames
from tests.unit.hostscripts import daemons
from tests.unit.hostscripts.daemons import debian_binary, no_network  # noqa: F401

NAMES = StackNames("t")
IMAGE = "sha256:" + "a" * 64
HOOK_TOKEN = "sEcReT-hook-token-0001"
PASSWORD = "smtp-pAssw0rd-never-shown"
MISSING = (
    "the {} binary is missing: the unit tier checks and runs the Alertmanager configuration "
    "with Debian's Alertmanager 0.25 (the package the lab's Alertmanager image is built from). "
    "Install it as root: `make setup` (scripts/host_packages.sh), or `apt-get update && "
    "apt-get install -y --no-install-recommends prometheus-alertmanager`")


def _binary(name: str) -> str:
    return debian_binary(name, MISSING)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MAIN = Placement("tiny-moe", ("spark-1", "spark-2"))
EMBED = Placement("org/tiny-embed", ("spark-1", "spark-2"), replicas=True)
WEBHOOK = Receiver("oncall", webhook=Webhook("hook"))
MAIL = Receiver("ops-mail", email=Email(("ops@example.com", "lead@example.com"),
                                        "spark@example.com", "smtp.example.com:587", "spark",
                                        "smtp"), send_resolved=False)


def _spec(*receivers: Receiver, **over: Any) -> AlertingSpec:
    values: dict[str, Any] = dict(stack="t", nodes=("spark-1", "spark-2"), models=(MAIN, EMBED),
                                  receivers=receivers)
    values.update(over)
    return AlertingSpec(**values)


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    return subprocess.run([_binary("amtool"), "check-config", str(path)], capture_output=True,
                          text=True)


# --- the file, through amtool -----------------------------------------------------------------


@pytest.mark.parametrize("receivers", [(), (WEBHOOK,), (MAIL,), (WEBHOOK, MAIL)])
def test_amtool_accepts_the_rendered_configuration(tmp_path, receivers):
    """`amtool check-config` passes on what render() writes, redacted (the command's text) and
    with the secret values: no receiver, a webhook, e-mail, both."""
    spec = _spec(*receivers)
    for text in (am.render(spec), am.render(spec, {"hook": f"https://h.example.com/{HOOK_TOKEN}",
                                                   "smtp": PASSWORD})):
        done = _check(tmp_path, text)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{len(receivers) + 1} receivers" in done.stdout
        assert "4 inhibit rules" in done.stdout  # 2 nodes x 2 models


def test_amtool_refuses_a_broken_configuration(tmp_path):
    """The check can fail: a malformed matcher and a webhook URL without a scheme."""
    text = am.render(_spec(WEBHOOK))
    assert _check(tmp_path, text.replace("alertname=~", "alertname=~~(")).returncode != 0
    done = _check(tmp_path, am.render(_spec(WEBHOOK), {"hook": "not a url"}))
    assert done.returncode != 0


def test_the_secret_values_are_only_where_they_belong():
    spec = _spec(WEBHOOK, MAIL)
    real = am.render(spec, {"hook": f"https://h.example.com/{HOOK_TOKEN}", "smtp": PASSWORD})
    redacted = am.render(spec)
    assert HOOK_TOKEN in real and PASSWORD in real
    assert HOOK_TOKEN not in redacted and PASSWORD not in redacted
    assert am.REDACTED_URL in redacted and f'auth_password: "{am.REDACTED_PASSWORD}"' in redacted
    assert real.replace(f"https://h.example.com/{HOOK_TOKEN}", am.REDACTED_URL).replace(
        PASSWORD, am.REDACTED_PASSWORD) == redacted
    with pytest.raises(KeyError):
        am.render(spec, {"hook": "https://h.example.com/"})  # the password missing


def test_every_receiver_gets_every_alert_and_groups_by_stack_model_and_node(tmp_path):
    """`amtool config routes test`: a model's alert, a node's and the reconcile's reach every
    declared receiver (their child routes `continue`), and the route groups by stack, model and
    node with the spec's timings."""
    path = tmp_path / "alertmanager.yml"
    path.write_text(am.render(_spec(WEBHOOK, MAIL, group_wait_seconds=7,
                                    group_interval_seconds=11, repeat_interval_seconds=600)))
    for labels in (["alertname=SparkVllmModelNotServing", "stack=t", "model=tiny-moe",
                    "replica=spark-1"],
                   ["alertname=SparkNodeMemoryLow", "stack=t", "node=spark-2"],
                   ["alertname=SparkVllmDriftNotRepaired", "stack=t", "node=spark-1"]):
        done = subprocess.run([_binary("amtool"), "config", "routes", "test",
                               f"--config.file={path}", "--verify.receivers=oncall,ops-mail",
                               *labels], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([_binary("amtool"), "config", "routes", f"--config.file={path}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "spark-vllm-none" in done.stdout and "oncall" in done.stdout
    text = path.read_text()
    assert 'group_by: ["stack", "model", "node"]' in text
    assert "group_wait: 7s" in text and "group_interval: 11s" in text
    assert "repeat_interval: 600s" in text


def test_inhibition_silences_the_models_on_a_node_that_is_down():
    """One rule per node and model: the main model (one engine over every node) by its name,
    a service's replica by its node too; a model not on the node is not silenced."""
    spec = _spec(models=(MAIN, Placement("embed", ("spark-2",), replicas=True)))
    assert am.inhibit_rules(spec) == [("spark-1", "tiny-moe", False),
                                      ("spark-2", "tiny-moe", False),
                                      ("spark-2", "embed", True)]


@pytest.mark.parametrize("over", [
    {"stack": "a b"},
    {"nodes": ("Spark 1",)},
    {"models": (Placement("tiny-moe", ("spark-9",)),)},
    {"models": (Placement("a b", ("spark-1",)),)},
    {"receivers": (WEBHOOK, WEBHOOK)},
    {"group_interval_seconds": 0},
])
def test_a_spec_that_cannot_be_rendered_is_refused(over):
    with pytest.raises(ValueError):
        _spec(**over)


def test_a_receiver_is_one_of_webhook_or_email_under_a_name_of_its_own():
    for bad in (dict(name="Bad Name", webhook=Webhook("x")), dict(name="x"),
                dict(name="x", webhook=Webhook("x"), email=MAIL.email),
                dict(name=am.NONE_RECEIVER, webhook=Webhook("x"))):
        with pytest.raises(ValueError):
            Receiver(**bad)


# --- a real Alertmanager, telling a stand-in webhook on loopback -------------------------------


class _Sink(http.server.BaseHTTPRequestHandler):
    """A webhook receiver: every notification's path and JSON body, in order."""

    got: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.got.append((self.path, json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Alertmanager:
    """Debian's prometheus-alertmanager with command()'s flags, its paths under `root`."""

    def __init__(self, root: Path, text: str) -> None:
        (root / "conf").mkdir(parents=True)
        (root / "data").mkdir()
        (root / "conf" / am.CONFIG_FILE).write_text(text)
        self.port = _free_port()
        argv = []
        for a in am.command("127.0.0.1", self.port):
            argv.append(a.replace(ALERTMANAGER_MOUNT, str(root)).replace(
                f"={ALERTMANAGER_DATA}", f"={root / 'data'}"))
        self.log = root / "alertmanager.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([_binary("prometheus-alertmanager"), *argv],
                                         stdout=out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        end = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < end, self.log.read_text()[-3000:]
            time.sleep(0.2)

    def post(self, *alerts: dict[str, Any]) -> None:
        req = urllib.request.Request(self.url + "/api/v2/alerts", method="POST",
                                     data=json.dumps(list(alerts)).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/api/v2/alerts", timeout=10) as r:
            result: list[dict[str, Any]] = json.loads(r.read())
            return result

    def stop(self) -> str:
        return daemons.stop(self.proc, self.log)


def _alert(name: str, ends: float | None = None, **labels: str) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC)
    out: dict[str, Any] = {"labels": {"alertname": name, "stack": "t", **labels},
                           "annotations": {"summary": f"{name} {labels}"},
                           "startsAt": (now - datetime.timedelta(seconds=60)).isoformat()}
    if ends is not None:
        out["endsAt"] = (now + datetime.timedelta(seconds=ends)).isoformat()
    return out


def _wait(pred, timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def sink() -> Iterator[tuple[type[_Sink], int]]:
    handler = type("Sink", (_Sink,), {"got": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, server.server_address[1]
    server.shutdown()


def test_a_real_alertmanager_groups_repeats_resolves_and_inhibits(tmp_path, sink):
    """Debian's Alertmanager with the rendered file (the webhook's URL, a secret, in it):
    - a model's not-serving alert reaches the webhook as a group of its stack and model, within
      group_wait, and again after repeat_interval while it fires;
    - resolved (its endsAt past), the webhook hears of the resolution (send_resolved);
    - the worker's exporter down silences the main model's alert (it runs there) and the
      service's replica on the worker, not the service's replica on the head: those are not
      delivered, and the API says they are suppressed (inhibitedBy)."""
    handler, port = sink
    url = f"http://127.0.0.1:{port}/hook/{HOOK_TOKEN}"
    spec = _spec(WEBHOOK, group_wait_seconds=1, group_interval_seconds=1,
                 repeat_interval_seconds=3)
    a = Alertmanager(tmp_path / "am", am.render(spec, {"hook": url}))
    try:
        a.post(_alert("SparkVllmModelNotServing", model="tiny-moe", replica="spark-1"))
        first = _wait(lambda: [b for _, b in handler.got if b["status"] == "firing"], 15,
                      "the first notification")[0]
        assert handler.got[0][0] == f"/hook/{HOOK_TOKEN}"
        assert first["receiver"] == "oncall" and first["groupLabels"] == {
            "stack": "t", "model": "tiny-moe"}
        assert [x["labels"]["alertname"] for x in first["alerts"]] == [
            "SparkVllmModelNotServing"]
        # repeated while it fires (kept firing: re-posted as Prometheus does every evaluation)
        t0 = time.monotonic()
        _wait(lambda: (a.post(_alert("SparkVllmModelNotServing", model="tiny-moe",
                                     replica="spark-1")),
                       len([b for _, b in handler.got if b["status"] == "firing"]) >= 2)[1],
              20, "the repeat")
        assert time.monotonic() - t0 >= 1
        # resolved
        a.post(_alert("SparkVllmModelNotServing", ends=-1, model="tiny-moe",
                      replica="spark-1"))
        resolved = _wait(lambda: [b for _, b in handler.got if b["status"] == "resolved"], 15,
                         "the resolution")[0]
        assert resolved["alerts"][0]["status"] == "resolved"
        assert resolved["groupLabels"] == {"stack": "t", "model": "tiny-moe"}
        # a node down: the models on it silenced, the others not
        handler.got.clear()

        def delivered() -> set[tuple[str, str]]:
            return {(x["labels"]["alertname"], x["labels"].get("model") or x["labels"]["node"])
                    for _, b in handler.got for x in b["alerts"] if x["status"] == "firing"}

        # the node's alert first, as Prometheus sends it (its rule fires before the models'
        # are re-sent): the inhibition holds once Alertmanager has taken it in
        a.post(_alert("SparkNodeExporterDown", node="spark-2"))
        _wait(lambda: ("SparkNodeExporterDown", "spark-2") in delivered(), 15, "the node's alert")
        a.post(_alert("SparkNodeExporterDown", node="spark-2"),
               _alert("SparkVllmModelNotServing", model="tiny-moe", replica="spark-1"),
               _alert("SparkVllmCrashLoop", model="org/tiny-embed", replica="spark-2"),
               _alert("SparkVllmModelNotServing", model="org/tiny-embed", replica="spark-1"))

        _wait(lambda: {("SparkNodeExporterDown", "spark-2"),
                       ("SparkVllmModelNotServing", "org/tiny-embed")} <= delivered(), 15,
              "the node's and the head replica's alerts")
        time.sleep(3)  # more group intervals: the silenced ones still do not come
        assert delivered() == {("SparkNodeExporterDown", "spark-2"),
                               ("SparkVllmModelNotServing", "org/tiny-embed")}
        states = {(x["labels"]["alertname"], x["labels"]["model"], x["labels"]["replica"]):
                  (x["status"]["state"], bool(x["status"]["inhibitedBy"]))
                  for x in a.alerts() if "model" in x["labels"]}
        assert states == {
            ("SparkVllmModelNotServing", "tiny-moe", "spark-1"): ("suppressed", True),
            ("SparkVllmCrashLoop", "org/tiny-embed", "spark-2"): ("suppressed", True),
            ("SparkVllmModelNotServing", "org/tiny-embed", "spark-1"): ("active", False)}
    finally:
        log = a.stop()
    assert "msg=\"Listening on\"" in log or "Listening" in log


# --- the head's script, run with a stand-in docker that runs the real amtool --------------------


def _head(tmp: Path) -> daemons.Head:
    return daemons.Head(tmp, NAMES, NAMES.alertmanager_dir, ALERTMANAGER_MOUNT, "amtool",
                        _binary("amtool"))


def test_config_write_checks_both_texts_and_keeps_the_secrets_root_only(tmp_path):
    """config_write, run: the redacted text (in the script) and the real one (stdin) both pass
    amtool; the real one becomes `conf/alertmanager.yml` (a link to `conf.<hash>`, root only:
    the folder 0700, the file 0600); the script's text holds no secret value. A real text
    amtool refuses fails the script with a message that does not quote it, and leaves `conf`
    as it was; so does an empty stdin."""
    head = _head(tmp_path)
    spec = _spec(WEBHOOK, MAIL)
    url = f"https://h.example.com/{HOOK_TOKEN}"
    real = am.render(spec, {"hook": url, "smtp": PASSWORD})
    redacted = am.render(spec)
    script = am.config_write(NAMES, redacted, IMAGE, {"spark-vllm.managed": "true"})
    assert HOOK_TOKEN not in script and PASSWORD not in script
    done = head.run(script, stdin=real)
    assert done.returncode == 0, done.stderr
    digest = am.config_hash(redacted)
    assert done.stdout == f"alertmanager config {digest}\n"
    conf = head.d / "conf"
    assert os.readlink(conf).startswith(f"conf.{digest}.")
    assert (conf / am.CONFIG_FILE).read_text() == real
    assert oct(head.d.stat().st_mode & 0o777) == "0o700"
    assert oct((head.d / os.readlink(conf)).stat().st_mode & 0o777) == "0o700"
    assert oct((conf / am.CONFIG_FILE).stat().st_mode & 0o777) == "0o600"
    (in_use,) = [p.name for p in head.d.iterdir() if p.name != "conf"]
    assert in_use.startswith(f"conf.{digest}.")
    assert "--label spark-vllm.role=alertmanager-check" in head.docker_log.read_text()
    # a value amtool refuses: failed, not quoted, the configuration in use kept
    bad = am.render(spec, {"hook": f"not-a-url-{HOOK_TOKEN}", "smtp": PASSWORD})
    done = head.run(am.config_write(NAMES, redacted, IMAGE, {}), stdin=bad)
    assert done.returncode != 0
    assert "amtool refuses the configuration with the secret values" in done.stderr
    assert HOOK_TOKEN not in done.stderr + done.stdout
    assert (conf / am.CONFIG_FILE).read_text() == real
    done = head.run(am.config_write(NAMES, redacted, IMAGE, {}), stdin="")
    assert done.returncode != 0 and (conf / am.CONFIG_FILE).read_text() == real
    # a new secret value, the same redacted text: a folder of its own, then in use
    other = am.render(spec, {"hook": url + "-new", "smtp": PASSWORD})
    done = head.run(am.config_write(NAMES, redacted, IMAGE, {}), stdin=other)
    assert done.returncode == 0, done.stderr
    assert (conf / am.CONFIG_FILE).read_text() == other
    assert len([p for p in head.d.iterdir() if p.name != "conf"]) == 1
    # a redacted text amtool refuses: its message shown
    broken = redacted.replace("alertname=~", "alertname=~~(")
    done = head.run(am.config_write(NAMES, broken, IMAGE, {}), stdin=real)
    assert done.returncode != 0 and "FAILED" in done.stdout + done.stderr
    assert (conf / am.CONFIG_FILE).read_text() == other
    # removed on destroy, with the stack's folder when empty
    done = head.run(am.config_remove(NAMES))
    assert done.returncode == 0 and not head.d.exists() and not head.stack_dir.exists()


def test_config_write_refuses_what_is_not_an_image_id():
    for bad in ("", "sha256:x; reboot", "prom/alertmanager:v0.25.0", IMAGE + "\n"):
        with pytest.raises(RemoteValueError):
            am.config_write(NAMES, am.render(_spec()), bad, {})


def test_command_listens_where_asked_with_the_cluster_off():
    argv = am.command("127.0.0.1", 9093)
    assert "--web.listen-address=127.0.0.1:9093" in argv
    assert "--cluster.listen-address=" in argv  # 0.0.0.0:9094 by default: every address
    assert f"--config.file={ALERTMANAGER_MOUNT}/conf/alertmanager.yml" in argv
    assert f"--storage.path={ALERTMANAGER_DATA}" in argv
    assert am.entrypoint() == ["alertmanager"]
    with pytest.raises(ValueError):
        am.command("127.0.0.1; reboot", 9093)
