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

    @property
    def tls(self) -> bool:
        return self.certificate is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"
