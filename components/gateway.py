"""Gateway: the stack's one endpoint for clients, HAProxy on the head (docs/design.md "The
gateway"; the configuration and what it does: hostscripts/gateway.py).

The only listener of the stack beyond a node: every vLLM (the main model's, each service's)
listens on loopback or a fabric address (config/listen.py), and clients use the gateway's
`endpoint`, which

* authenticates every request on every path with the stack's API key (`vllmApiKey`, or the one
  the stack made): HAProxy compares the SHA-256 of the presented bearer token with the key's in
  constant time; only `GET /gateway/live` answers without it, and says nothing about the models;
* routes by the request's `model` to the container that serves it, answers `/v1/models` with
  every served model and a name it does not serve with 404 naming them;
* streams responses as they come and closes the request at vLLM when the client goes away;
* terminates TLS when `gateway.certificate` is set (its key: the secret `gatewayTlsKey`).

Children, all on the head:
* `gateway-image`: the HAProxy image, pulled by digest (a tag is resolved at the registry first,
  like the serving image's);
* `gateway-key`: the key's SHA-256 (computed here from the secret) on stdin into a root-only
  map file; the key itself never reaches the gateway; `gateway-tls`: the chain and the private
  key on stdin into a root-only PEM file;
* `gateway-config`: haproxy.cfg and the answers the gateway gives itself, written into a new
  folder, checked with the image's own `haproxy -c`, swapped in, and the running gateway
  reloaded (SIGUSR2: no connection dropped). Its text is the configuration: a preview shows a
  routing change as this command's update, and nothing else of the stack changes with it;
* `gateway-haproxy`: the container (`spark-vllm-<stack>-gateway`, host network, restart
  `unless-stopped`, the gateway folder mounted read-only, its run folder for the stats socket;
  none of the configuration is in its inputs, so a new configuration reloads it and never
  replaces it);
* `gateway-health`: from the head, the gateway answers as it must (payloads/gateway_health.py),
  again after every new configuration or container; a container recon found stopped is started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import daemon, rerun
from components.rerun import Again
from components.spark_node import SparkNode
from config.gateway import GatewayConfig
from contract import labels as lbl
from contract import types
from contract.props import GatewayProps
from hostscripts import gateway as gw
from hostscripts.paths import GATEWAY_MOUNT, GATEWAY_RUN_MOUNT, StackNames

ROLE = "gateway"


def restart_reason(containers: Sequence[Any], stack_label: str, role: str = ROLE) -> str | None:
    """Why the gate of the stack's `role` container (the gateway's; Prometheus's too) must
    start it again: recon found it not running."""
    bad = [f"{c.name} is {c.state or 'not running'}" for c in containers
           if c.labels.get(lbl.STACK) == stack_label
           and c.labels.get(lbl.ROLE) == role and c.state != "running"]
    return "; ".join(bad) or None


@dataclass
class GatewayArgs:
    gateway: GatewayConfig
    head: SparkNode
    names: StackNames
    labels: Mapping[str, str]  # managed + stack
    environment: str
    routes: Sequence[gw.Route]  # the main model's first
    api_key: pulumi.Output[str]  # the stack's (configured or generated): secret
    key_file: remote.Command  # the main vLLM's key file on the head, which the gate reads
    tls_key: pulumi.Output[str] | None = None  # secret, with gateway.certificate
    gate_timeout_seconds: int = 300
    after: list[pulumi.Resource] = field(default_factory=list)  # the vLLM gates
    restart_reason: str | None = None
    # the IDs of what serves the routes (vLLM containers, their gates): a new one runs the
    # gate again, so an up ends when the gateway itself routes to it (HAProxy's own checks
    # see a replaced server up only seconds after vLLM answers: a 503 meanwhile)
    backends: Sequence[pulumi.Input[str]] = ()


class Gateway(pulumi.ComponentResource):
    image: docker.RemoteImage
    key: remote.Command
    tls: remote.Command | None
    config: remote.Command
    container: docker.Container
    gate: remote.Command
    endpoint: str  # what clients use
    files: dict[str, str]  # the configuration files (what `gateway-config` writes)

    def __init__(
        self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        g, head, names = args.gateway, args.head, args.names
        spec = gw.GatewaySpec(port=g.port, tls=g.tls, max_body_bytes=g.max_body_bytes,
                              routes=tuple(args.routes),
                              max_connections_per_source=g.max_connections_per_source,
                              unauthorized_per_minute=g.unauthorized_per_minute,
                              header_timeout_seconds=g.header_timeout_seconds)
        props = self._props(args, spec)
        super().__init__(types.GATEWAY, name, props, opts)
        # the main model's first (not a class annotation: the SDK reads those as output types)
        self.routes: tuple[gw.Route, ...] = spec.routes
        self.files = gw.render(spec)
        # files recon found gone from the head (the stack's folder wiped behind it): the
        # commands that write them run again (a fresh trigger; delete first, then create)
        again = Again.when_wiped([rerun.fresh_trigger()]
                                 if head.facts.gateway_files_present is False else [])
        self.image = daemon.remote_image(f"{name}-image", self, g.image.ref, head)
        self.key = daemon.secret_command(
            head, f"{name}-key", self, again, gw.key_write(names),
            gw.secret_remove(names, names.gateway_key_file),
            pulumi.Output.secret(args.api_key.apply(gw.key_map)))
        # a new key or certificate reloads the gateway from its own command: nothing derived
        # from a secret (not even a hash: a weak configured key could be guessed from one) is
        # in the configuration's text, which stays readable in a preview's diff
        self.tls = None
        if g.certificate is not None:
            if args.tls_key is None:
                raise ValueError("gateway.certificate is set but the secret gatewayTlsKey is "
                                 "not (config/load.py refuses this)")
            chain = g.certificate
            self.tls = daemon.secret_command(
                head, f"{name}-tls", self, again, gw.tls_write(names),
                gw.secret_remove(names, names.gateway_tls_file),
                pulumi.Output.secret(args.tls_key.apply(
                    lambda k: chain + (k if k.endswith("\n") else k + "\n"))))
        labels = {**args.labels, lbl.ROLE: ROLE, lbl.NODE: head.name,
                  lbl.PORT: str(g.port)}
        files = self.files
        # replaced (a fresh trigger): its delete removes the folders, so it goes first
        self.config = daemon.config_command(
            head, f"{name}-config", self, again, self.image,
            lambda i: gw.config_write(names, files, i, args.labels), gw.config_remove(names),
            # a model is routed once it serves (its gate); a removed one is unrouted before
            # its container goes (the engine deletes last)
            depends_on=[self.key, *([self.tls] if self.tls else []), *args.after],
        )
        # root in the container (daemon.container's default): HAProxy's master reads the
        # root-only files on every reload; its workers run as the image's haproxy user (`user`
        # in haproxy.cfg). Its name and its port on the head: the old one goes first.
        self.container = daemon.container(
            f"{name}-haproxy", self, head, self.image, names.gateway, gw.entrypoint(),
            gw.command(),
            mounts=daemon.bind_mounts((GATEWAY_MOUNT, names.gateway_dir)),
            # the stats socket `spark-vllm status` reads (a `volumes` bind: Docker makes the
            # folder again after a reboot empties /run)
            volumes=[docker.ContainerVolumeArgs(host_path=names.gateway_run_dir,
                                                container_path=GATEWAY_RUN_MOUNT)],
            labels=[docker.ContainerLabelArgs(label=k, value=v)
                    for k, v in sorted(labels.items())],
            destroy_grace_seconds=30,
            depends_on=[self.config],
        )
        restart = Again.because(args.restart_reason)
        self.endpoint = f"{g.scheme}://{head.node.host}:{g.port}/v1"
        local = f"{g.scheme}://127.0.0.1:{g.port}"
        self.gate = daemon.rerun_command(
            head,
            f"{name}-health",
            self,
            restart,
            create=pulumi.Output.all(self.container.id, self.config.stdout,
                                     *args.backends).apply(
                lambda v: gw.gate_script(names, gw.gate_marker(v[0], v[1], v[2:]), local,
                                         args.routes, args.gate_timeout_seconds)),
            depends_on=[self.container, self.config, args.key_file, *args.after],
            timeout_seconds=args.gate_timeout_seconds + 120,
        )
        self.register_outputs({**props, "endpoint": self.endpoint, "health": self.gate.stdout,
                               "container": self.container.name})

    @staticmethod
    def _props(args: GatewayArgs, spec: gw.GatewaySpec) -> GatewayProps:
        """What the policy pack reviews (policies/rules/gateway.py)."""
        g, head = args.gateway, args.head
        return {
            "environment": args.environment,
            "node": head.name,
            "host": head.node.host,
            "port": g.port,
            "listen": f"0.0.0.0:{g.port}",
            "tls": g.tls,
            "image": g.image.ref,
            "livenessPath": gw.LIVE_PATH,
            "maxBodyBytes": g.max_body_bytes,
            "routes": [{"name": r.name, "task": r.task,
                        "servers": [{"node": s.node, "address": s.address, "port": s.port}
                                    for s in r.servers]} for r in spec.routes],
        }
