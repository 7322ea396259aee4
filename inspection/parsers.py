"""Pure parsers of command output, one function per output kind.

Every parser takes the raw text a command printed and returns facts objects (or plain values
for the small ones). Anything it cannot read raises `ParseError(kind, reason, excerpt)`, whose
message names the command, says what was wrong and quotes the offending text: never an
IndexError/KeyError traceback. The recorded real outputs these parsers are tested on live in
tests/fixtures/gb10/ (see INDEX.md there for their sources and quirks).

Lines end only at '\n' (what the node's shell prints): `str.splitlines` also breaks at '\r',
'\x1c'-'\x1e', '\x85', '\u2028' ..., so a name holding one of them would become two records.
The survey's own listings (HF cache, stopped markers, GPU runtime, vLLM liveness, container
memory) are read in their exact format: a line that does not match it is refused, never guessed
at. Their snippets never print a name that is not printable ASCII; they print a
`skip\t<name in printf %q form>` record instead (see `skipped_names`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

from config.forms import CONTAINER_NAME, IMAGE_ID
from inspection.facts import (
    ContainerFacts,
    DockerFacts,
    FirewallFacts,
    GpuFacts,
    GuardFacts,
    HfRepoFacts,
    IbPort,
    ImageFacts,
    ImageNccl,
    InterfaceFacts,
    MemoryFacts,
    NcclLibrary,
    OomKill,
    RoceFacts,
)


class ParseError(ValueError):
    """Output of `kind` could not be read; `reason` says why, `excerpt` shows the text."""

    def __init__(self, kind: str, reason: str, excerpt: str = "") -> None:
        self.kind = kind
        self.reason = reason
        self.excerpt = _excerpt(excerpt)
        message = f"cannot read the output of {kind}: {reason}"
        if self.excerpt:
            message += f" (got: {self.excerpt!r})"
        super().__init__(message)


def _excerpt(text: str, limit: int = 160) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def split_lines(text: str) -> list[str]:
    """The lines of a command's output: broken at '\n' only (see the module docstring)."""
    lines = (text or "").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


_ASCII_SPACE = " \t\r\n\x0b\x0c"


def _lines(text: str) -> list[str]:
    return [line.rstrip(_ASCII_SPACE) for line in split_lines(text)]


def _nonblank(text: str) -> list[str]:
    return [line for line in _lines(text) if line.strip(_ASCII_SPACE)]


# A field of the survey's own listings: printable ASCII (space included), no tab, not empty.
_FIELD = re.compile(r"[\x20-\x7e]+")


def _field(value: str) -> bool:
    return _FIELD.fullmatch(value) is not None


def _skip_record(parts: list[str]) -> bool:
    """`skip\t<name in printf %q form>`: a name the snippet refused to print raw."""
    return len(parts) == 2 and parts[0] == "skip" and _field(parts[1])


def skipped_names(text: str) -> list[str]:
    """The `skip` records of a survey listing: names refused because they are not printable
    ASCII, in bash's `printf %q` form (itself printable ASCII)."""
    return [parts[1] for parts in (line.split("\t") for line in _nonblank(text))
            if _skip_record(parts)]


# --------------------------------------------------------------------------- units

_BINARY = {"": 1, "b": 1, "k": 1024, "ki": 1024, "kib": 1024, "m": 1024**2, "mi": 1024**2,
           "mib": 1024**2, "g": 1024**3, "gi": 1024**3, "gib": 1024**3, "t": 1024**4,
           "ti": 1024**4, "tib": 1024**4, "p": 1024**5, "pi": 1024**5, "pib": 1024**5}
_DECIMAL = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15}
_SIZE = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, *, kind: str = "size", decimal_units: bool = False) -> int:
    """'121Gi', '5.3Mi', '0B', '45.2GiB', '26.1GB' -> bytes.

    `free -h` and `docker stats` use binary units (Ki/KiB = 1024); `docker images` prints
    decimal units (kB/MB/GB = 1000). With decimal_units=True, 'KB/MB/GB' are powers of 1000.
    """
    m = _SIZE.match(text or "")
    if not m:
        raise ParseError(kind, "expected a size such as '121Gi' or '26.1GB'", text)
    number, unit = float(m.group(1)), m.group(2).lower()
    if decimal_units and unit in _DECIMAL:
        factor = _DECIMAL[unit]
    elif unit in _BINARY:
        factor = _BINARY[unit]
    elif unit in _DECIMAL:
        factor = _DECIMAL[unit]
    else:
        raise ParseError(kind, f"unknown size unit {m.group(2)!r}", text)
    return round(number * factor)


# --------------------------------------------------------------------------- nvidia-smi

_SMI_HEADER = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+Driver Version:\s*(?P<driver>\S+)\s+CUDA Version:\s*(?P<cuda>\S+)"
)
# "|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |                  N/A |"
_SMI_GPU_ROW = re.compile(
    r"^\|\s+(?P<index>\d+)\s+(?P<name>.+?)\s+(?P<persistence>On|Off)\s+\|"
    r"\s+(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s+(?P<disp>On|Off)\s+\|"
)
_SMI_MEMORY = re.compile(r"(?P<used>\d+)MiB\s*/\s*(?P<total>\d+)MiB")


def parse_nvidia_smi(text: str) -> list[GpuFacts]:
    """The default `nvidia-smi` table: GPU name, driver and CUDA version, board memory.

    On GB10 the Memory-Usage cell reads 'Not Supported' (no 'MiB / MiB'), so
    memory_total_mib stays None. 'No devices were found' gives an empty list.
    """
    kind = "nvidia-smi"
    if "No devices were found" in (text or ""):
        return []
    if "NVIDIA-SMI has failed" in (text or ""):
        raise ParseError(kind, "nvidia-smi could not talk to the driver", text)
    header = _SMI_HEADER.search(text or "")
    if not header:
        raise ParseError(kind, "no 'Driver Version: ... CUDA Version: ...' header line", text)
    lines = _lines(text)
    gpus: list[GpuFacts] = []
    for i, line in enumerate(lines):
        row = _SMI_GPU_ROW.match(line)
        if not row:
            continue
        memory = None
        if i + 1 < len(lines):
            cells = lines[i + 1].split("|")
            cell = cells[2].strip() if len(cells) > 3 else ""
            mem = _SMI_MEMORY.fullmatch(cell)
            if mem:
                memory = int(mem.group("total"))
            elif cell not in {"Not Supported", "N/A"}:
                raise ParseError(kind, f"GPU {row.group('index')}: unreadable Memory-Usage cell",
                                 lines[i + 1])
        else:
            raise ParseError(kind, f"GPU {row.group('index')}: table ends after the name row", line)
        gpus.append(GpuFacts(
            name=row.group("name").strip(),
            driver_version=header.group("driver"),
            cuda_version=header.group("cuda"),
            memory_total_mib=memory,
        ))
    if not gpus:
        raise ParseError(kind, "header found but no GPU row (the table looks truncated)", text)
    return gpus


QUERY_GPU_FIELDS = ("name", "compute_cap", "driver_version", "memory.total")
# a header cell of `--format=csv`: a query field name, then its unit (`memory.total [MiB]`)
_QUERY_HEADER = re.compile(r"[a-z_][a-z0-9_.]*(?: \[[^\]]*\])?")


def parse_nvidia_smi_query(text: str, fields: tuple[str, ...] = QUERY_GPU_FIELDS) -> list[GpuFacts]:
    """`nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader`.

    memory.total is '[N/A]' on GB10 (memory_total_mib None); '122880 MiB' or, with nounits,
    '122880' elsewhere. With `--format=csv` (a header line, e.g. `index, name, memory.total
    [MiB]`) the columns are read by the header's names instead of `fields`; a header without a
    `name` column is refused.
    """
    kind = "nvidia-smi --query-gpu"
    if "No devices were found" in (text or ""):
        return []
    rows = _nonblank(text)
    if not rows:
        raise ParseError(kind, "empty output", text)
    header = [c.strip() for c in rows[0].split(",")]
    if all(_QUERY_HEADER.fullmatch(c) for c in header):
        # `--format=csv` with its header line: the columns are named there (units dropped)
        named = tuple(c.split(" [", 1)[0] for c in header)
        if "name" not in named and "gpu_name" not in named:
            raise ParseError(kind, "the header line names no `name` column", rows[0])
        fields = tuple("name" if f == "gpu_name" else f for f in named)
        rows = rows[1:]
        if not rows:
            raise ParseError(kind, "a header line and no GPU row", text)
    gpus = []
    for row in rows:
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != len(fields):
            raise ParseError(kind, f"expected {len(fields)} comma-separated values "
                                   f"({', '.join(fields)}), got {len(cells)}", row)
        values = dict(zip(fields, cells, strict=False))
        if not values.get("name") or values["name"].startswith("["):
            raise ParseError(kind, "GPU name missing", row)
        memory = None
        raw_memory = values.get("memory.total", "[N/A]")
        if raw_memory not in {"[N/A]", "N/A", "[Not Supported]"}:
            m = re.fullmatch(r"(\d+)(?:\s*MiB)?", raw_memory)
            if not m:
                raise ParseError(kind, "memory.total is neither a MiB value nor [N/A]", row)
            memory = int(m.group(1))
        compute_cap = values.get("compute_cap", "")
        if compute_cap and not re.fullmatch(r"\d+\.\d+", compute_cap):
            raise ParseError(kind, f"compute_cap {compute_cap!r} is not like '12.1'", row)
        driver = values.get("driver_version", "")
        if driver and not re.fullmatch(r"\d+(?:\.\d+)+", driver):
            raise ParseError(kind, f"driver_version {driver!r} is not like '580.95.05'", row)
        gpus.append(GpuFacts(name=values["name"], compute_capability=compute_cap,
                             driver_version=driver, memory_total_mib=memory))
    return gpus


_SMI_L = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?) \(UUID: (?P<uuid>[^)]+)\)\s*$")


def parse_nvidia_smi_list(text: str) -> list[GpuFacts]:
    """`nvidia-smi -L`: 'GPU 0: NVIDIA GB10 (UUID: GPU-...)' per GPU."""
    kind = "nvidia-smi -L"
    if "No devices were found" in (text or ""):
        return []
    rows = _nonblank(text)
    if not rows:
        raise ParseError(kind, "empty output", text)
    gpus = []
    for row in rows:
        m = _SMI_L.match(row)
        if not m:
            raise ParseError(kind, "line is not 'GPU <n>: <name> (UUID: <uuid>)'", row)
        gpus.append(GpuFacts(name=m.group("name"), uuid=m.group("uuid")))
    return gpus


def merge_gpu_facts(query: list[GpuFacts], table: list[GpuFacts]) -> list[GpuFacts]:
    """Combine --query-gpu (compute capability) with the table (CUDA version), by position."""
    if not query:
        return list(table)
    merged = []
    for i, gpu in enumerate(query):
        other = table[i] if i < len(table) else None
        update: dict[str, Any] = {}
        if other is not None:
            if not gpu.cuda_version:
                update["cuda_version"] = other.cuda_version
            if not gpu.driver_version:
                update["driver_version"] = other.driver_version
            if gpu.memory_total_mib is None and other.memory_total_mib is not None:
                update["memory_total_mib"] = other.memory_total_mib
        merged.append(gpu.model_copy(update=update) if update else gpu)
    return merged


# --------------------------------------------------------------------------- memory

# /proc/meminfo keys -> MemoryFacts fields beside MemTotal/MemAvailable (each optional: a kernel
# or a container that shows fewer lines leaves the field None and preflight says so)
MEMINFO_BREAKDOWN = {
    "MemFree": "free_bytes",
    "Buffers": "buffers_bytes",
    "Cached": "cached_bytes",
    "Shmem": "shmem_bytes",
    "Mapped": "mapped_bytes",
    "SReclaimable": "sreclaimable_bytes",
}


def parse_meminfo(text: str) -> MemoryFacts:
    """/proc/meminfo (kB) -> bytes: MemTotal and MemAvailable (required), and the page-cache
    breakdown (MemFree, Buffers, Cached, Shmem, Mapped, SReclaimable) when present.

    Field meanings: the kernel's Documentation/filesystems/proc.rst, section meminfo
    (https://www.kernel.org/doc/html/latest/filesystems/proc.html#meminfo).
    """
    kind = "/proc/meminfo"
    values: dict[str, int] = {}
    for line in _nonblank(text):
        m = re.fullmatch(r"([A-Za-z0-9_]+(?:\([A-Za-z0-9_]+\))?):[ \t]+([0-9]+)(?: kB)?", line)
        if not m:
            raise ParseError(kind, "line is not '<Key>: <number> [kB]'", line)
        if m.group(1) in values:
            raise ParseError(kind, f"{m.group(1)} appears twice", line)
        values[m.group(1)] = int(m.group(2))
    missing = [k for k in ("MemTotal", "MemAvailable") if k not in values]
    if missing:
        raise ParseError(kind, f"no {' and no '.join(missing)} line", text)
    if values["MemTotal"] <= 0:
        raise ParseError(kind, "MemTotal is 0", text)
    breakdown = {field: values[key] * 1024 for key, field in MEMINFO_BREAKDOWN.items()
                 if key in values}
    return MemoryFacts(total_bytes=values["MemTotal"] * 1024,
                       available_bytes=values["MemAvailable"] * 1024, **breakdown)


# --------------------------------------------------------------------------- OS identity

def parse_key_value_file(text: str, kind: str) -> dict[str, str]:
    """KEY=value / KEY="value" lines (os-release, dgx-release, lsb-release).

    Blank lines and '#' comments are skipped; a repeated key keeps its last value (dgx-release
    appends a DGX_OTA_VERSION/DGX_OTA_DATE block after each OTA).
    """
    values: dict[str, str] = {}
    for line in _lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", stripped)
        if not m:
            raise ParseError(kind, "line is not KEY=value", line)
        value = m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif value[:1] in "\"'":
            raise ParseError(kind, f"unterminated quote in {m.group(1)}", line)
        values[m.group(1)] = value
    return values


def parse_os_release(text: str) -> dict[str, str]:
    """/etc/os-release -> {'ID': 'ubuntu', 'VERSION_ID': '24.04', 'PRETTY_NAME': ...}."""
    values = parse_key_value_file(text, "/etc/os-release")
    if "ID" not in values:
        raise ParseError("/etc/os-release", "no ID= line", text)
    return values


def parse_dgx_release(text: str) -> dict[str, str]:
    """/etc/dgx-release (absent on non-DGX GB10 boxes: empty text gives {})."""
    return parse_key_value_file(text, "/etc/dgx-release")


def parse_uname(text: str) -> dict[str, str]:
    """`uname -a` (or just `uname -r` / `uname -m`) -> {'hostname', 'kernel', 'arch'}.

    `uname -a` is
    'Linux <host> <release> <version ... year> <machine> [<proc> <platform>] GNU/Linux';
    the machine is the token after the build year that ends the version string.
    """
    kind = "uname"
    rows = _nonblank(text)
    if not rows:
        raise ParseError(kind, "empty output", text)
    tokens = rows[0].split()
    if len(tokens) == 1:
        token = tokens[0]
        if re.fullmatch(r"(aarch64|arm64|x86_64|amd64|i[3-6]86|ppc64le|s390x|riscv64)", token):
            return {"hostname": "", "kernel": "", "arch": token}
        if re.match(r"^\d+\.\d+", token):
            return {"hostname": "", "kernel": token, "arch": ""}
        raise ParseError(
            kind, "a single word that is neither a kernel release nor a machine", token
        )
    if tokens[0] != "Linux" or len(tokens) < 6:
        raise ParseError(kind, "expected 'Linux <host> <release> <version> <machine> ...'", rows[0])
    hostname, kernel = tokens[1], tokens[2]
    rest = tokens[3:]
    if rest and rest[-1] == "GNU/Linux":
        rest = rest[:-1]
    arch = ""
    for i, tok in enumerate(rest):
        if re.fullmatch(r"(19|20|21)\d\d", tok) and i + 1 < len(rest):
            arch = rest[i + 1]
            break
    if not arch:
        arch = rest[-1] if rest else ""
    if not re.match(r"^\d+\.\d+", kernel) or not arch:
        raise ParseError(kind, "cannot find the kernel release and machine", rows[0])
    return {"hostname": hostname, "kernel": kernel, "arch": arch}


# --------------------------------------------------------------------------- RoCE

_IBDEV = re.compile(
    r"^(?P<dev>\S+)\s+port\s+(?P<port>\d+)\s+==>\s+(?P<netdev>\S+)\s+\((?P<state>[^)]+)\)\s*$"
)


def parse_ibdev2netdev(text: str) -> list[RoceFacts]:
    """`ibdev2netdev`: 'rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)'; empty output = no devices."""
    out = []
    for line in _nonblank(text):
        m = _IBDEV.match(line.strip())
        if not m:
            raise ParseError("ibdev2netdev", "line is not '<dev> port <n> ==> <netdev> (Up|Down)'",
                             line)
        out.append(RoceFacts(device=m.group("dev"), port=int(m.group("port")),
                             netdev=m.group("netdev"), state=m.group("state")))
    return out


_IBSTAT_CA = re.compile(r"^CA '(?P<ca>[^'\s]+)'$")
_IBSTAT_PORT = re.compile(r"^Port (?P<port>\d+):$")
_IBSTAT_KV = re.compile(r"^(?P<key>[A-Za-z][A-Za-z ]*?):\s*(?P<value>\S.*?)?\s*$")


def parse_ibstat(text: str) -> list[IbPort]:
    """`ibstat` (infiniband-diags): a `CA '<name>'` block of indented `Key: value` lines, with a
    `Port <n>:` block per port. Every port must state its `State`; Physical state, Rate and
    Link layer are read when present (a capture cut mid-block keeps what it shows). Empty
    output: no CA. Anything else (a line outside a CA, a port without a State, a Rate that is
    not a number) is a ParseError, never a guess."""
    kind = "ibstat"
    ports: list[IbPort] = []
    ca: str | None = None
    ca_type = ""
    port: dict[str, str] | None = None
    port_line = ""

    def close() -> None:
        if port is None:
            return
        if "State" not in port:
            raise ParseError(kind, f"{ca} port {port['#']}: no 'State:' line", port_line)
        rate = port.get("Rate")
        if rate is not None and not re.fullmatch(r"\d+(?:\.\d+)?", rate):
            raise ParseError(kind, f"{ca} port {port['#']}: Rate {rate!r} is not a number",
                             rate)
        assert ca is not None
        ports.append(IbPort(ca=ca, ca_type=ca_type, port=int(port["#"]), state=port["State"],
                            physical_state=port.get("Physical state", ""),
                            rate_gbps=float(rate) if rate is not None else None,
                            link_layer=port.get("Link layer", "")))

    for line in _nonblank(text):
        stripped = line.strip()
        if m := _IBSTAT_CA.match(stripped):
            close()
            ca, ca_type, port = m.group("ca"), "", None
        elif ca is None:
            raise ParseError(kind, "expected a `CA '<name>'` line first", line)
        elif m := _IBSTAT_PORT.match(stripped):
            close()
            port, port_line = {"#": m.group("port")}, line
        elif m := _IBSTAT_KV.match(stripped):
            key, value = m.group("key"), m.group("value") or ""
            if port is not None:
                if key in port:
                    raise ParseError(kind, f"{ca} port {port['#']}: {key} appears twice", line)
                port[key] = value
            elif key == "CA type":
                ca_type = value
        else:
            raise ParseError(kind, "line is neither `CA '<name>'`, `Port <n>:` nor `Key: value`",
                             line)
    close()
    return ports


_RDMA_LINK = re.compile(r"^link\s+(?P<dev>[^/\s]+)/(?P<port>\d+)\s+(?P<rest>.*)$")


def parse_rdma_link(text: str) -> list[RoceFacts]:
    """`rdma link`: 'link rocep1s0f0/1 state ACTIVE physical_state LINK_UP netdev enp1s0f0np0'."""
    out = []
    for line in _nonblank(text):
        m = _RDMA_LINK.match(line.strip())
        if not m:
            raise ParseError("rdma link", "line is not 'link <dev>/<port> state ...'", line)
        words = m.group("rest").split()
        attrs = dict(zip(words[0::2], words[1::2], strict=False))
        if "state" not in attrs:
            raise ParseError("rdma link", f"{m.group('dev')}: no state", line)
        out.append(RoceFacts(device=m.group("dev"), port=int(m.group("port")),
                             netdev=attrs.get("netdev", ""), state=attrs["state"]))
    return out


# --------------------------------------------------------------------------- interfaces

def _ifname(raw: str) -> str:
    return raw.split("@", 1)[0]  # veth5b4ba42@if2 -> veth5b4ba42


def parse_ip_json_addr(text: str) -> list[InterfaceFacts]:
    """`ip -j addr` (the live survey uses this): name, IPv4 CIDRs, MTU, carrier."""
    kind = "ip -j addr"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(kind, f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                         text) from None
    if not isinstance(data, list):
        raise ParseError(kind, "expected a JSON list of interfaces", text)
    out = []
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("ifname"), str):
            raise ParseError(kind, "an entry has no ifname", json.dumps(entry)[:160])
        flags = entry.get("flags") or []
        addrs = entry.get("addr_info") or []
        mtu = entry.get("mtu") or 0
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags) \
                or not isinstance(addrs, list) or not isinstance(mtu, int) \
                or isinstance(mtu, bool):
            raise ParseError(kind, f"{entry['ifname']}: flags, addr_info or mtu of the wrong type",
                             json.dumps(entry)[:160])
        ipv4 = []
        for a in addrs:
            if not isinstance(a, dict) or a.get("family") != "inet":
                continue
            local, prefix = a.get("local"), a.get("prefixlen")
            if not isinstance(local, str) or not isinstance(prefix, int) \
                    or isinstance(prefix, bool):
                raise ParseError(kind, f"{entry['ifname']}: an IPv4 address without "
                                       "local/prefixlen", json.dumps(a)[:160])
            ipv4.append(f"{local}/{prefix}")
        carrier = ("LOWER_UP" in flags and "NO-CARRIER" not in flags
                   and entry.get("operstate") != "DOWN")
        out.append(InterfaceFacts(name=_ifname(entry["ifname"]), ipv4=ipv4, mtu=mtu,
                                  carrier=carrier))
    return out


def parse_ethtool_speed(text: str) -> int | None:
    """`ethtool <if> | grep Speed` ('\\tSpeed: 200000Mb/s') or a bare sysfs speed ('200000').

    'Speed: Unknown!' and sysfs '-1' (no link) give None.
    """
    kind = "ethtool speed"
    rows = _nonblank(text)
    if not rows:
        raise ParseError(kind, "empty output", text)
    if len(rows) != 1:
        raise ParseError(kind, "expected one 'Speed: <n>Mb/s' line or one sysfs number", text)
    row = rows[0].strip(_ASCII_SPACE)
    m = re.fullmatch(r"Speed:[ \t]*(\S+)", row)
    raw = m.group(1) if m else row
    if raw.lower().startswith("unknown") or raw == "-1":
        return None
    n = re.fullmatch(r"([0-9]+)(?:Mb/s)?", raw)
    if n:
        return int(n.group(1))
    raise ParseError(kind, "no 'Speed: <n>Mb/s' line", text)


# --------------------------------------------------------------------------- docker

def _json_lines(text: str, kind: str) -> list[dict[str, Any]]:
    out = []
    for line in _nonblank(text):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ParseError(kind, f"a line is not JSON ({exc.msg})", line) from None
        if not isinstance(value, dict):
            raise ParseError(kind, "a line is not a JSON object", line)
        out.append(value)
    return out


def _gpu_runtime(runtimes: list[str]) -> bool:
    return any("nvidia" in r for r in runtimes)


def parse_docker_info_json(text: str) -> DockerFacts:
    """`docker info --format '{{json .}}'`: server version, runtimes, cgroup driver.

    gpu_support here only reflects an 'nvidia' runtime; on a Spark the toolkit may work through
    the hook/CDI without one (see parse_gpu_runtime and inspection.recon). A reply without a
    ServerVersion means the daemon did not answer (ParseError naming the daemon's error).
    """
    kind = "docker info"
    rows = _nonblank(text)
    if not rows:
        raise ParseError(kind, "empty output", text)
    try:
        info = json.loads("\n".join(rows))
    except json.JSONDecodeError as exc:
        raise ParseError(kind, f"not JSON ({exc.msg})", text) from None
    if not isinstance(info, dict):
        raise ParseError(kind, "expected a JSON object", text)
    version = info.get("ServerVersion") or ""
    if not version:
        errors = info.get("ServerErrors") or []
        if not isinstance(errors, list):
            errors = [errors]
        detail = "; ".join(str(e) for e in errors) if errors else "no ServerVersion in the reply"
        raise ParseError(kind, f"the Docker daemon did not answer ({detail})", "")
    runtimes = info.get("Runtimes") or {}
    cgroup = info.get("CgroupDriver") or ""
    if not isinstance(version, str) or not isinstance(runtimes, dict) \
            or not isinstance(cgroup, str):
        raise ParseError(kind, "ServerVersion, Runtimes or CgroupDriver of the wrong type",
                         text)
    names = sorted(str(k) for k in runtimes)
    return DockerFacts(version=version, runtimes=names, gpu_support=_gpu_runtime(names),
                       cgroup_driver=cgroup)



def _labels_of(row: dict[str, Any], kind: str) -> dict[str, str]:
    labels = row.get("Labels")
    if labels is None:
        return {}
    if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ParseError(kind, "a Labels is not a mapping of strings", json.dumps(row)[:160])
    return dict(labels)


STACK_LABEL_PREFIX = "spark-vllm."


def parse_docker_labels_json(text: str) -> dict[str, dict[str, str]]:
    """The docker_labels snippet: every container's labels (`docker inspect`, as JSON) and its
    image's, by full container ID. docker ps's Labels column is never read for them: it joins
    the labels with ',' and a value may hold one, so an image label
    `description=fast,spark-vllm.managed=true` would pose as the stack's own label.

    A container inherits its image's labels: an image built with `LABEL spark-vllm.managed=true`
    (or committed from a stack's container) would make its containers the stack's. So a
    container's `spark-vllm.*` label is kept only when the container carries it with a value its
    image does not (the stack sets them with `--label`, issue 46); a container row that names no
    image (an older snippet's output) keeps none. An image named by a container but not listed
    is a ParseError (its labels unknown: preflight cannot judge, fail closed)."""
    kind = "docker labels"
    rows: dict[str, tuple[str | None, dict[str, str]]] = {}
    images: dict[str, dict[str, str]] = {}
    for row in _json_lines(text, kind):
        if "ImageID" in row:
            image = row["ImageID"]
            if not isinstance(image, str) or IMAGE_ID.fullmatch(image) is None:
                raise ParseError(kind, "an image's ID is not sha256:<64 hex>",
                                 json.dumps(row)[:160])
            if image in images:
                raise ParseError(kind, "an image is listed twice", json.dumps(row)[:160])
            images[image] = _labels_of(row, kind)
            continue
        ident, image = row.get("ID"), row.get("Image")
        if not isinstance(ident, str) or _CONTAINER_FULL_ID.fullmatch(ident) is None:
            raise ParseError(kind, "a container's ID is not 64 hex digits", json.dumps(row)[:160])
        if image is not None and (not isinstance(image, str) or IMAGE_ID.fullmatch(image) is None):
            raise ParseError(kind, "a container's Image is not sha256:<64 hex>",
                             json.dumps(row)[:160])
        if ident in rows:
            raise ParseError(kind, "a container is listed twice", json.dumps(row)[:160])
        rows[ident] = (image, _labels_of(row, kind))
    out: dict[str, dict[str, str]] = {}
    for ident, (image, labels) in rows.items():
        if image is not None and image not in images:
            raise ParseError(kind, f"the labels of image {image} (of container {ident[:12]}) "
                                   "were not read", "")
        inherited = images.get(image, {}) if image is not None else None
        out[ident] = {k: v for k, v in labels.items()
                      if not k.startswith(STACK_LABEL_PREFIX)
                      or (inherited is not None and inherited.get(k) != v)}
    return out


def _state_from_status(status: str) -> str:
    s = status.strip()
    if s.startswith("Up"):
        return "paused" if "(Paused)" in s else "running"
    if s.startswith("Exited"):
        return "exited"
    if s.startswith("Created"):
        return "created"
    if s.startswith("Restarting"):
        return "restarting"
    return s.split(" ", 1)[0].lower() if s else ""


def parse_docker_ps_json(text: str) -> list[ContainerFacts]:
    """`docker ps [-a] [--no-trunc] --format '{{json .}}'`: one JSON object per line."""
    kind = "docker ps"
    out = []
    for row in _json_lines(text, kind):
        missing = [k for k in ("ID", "Names", "Image") if k not in row]
        if missing:
            raise ParseError(
                kind, f"a container has no {', '.join(missing)}", json.dumps(row)[:160]
            )
        wrong = [k for k in ("ID", "Names", "Image", "State", "Status", "Labels")
                 if k in row and not isinstance(row[k], str)]
        if wrong:
            raise ParseError(kind, f"{', '.join(wrong)} of a container is not a string",
                             json.dumps(row)[:160])
        state = row.get("State") or _state_from_status(row.get("Status", ""))
        # labels: from the docker_labels section (parse_docker_labels_json), never from the
        # Labels column, which cannot tell a ',' in a value from the next label
        out.append(ContainerFacts(id=row["ID"], name=row["Names"].split(",")[0],
                                  image=row["Image"], state=state))
    return out


_CONTAINER_FULL_ID = re.compile(r"[0-9a-f]{64}")
_CGROUP_MEMORY = re.compile(
    r"(?P<id>[0-9a-f]{64}) (?P<version>v1|v2) (?P<usage>\S+) (?P<inactive>\S+)")
_CGROUP_UNAVAILABLE = re.compile(r"(?P<id>[0-9a-f]{64}) unavailable (?P<why>[\x20-\x7e]+)")
_COUNTER = re.compile(r"[0-9]{1,20}")


def parse_container_memory(text: str) -> tuple[dict[str, int], dict[str, str]]:
    """The survey's own container_memory section -> ({full container ID: memory bytes},
    {full container ID: why its memory is unknown}).

    One line per running container (inspection/snippets/container_memory.sh):

        <id> v2 <memory.current> <inactive_file>
        <id> v1 <memory.usage_in_bytes> <total_inactive_file>
        <id> unavailable <why>

    The memory is the usage minus the inactive page cache, what `docker stats` shows as MEM
    USAGE (the docker CLI's calculateMemUsageUnixNoCache). An inactive count above the usage
    (the two counters are read a moment apart) gives 0, never a negative size (docker's CLI
    shows the whole usage then; 0 never overstates what stopping a container frees). A counter
    that is not a number makes that container's memory unknown; `skip\t<%q>` records (an ID
    docker printed that is not 64 hex digits) are left out; any other line is refused.
    """
    kind = "container memory (cgroup counters)"
    usage: dict[str, int] = {}
    unknown: dict[str, str] = {}
    for line in _nonblank(text):
        if _skip_record(line.split("\t")):
            continue
        gone = _CGROUP_UNAVAILABLE.fullmatch(line)
        m = _CGROUP_MEMORY.fullmatch(line) if gone is None else None
        found = gone or m
        if found is None:
            raise ParseError(kind, "line is not '<64-hex id> v1|v2 <usage> <inactive>' or "
                                   "'<64-hex id> unavailable <why>'", line)
        ident = found.group("id")
        if ident in usage or ident in unknown:
            raise ParseError(kind, f"container {ident[:12]} is listed twice", line)
        if m is None:
            unknown[ident] = found.group("why")
            continue
        counters = ("memory.current", "inactive_file") if m.group("version") == "v2" else (
            "memory.usage_in_bytes", "total_inactive_file")
        bad = [name for name, value in zip(counters, (m.group("usage"), m.group("inactive")),
                                           strict=True) if not _COUNTER.fullmatch(value)]
        if bad:
            unknown[ident] = (f"{bad[0]} is not a number" if len(bad) == 1
                              else f"{' and '.join(bad)} are not numbers")
            continue
        usage[ident] = max(0, int(m.group("usage")) - int(m.group("inactive")))
    return usage, unknown


def parse_docker_images_json(text: str) -> list[ImageFacts]:
    """`docker images --no-trunc --format '{{json .}}'`; tags of one image ID are merged.

    Size is in decimal units ('26.1GB').
    """
    kind = "docker images"
    by_id: dict[str, dict[str, Any]] = {}
    for row in _json_lines(text, kind):
        if "ID" not in row or "Repository" not in row:
            raise ParseError(kind, "a row has no ID or Repository", json.dumps(row)[:160])
        wrong = [k for k in ("ID", "Repository", "Tag", "Digest", "Size")
                 if k in row and not isinstance(row[k], str)]
        if wrong:
            raise ParseError(kind, f"{', '.join(wrong)} of an image is not a string",
                             json.dumps(row)[:160])
        entry = by_id.setdefault(row["ID"], {"tags": [], "digests": [], "size": 0})
        repo, tag, digest = row.get("Repository", ""), row.get("Tag", ""), row.get("Digest", "")
        if repo and repo != "<none>" and tag and tag != "<none>":
            ref = f"{repo}:{tag}"
            if ref not in entry["tags"]:
                entry["tags"].append(ref)
        if repo and repo != "<none>" and digest and digest != "<none>":
            ref = f"{repo}@{digest}"
            if ref not in entry["digests"]:
                entry["digests"].append(ref)
        if row.get("Size") and row["Size"] != "N/A":
            entry["size"] = parse_size(row["Size"], kind=kind, decimal_units=True)
    return [ImageFacts(id=i, repo_tags=e["tags"], repo_digests=e["digests"], size_bytes=e["size"])
            for i, e in by_id.items()]


def parse_gpu_runtime(text: str) -> list[str]:
    """The survey's own 'gpu_runtime' section: one 'hook <path>' / 'cdi <file>' line per piece
    of NVIDIA container support found (the hook serves `--gpus`, CDI specs serve nvidia.com/gpu)."""
    found = []
    for line in _nonblank(text):
        if _skip_record(line.split("\t")):
            continue  # a path that is not printable ASCII: not evidence of anything
        m = re.fullmatch(r"(hook|cdi|ctk) (/[\x20-\x7e]*)", line)
        if not m:
            raise ParseError("gpu runtime probe", "line is not 'hook|cdi|ctk <path>'", line)
        found.append(f"{m.group(1)} {m.group(2)}")
    return found


# --------------------------------------------------------------------------- HF cache, disk

def parse_hf_cache(text: str) -> list[HfRepoFacts]:
    """The survey's own HF cache listing, tab separated, one record per line:

        repo\\tmodels--Qwen--Qwen3.5-122B-A10B-FP8
        ref\\tmain\\t<40-hex commit>
        listed                                   (the stack's repos: their files follow)
        snapshot\\t<commit>
        file\\t<commit>\\t<path in the snapshot>\\t<bytes>   (a listed repo's, after its snapshot)
        blobs\\t<bytes>
        changed\\t<verified blobs gone or changed since>   (only for a repo the stack verified)

    'listed', 'ref', 'snapshot', 'file', 'blobs' and 'changed' belong to the last 'repo' line.
    Only model repos are listed. A listed repo's facts hold each snapshot's files (a snapshot
    with none has an empty listing); another repo's listing is None (not looked at).
    Every field is printable ASCII (a ref's content may be empty); `skip\t<%q name>` records
    (names the snippet refused to print) are left out.
    """
    kind = "HF cache listing"
    repos: list[dict[str, Any]] = []
    for line in _nonblank(text):
        parts = line.split("\t")
        tag = parts[0]
        if _skip_record(parts):
            continue
        if tag == "repo" and len(parts) == 2 and _field(parts[1]):
            folder = parts[1]
            m = re.fullmatch(r"models--(.+?)--(.+)", folder)
            if not m:
                raise ParseError(kind, f"{folder!r} is not a 'models--<org>--<name>' folder", line)
            repos.append({"repo_id": f"{m.group(1)}/{m.group(2)}", "refs": {}, "snapshots": [],
                          "size": 0, "changed": 0, "files": None})
            continue
        if not repos:
            raise ParseError(kind, "a record comes before any 'repo' line", line)
        current = repos[-1]
        if tag == "ref" and len(parts) == 3 and _field(parts[1]) \
                and (parts[2] == "" or _field(parts[2])):
            current["refs"][parts[1]] = parts[2]
        elif tag == "listed" and len(parts) == 1 and current["files"] is None \
                and not current["snapshots"]:
            current["files"] = {}
        elif tag == "snapshot" and len(parts) == 2 and _field(parts[1]):
            current["snapshots"].append(parts[1])
            if current["files"] is not None:
                current["files"].setdefault(parts[1], {})
        elif tag == "file" and len(parts) == 4 and current["files"] is not None \
                and parts[1] in current["files"] and _field(parts[2]) \
                and re.fullmatch(r"[0-9]+", parts[3]):
            if parts[2] in current["files"][parts[1]]:
                raise ParseError(kind, f"file {parts[2]!r} of {parts[1]} is listed twice", line)
            current["files"][parts[1]][parts[2]] = int(parts[3])
        elif tag == "blobs" and len(parts) == 2 and re.fullmatch(r"[0-9]+", parts[1]):
            current["size"] = int(parts[1])
        elif tag == "changed" and len(parts) == 2 and re.fullmatch(r"[0-9]+", parts[1]):
            current["changed"] = int(parts[1])
        else:
            raise ParseError(kind, "line is not repo/listed/ref/snapshot/file/blobs/changed with "
                                   "tab-separated printable fields (a file after its snapshot)",
                             line)
    return [HfRepoFacts(repo_id=r["repo_id"], refs=r["refs"], snapshots=sorted(r["snapshots"]),
                        size_bytes=r["size"], changed_blobs=r["changed"],
                        snapshot_files=r["files"]) for r in repos]


def parse_df_avail(text: str) -> int:
    """`df -B1 --output=avail <path>`: header 'Avail' then the free bytes."""
    rows = _nonblank(text)
    if len(rows) != 2 or rows[0].strip() != "Avail":
        raise ParseError("df --output=avail", "expected an 'Avail' header and one number", text)
    value = rows[1].strip()
    if not re.fullmatch(r"[0-9]+", value):
        raise ParseError("df --output=avail", f"{value!r} is not a byte count", text)
    return int(value)


# --------------------------------------------------------------------------- clock, host keys

def parse_epoch(text: str) -> float:
    """`date +%s.%N` -> seconds since the epoch."""
    rows = _nonblank(text)
    if len(rows) != 1 or not re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", rows[0].strip()):
        raise ParseError("date +%s.%N", "expected seconds since the epoch", text)
    return float(rows[0].strip())


def parse_host_keys(text: str) -> list[str]:
    """Contents of /etc/ssh/ssh_host_*_key.pub -> ['ssh-ed25519 AAAA...', ...] (no comments)."""
    keys = []
    for line in _nonblank(text):
        m = re.fullmatch(r"((?:ssh|ecdsa|sk)-[A-Za-z0-9@.-]+)[ \t]+([A-Za-z0-9+/]+=*)"
                         r"(?:[ \t][\x20-\x7e\t]*)?", line)
        if not m:
            raise ParseError("ssh host keys", "line is not '<type> <base64> [comment]'", line)
        keys.append(f"{m.group(1)} {m.group(2)}")
    return keys


def parse_fabric_files(text: str) -> dict[str, str | None]:
    """`<sha256>  <path>` (sha256sum) or `absent <path>` per line -> {path: sha256 or None}."""
    out: dict[str, str | None] = {}
    for line in _nonblank(text):
        m = re.fullmatch(r"(?:([0-9a-f]{64}) [ *]|absent )(/[\x21-\x7e]+)", line.strip())
        if not m:
            raise ParseError("netplan files", "line is not '<sha256>  <path>' or 'absent <path>'",
                             line)
        out[m.group(2)] = m.group(1)
    return out


def parse_presence(text: str) -> bool:
    """`present` or `absent` (a file the stack keeps on the node, e.g. the Ray token)."""
    lines = _nonblank(text)
    if lines == ["present"]:
        return True
    if lines == ["absent"]:
        return False
    raise ParseError("presence", "expected one line, present or absent", text[:80])


def parse_stopped_markers(text: str) -> dict[str, str]:
    """`marker\t<container>\t<project>/<stack>` lines (recon's stopped section; `skip\t<%q>`
    records for file names that are not printable ASCII are left out) -> {container: stack}."""
    out: dict[str, str] = {}
    for line in _nonblank(text):
        parts = line.split("\t")
        if _skip_record(parts):
            continue
        if len(parts) != 3 or parts[0] != "marker" or not CONTAINER_NAME.fullmatch(parts[1]) \
                or not _field(parts[2]):
            raise ParseError("stopped", "expected 'marker\\t<container>\\t<project>/<stack>'",
                             line)
        out[parts[1]] = parts[2]
    return out


def parse_liveness_starts(text: str) -> list[tuple[float, str]]:
    """The liveness watchdog's starts file (hostscripts/payloads/vllm_liveness.py) ->
    [(time, "start" | "serving")], oldest first, in the node's clock. Lines of another shape
    are left out, as the watchdog itself does (it writes the file whole, with os.replace)."""
    out: list[tuple[float, str]] = []
    for line in split_lines(text):
        part = line.split()
        if len(part) == 2 and part[1] in ("start", "serving"):
            try:
                out.append((float(part[0]), part[1]))
            except ValueError:
                continue
    return out


def _json_object(kind: str, line: str) -> dict[str, Any]:
    try:
        raw = json.loads(line)
    except ValueError:
        raise ParseError(kind, "not JSON", line) from None
    if not isinstance(raw, dict):
        raise ParseError(kind, "not a JSON object", line)
    return raw


def parse_nccl_host(text: str) -> list[NcclLibrary]:
    """payloads/nccl_library.py `host`: {"libraries": [...]} -> each libnccl the node's dynamic
    linker knows."""
    lines = _nonblank(text)
    if not lines:
        raise ParseError("the host's NCCL", "no output", text)
    raw = _json_object("the host's NCCL", lines[-1])
    libs = raw.get("libraries")
    if not isinstance(libs, list):
        raise ParseError("the host's NCCL", "no libraries list", lines[-1])
    try:
        return [NcclLibrary.model_validate(x) for x in libs]
    except ValidationError as exc:
        raise ParseError("the host's NCCL", f"a library is not readable ({exc.error_count()} "
                         "errors)", lines[-1]) from None


def parse_image_nccl(text: str) -> dict[str, ImageNccl]:
    """`<64 hex>\t<the image probe's JSON>` per record (recon's image_nccl section) -> {image
    ID: the NCCL that image's vLLM loads}; a record without an NCCL answer is left out."""
    out: dict[str, ImageNccl] = {}
    for line in _nonblank(text):
        name, _, body = line.partition("\t")
        if not re.fullmatch(r"[0-9a-f]{64}", name):
            raise ParseError("image probe records", "a record's name is not an image ID", line)
        raw = _json_object("image probe records", body)
        if not isinstance(raw.get("nccl"), dict):
            continue
        try:
            out[f"sha256:{name}"] = ImageNccl.model_validate(raw["nccl"])
        except ValidationError:
            raise ParseError("image probe records", "its nccl answer is not readable",
                             body) from None
    return out


def parse_collective_record(text: str) -> tuple[bool, bool | None]:
    """`absent`, or the collective gate's record (JSON) -> (present, whether it stopped an up)."""
    lines = _nonblank(text)
    if lines == ["absent"]:
        return False, None
    if len(lines) != 1:
        raise ParseError("the collective gate's record", "expected one line", text)
    raw = _json_object("the collective gate's record", lines[0])
    stopped = raw.get("stopped")
    if not isinstance(stopped, bool):
        raise ParseError("the collective gate's record", "no stopped: true|false", lines[0])
    return True, stopped


def parse_nft_version(text: str) -> str:
    """`nftables v1.0.6 (Lester Gooch #5)` (nft --version) -> `1.0.6`."""
    m = re.fullmatch(r"nftables v(\d+(?:\.\d+){1,3})(?: \([\x20-\x7e]*\))?",
                     " ".join(_nonblank(text)).strip())
    if not m:
        raise ParseError("nft --version", "expected 'nftables v<version> (<name>)'", text[:80])
    return m.group(1)


def parse_port_range(text: str) -> tuple[int, int]:
    """/proc/sys/net/ipv4/ip_local_port_range (`32768\t60999`) -> (first, last)."""
    m = re.fullmatch(r"(\d{1,5})\s+(\d{1,5})", " ".join(_nonblank(text)).strip())
    if not m:
        raise ParseError("ip_local_port_range", "expected two port numbers", text[:80])
    lo, hi = int(m.group(1)), int(m.group(2))
    if not 1 <= lo <= hi <= 65535:
        raise ParseError("ip_local_port_range", "expected 1 <= first <= last <= 65535", text[:80])
    return lo, hi


def parse_firewall(text: str) -> FirewallFacts:
    """hostscripts/firewall.check_script's lines -> FirewallFacts: `table|file|unit <sha256 or
    absent>`, `enabled yes|no`, `record <sha256> <sha256>` or `record absent`, each once."""
    digest = r"[0-9a-f]{64}"
    seen: dict[str, str] = {}
    for line in _nonblank(text):
        what, _, value = line.strip().partition(" ")
        if what in seen or what not in ("table", "file", "unit", "enabled", "record"):
            raise ParseError("firewall", "unexpected or repeated line", line)
        ok = {"enabled": r"yes|no", "record": rf"absent|{digest} {digest}"}.get(
            what, rf"absent|{digest}")
        if not re.fullmatch(ok, value):
            raise ParseError("firewall", f"{what}: expected {ok}", line)
        seen[what] = value
    missing = {"table", "file", "unit", "enabled", "record"} - set(seen)
    if missing:
        raise ParseError("firewall", f"no line for {sorted(missing)}", text[:80])

    def d(what: str) -> str | None:
        return None if seen[what] == "absent" else seen[what]

    record = seen["record"].split() if seen["record"] != "absent" else None
    return FirewallFacts(table=d("table"), file=d("file"), unit=d("unit"),
                         enabled=seen["enabled"] == "yes",
                         record=(record[0], record[1]) if record else None)


_GUARD_TOOLS = ("earlyoom", "systemctl", "apt-get", "systemd-oomd")
_GUARD_UNITS = ("earlyoom.service", "systemd-oomd.service")


def parse_guard(text: str) -> GuardFacts:
    """inspection/snippets/guard.sh's records -> GuardFacts. Every line is one of its four
    kinds, exactly; anything else is refused."""
    kind = "guard"
    tools: dict[str, str | None] = {}
    active: dict[str, str] = {}
    files: dict[str, str | None] = {}
    records: bool | None = None
    for line in _nonblank(text):
        parts = line.split("\t")
        if parts[0] == "tool" and len(parts) == 3 and parts[1] in _GUARD_TOOLS and (
                parts[2] == "absent" or re.fullmatch(r"/[\x21-\x7e]{1,255}", parts[2])):
            tools[parts[1]] = None if parts[2] == "absent" else parts[2]
        elif parts[0] == "active" and len(parts) == 3 and parts[1] in _GUARD_UNITS and \
                re.fullmatch(r"[a-z-]{1,20}", parts[2]):
            active[parts[1]] = parts[2]
        elif parts[0] == "records" and len(parts) == 2 and parts[1] in ("present", "absent"):
            records = parts[1] == "present"
        elif parts[0] == "file" and len(parts) == 3 and re.fullmatch(
                r"[0-9a-f]{64}|absent", parts[1]) and re.fullmatch(r"/[\x21-\x7e]{1,255}",
                                                                  parts[2]):
            files[parts[2]] = None if parts[1] == "absent" else parts[1]
        else:
            raise ParseError(kind, "not a tool, active, records or file record", line)
    if records is None or set(tools) != set(_GUARD_TOOLS):
        raise ParseError(kind, "no records line, or not every tool said", text[:200])
    return GuardFacts(tools=tools, active=active, records_present=records, files=files)


def parse_oom_kills(text: str) -> list[OomKill]:
    """The guard's record of the node's kills (hostscripts/guard.py's hook: `<epoch>
    <MemAvailable bytes|-> <MemTotal bytes|-> <pid> <name>` per line, oldest first; the
    available memory when earlyoom acted) -> OomKill in the node's clock. A line of another
    shape (a cut write) is left out."""
    out: list[OomKill] = []
    for line in split_lines(text):
        m = re.fullmatch(r"([0-9]{1,12}(?:\.[0-9]{1,6})?) ([0-9]{1,20}|-) ([0-9]{1,20}|-) "
                         r"([0-9]{1,10}) ([A-Za-z0-9_.:+-]{1,32})", line.strip())
        if m:
            avail, total = (None if v == "-" else int(v) for v in (m.group(2), m.group(3)))
            out.append(OomKill(time=float(m.group(1)), available_bytes=avail,
                               total_bytes=total, pid=int(m.group(4)), name=m.group(5)))
    return out


def parse_liveness_ooms(text: str) -> list[OomKill]:
    """The OOM kills in the liveness watchdog's starts file (`<time> oom <earlyoom|kernel>
    <available|-> <total|-> <victim|->`, hostscripts/payloads/vllm_liveness.py) -> OomKill in
    the node's clock, oldest first. Lines of another shape are left out."""
    out: list[OomKill] = []
    for line in split_lines(text):
        m = re.fullmatch(r"([0-9]{1,12}(?:\.[0-9]{1,6})?) oom (earlyoom|kernel) ([0-9]{1,20}|-) "
                         r"([0-9]{1,20}|-) ([A-Za-z0-9_.:+-]{1,32})", line.strip())
        if m:
            avail, total = (None if v == "-" else int(v) for v in (m.group(3), m.group(4)))
            out.append(OomKill(time=float(m.group(1)), source=m.group(2), available_bytes=avail,
                               total_bytes=total, name="" if m.group(5) == "-" else m.group(5)))
    return out
