"""18. remote-code-reviewed: a model that runs its repository's own Python code
(`vllm.trustRemoteCode`, a service's too) is a review item: each repo at the commit it runs is
reported until the pack config's `reviewed` lists it (`"<repo>@<commit>"`), the record that
someone read that code. Advisory in dev (policies/config.dev.json), mandatory elsewhere. The
config already refuses trustRemoteCode on a branch or tag (config/validate.py): a commit that is
not 40-hex here is a finding in every environment too."""
from __future__ import annotations

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from ._common import (
    VLLM_SERVER,
    VLLM_SERVICE,
    Report,
    conf,
    each,
    flag,
    is_unknown,
    model_props,
    text,
)
from ._schema import schema
from .pinning import COMMIT_RE


def remote_code_findings(props: object, reviewed: set[str]) -> list[str]:
    """What a VllmServer's or VllmService's props say of the remote code it runs."""
    p = model_props(props)
    if flag(p["trustRemoteCode"]) is not True:
        return []
    out = []
    for entry in each(p["remoteCode"]):
        repo, commit = text(entry["repo"]) or "?", entry["commit"]
        if is_unknown(commit):
            continue  # the commit is resolved during the preview; judged when it is known
        if not isinstance(commit, str) or not COMMIT_RE.fullmatch(commit):
            out.append(f"{repo}: runs the repository's own Python code from {commit!r}, not a "
                       "40-hex commit")
        elif f"{repo}@{commit}" not in reviewed:
            out.append(f"{repo} at {commit}: runs the repository's own Python code "
                       "(trustRemoteCode); read it at that commit, then list "
                       f"\"{repo}@{commit}\" in remote-code-reviewed's `reviewed`")
    return out


def validate_remote_code(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type not in (VLLM_SERVER, VLLM_SERVICE):
        return
    reviewed = {r for r in (conf(args, "reviewed") or []) if isinstance(r, str)}
    for finding in remote_code_findings(args.props, reviewed):
        report(finding, None)


remote_code_reviewed = ResourceValidationPolicy(
    name="remote-code-reviewed",
    description="A model that runs its repository's own code (trustRemoteCode) is reviewed at "
                "the commit it runs.",
    validate=validate_remote_code,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Read the repository's Python files at that commit, then add "
                      "\"<repo>@<commit>\" to remote-code-reviewed.reviewed in "
                      "policies/config.<stack>.json (a change reviewed like any other), or set "
                      "vllm.trustRemoteCode: false.",
    config_schema=schema(reviewed={
        "type": "array", "items": {"type": "string"}, "default": [],
        "description": "\"<repo>@<40-hex commit>\" of every repository whose code someone "
                       "read at that commit"}),
)
