"""6. no-privileged-containers: no privileged containers and no added capabilities beyond the
allowed ones (IPC_LOCK, which RDMA needs)."""
from __future__ import annotations

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from ._common import CONTAINER, DEFAULTS, Report, conf, elements, flag, get
from ._schema import schema


def _cap(name: str) -> str:
    name = name.strip().upper()
    return name[4:] if name.startswith("CAP_") else name


def validate_no_privileged(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != CONTAINER:
        return
    if flag(get(args.props, "privileged")) is True:
        report(f"container {args.name} runs privileged; use the nvidia runtime/CDI for GPUs, "
               f"`devices` for /dev/infiniband and capability IPC_LOCK for RDMA", None)
    allowed = {_cap(c) for c in (conf(args, "allowedCapabilities") or []) if isinstance(c, str)}
    adds = [a for a in elements(get(args.props, "capabilities", "adds")) if isinstance(a, str)]
    extra = sorted({_cap(a) for a in adds} - allowed)
    if extra:
        report(f"container {args.name} adds capabilities {', '.join(extra)} beyond the allowed "
               f"{', '.join(sorted(allowed)) or 'none'}", None)


no_privileged_containers = ResourceValidationPolicy(
    name="no-privileged-containers",
    description="No privileged containers and no added capabilities beyond IPC_LOCK (RDMA).",
    validate=validate_no_privileged,
    enforcement_level=EnforcementLevel.MANDATORY,
    remediation_steps="Drop privileged; expose GPUs via the nvidia runtime/CDI, RDMA devices via "
                      "`devices` (/dev/infiniband), and add only IPC_LOCK.",
    config_schema=schema(
        allowedCapabilities={"type": "array", "items": {"type": "string"},
                             "default": DEFAULTS["allowedCapabilities"]},
    ),
)
