"""10. prod-pinned: in prod, images by digest, the model revision a 40-hex commit, a pinned host
key for every node."""
from __future__ import annotations

import re
from collections.abc import Callable

from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    StackValidationArgs,
    StackValidationPolicy,
)

from contract import forms
from contract.props import ModelCacheProps, SparkNodeProps, VllmImageProps

from ._common import (
    CONTAINER,
    DEFAULTS,
    MODEL_CACHE,
    SPARK_NODE,
    VLLM_IMAGE,
    Report,
    conf,
    get,
    is_unknown,
    props_as,
    stack_environment,
    text,
)
from ._schema import ENV_PROP, env_list_prop, schema

# Used with fullmatch only: `^...$` with match (or `...$` with search) takes a value with a
# trailing newline as pinned.
# the program's forms (contract/forms.py), used with fullmatch
DIGEST_REF_RE = forms.DIGEST_REF
IMAGE_ID_RE = forms.IMAGE_ID
COMMIT_RE = forms.COMMIT
HOST_KEY_RE = re.compile(r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|"
                         r"sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com)"
                         r" [A-Za-z0-9+/]+={0,3}( [^\n]*)?")


def _image_ref_finding(env: str | None, r: PolicyResource) -> str | None:
    ref = props_as(r.props, VllmImageProps)["ref"]
    if is_unknown(ref) or (isinstance(ref, str) and DIGEST_REF_RE.fullmatch(ref)):
        return None
    return f"{env}: image ref {ref!r} is not pinned by digest (<repo>@sha256:<64 hex>)"


def _container_image_finding(env: str | None, r: PolicyResource) -> str | None:
    image = get(r.props, "image")
    if not isinstance(image, str) or DIGEST_REF_RE.fullmatch(image) or IMAGE_ID_RE.fullmatch(image):
        return None
    return f"{env}: container {r.name} image {image!r} is neither a digest ref nor an image ID"


def _model_revision_finding(env: str | None, r: PolicyResource) -> str | None:
    props = props_as(r.props, ModelCacheProps)
    revision = props["revision"]
    if is_unknown(revision):
        return None
    if revision is None:
        revision = props["commit"]
    if is_unknown(revision) or (isinstance(revision, str) and COMMIT_RE.fullmatch(revision)):
        return None
    return (f"{env}: model {text(props['repo']) or '?'} revision {revision!r} is not a "
            f"40-hex commit")


def _host_key_finding(env: str | None, r: PolicyResource) -> str | None:
    props = props_as(r.props, SparkNodeProps)
    key = props["hostKey"]
    if is_unknown(key) or (isinstance(key, str) and HOST_KEY_RE.fullmatch(key.strip())):
        return None
    return (f"{env}: node {text(props['name']) or r.name} has no pinned host key "
            f"(got {key!r}; expected '<type> <base64>')")


_CHECKS: dict[str, Callable[[str | None, PolicyResource], str | None]] = {
    VLLM_IMAGE: _image_ref_finding,
    CONTAINER: _container_image_finding,
    MODEL_CACHE: _model_revision_finding,
    SPARK_NODE: _host_key_finding,
}


def validate_prod_pinned(args: StackValidationArgs, report: Report) -> None:
    env = stack_environment(args)
    if env not in set(conf(args, "prodEnvironments") or []):
        return
    for r in args.resources:
        check = _CHECKS.get(r.resource_type)
        msg = check(env, r) if check else None
        if msg:
            report(msg, r.urn)


prod_pinned = StackValidationPolicy(
    name="prod-pinned",
    description="In prod: images by digest, the model revision a 40-hex commit, a pinned host key "
                "for every node.",
    validate=validate_prod_pinned,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Set image.ref to <repo>@sha256:<digest>, model.revision to the commit hash, "
                      "and hostKey for every node (`ssh-keyscan -t ed25519 <host>`).",
    config_schema=schema(
        environment=ENV_PROP,
        prodEnvironments=env_list_prop(DEFAULTS["prodEnvironments"], "environments that must pin"),
    ),
)
