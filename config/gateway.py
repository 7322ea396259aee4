"""`spark-vllm:gateway`: the stack's one endpoint for clients (components/gateway.py).

HAProxy on the head, the only listener of the stack beyond a node: it authenticates every
request on every path with the stack's API key (`vllmApiKey`), routes by the request's `model`
to the vLLM container that serves it (the main model and each service), answers `/v1/models`
with every served model and streams responses as they come. Every vLLM listens only where the
gateway reaches it (config/listen.py).

Keys (camelCase in the file):

    port          where clients connect, on every address of the head
    image         {ref, plainHttpRegistry}: the HAProxy image (the lab's: built from Debian's
                  haproxy package; on real Sparks the upstream image, by digest in prod)
    certificate   PEM certificates (the server's, then its chain): TLS on `port`; the private
                  key is the secret `spark-vllm:gatewayTlsKey`. None: plain HTTP
    maxBodyBytes  how much of a request body the gateway reads to find its `model` (HAProxy's
                  tune.bufsize); a larger body whose `model` comes after it is refused (413).
                  It also sizes every connection's buffers, so the connections HAProxy takes at
                  once are 1 GiB / maxBodyBytes (16..4096; 512 at the default)
    maxConnectionsPerSource  connections one client address may hold at once (64); more are
                  closed as they arrive, before they take one of those slots
    unauthorizedPerMinute   requests without the key (401) one client address may make in a
                  minute (30); past that its new connections are closed until its rate falls
    headerTimeoutSeconds    how long a connection may take to send a request's headers (5):
                  until then nobody is authenticated, so a slow client holds a slot no longer
These three are HAProxy's per-source stick table and its `timeout http-request` (issue 46: a 401
kept its connection alive 60 s, a slow header held a slot 30 s); a 401 also closes its
connection. `spark-vllm status` shows the gateway's counters.
"""

from __future__ import annotations

from pydantic import Field

from config.forms import KIB, MIB, is_digest_ref
from config.types import ConfigModel, ImageRef, PemCertificates, Port

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY = 2 * MIB  # a 262144-token prompt as JSON, with room


class GatewayImageConfig(ConfigModel):
    """The gateway's image: `ref` by digest (prod) or by tag (resolved to its digest at the
    registry on every run, like the serving image)."""

    ref: ImageRef
    # The registry of `ref` speaks plain HTTP (the lab's); the head's Docker daemon must list it
    # under insecure-registries too.
    plain_http_registry: bool = False

    @property
    def by_digest(self) -> bool:
        return is_digest_ref(self.ref)


class GatewayConfig(ConfigModel):
    port: Port = DEFAULT_PORT
    image: GatewayImageConfig
    certificate: PemCertificates | None = None
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY, ge=64 * KIB, le=64 * MIB)
    max_connections_per_source: int = Field(default=64, ge=1, le=4096)
    unauthorized_per_minute: int = Field(default=30, ge=1, le=100_000)
    header_timeout_seconds: int = Field(default=5, ge=1, le=60)

    @property
    def tls(self) -> bool:
        return self.certificate is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"
