"""The gateway's pieces: HAProxy's configuration (`render`), the scripts that write it, check it
with the gateway image's own `haproxy -c` and reload the running gateway, the files that hold
the key's digest and the TLS key, and the gate that proves the gateway from the head.

Why HAProxy (docs/design.md "The gateway"): Debian-packaged (bookworm: 2.6 LTS, what the lab
builds its image from) and an upstream image for the Sparks; it reads the JSON body's `model`
(`json_query`), hashes (`sha2`) and compares in constant time (`secure_memcmp`), answers by
itself (`http-request return`), routes through maps, streams responses as they come and reloads
without dropping connections (master-worker mode, SIGUSR2). Configuration manual:
https://docs.haproxy.org/2.6/configuration.html, management: https://docs.haproxy.org/2.6/management.html.

What the rendered configuration does, in this order, for every request:

1. `GET /gateway/live`: 200 `ok` from HAProxy itself, with no key (a liveness probe that says
   nothing about the models: vLLM registers no such path);
2. every other request needs the stack's API key as `Authorization: Bearer <key>`: HAProxy
   hashes the presented token with SHA-256 and compares it in constant time with the key's
   digest, read from a root-only map file the stack writes from stdin; the key itself never
   reaches the gateway's node, its files or any command line. Without it: 401 (JSON), and the
   connection is closed (issue 46: it stayed open 60 s for the next guess);
3. `GET /v1/models`: the served models, a static answer the stack generates;
4. `/metrics`: the main model's vLLM metrics, `/metrics?model=<served name>` another's, and
   `/metrics?model=<served name>&replica=<node>` those of that node's vLLM of the model only
   (Prometheus scrapes each replica so: through the model's balancing, each scrape would reach
   any replica, its counters jumping between processes); a replica the model does not have:
   404 naming its replicas;
5. a POST's `model` (the JSON body's) picks the backend through a map; a name the stack does not
   serve: 404 listing the served names; no `model` at all: the main model (vLLM's default); a
   body larger than `gateway.maxBodyBytes` whose `model` is not within that prefix: 413.

Responses are forwarded as they arrive (no response buffering, no compression): server-sent
events stream through. A client that goes away closes the connection to vLLM, which then aborts
the request.

Before any of that, per client address (a stick table, issue 46): a connection beyond
`gateway.maxConnectionsPerSource` at once, or from an address past
`gateway.unauthorizedPerMinute` answers 401 in the last minute, is closed as it arrives, before
it takes one of the `maxconn` slots; a request's headers must arrive within
`gateway.headerTimeoutSeconds` (until then nobody is authenticated). The counters are read
through HAProxy's stats socket (`stats_script`) by `spark-vllm status`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from contract import labels as lbl
from hostscripts import daemon as dm
from hostscripts.common import (
    container_ids,
    image_id,
    payload,
    plain,
    q,
    stack_path_remove,
)
from hostscripts.paths import GATEWAY_MOUNT, GATEWAY_RUN_MOUNT, GATEWAY_STATS_SOCKET, StackNames

_GATE_PY = payload("gateway_health.py")

LIVE_PATH = "/gateway/live"  # the one path without the key
KEY_MAP_KEY = "api-key"  # the map entry holding the key's digest
# Inactivity limits: a non-streamed completion of a long answer sends nothing until it is done
TIMEOUT_SECONDS = 3600
BODY_WAIT_SECONDS = 30  # how long the gateway waits for a request body to find its `model`
# The per-source stick table: addresses seen in the last SOURCE_MEMORY_SECONDS (up to
# SOURCE_TABLE_SIZE of them), their connections now and their 401s (count and rate per minute)
SOURCE_TABLE = "api"
SOURCE_TABLE_SIZE = 100_000
SOURCE_MEMORY_SECONDS = 600
# HAProxy's buffers are tune.bufsize each (maxBodyBytes), held by every connection with data in
# flight, before the key is checked too: the connections at once are bounded so that their
# request buffers never take more than BUFFER_BUDGET (1 GiB; as much again for responses)
BUFFER_BUDGET = 1 << 30
MAXCONN_RANGE = (16, 4096)
_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")  # config.types.ServedName


@dataclass(frozen=True)
class Server:
    """One vLLM that serves a route: the node and the address the gateway reaches it at."""

    node: str
    address: str
    port: int


@dataclass(frozen=True)
class Route:
    """A served model name and the vLLM containers that serve it."""

    name: str
    task: str  # generate | embed | score (config.ServiceTask)
    repo: str
    servers: tuple[Server, ...]


@dataclass(frozen=True)
class GatewaySpec:
    """What the gateway serves; `routes[0]` is the main model (a request without `model`)."""

    port: int
    tls: bool
    max_body_bytes: int
    routes: tuple[Route, ...]
    max_connections_per_source: int = 64  # config.gateway's defaults
    unauthorized_per_minute: int = 30
    header_timeout_seconds: int = 5

    def __post_init__(self) -> None:
        if not self.routes:
            raise ValueError("a gateway needs at least the main model's route")
        names = [r.name for r in self.routes]
        if len(set(names)) != len(names):
            raise ValueError(f"served names must be unique: {names}")
        for r in self.routes:
            # the names reach a map file, JSON answers and comments: only the config's form
            if not _SERVED.fullmatch(r.name) or not r.servers:
                raise ValueError(f"route {r.name!r}: not a served name, or no server")

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.routes]


def maxconn(max_body_bytes: int) -> int:
    """The connections HAProxy takes at once (more wait in the kernel's backlog): BUFFER_BUDGET
    over the buffer size, within MAXCONN_RANGE (512 at the default 2 MiB; vLLM serves far fewer
    requests at once: the 122B recipe's maxNumSeqs is 4)."""
    low, high = MAXCONN_RANGE
    return max(low, min(high, BUFFER_BUDGET // max_body_bytes))


def backend_name(index: int, route: Route) -> str:
    """A HAProxy backend name for a route (its served name may hold `/`)."""
    return f"model{index}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", route.name)


def replica_backend_name(index: int, route: Route, server: Server) -> str:
    """The backend of one replica of a route: that server alone (its metrics)."""
    return f"{backend_name(index, route)}.{plain(server.node)}"


def replica_key(route: Route, server: Server) -> str:
    """The key of replicas.map: `<served name>@<node>` (a served name has no `@`)."""
    return f"{route.name}@{server.node}"


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n"


def _error(code: int, kind: str, message: str, **more: object) -> str:
    """vLLM's (OpenAI's) error shape."""
    return _json({"error": {"message": message, "type": kind, "param": more.pop("param", None),
                            "code": code, **more}})


def render(spec: GatewaySpec, *, root: str = GATEWAY_MOUNT, run: str = GATEWAY_RUN_MOUNT,
           user: str | None = "haproxy") -> dict[str, str]:
    """The gateway's configuration files, by path under `<root>/conf` (the folder the running
    HAProxy reads; `root` is GATEWAY_MOUNT in the container, another folder in tests). The
    key's digest and the TLS file are under `<root>/secrets`, written by their own commands;
    the stats socket (root only) in `run`. `user`: whom HAProxy's workers run as (the master
    stays root to read the root-only files on every reload); None to run as the caller."""
    conf, secrets = f"{root}/conf", f"{root}/secrets"
    errors = f"{conf}/errors"
    served = ", ".join(spec.names)
    replicas = [replica_key(r, s) for r in spec.routes for s in r.servers]
    files = {
        "models.map": "".join(f"{r.name} {backend_name(i, r)}\n"
                              for i, r in enumerate(spec.routes)),
        "replicas.map": "".join(f"{replica_key(r, s)} {replica_backend_name(i, r, s)}\n"
                                for i, r in enumerate(spec.routes) for s in r.servers),
        "models.json": _json({"object": "list", "data": [
            {"id": r.name, "object": "model", "created": 0, "owned_by": "spark-vllm",
             "root": r.repo, "parent": None} for r in spec.routes]}),
        "errors/401.json": _error(
            401, "AuthenticationError",
            "Unauthorized: send the stack's API key as `Authorization: Bearer <key>`"),
        "errors/404.json": _error(
            404, "NotFoundError", f"The model is not served here. Served models: {served}",
            param="model", served_models=spec.names),
        "errors/404replica.json": _error(
            404, "NotFoundError", "No such replica: /metrics?model=<served name>&replica=<node> "
            f"names one of {', '.join(replicas)}", param="replica", replicas=replicas),
        "errors/413.json": _error(
            413, "RequestTooLarge",
            f"The request body is larger than the {spec.max_body_bytes} bytes the gateway reads "
            "to find its `model`, and `model` was not within them: put `model` first in the "
            "JSON body, or raise spark-vllm:gateway.maxBodyBytes", param="model"),
        "errors/502.json": _error(502, "BadGateway", "The model's server answered badly"),
        "errors/503.json": _error(503, "ServiceUnavailable",
                                  "The model's server is not available (starting or down)"),
        "errors/504.json": _error(504, "GatewayTimeout", "The model's server did not answer"),
    }
    bind = f"bind *:{spec.port}"
    if spec.tls:
        bind += f" ssl crt {secrets}/tls.pem alpn h2,http/1.1"
    lines = [
        "# spark-vllm's gateway: written by the stack (hostscripts/gateway.py). A change is a",
        "# new folder, checked with this image's haproxy -c, then the running HAProxy reloads.",
        "global",
        "    log stdout format raw local0 info",
        f"    maxconn {maxconn(spec.max_body_bytes)}",
        # the request buffer is what json_query sees of a body
        f"    tune.bufsize {spec.max_body_bytes}",
        # workers of an older configuration finish their streams at most this long after a
        # reload; no connection is dropped before
        f"    hard-stop-after {TIMEOUT_SECONDS}s",
        # the counters `spark-vllm status` shows (stats_script): root only, on the head
        f"    stats socket {run}/{GATEWAY_STATS_SOCKET} mode 600 level operator",
    ]
    if user is not None:
        lines += [f"    user {user}", f"    group {user}"]
    if spec.tls:
        lines.append("    ssl-default-bind-options ssl-min-ver TLSv1.2")
    lines += [
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlognull",
        "    option forwardfor",
        # a client that closes before the answer aborts the request at vLLM (without it,
        # HAProxy waits for vLLM's answer to a client that left: measured)
        "    option abortonclose",
        # send each piece of a response as it comes: without it HAProxy holds back small
        # writes hoping for more (measured: every server-sent event ~200 ms late)
        "    option http-no-delay",
        "    timeout connect 5s",
        # the headers of a request: until they are in, nobody is authenticated (issue 46: a
        # slow header held a slot 30 s); the body of an authenticated one: wait-for-body
        f"    timeout http-request {spec.header_timeout_seconds}s",
        "    timeout http-keep-alive 60s",
        "    timeout queue 30s",
        f"    timeout client {TIMEOUT_SECONDS}s",
        f"    timeout server {TIMEOUT_SECONDS}s",
        "    timeout check 5s",
        *(f"    http-error status {code} content-type application/json "
          f"file {errors}/{code}.json" for code in (502, 503, 504)),
        "",
        "frontend api",
        f"    {bind}",
        "    # per client address: its connections now and its 401s; one past either limit is",
        "    # closed as it arrives, before it takes a slot (issue 46)",
        f"    stick-table type ip size {SOURCE_TABLE_SIZE} expire {SOURCE_MEMORY_SECONDS}s "
        "store conn_cur,gpc0,gpc0_rate(60s)",
        "    tcp-request connection track-sc0 src",
        f"    tcp-request connection reject if {{ sc0_conn_cur gt "
        f"{spec.max_connections_per_source} }}",
        f"    tcp-request connection reject if {{ sc0_gpc0_rate gt "
        f"{spec.unauthorized_per_minute} }}",
        "    # liveness only: nothing about the models",
        f"    http-request return status 200 content-type text/plain string ok "
        f"if {{ path {LIVE_PATH} }}",
        "    # the stack's API key: the presented token's SHA-256 against the key's, compared in",
        "    # constant time; the key's digest is a root-only file, the key is nowhere here",
        f"    http-request set-var(txn.want) str({KEY_MAP_KEY}),map({secrets}/api-key.map)",
        "    http-request set-var(txn.got) http_auth_bearer,sha2(256),hex,lower",
        "    acl authorized var(txn.got),secure_memcmp(txn.want)",
        "    # counted against the source, answered, and the connection closed",
        "    http-request sc-inc-gpc0(0) unless authorized",
        f"    http-request return status 401 content-type application/json "
        f"file {errors}/401.json hdr WWW-Authenticate 'Bearer realm=\"spark-vllm\"' "
        "hdr Connection close unless authorized",
        "    # the served models, as the stack knows them",
        f"    http-request return status 200 content-type application/json "
        f"file {conf}/models.json if {{ path /v1/models }} METH_GET",
        "    # vLLM's metrics: the main model's, or those of ?model=<served name>",
        "    acl metrics path /metrics",
        "    http-request set-var(txn.model) urlp(model),url_dec if metrics",
        "    # ... or of one replica: &replica=<node> (the main model's without a model)",
        "    http-request set-var(txn.replica) urlp(replica),url_dec if metrics",
        f"    http-request set-var(txn.model) str({spec.routes[0].name}) if metrics "
        "{ var(txn.replica) -m found } !{ var(txn.model) -m found }",
        "    # the model a request is for: its JSON body's `model`",
        f"    http-request wait-for-body time {BODY_WAIT_SECONDS}s if METH_POST !metrics",
        "    http-request set-var(txn.model) req.body,json_query('$.model') "
        "if METH_POST !metrics",
        f"    http-request set-var(txn.backend) var(txn.model),map({conf}/models.map)",
        f"    http-request return status 404 content-type application/json "
        f"file {errors}/404.json if {{ var(txn.model) -m found }} "
        "!{ var(txn.backend) -m found }",
        "    http-request set-var(txn.bodysize) req.body_size if METH_POST",
        f"    http-request return status 413 content-type application/json "
        f"file {errors}/413.json if METH_POST !{{ var(txn.model) -m found }} "
        "{ req.body_len,sub(txn.bodysize) lt 0 }",
        "    http-request set-var(txn.rkey) var(txn.model),concat(@,txn.replica) "
        "if metrics { var(txn.replica) -m found } { var(txn.backend) -m found }",
        f"    http-request set-var(txn.rbackend) var(txn.rkey),map({conf}/replicas.map) "
        "if { var(txn.rkey) -m found }",
        f"    http-request return status 404 content-type application/json "
        f"file {errors}/404replica.json if {{ var(txn.replica) -m found }} "
        "!{ var(txn.rbackend) -m found }",
        "    use_backend %[var(txn.rbackend)] if { var(txn.rbackend) -m found }",
        "    use_backend %[var(txn.backend)] if { var(txn.backend) -m found }",
        f"    default_backend {backend_name(0, spec.routes[0])}",
    ]
    for i, r in enumerate(spec.routes):
        lines += [
            "",
            # a comment and directive words of haproxy.cfg: a newline in a value would start a
            # directive of its own, so only plain values (issue 31, item 7: hostscripts.common)
            f"# {r.name}: {plain(r.task)}, {plain(r.repo)}",
            f"backend {backend_name(i, r)}",
            "    balance leastconn",
            "    option httpchk GET /health",
            "    http-check expect status 200",
            "    default-server check inter 5s fall 2 rise 1",
            *(f"    server {plain(s.node)} {plain(s.address)}:{int(s.port)}" for s in r.servers),
        ]
        for s in r.servers:
            # one replica's metrics: that server alone, no balancing and no health check (a
            # replica down answers 503 at once: its target is down, as it should be)
            lines += [
                "",
                f"backend {replica_backend_name(i, r, s)}",
                f"    server {plain(s.node)} {plain(s.address)}:{int(s.port)}",
            ]
    files["haproxy.cfg"] = "\n".join(lines) + "\n"
    return dict(sorted(files.items()))


def config_hash(files: Mapping[str, str]) -> str:
    """A short content hash of the configuration files (names the folder they go in)."""
    return dm.files_hash(_json(dict(files)))


def key_map(api_key: str) -> str:
    """The key's digest as the map the configuration reads (computed where Pulumi runs, from the
    secret; travels on stdin into a root-only file)."""
    return f"{KEY_MAP_KEY} {hashlib.sha256(api_key.encode()).hexdigest()}\n"


def daemon(names: StackNames) -> dm.Daemon:
    """The gateway as a configured daemon on the head (hostscripts/daemon.py): reloaded by
    SIGUSR2 to HAProxy's master (new workers take the listeners, the old ones finish their
    connections). HAProxy's master ignores SIGUSR2 until it has started (measured: a reload sent
    then is lost), so the reload first waits until it catches the signal (SigCgt bit 12), at
    most 30 s."""
    return dm.Daemon(name="gateway", config="gateway", container=names.gateway,
                     dir=names.gateway_dir, signal="USR2",
                     wait=dm.wait_caught("gateway", "SIGUSR2", bit=11))


def key_write(names: StackNames) -> str:
    """On the head: the key's digest map (stdin) into its root-only file, and a running gateway
    reloaded to read it (a new key takes at once); prints the file's sha256."""
    return dm.secret_write(daemon(names), names.gateway_key_file, "gateway key digest")


def tls_write(names: StackNames) -> str:
    """On the head: the TLS chain and private key (stdin, one PEM file) into its root-only file,
    and a running gateway reloaded to read it; prints the file's sha256."""
    return dm.secret_write(daemon(names), names.gateway_tls_file, "gateway tls")


def reload_lines(names: StackNames) -> list[str]:
    """Shell lines: the gateway, if it runs, reloaded (`daemon`; hostscripts/daemon.py
    reload_lines says why the signal goes to the process, never through `docker kill -s`)."""
    return dm.reload_lines(daemon(names))


def secret_remove(names: StackNames, path: str) -> str:
    """One of the gateway's secret files removed, with its folders as far as they are empty."""
    return stack_path_remove(names, path, tree=True)


def config_write(names: StackNames, files: Mapping[str, str], image: str,
                 labels: Mapping[str, str]) -> str:
    """On the head: the configuration into a new folder `conf.<hash>`, checked by the gateway
    image's own `haproxy -c` (with the secret files it reads), then made the one in use (`conf`
    is a link, swapped atomically) and the running gateway reloaded (reload_lines): the
    daemon's config_write (hostscripts/daemon.py). A check that fails fails the command and
    leaves the configuration in use as it was. Nothing secret is in its text (a new key or
    certificate reloads the gateway from its own command). Prints `gateway config <hash>`."""
    digest = config_hash(files)
    image = image_id(image)  # read back from the head: its exact form before a shell sees it
    d = daemon(names)
    new = f"{d.dir}/conf.{digest}"
    check_labels = {**labels, lbl.ROLE: lbl.GATEWAY_CHECK}
    for path in files:
        if not re.fullmatch(r"[a-z0-9]+(/[a-z0-9]+)?\.[a-z]+", path):
            raise ValueError(f"not a gateway file name: {path!r}")
    check = dm.check_run(
        check_labels, [q(new + ":" + GATEWAY_MOUNT + "/conf:ro"),
                       q(d.dir + "/secrets:" + GATEWAY_MOUNT + "/secrets:ro")],
        "haproxy", image, f"-c -f {q(GATEWAY_MOUNT + '/conf/haproxy.cfg')} >&2")
    return dm.config_write(d, files.items(), digest, check, subdir="errors")


def config_remove(names: StackNames) -> str:
    """The gateway's configuration folders (its secret files go with their own commands)."""
    return dm.config_remove(daemon(names), names.dir)


def entrypoint() -> list[str]:
    return ["haproxy"]


def command() -> list[str]:
    """HAProxy in master-worker mode (-W: SIGUSR2 reloads without dropping connections) in the
    foreground (-db), reading the configuration in use."""
    return ["-W", "-db", "-f", f"{GATEWAY_MOUNT}/conf/haproxy.cfg"]


def gate_script(names: StackNames, ids_marker: str, url: str, routes: Sequence[Route],
                timeout: int) -> str:
    """On the head, after the gateway container and its configuration: the gateway is started if
    recon found it stopped, then payloads/gateway_health.py (the head's python3) proves it from
    the head: liveness without the key, 401 without or with a wrong key, `/v1/models` listing
    every served name, 404 for a name not served, and one request per model through it on the
    endpoint its task uses. The key comes on stdin from the main vLLM's root-only key file.

    `ids_marker`: the gateway container's ID, the configuration's hash and the backends' IDs
    (gate_marker), so a new container, configuration or vLLM behind it runs the gate again."""
    spec = json.dumps({"models": [{"name": r.name, "task": r.task} for r in routes],
                       "live": LIVE_PATH}, sort_keys=True, separators=(",", ":"))
    return dm.gate_script("gateway", ids_marker, [names.gateway],
                          f"python3 -c {q(_GATE_PY)} {q(url)} {q(spec)} {int(timeout)} "
                          f"< {q(names.vllm_key_file)}")


def gate_marker(container_id: str, config_stdout: str, backends: Sequence[str] = ()) -> str:
    """The gate's marker: the container's ID (checked), the configuration's hash and the IDs of
    what serves the routes (Pulumi's: container IDs, commands' IDs), in that order."""
    return " ".join([container_ids(container_id), dm.config_digest(config_stdout, "gateway"),
                     *(plain(b) for b in backends)])
