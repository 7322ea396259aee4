"""What the serving image carries, as its own python reports it, and whether the stack can run it.

hostscripts/payloads/image_probe.py prints one JSON object per node (once per image ID); this
module reads it and judges the set: every node must carry the same Ray and vLLM (ranks of
different builds fail in ways that are hard to read later), Ray must be new enough for token
authentication (the stack always turns it on: Ray 2.52, https://docs.ray.io/en/latest/
ray-security/token-auth.html), and with `nccl.rdma` the image must be able to load libibverbs
(without it NCCL silently falls back to TCP sockets). Pure; no resources.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inspection.facts import ImageNccl

RAY_TOKEN_AUTH = (2, 52)  # the first Ray release with RAY_AUTH_MODE=token


class ServeCheck(BaseModel):
    """The probe's check of the serve command with the image's own vLLM (payloads/image_probe.py
    with a request): whether it ran, the parser's verdict, and the VLLM_* variables vLLM does
    not know or refuses. The payload itself exits 1 on what must stop the `up`."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    checked: bool = False
    ok: bool | None = None
    parser: str | None = None  # the module whose make_arg_parser read the argv
    error: str | None = None  # the parser's or validation's message when it rejected the argv
    reason: str | None = None  # why the check could not run
    unknown_env: list[str] = Field(default_factory=list, alias="unknownEnv")
    bad_env: dict[str, str] = Field(default_factory=dict, alias="badEnv")
    # extraArgs as the image's parser read them: [destination, option as spelled] per token, and
    # what of them set a destination the stack owns or forbids (config/serve.py)
    extra_dests: list[list[str]] = Field(default_factory=list, alias="extraDests")
    extra_refused: list[str] = Field(default_factory=list, alias="extraRefused")

    def line(self) -> str:
        if not self.checked:
            text = f"serve command not checked ({self.reason or 'no reason given'})"
        elif self.ok:
            text = f"serve command accepted by {self.parser}"
        else:
            text = f"serve command REJECTED: {self.error}"
        if self.unknown_env:
            text += f"; unknown to vLLM: {', '.join(self.unknown_env)}"
        if self.bad_env:
            text += f"; refused values: {', '.join(sorted(self.bad_env))}"
        if self.extra_refused:
            text += f"; extraArgs refused: {'; '.join(self.extra_refused)}"
        return text


def parse_serve_check(node: str, text: str) -> ServeCheck:
    """The serve check's answer (the `serve` object of the probe's last line)."""
    probe = parse_probe(node, text)
    if probe.serve is None:
        clipped = text[-300:].replace("\n", "\\n")
        raise ImageProbeError(f"{node}: the image probe printed no serve check: {clipped!r}")
    return probe.serve


class ImageProbe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    python: str
    torch: str | None = None
    torch_cuda: str | None = None  # None: a CPU build of torch (or no torch)
    vllm: str | None = None
    ray: str | None = None
    libibverbs: bool = False
    fastsafetensors: str | None = None
    # vLLM's fastsafetensors loader uses vLLM's world group (patched for clusters), torch's
    # default WORLD group (stock: fails or hangs across nodes), or was not found (None)
    fastsafetensors_cluster: bool | None = None
    serve: ServeCheck | None = None  # only when the probe was given a serve check request
    nccl: ImageNccl | None = None  # the NCCL vLLM loads (only when the probe was asked)

    def line(self) -> str:
        cuda = f"CUDA {self.torch_cuda}" if self.torch_cuda else "no CUDA"
        text = (f"python {self.python}, torch {self.torch or '-'} ({cuda}), vllm "
                f"{self.vllm or '-'}, ray {self.ray or '-'}, libibverbs "
                f"{'yes' if self.libibverbs else 'no'}")
        if self.fastsafetensors:
            patch = {True: "yes", False: "no", None: "?"}[self.fastsafetensors_cluster]
            text += f", fastsafetensors {self.fastsafetensors} (multi-node patch: {patch})"
        if self.nccl is not None:
            text += f"; {self.nccl.line()}"
        return text


class ImageProbeError(ValueError):
    pass


def parse_probe(node: str, text: str) -> ImageProbe:
    """The probe's stdout (its last line: the image's python may print warnings first)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    try:
        raw = json.loads(lines[-1]) if lines else None
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        for camel, snake in (("torchCuda", "torch_cuda"),
                             ("fastsafetensorsCluster", "fastsafetensors_cluster")):
            if camel in raw:
                raw[snake] = raw.pop(camel)
        return ImageProbe.model_validate(raw)
    except (ValueError, ValidationError) as exc:
        clipped = text[-300:].replace("\n", "\\n")
        raise ImageProbeError(f"{node}: the image probe printed no readable answer "
                              f"({type(exc).__name__}): {clipped!r}") from None


def version_tuple(v: str) -> tuple[int, ...]:
    """`2.60.0` -> (2, 60, 0); `0.32.0+cpu` -> (0, 32, 0); pre-release tails dropped."""
    parts = []
    for piece in v.split("+", 1)[0].split("."):
        m = re.match(r"[0-9]+", piece)
        if not m:
            break
        parts.append(int(m.group(0)))
    return tuple(parts)


def loader_findings(probes: Mapping[str, ImageProbe], *, load_format: str, nodes: int,
                    prod: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings) of loadFormat fastsafetensors with these images.

    Across nodes vLLM's stock loader passes torch's default WORLD group to fastsafetensors,
    which fails or hangs in a multi-node cluster; eugr/spark-vllm-docker patches it to use
    vLLM's world group (README section 8, fastsafetensors.patch;
    https://github.com/foundation-model-stack/fastsafetensors/issues/36). In prod an image
    whose loader the probe does not show handling it (and an image without the package) stops
    the `up`; elsewhere it is a warning."""
    out: list[str] = []
    if load_format != "fastsafetensors":
        return [], []
    for node, p in sorted(probes.items()):
        if p.fastsafetensors is None:
            out.append(f"{node}: loadFormat fastsafetensors but the image has no fastsafetensors "
                       "package: vLLM will fail to load the weights")
        elif nodes > 1 and p.fastsafetensors_cluster is not True:
            known = "stock" if p.fastsafetensors_cluster is False else "unknown"
            out.append(f"{node}: loadFormat fastsafetensors across {nodes} nodes with an image not "
                       f"known to carry the cluster patch (its loader is {known}: it uses torch's "
                       "default WORLD group); loads may fail or hang. Use an image built with the "
                       "patch (eugr/spark-vllm-docker fastsafetensors.patch) or loadFormat auto")
    return (out, []) if prod else ([], out)


def warnings(probes: Mapping[str, ImageProbe], *, load_format: str, nodes: int) -> list[str]:
    """What may go wrong and is worth saying outside prod, without stopping the `up`
    (loader_findings)."""
    return loader_findings(probes, load_format=load_format, nodes=nodes, prod=False)[1]


NO_CUDA = "a torch without CUDA"  # payloads/nccl_library.py: no NCCL to load, nothing wrong


def nccl_findings(probes: Mapping[str, ImageProbe], *, strict: bool) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the NCCL each node's vLLM loads: two nodes that load different
    builds (by GNU build ID; version and size without one) are refused everywhere (ranks of
    different NCCL builds are what vLLM issues 42354 and 41725 traced hangs to); a node whose
    NCCL the probe could not establish is a problem outside dev (strict) and a warning in dev,
    since the builds cannot be compared. Probes not asked for NCCL are left out."""
    asked = {n: p.nccl for n, p in probes.items() if p.nccl is not None}
    known = {n: x.vllm for n, x in asked.items() if x.vllm is not None}
    problems: list[str] = []
    warnings: list[str] = []
    builds = {lib.identity for lib in known.values()}
    if len(builds) > 1:
        detail = "; ".join(f"{n}: {lib.line()} at {lib.real_path or lib.path}"
                           for n, lib in sorted(known.items()))
        problems.append(f"the nodes' vLLM load different NCCL builds ({detail}); every rank "
                        "must run the same build: serve one image (by digest) with the same "
                        "VLLM_NCCL_SO_PATH everywhere")
    for n, x in sorted(asked.items()):
        if x.vllm is None and not (x.reason or "").startswith(NO_CUDA):
            text = (f"{n}: the NCCL the image's vLLM loads is unknown ({x.reason or 'no answer'}),"
                    " so the nodes' NCCL builds cannot be compared")
            (problems if strict else warnings).append(text)
    return problems, warnings


def judge(probes: Mapping[str, ImageProbe], *, rdma: bool) -> list[str]:
    """Problems that must stop the `up` before Ray starts; [] when the images can serve."""
    problems = []
    for node, p in sorted(probes.items()):
        if p.ray is None:
            problems.append(f"{node}: the image has no Ray (the stack runs vLLM on a Ray cluster)")
        elif version_tuple(p.ray) < RAY_TOKEN_AUTH:
            need = ".".join(map(str, RAY_TOKEN_AUTH))
            problems.append(f"{node}: the image's Ray {p.ray} cannot do token authentication "
                            f"(needs Ray >= {need}); build the image with a newer Ray")
        if p.vllm is None:
            problems.append(f"{node}: the image has no vLLM")
        if rdma and not p.libibverbs:
            problems.append(f"{node}: nccl.rdma is true but the image cannot load libibverbs "
                            "(NCCL would fall back to TCP sockets): install rdma-core/"
                            "libibverbs1 in the image, or set spark-vllm:nccl.rdma false")
    for what in ("ray", "vllm"):
        seen = {node: getattr(p, what) for node, p in probes.items()}
        if len(set(seen.values())) > 1:
            detail = ", ".join(f"{n}={v}" for n, v in sorted(seen.items()))
            problems.append(f"the images carry different {what} versions ({detail}); every "
                            "node must run the same build")
    return problems
