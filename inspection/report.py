"""Readable reconnaissance: a JSON-able summary (`pulumi stack output recon`) and a side-by-side
table (`make recon`), one column per node, with values that should match across nodes but do
not marked `!` (and coloured when the output is a terminal)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from config.forms import GIB
from inspection.facts import NcclLibrary, NodeFacts
from inspection.preflight import Plan, nccl_running
from inspection.recon import ReconError, printable

RED, BOLD, DIM, RESET = "\033[31m", "\033[1m", "\033[2m", "\033[0m"
MAX_CELL = 44

Result = NodeFacts | ReconError  # what recon.survey_all gives per node


def _fabric_like(name: str) -> bool:
    return name.startswith(("en", "ib", "eth"))


# --------------------------------------------------------------------------- summary

def summary(facts: Mapping[str, Result], plan: Plan | None = None,
            stack_label: str | None = None) -> dict[str, Any]:
    """Plain dict (str/int/float/bool/list/dict only) for a stack output."""
    nodes: dict[str, Any] = {}
    for name, f in facts.items():
        if isinstance(f, ReconError):
            nodes[name] = {"error": f.reason, "kind": f.kind, "fix": f.fix}
            continue
        gpu = f.gpus[0] if f.gpus else None
        nodes[name] = {
            "hostname": f.hostname,
            "os": f.os.pretty_name, "kernel": f.os.kernel, "arch": f.os.arch,
            "dgx": f.os.dgx_release.get("DGX_PRETTY_NAME") or f.os.dgx_release.get("DGX_NAME", ""),
            "dgxOtaVersion": f.os.dgx_release.get("DGX_OTA_VERSION",
                                                  f.os.dgx_release.get("DGX_SWBUILD_VERSION", "")),
            "gpus": [{"name": g.name, "computeCapability": g.compute_capability,
                      "driver": g.driver_version, "cuda": g.cuda_version, "uuid": g.uuid}
                     for g in f.gpus],
            "gpu": gpu.name if gpu else None,
            "memTotalBytes": f.memory.total_bytes,
            "memAvailableBytes": f.memory.available_bytes,
            "unifiedMemory": f.memory.unified,
            "docker": None if f.docker is None else {
                "version": f.docker.version, "runtimes": list(f.docker.runtimes),
                "gpuSupport": f.docker.gpu_support, "cgroupDriver": f.docker.cgroup_driver,
                "containers": [{"name": c.name, "image": c.image, "state": c.state,
                                "memoryBytes": c.memory_bytes, "managed": c.managed}
                               for c in f.docker.containers],
                "images": [{"id": i.id, "tags": list(i.repo_tags), "sizeBytes": i.size_bytes}
                           for i in f.docker.images],
            },
            "hfCache": [{"repo": r.repo_id, "refs": dict(r.refs), "snapshots": list(r.snapshots),
                         "sizeBytes": r.size_bytes} for r in f.hf_cache],
            "interfaces": [{"name": i.name, "ipv4": list(i.ipv4), "mtu": i.mtu,
                            "carrier": i.carrier, "speedMbps": i.speed_mbps}
                           for i in f.interfaces if _fabric_like(i.name)],
            "roce": [{"device": r.device, "port": r.port, "netdev": r.netdev, "state": r.state}
                     for r in f.roce],
            "nccl": _nccl_summary(f, stack_label),
            "diskFreeBytes": f.disk_free_bytes,
            "clockOffsetSeconds": f.clock_offset_seconds,
            "missingTools": list(f.missing_tools),
            "unreadable": dict(f.unreadable),
        }
    out: dict[str, Any] = {"nodes": nodes}
    if plan is not None:
        out["plan"] = {
            "stopContainers": {n: [{"name": c.name, "image": c.image, "memoryBytes": c.memory_bytes}
                                   for c in cs] for n, cs in plan.stop_containers.items()},
            "warnings": [str(w) for w in plan.warnings],
            "memoryBudgetBytes": dict(plan.memory_budget_bytes),
            "hcasUp": {n: list(v) for n, v in plan.hcas_up.items()},
            "nccl": dict(plan.nccl),
        }
    return out


def _nccl_summary(f: NodeFacts, stack_label: str | None) -> dict[str, Any]:
    image, found = nccl_running(f, stack_label)
    return {
        "image": image,
        "vllm": None if found is None or found.vllm is None else found.vllm.model_dump(),
        "reason": None if found is None else found.reason,
        "host": None if f.nccl_host is None else [lib.model_dump() for lib in f.nccl_host],
    }


def _nccl_cell(lib: NcclLibrary) -> str:
    """A library in a table cell: version, source, package, the build ID's start."""
    return " ".join(filter(None, (lib.version or "?", lib.source, lib.package,
                                  (lib.build or "no-build-id")[:8])))


def _nccl_image(f: NodeFacts, stack_label: str | None) -> str:
    _image, found = nccl_running(f, stack_label)
    if found is None:
        return "not probed yet"
    return _nccl_cell(found.vllm) if found.vllm is not None else "unknown"


# --------------------------------------------------------------------------- table

@dataclass
class Row:
    label: str
    cell: Callable[[NodeFacts], str]
    compare: bool = True  # mark when nodes differ


def _gib(n: int) -> str:
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{n / 1024**2:.0f} MiB" if n >= 1024**2 else f"{n} B"


def _gpu(f: NodeFacts, attr: str) -> str:
    return ", ".join(getattr(g, attr) or "?" for g in f.gpus) or "-"


def _rows(facts: list[NodeFacts], stack_label: str | None = None) -> list[Row]:
    rows = [
        Row("hostname", lambda f: f.hostname or "?", compare=False),
        Row("os", lambda f: f.os.pretty_name or "?"),
        Row("kernel", lambda f: f.os.kernel or "?"),
        Row("arch", lambda f: f.os.arch or "?"),
        Row("dgx-release", lambda f: (f.os.dgx_release.get("DGX_NAME", "") + " " +
                                      f.os.dgx_release.get("DGX_OTA_VERSION",
                                      f.os.dgx_release.get("DGX_SWBUILD_VERSION", ""))).strip()
            or "-"),
        Row("gpu", lambda f: _gpu(f, "name")),
        Row("compute capability", lambda f: _gpu(f, "compute_capability")),
        Row("driver", lambda f: _gpu(f, "driver_version")),
        Row("cuda", lambda f: _gpu(f, "cuda_version")),
        Row("memory total", lambda f: _gib(f.memory.total_bytes)
            + (" (unified)" if f.memory.unified else "")),
        Row("memory available", lambda f: _gib(f.memory.available_bytes), compare=False),
        Row("docker", lambda f: f.docker.version if f.docker else "missing"),
        Row("docker gpu support", lambda f: ("yes" if f.docker.gpu_support else "NO")
            if f.docker else "-"),
        Row("containers running", lambda f: str(sum(c.state == "running" for c in
                                                    (f.docker.containers if f.docker else []))),
            compare=False),
        Row("foreign containers", lambda f: ", ".join(
            f"{c.name} {_gib(c.memory_bytes)}" for c in f.foreign_containers()) or "-",
            compare=False),
        Row("images", lambda f: str(len(f.docker.images)) if f.docker else "-", compare=False),
        # which NCCL the stack's vLLM loads (the image probe's record; by build, so two nodes
        # loading different builds of one version are marked) and the host's
        Row("nccl (vLLM)", lambda f: _nccl_image(f, stack_label)),
        Row("nccl (host)", lambda f: "not surveyed" if f.nccl_host is None else ", ".join(
            _nccl_cell(lib) for lib in f.nccl_host) or "none"),
    ]
    repos = sorted({r.repo_id for f in facts for r in f.hf_cache})
    for repo in repos:
        def cached(f: NodeFacts, repo: str = repo) -> str:
            r = f.hf_repo(repo)
            if r is None:
                return "-"
            main = r.refs.get("main", "")
            return f"{_gib(r.size_bytes)}" + (f" @ {main[:8]}" if main else "")
        rows.append(Row(f"hf {repo}", cached))
    names = []
    for f in facts:
        for i in f.interfaces:
            if _fabric_like(i.name) and i.name not in names:
                names.append(i.name)
    for name in names:
        def link(f: NodeFacts, name: str = name) -> str:
            i = f.interface(name)
            if i is None:
                return "missing"
            speed = f" {i.speed_mbps // 1000}G" if i.speed_mbps else ""
            return f"{'UP' if i.carrier else 'DOWN'} mtu {i.mtu or '?'}{speed}"

        def addr(f: NodeFacts, name: str = name) -> str:
            i = f.interface(name)
            return ", ".join(i.ipv4) if i and i.ipv4 else "-"
        rows.append(Row(f"if {name}", link))
        rows.append(Row(f"   {name} ipv4", addr, compare=False))
    devices = []
    for f in facts:
        for r in f.roce:
            if r.device not in devices:
                devices.append(r.device)
    for dev in devices:
        def state(f: NodeFacts, dev: str = dev) -> str:
            r = f.roce_device(dev)
            return f"{r.state} ({r.netdev})" if r else "missing"
        rows.append(Row(f"roce {dev}", state))
    rows += [
        Row("disk free (cache)", lambda f: _gib(f.disk_free_bytes), compare=False),
        Row("clock offset", lambda f: f"{f.clock_offset_seconds:+.2f} s", compare=False),
        Row("missing tools", lambda f: ", ".join(f.missing_tools) or "-"),
        Row("unreadable", lambda f: ", ".join(sorted(f.unreadable)) or "-", compare=False),
    ]
    return rows


def _clip(text: str) -> str:
    """A cell: what the node said escaped where it is not printable ASCII (a name or field from
    the node may hold a terminal escape, issue 46; status escapes them so too), then cut."""
    text = printable(text, 10 * MAX_CELL)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def render_table(facts: Mapping[str, Result], *, color: bool = False,
                 stack_label: str | None = None) -> str:
    """Side by side, one column per node. Rows whose values should match but differ start with
    `!` (and are red when color=True). Nodes that could not be surveyed show why."""
    names = list(facts)
    ok = [f for f in facts.values() if isinstance(f, NodeFacts)]
    rows = _rows(ok, stack_label) if ok else [Row("status", lambda f: "")]
    table: list[tuple[str, list[str], bool]] = []
    for row in rows:
        cells = []
        for name in names:
            f = facts[name]
            cells.append(_clip(row.cell(f)) if isinstance(f, NodeFacts) else "")
        values = {c for c, name in zip(cells, names, strict=True)
                  if isinstance(facts[name], NodeFacts)}
        table.append((printable(row.label, 10 * MAX_CELL), cells,
                      row.compare and len(values) > 1))
    errors = [(n, e) for n, e in facts.items() if isinstance(e, ReconError)]
    if errors:
        for i, (_, cells, _) in enumerate(table):
            for j, name in enumerate(names):
                err = facts[name]
                if isinstance(err, ReconError):
                    cells[j] = _clip(f"NOT SURVEYED ({err.kind})") if i == 0 else ""
    label_w = max([len(r[0]) for r in table] + [4]) + 2
    widths = [max([len(n)] + [len(r[1][j]) for r in table]) for j, n in enumerate(names)]

    def line(label: str, cells: list[str], bad: bool) -> str:
        mark = "! " if bad else "  "
        text = (mark + label).ljust(label_w + 2)
        parts = []
        for cell, w in zip(cells, widths, strict=True):
            padded = cell.ljust(w)
            parts.append(f"{RED}{BOLD}{padded}{RESET}" if bad and color else padded)
        return (text + "  ".join(parts)).rstrip()

    header = "  " + "fact".ljust(label_w) + "  ".join(
        n.ljust(w) for n, w in zip(names, widths, strict=True))
    rule = "-" * len(header.rstrip())
    out = [f"{BOLD}{header.rstrip()}{RESET}" if color else header.rstrip(), rule]
    out += [line(label, cells, bad) for label, cells, bad in table]
    mismatches = sum(bad for _, _, bad in table)
    out.append(rule)
    if mismatches:
        out.append(f"rows marked ! differ between nodes: {mismatches}")
    for name, err in errors:
        out.append(f"{name}: {printable(str(getattr(err, 'reason', err)), 1000)} — "
                   f"{printable(str(getattr(err, 'fix', '')), 1000)}")
    return "\n".join(out) + "\n"


def _gate_cell(gate: Mapping[str, Any]) -> str:
    """The collective gate's verdict and all_gather figure (the stack output collectiveGate)."""
    verdict = gate.get("verdict")
    if not isinstance(verdict, str):
        return "-"
    figure = gate.get("allGatherBusGBps")
    return verdict + (f", {figure:.3f} GB/s" if isinstance(figure, (int, float)) else "")


def render_last_up(names: list[str], outputs: Mapping[str, Any]) -> str:
    """What the last `pulumi up` proved, side by side like the recon table: the fabric pairs
    each node pinged at the MTU, what each node's image carries, the transport NCCL chose.
    `outputs` is `pulumi stack output --json` (no secrets needed)."""
    def mapping(key: str) -> Mapping[str, Any]:
        value = outputs.get(key)
        return value if isinstance(value, Mapping) else {}

    fabric, probe, transport = (mapping(k) for k in ("fabricCheck", "imageProbe",
                                                     "ncclTransport"))
    gate = mapping("collectiveGate")

    def fabric_cell(node: str) -> str:
        lines = fabric.get(node)
        if not isinstance(lines, list) or not lines:
            return "-"
        mtus = sorted({ln.rsplit(" ", 1)[-1] for ln in lines if isinstance(ln, str)})
        return f"{len(lines)} pairs ok at MTU {'/'.join(mtus)}"

    def text(value: object) -> str:
        return value if isinstance(value, str) and value else "-"

    rows = [
        ("fabric check", [fabric_cell(n) for n in names]),
        ("image", [text(probe.get(n)) for n in names]),
        ("nccl transport", [text(transport.get(n, transport.get("all"))) for n in names]),
        ("collective gate", [_gate_cell(gate)] * len(names)),
    ]
    label_w = max(len(label) for label, _ in rows) + 2
    widths = [max([len(n)] + [len(_clip(r[1][j])) for r in rows]) for j, n in enumerate(names)]
    header = "  " + "last up".ljust(label_w) + "  ".join(
        n.ljust(w) for n, w in zip(names, widths, strict=True))
    rule = "-" * len(header.rstrip())
    out = [header.rstrip(), rule]
    for label, cells in rows:
        out.append(("  " + label.ljust(label_w) + "  ".join(
            _clip(c).ljust(w) for c, w in zip(cells, widths, strict=True))).rstrip())
    out.append(rule)
    return "\n".join(out) + "\n"
