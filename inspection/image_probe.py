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

from pydantic import BaseModel, ConfigDict, ValidationError

RAY_TOKEN_AUTH = (2, 52)  # the first Ray release with RAY_AUTH_MODE=token


class ImageProbe(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    python: str
    torch: str | None = None
    torch_cuda: str | None = None  # None: a CPU build of torch (or no torch)
    vllm: str | None = None
    ray: str | None = None
    libibverbs: bool = False

    def line(self) -> str:
        cuda = f"CUDA {self.torch_cuda}" if self.torch_cuda else "no CUDA"
        return (f"python {self.python}, torch {self.torch or '-'} ({cuda}), vllm "
                f"{self.vllm or '-'}, ray {self.ray or '-'}, libibverbs "
                f"{'yes' if self.libibverbs else 'no'}")


class ImageProbeError(ValueError):
    pass


def parse_probe(node: str, text: str) -> ImageProbe:
    """The probe's stdout (its last line: the image's python may print warnings first)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    try:
        raw = json.loads(lines[-1]) if lines else None
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        if "torchCuda" in raw:
            raw["torch_cuda"] = raw.pop("torchCuda")
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
