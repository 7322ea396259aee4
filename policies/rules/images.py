"""2. same-image-everywhere: every node runs the same vLLM image ID, and all serving containers
(Ray's and vLLM's, whichever executor runs) the same image."""
from __future__ import annotations

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    StackValidationArgs,
    StackValidationPolicy,
)

from contract import labels
from contract.props import VllmImageProps

from ._common import CONTAINER, VLLM_IMAGE, Report, get, mapping_items, props_as, text
from ._containers import is_ray_container, labels_of


def _short(image_id: str) -> str:
    return image_id[:19] if image_id.startswith("sha256:") else image_id


def _listing(images: dict[str, str]) -> str:
    return ", ".join(f"{n}={_short(v)}" for n, v in sorted(images.items()))


def _image_id_finding(r: PolicyResource) -> str | None:
    """A VllmImage whose image IDs (an output, per node) differ between nodes."""
    # imageIds is a registered output, not a prop of the contract (contract/props.py says why)
    ids = {node: text(v) for node, v in mapping_items(get(r.props, "imageIds"))}
    known = {node: v for node, v in ids.items() if v}
    if len(set(known.values())) <= 1:
        return None
    ref = text(props_as(r.props, VllmImageProps)["ref"]) or "?"
    return f"image {ref} has different image IDs per node: {_listing(known)}"


def _serving(props: object) -> bool:
    """A container that runs Ray or vLLM (`spark-vllm.role` vllm-serve, or vllm-service: a
    service of spark-vllm:services runs the stack's one image too)."""
    return is_ray_container(props) or text(labels_of(props).get(labels.ROLE)) in labels.API_ROLES


def _ray_images(resources: list[PolicyResource]) -> dict[str, str]:
    """Container name -> image, for the containers that run Ray or vLLM."""
    images: dict[str, str] = {}
    for r in resources:
        if r.resource_type != CONTAINER or not _serving(r.props):
            continue
        image = text(get(r.props, "image"))
        if image:
            images[r.name] = image
    return images


def validate_same_image(args: StackValidationArgs, report: Report) -> None:
    for r in args.resources:
        if r.resource_type == VLLM_IMAGE:
            msg = _image_id_finding(r)
            if msg:
                report(msg, r.urn)
    images = _ray_images(args.resources)
    if len(set(images.values())) > 1:
        report(f"Ray and vLLM containers run different images: {_listing(images)}", None)


same_image_everywhere = StackValidationPolicy(
    name="same-image-everywhere",
    description="Every node runs the same vLLM image ID, and all Ray and vLLM containers the "
                "same image.",
    validate=validate_same_image,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Pin image.ref by digest and let VllmImage distribute that one image to "
                      "every node (source: head copies it over the fabric); remove stale tags on "
                      "nodes.",
)
