"""The recipes of the lab's images made of Debian packages: the gateway's (Debian's haproxy),
Prometheus's, the node exporter's and Alertmanager's (`DebImage`, `DEB_IMAGES`), each with the
checks its new image must pass. lab/image.py builds them (`deb_key`, `ensure_deb_image`); lab/
hosts.py keeps their pulled images on a node's Docker across `down` (`scrub_docker`). A module
of its own so that both import it and neither imports the other.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from lab.layout import GATEWAY_REPO

# What every DebImage tree loses before the import: nothing the images run needs them
DEB_TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
            "var/cache/apt", "var/lib/apt/lists", "var/cache/debconf")
DEB_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")


@dataclass(frozen=True)
class Probe:
    """One `docker run --rm --network none` of a new image before its push: the arguments after
    the image's name, and another entrypoint, a user or standard input when set."""

    args: tuple
    entrypoint: str = ""
    user: str = ""
    input: str | None = None


@dataclass(frozen=True)
class DebImage:
    """An image made of Debian packages, one layer: `debootstrap --variant=minbase
    --include=<pkgs>` (their Depends, never their Recommends), `setup` run in the chroot, the
    folders of `trim` emptied, `docker import`ed with `env`, `workdir`, `user`, `entrypoint`,
    `cmd` and the labels org.opencontainers.image.title=spark-vllm-lab-<label> and
    spark-vllm.lab.<label>=<key>, pushed as <REGISTRY>/<repo>:<key> once `check` finds nothing
    wrong in what the `probes` answered (one CompletedProcess each, in order).

    No service starts in the chroot: minbase has no systemd, and debootstrap configures the
    packages with its own /usr/sbin/policy-rc.d (exit 101) and a start-stop-daemon that does
    nothing, both removed afterwards (second_stage_install in
    https://salsa.debian.org/installer-team/debootstrap/-/blob/master/scripts/debian-common)."""

    label: str
    repo: str
    pkgs: tuple
    entrypoint: tuple
    probes: tuple
    check: Callable[[list], list]
    cmd: tuple = ()
    setup: str = ""  # a /bin/sh script run in the chroot after debootstrap
    user: str = ""
    workdir: str = "/"
    trim: tuple = DEB_TRIM
    env: tuple = DEB_ENV
    key_parts: tuple = ()  # what else the key hashes: the check's inputs
    rev: int = 1  # bump when the build changes in a way the key does not see
    # the key hashes setup, workdir, user, entrypoint, cmd and probes too; False only for the
    # gateway, whose key predates them (its rev stands for them), so its cached image stays
    key_has_config: bool = True


def _output(p: subprocess.CompletedProcess) -> str:
    return (p.stdout or "") + (p.stderr or "")


def version_problems(program: str, want: str, rc: int, out: str) -> list:
    """What is wrong with `<program> --version` (exit status, output): it must exit 0 and its
    first line say `<program>, version <want>...` (the Prometheus projects' form)."""
    first = (out.strip().splitlines() or [""])[0]
    if rc != 0:
        return [f"{program} --version exited {rc}: {out.strip()[-500:]!r}"]
    if not first.startswith(f"{program}, version {want}"):
        return [f"expected {program} {want}x, got {first!r}"]
    return []


# --------------------------------------------------------------------------- the gateway's image
GATEWAY_VERSION = "2.6."  # what `haproxy -vv` must say: the config is written for 2.6
GATEWAY_SMOKE_CFG = """global
    log stdout format raw local0 info
    tune.bufsize 2097152
    hard-stop-after 3600s
    user haproxy
    group haproxy
    ssl-default-bind-options ssl-min-ver TLSv1.2
defaults
    mode http
    log global
    option httplog
    option abortonclose
    option http-no-delay
    timeout connect 5s
    timeout client 3600s
    timeout server 3600s
    http-error status 503 content-type application/json string '{"error":{}}'
frontend api
    bind *:8080
    http-request return status 200 content-type text/plain string ok if { path /gateway/live }
    http-request set-var(txn.want) str(x),sha2(256),hex,lower
    http-request set-var(txn.got) http_auth_bearer,sha2(256),hex,lower
    acl authorized var(txn.got),secure_memcmp(txn.want)
    http-request return status 401 content-type text/plain string x hdr X-A 'B r="x"' if !authorized
    http-request wait-for-body time 30s if METH_POST
    http-request set-var(txn.model) req.body,json_query('$.model') if METH_POST
    http-request set-var(txn.bodysize) req.body_size if METH_POST
    http-request return status 413 if METH_POST { req.body_len,sub(txn.bodysize) lt 0 }
    use_backend %[var(txn.model)] if { var(txn.model) -m found }
    default_backend model0
backend model0
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 5s fall 2 rise 1
    server spark-1 127.0.0.1:8000
"""


def gateway_check(vv: str, check_rc: int, check_out: str) -> list:
    """What is wrong with a built gateway image, from `haproxy -vv` and `haproxy -c` of
    GATEWAY_SMOKE_CFG (empty: nothing)."""
    problems = []
    first = (vv.strip().splitlines() or [""])[0]
    if f"HAProxy version {GATEWAY_VERSION}" not in first:
        problems.append(f"expected HAProxy {GATEWAY_VERSION}x, got {first!r}")
    if "Built with OpenSSL" not in vv:
        problems.append("HAProxy without OpenSSL (no sha2, no secure_memcmp, no TLS)")
    if check_rc != 0:
        problems.append(f"haproxy -c of the smoke config failed: {check_out.strip()[-1500:]}")
    return problems


GATEWAY = DebImage(
    label="gateway", repo=GATEWAY_REPO,
    pkgs=("haproxy",),  # Debian's haproxy (bookworm: 2.6 LTS) and its libraries
    entrypoint=("haproxy",), cmd=("-W", "-db", "-f", "/etc/spark-vllm/gateway/conf/haproxy.cfg"),
    probes=(Probe(("-vv",)), Probe(("-c", "-f", "/dev/stdin"), user="0", input=GATEWAY_SMOKE_CFG)),
    check=lambda got: gateway_check(got[0].stdout or "", got[1].returncode, _output(got[1])),
    key_parts=(GATEWAY_SMOKE_CFG, GATEWAY_VERSION), key_has_config=False)


# --------------------------------------------------------------------------- Prometheus's images
PROMETHEUS_REPO = "spark-lab/prometheus"  # Debian's prometheus (and promtool)
NODE_EXPORTER_REPO = "spark-lab/node-exporter"  # Debian's prometheus-node-exporter
PROMETHEUS_VERSION = "2.42."  # bookworm's prometheus (and promtool)
NODE_EXPORTER_VERSION = "1.5."  # bookworm's prometheus-node-exporter
# Debian's prometheus depends on libjs-moment-timezone (218 MB installed) for its web UI, which
# loads only its moment-timezone-with-data.min.js: all but 2 MB of it is data/ (every tzdata
# release as JSON), trimmed (https://packages.debian.org/bookworm/libjs-moment-timezone)
PROMETHEUS_TRIM = (*DEB_TRIM, "usr/share/javascript/moment-timezone/data")
# Set up as upstream's images run them (user nobody; Prometheus in /prometheus with its data):
# https://github.com/prometheus/prometheus/blob/v2.42.0/Dockerfile
# https://github.com/prometheus/node_exporter/blob/v1.5.0/Dockerfile


def prometheus_check(rc: int, out: str, promtool_rc: int, promtool_out: str) -> list:
    """What is wrong with a built Prometheus image, from `prometheus --version` and
    `promtool --version` (empty: nothing)."""
    return (version_problems("prometheus", PROMETHEUS_VERSION, rc, out) +
            version_problems("promtool", PROMETHEUS_VERSION, promtool_rc, promtool_out))


def node_exporter_check(rc: int, out: str) -> list:
    """What is wrong with a built node exporter image, from `node_exporter --version`."""
    return version_problems("node_exporter", NODE_EXPORTER_VERSION, rc, out)


PROMETHEUS = DebImage(
    label="prometheus", repo=PROMETHEUS_REPO, pkgs=("prometheus",),
    entrypoint=("prometheus",),
    cmd=("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"),
    user="nobody", workdir="/prometheus", trim=PROMETHEUS_TRIM,
    setup="mkdir -p /prometheus\nchown nobody:nogroup /prometheus\n",
    probes=(Probe(("--version",)), Probe(("--version",), entrypoint="promtool")),
    check=lambda got: prometheus_check(got[0].returncode, _output(got[0]), got[1].returncode,
                                       _output(got[1])),
    key_parts=(PROMETHEUS_VERSION,))

NODE_EXPORTER = DebImage(
    label="node-exporter", repo=NODE_EXPORTER_REPO, pkgs=("prometheus-node-exporter",),
    # upstream's binary name (prom/node-exporter), on PATH
    entrypoint=("node_exporter",), user="nobody",
    setup="ln -s /usr/bin/prometheus-node-exporter /usr/local/bin/node_exporter\n",
    probes=(Probe(("--version",)),),
    check=lambda got: node_exporter_check(got[0].returncode, _output(got[0])),
    key_parts=(NODE_EXPORTER_VERSION,))

# ------------------------------------------------------------------------ Alertmanager's image
ALERTMANAGER_REPO = "spark-lab/alertmanager"  # Debian's prometheus-alertmanager (and amtool)
ALERTMANAGER_VERSION = "0.25."  # bookworm's prometheus-alertmanager
# Set up as upstream's prom/alertmanager runs it (user nobody; its data in /alertmanager; its
# binaries alertmanager and amtool on PATH):
# https://github.com/prometheus/alertmanager/blob/v0.25.0/Dockerfile
# Debian names the server's binary prometheus-alertmanager (it prints `alertmanager, version`);
# amtool keeps its name.


def alertmanager_check(rc: int, out: str, amtool_rc: int, amtool_out: str) -> list:
    """What is wrong with a built Alertmanager image, from `alertmanager --version` and
    `amtool --version` (empty: nothing)."""
    return (version_problems("alertmanager", ALERTMANAGER_VERSION, rc, out) +
            version_problems("amtool", ALERTMANAGER_VERSION, amtool_rc, amtool_out))


ALERTMANAGER = DebImage(
    label="alertmanager", repo=ALERTMANAGER_REPO, pkgs=("prometheus-alertmanager",),
    entrypoint=("alertmanager",),
    cmd=("--config.file=/etc/prometheus/alertmanager.yml",  # the package's sample
         "--storage.path=/alertmanager"),
    user="nobody", workdir="/alertmanager",
    setup=("ln -s /usr/bin/prometheus-alertmanager /usr/local/bin/alertmanager\n"
           "mkdir -p /alertmanager\nchown nobody:nogroup /alertmanager\n"),
    probes=(Probe(("--version",)), Probe(("--version",), entrypoint="amtool")),
    check=lambda got: alertmanager_check(got[0].returncode, _output(got[0]), got[1].returncode,
                                         _output(got[1])),
    key_parts=(ALERTMANAGER_VERSION,))

# The Debian package images by the name lab.json and stack.json give their references; `up`
# points each one's STACK_TAG at it
DEB_IMAGES = {"gatewayImage": GATEWAY, "prometheusImage": PROMETHEUS,
              "nodeExporterImage": NODE_EXPORTER, "alertmanagerImage": ALERTMANAGER}
