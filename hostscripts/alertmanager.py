"""Alertmanager's pieces (spark-vllm:monitoring, config/monitoring.py `alerting`): its
configuration (`render`), the script that writes it, checks it with the Alertmanager image's own
`amtool check-config` and reloads the running Alertmanager, and its arguments.

What the configuration does (reference: https://prometheus.io/docs/alerting/latest/configuration/):

* route: every alert Prometheus sends (the stack's rules, the reconcile's among them) is grouped
  by `stack`, `model` and `node` (a model's alerts, whatever replica, in one notification; a
  node's in another), waits `group_wait` before the group's first notification,
  `group_interval` between notifications of new or resolved alerts in the group, and is sent
  again every `repeat_interval` while it fires. The root receiver tells nobody; one child route
  per declared receiver, each matching everything with `continue: true`, so every receiver gets
  every group;
* receivers: a webhook (its URL, often carrying a token, is a secret) or e-mail over SMTP (its
  password is a secret), each with `send_resolved`;
* inhibition: a node whose exporter is down (SparkNodeExporterDown, per node) silences the
  alerts of every model that runs on it: the main model runs on every node (one engine across
  them), a service's replica on its own node (its `replica` label). One rule per node and model,
  generated from where the stack runs them.

Secrets: Debian bookworm's Alertmanager 0.25 (the lab's image) reads a webhook's URL only from
the configuration (`url_file` came later), so the file that holds the secret values is written
from stdin into a root-only folder, never from a command line, and the command's text holds the
configuration with every secret value replaced by a placeholder (`redacted`): what a preview
shows and what the stack's state records. Both are checked with the image's amtool: the
redacted one with its output shown, the real one with its output hidden (a message about a
malformed value could quote it; config/load.py checks each value's form before it gets here).
Everything here uses only what both 0.25 and upstream's 0.2x accept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from contract import labels as lbl
from hostscripts import daemon as dm
from hostscripts.common import image_id, plain, q
from hostscripts.paths import ALERTMANAGER_DATA, ALERTMANAGER_MOUNT, StackNames

CONFIG_FILE = "alertmanager.yml"
NONE_RECEIVER = "spark-vllm-none"  # the root route's receiver: tells nobody
GROUP_BY = ("stack", "model", "node")
NODE_DOWN = "SparkNodeExporterDown"  # the source of the inhibition (hostscripts/monitoring.py)
MODEL_ALERTS = "SparkVllm(ModelNotServing|CrashLoop|KvCacheFull|RequestsWaiting)"
# placeholders of the secret values in the command's text (the redacted configuration)
REDACTED_URL = "https://redacted.invalid/"
REDACTED_PASSWORD = "redacted"  # a placeholder, not a password
# Alertmanager is a Go program: like Prometheus, a SIGHUP in its first milliseconds kills it
RELOAD_MIN_AGE_SECONDS = 5
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")  # config/monitoring.py ReceiverName
_NODE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


@dataclass(frozen=True)
class Webhook:
    url_secret: str  # the name of its URL in the secrets
    max_alerts: int = 0


@dataclass(frozen=True)
class Email:
    to: tuple[str, ...]
    sender: str
    smarthost: str
    username: str | None = None
    password_secret: str | None = None
    require_tls: bool = True


@dataclass(frozen=True)
class Receiver:
    name: str
    webhook: Webhook | None = None
    email: Email | None = None
    send_resolved: bool = True

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or self.name == NONE_RECEIVER:
            raise ValueError(f"not a receiver name: {self.name!r}")
        if (self.webhook is None) == (self.email is None):
            raise ValueError(f"receiver {self.name}: exactly one of webhook or email")

    @property
    def secrets(self) -> dict[str, str]:
        """The secret values it takes: name -> kind (url | password)."""
        if self.webhook is not None:
            return {self.webhook.url_secret: "url"}
        assert self.email is not None
        return {self.email.password_secret: "password"} if self.email.password_secret else {}


@dataclass(frozen=True)
class Placement:
    """A served model and the nodes it runs on. `replicas`: each node serves it on its own (a
    service), so a node down silences only that node's replica; otherwise one engine spans the
    nodes (the main model) and a node down silences the model."""

    model: str
    nodes: tuple[str, ...]
    replicas: bool = False


@dataclass(frozen=True)
class AlertingSpec:
    """Who Alertmanager tells, and how often; where the stack's models run (inhibition)."""

    stack: str
    nodes: tuple[str, ...]
    models: tuple[Placement, ...]
    receivers: tuple[Receiver, ...] = ()
    group_wait_seconds: int = 30
    group_interval_seconds: int = 300
    repeat_interval_seconds: int = 14400

    def __post_init__(self) -> None:
        StackNames(self.stack)
        for n in self.nodes:
            if not _NODE.fullmatch(n):
                raise ValueError(f"not a node name: {n!r}")
        for m in self.models:
            if not _SERVED.fullmatch(m.model) or not set(m.nodes) <= set(self.nodes) or \
                    not m.nodes:
                raise ValueError(f"model {m.model!r} on {m.nodes}: not a served name on the "
                                 "stack's nodes")
        names = [r.name for r in self.receivers]
        if len(set(names)) != len(names):
            raise ValueError(f"receiver names must be unique: {names}")
        if self.group_wait_seconds < 0 or self.group_interval_seconds < 1 or \
                self.repeat_interval_seconds < 1:
            raise ValueError("group wait >= 0 s, group and repeat intervals >= 1 s")

    @property
    def secrets(self) -> dict[str, str]:
        """Every secret value the receivers take: name -> kind."""
        out: dict[str, str] = {}
        for r in self.receivers:
            out.update(r.secrets)
        return out


def _s(value: str) -> str:
    """A YAML scalar (a JSON string is a YAML double-quoted one): no value can start a key, a
    list or a comment of its own."""
    return json.dumps(value)


def _seconds(n: int) -> str:
    return f"{int(n)}s"


def placeholders(spec: AlertingSpec) -> dict[str, str]:
    """Each secret value's placeholder in the redacted configuration."""
    return {name: REDACTED_URL if kind == "url" else REDACTED_PASSWORD
            for name, kind in spec.secrets.items()}


def render(spec: AlertingSpec, secrets: Mapping[str, str] | None = None) -> str:
    """alertmanager.yml. `secrets`: the values the receivers name (None: the placeholders, the
    redacted text the command's text holds). A value missing is a KeyError: never a file that
    says less than the stack declares."""
    values = placeholders(spec) if secrets is None else secrets
    lines = [
        "# spark-vllm's Alertmanager: written by the stack (hostscripts/alertmanager.py). A change",
        "# is a new folder, checked with this image's amtool, then Alertmanager reloads (SIGHUP).",
        "# https://prometheus.io/docs/alerting/latest/configuration/",
        "global:",
        "  resolve_timeout: 5m",
        "route:",
        f"  receiver: {_s(NONE_RECEIVER)}",
        f"  group_by: [{', '.join(_s(g) for g in GROUP_BY)}]",
        f"  group_wait: {_seconds(spec.group_wait_seconds)}",
        f"  group_interval: {_seconds(spec.group_interval_seconds)}",
        f"  repeat_interval: {_seconds(spec.repeat_interval_seconds)}",
    ]
    if spec.receivers:
        lines.append("  routes:")
        for r in spec.receivers:
            lines += [f"    - receiver: {_s(r.name)}", "      continue: true"]
    lines += ["receivers:", f"  - name: {_s(NONE_RECEIVER)}"]
    for r in spec.receivers:
        lines.append(f"  - name: {_s(r.name)}")
        if r.webhook is not None:
            lines += [
                "    webhook_configs:",
                f"      - url: {_s(values[r.webhook.url_secret])}",
                f"        send_resolved: {str(r.send_resolved).lower()}",
                f"        max_alerts: {int(r.webhook.max_alerts)}",
            ]
        elif r.email is not None:
            e = r.email
            lines += [
                "    email_configs:",
                f"      - to: {_s(', '.join(e.to))}",
                f"        from: {_s(e.sender)}",
                f"        smarthost: {_s(e.smarthost)}",
                f"        require_tls: {str(e.require_tls).lower()}",
                f"        send_resolved: {str(r.send_resolved).lower()}",
            ]
            if e.username is not None and e.password_secret is not None:
                lines += [f"        auth_username: {_s(e.username)}",
                          f"        auth_password: {_s(values[e.password_secret])}"]
    rules = inhibit_rules(spec)
    if rules:
        lines.append("inhibit_rules:")
        for node, model, replica in rules:
            target = [f"alertname=~{MODEL_ALERTS}", f'model="{model}"']
            if replica:
                target.append(f'replica="{node}"')
            lines += [
                f"  # {plain(node)} down: {plain(model)}" + (" (its replica there)"
                                                           if replica else " runs there"),
                f"  - source_matchers: [{_s(f'alertname={NODE_DOWN}')}, "
                f"{_s(f'node={json.dumps(node)}')}]",
                f"    target_matchers: [{', '.join(_s(m) for m in target)}]",
                f"    equal: [{_s('stack')}]",
            ]
    return "\n".join(lines) + "\n"


def inhibit_rules(spec: AlertingSpec) -> list[tuple[str, str, bool]]:
    """(node, model, by replica) for every node a model runs on."""
    return [(n, m.model, m.replicas) for n in spec.nodes for m in spec.models if n in m.nodes]


def config_hash(text: str) -> str:
    """A short content hash of the redacted configuration (names the folder it goes in)."""
    return dm.files_hash(text)


def daemon(names: StackNames) -> dm.Daemon:
    """Alertmanager as a configured daemon on the head (hostscripts/daemon.py): reloaded by
    SIGHUP (it reads its configuration again; one it refuses leaves the one it runs), once it
    has run RELOAD_MIN_AGE_SECONDS (a Go program, like Prometheus: hostscripts/monitoring.py
    daemon says why)."""
    return dm.Daemon(name="alertmanager", config="alertmanager", container=names.alertmanager,
                     dir=names.alertmanager_dir, signal="HUP",
                     wait=dm.wait_age(RELOAD_MIN_AGE_SECONDS))


def _check(image: str, folder: str, labels: Mapping[str, str], quiet: bool) -> str:
    """amtool check-config of `folder`'s file (a shell word: "$var") in the image."""
    run = dm.check_run(labels, [f"{folder}:{q(ALERTMANAGER_MOUNT + '/conf:ro')}"], "amtool",
                       image, f"check-config {q(ALERTMANAGER_MOUNT + '/conf/' + CONFIG_FILE)}")
    if not quiet:
        return f"{run} >&2"
    return (f"{run} >/dev/null 2>&1 || {{ echo 'alertmanager config: amtool refuses the "
            "configuration with the secret values (their form; its message is not shown: it "
            "could quote one)' >&2; exit 1; }")


def config_write(names: StackNames, redacted: str, image: str,
                 labels: Mapping[str, str]) -> str:
    """On the head: the configuration with the secret values (stdin) into a new root-only
    folder `conf.<hash of the redacted text>.<random>` (a new secret value keeps the redacted
    text's hash: the folder in use is never written over), after the redacted text (in this
    script) passed the Alertmanager image's own `amtool check-config`, the real one too
    (quietly); then made the one in use (`conf` is a link, swapped atomically), the older ones
    removed, and the running Alertmanager reloaded. A check that fails fails the command and
    leaves the configuration in use. Prints `alertmanager config <hash>`."""
    digest = config_hash(redacted)
    image = image_id(image)  # read back from the head: its exact form before a shell sees it
    d = names.alertmanager_dir
    check_labels = {**labels, lbl.ROLE: lbl.ALERTMANAGER_CHECK}
    return "\n".join([
        "set -eu",
        "umask 077",
        f"mkdir -p {q(d)}",
        f"chmod 700 {q(d)}",
        f"rm -rf {q(d)}/check.* {q(d)}/new.*",
        # the redacted text, checked with amtool's output shown
        f"check=$(mktemp -d {q(d + '/check.XXXXXX')})",
        f"printf '%s' {q(redacted)} > \"$check\"/{CONFIG_FILE}",
        _check(image, '"$check"', check_labels, quiet=False),
        'rm -rf "$check"',
        # the real one, with the secret values, from stdin only, checked quietly
        f"new=$(mktemp -d {q(d + '/new.XXXXXX')})",
        f'cat > "$new"/{CONFIG_FILE}',
        f'test -s "$new"/{CONFIG_FILE} || {{ echo "alertmanager config: nothing on stdin" >&2; '
        'rm -rf "$new"; exit 1; }',
        _check(image, '"$new"', check_labels, quiet=True),
        f"conf={q(d + '/conf.' + digest)}.$(basename \"$new\" | cut -d. -f2)",
        'mv "$new" "$conf"',
        *dm.swap_lines(daemon(names), '"$(basename "$conf")"', '"$conf"'),
        *reload_lines(names),
        f"echo 'alertmanager config {digest}'",
    ])


def config_remove(names: StackNames) -> str:
    """Alertmanager's configuration folders (and a check's or a new one's a run left)."""
    return dm.config_remove(daemon(names), names.dir, secrets=False, scratch=("check", "new"))


def reload_lines(names: StackNames) -> list[str]:
    """Shell lines: Alertmanager, if it runs, reloaded (`daemon`; hostscripts/daemon.py
    reload_lines says why the signal goes to the process, never through `docker kill -s`)."""
    return dm.reload_lines(daemon(names))


def entrypoint() -> list[str]:
    """Upstream's binary name (prom/alertmanager: /bin/alertmanager); the lab's image links
    Debian's /usr/bin/prometheus-alertmanager to it."""
    return ["alertmanager"]


def command(listen: str, port: int) -> list[str]:
    """Alertmanager reading the configuration in use, its notification log and silences in
    ALERTMANAGER_DATA (the data folder's mount), its API and UI on `listen`:`port` (an address
    of the head), and no cluster: its gossip listener (0.0.0.0:9094 by default, every address)
    is off, one Alertmanager per stack."""
    address = f"{plain(listen)}:{int(port)}"
    return [
        f"--config.file={ALERTMANAGER_MOUNT}/conf/{CONFIG_FILE}",
        f"--storage.path={ALERTMANAGER_DATA}",
        f"--web.listen-address={address}",
        f"--web.external-url=http://{address}/",
        "--cluster.listen-address=",
    ]
