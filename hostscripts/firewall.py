"""The node's firewall: an nftables table of the stack's own on every node (issue 45).

Ray's gRPC servers, torch.distributed's store and vLLM's own sockets listen on every address of
a node whatever they are told (Ray: `--node-ip-address` is only what it advertises; torch's
TCPStore binds `::`/`0.0.0.0`: torch/csrc/distributed/c10d/TCPStoreLibUvBackend.cpp,
`UvTcpServer::makeWithPort`; vLLM's `get_open_port` binds "": vllm/utils/network_utils.py). So
the stack filters its own ports, and only them, with a table of its own,
`inet spark-vllm-<stack>` (IPv4 and IPv6 in one), on every node:

* an `input` chain (policy accept, priority filter) that admits the node's loopback, replies of
  connections already made, the stack's sshd port (always: an operator never loses ssh) and
  the public ports (the gateway), then for each of the stack's ports (config/ports.node_ports)
  admits its sources (the stack's nodes' fabric addresses, or the head's) and counts and drops
  everything else; and new connections to the kernel's ephemeral port range from anywhere but
  the stack's nodes (the data plane: sockets that bind port 0, so that no rule can name their
  port: gloo's and vLLM's message queues on the fabric address, and the torch store Ray's V2
  executor of vLLM 0.32 makes on every address, vllm/v1/executor/ray_executor_v2.py
  `create_dist_init_method`, which no variable pins);
* a probe for the vLLM launcher: a connection to the stack's own loopback address
  (`probe_address`, in 127/8) at the probe port is rejected with ICMP admin-prohibited
  (EHOSTUNREACH) by this table only; without it the kernel answers with a reset
  (ECONNREFUSED). The launcher in a vLLM container (no CAP_NET_ADMIN, so it cannot list the
  table, and must not be able to change it) refuses to start vLLM unless the probe says the
  table is there (payloads/firewall_probe.py).

What it never does: touch another table (the operator's rules, Docker's chains: an nftables
`accept` ends only this chain, a `drop` in any chain is final, so this table can close what it
names and never open what another closes), or filter a port that is not the stack's.

Persistence: the table is a file the stack writes (`<stack folder>/firewall/table.nft`, loaded
with `nft -f`, which replaces the table atomically), and a systemd unit of the stack's own,
`spark-vllm-<stack>-firewall.service`, loads that file at boot before docker.service starts any
container (and after nftables.service, whose configuration may flush the ruleset). Recon reads
the table's digest (`nft -s list table`, counters left out), the file's, the unit's and the
record the last load wrote: a table removed or edited by hand is drift the next `up` repairs.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from config.firewall import Ports
from hostscripts.common import payload, plain, q
from hostscripts.paths import StackNames

NFT = "/usr/sbin/nft"  # Debian's and Ubuntu's nftables package
UNIT_DIR = "/etc/systemd/system"
PROBE_ENV = "SPARK_VLLM_FIREWALL_PROBE"  # the probe port, in the vLLM containers' environment
_PROBE_PY = payload("firewall_probe.py")


def table_name(names: StackNames) -> str:
    """The stack's table (nftables names start with a letter; the stack's name is plain)."""
    return f"spark-vllm-{names.stack}"


def probe_address(names: StackNames) -> str:
    """The loopback address of the stack's probe (127/8 is all the node's own): one per stack,
    so that another stack's table on the same node never answers this stack's launcher."""
    h = hashlib.sha256(names.stack.encode()).digest()
    return f"127.{1 + h[0] % 254}.{h[1]}.{1 + h[2] % 254}"


def probe_target(names: StackNames, port: int) -> str:
    """What the vLLM containers' PROBE_ENV holds: `<probe address>:<port>`."""
    return f"{probe_address(names)}:{int(port)}"


def unit_name(names: StackNames) -> str:
    return f"spark-vllm-{names.stack}-firewall.service"


def unit_path(names: StackNames) -> str:
    return f"{UNIT_DIR}/{unit_name(names)}"


def firewall_dir(names: StackNames) -> str:
    return f"{names.dir}/firewall"


def ruleset_path(names: StackNames) -> str:
    return f"{firewall_dir(names)}/table.nft"


def record_path(names: StackNames) -> str:
    """What the last load wrote: `<sha256 of the file> <sha256 of the table as listed>`."""
    return f"{firewall_dir(names)}/loaded"


@dataclass(frozen=True)
class Rule:
    """Ports of the stack on the node and the addresses (IPv4) that may reach them besides the
    node itself; none: loopback only."""

    what: str
    ports: Ports
    sources: tuple[str, ...]


@dataclass(frozen=True)
class DataPlane:
    """New connections to the kernel's ephemeral range, on every address of the node, from
    anywhere but the stack's nodes (IPv6: from anywhere)."""

    ports: tuple[int, int]  # net.ipv4.ip_local_port_range
    sources: tuple[str, ...]  # every fabric address of the stack


@dataclass(frozen=True)
class TableSpec:
    stack: str
    node: str
    ssh_port: int
    public: tuple[int, ...]
    rules: tuple[Rule, ...]
    data_plane: DataPlane | None
    probe: int

    @property
    def names(self) -> StackNames:
        return StackNames(self.stack)

    @property
    def stack_sources(self) -> tuple[str, ...]:
        return tuple(sorted({a for r in self.rules for a in r.sources}
                            | set(self.data_plane.sources if self.data_plane else ()),
                            key=ipaddress.IPv4Address))


def _port(p: int) -> str:
    if not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= 65535:
        raise ValueError(f"not a port: {p!r}")
    return str(p)


def _ports(ports: Ports) -> str:
    words = []
    for p in ports:
        if isinstance(p, tuple):
            lo, hi = p
            if int(lo) > int(hi):
                raise ValueError(f"not a port range: {p!r}")
            words.append(f"{_port(lo)}-{_port(hi)}")
        else:
            words.append(_port(p))
    if not words:
        raise ValueError("a rule with no port")
    return "{ " + ", ".join(words) + " }"


def _addresses(addresses: Sequence[str]) -> str:
    if not addresses:
        raise ValueError("no address")
    return "{ " + ", ".join(str(ipaddress.IPv4Address(a)) for a in addresses) + " }"


def _what(what: str) -> str:
    return plain(what)


def _set_name(sources: tuple[str, ...], sets: dict[tuple[str, ...], str]) -> str:
    return sets[tuple(sorted(sources, key=ipaddress.IPv4Address))]


def render(spec: TableSpec) -> str:
    """The table as the file `nft -f` loads: created if missing, then deleted and made again in
    one transaction, so a load replaces it whole or not at all."""
    table = table_name(spec.names)
    plain(spec.node)
    stack = spec.stack_sources
    # one named set per group of sources: `stack4` every fabric address of the stack, `fromN`
    # the others (the head's)
    source_sets: dict[tuple[str, ...], str] = {stack: "stack4"} if stack else {}
    for r in spec.rules:
        if r.sources:
            key = tuple(sorted(r.sources, key=ipaddress.IPv4Address))
            source_sets.setdefault(key, f"from{len(source_sets)}")
    lines = [
        f"# spark-vllm: the firewall of stack {spec.stack} on {spec.node}, generated by",
        "# hostscripts/firewall.py. The stack's `up` writes and loads it; its unit",
        f"# {unit_name(spec.names)} loads it at boot. Edited by hand, it is put back.",
        f"table inet {table} {{}}",
        f"delete table inet {table}",
        f"table inet {table} {{",
        "\tcomment \"spark-vllm: this stack's own ports only\"",
    ]
    for key, name in source_sets.items():
        lines.append(f"\tset {name} {{ type ipv4_addr; elements = {_addresses(key)}; }}")
    lines += [
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        # before the loopback's accept: the launcher's probe, answered by this table only
        f"\t\tip daddr {probe_address(spec.names)} tcp dport {_port(spec.probe)} "
        "reject with icmp type admin-prohibited comment \"launcher-probe\"",
        "\t\tiifname \"lo\" accept",
        "\t\tct state established,related accept",
        f"\t\ttcp dport {_port(spec.ssh_port)} accept comment \"sshd\"",
    ]
    if spec.public:
        lines.append(f"\t\ttcp dport {_ports(spec.public)} accept comment \"public\"")
    for r in spec.rules:
        ports = _ports(r.ports)
        if r.sources:
            lines.append(f"\t\ttcp dport {ports} ip saddr @{_set_name(r.sources, source_sets)} "
                         f"accept comment \"{_what(r.what)}\"")
        lines.append(f"\t\ttcp dport {ports} counter drop comment \"{_what(r.what)}\"")
    if spec.data_plane is not None:
        lo, hi = spec.data_plane.ports
        ports = f"{_port(lo)}-{_port(hi)}"
        lines += [f"\t\ttcp dport {ports} ct state new ip saddr != @stack4 counter drop "
                  "comment \"data-plane\"",
                  f"\t\tmeta nfproto ipv6 tcp dport {ports} ct state new counter drop "
                  "comment \"data-plane\""]
    lines += ["\t}", "}", ""]
    return "\n".join(lines)


def render_unit(names: StackNames) -> str:
    """The stack's systemd unit: the table from its file, before Docker starts any container.
    `DefaultDependencies=no` so it can run that early; after nftables.service (the host's own
    configuration may flush the ruleset) and the local file systems (the file)."""
    return "\n".join([
        "[Unit]",
        f"Description=spark-vllm stack {names.stack}: its nftables table, before Docker",
        "Documentation=man:nft(8)",
        "DefaultDependencies=no",
        "After=local-fs.target nftables.service",
        "Before=network-pre.target docker.service",
        "Wants=network-pre.target",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        f"ExecStart={NFT} -f {ruleset_path(names)}",
        f"ExecReload={NFT} -f {ruleset_path(names)}",
        "",
        "[Install]",
        "WantedBy=multi-user.target docker.service",
        "",
    ])


def unit_sha256(names: StackNames) -> str:
    return hashlib.sha256(render_unit(names).encode()).hexdigest()


def ruleset_sha256(spec: TableSpec) -> str:
    return hashlib.sha256(render(spec).encode()).hexdigest()


def _heredoc(path: str, text: str, marker: str) -> list[str]:
    if f"\n{marker}\n" in f"\n{text}":
        raise ValueError(f"the text holds its heredoc's end marker {marker}")
    return [f"cat > {q(path)} <<'{marker}'", text.rstrip("\n"), marker]


# The chain the mp rendezvous guard of issue 31 (iptables) kept on the head: this table
# replaced it, and an apply removes what is left of it
def legacy_chain(names: StackNames) -> str:
    return "SVLLM-MP-" + hashlib.sha256(names.stack.encode()).hexdigest()[:12]


def legacy_guard_remove(names: StackNames) -> list[str]:
    """Every INPUT rule that jumps to the old chain, then the chain, in iptables and ip6tables
    where they are installed (nothing when they are not, or the chain is gone)."""
    chain = legacy_chain(names)
    return [
        "for ipt in iptables ip6tables; do",
        "  command -v \"$ipt\" >/dev/null 2>&1 || continue",
        f"  \"$ipt\" -w -S {q(chain)} >/dev/null 2>&1 || continue",
        f"  \"$ipt\" -w -S INPUT | awk -v c={q(chain)} "
        "'$1 == \"-A\" && $NF == c {sub(/^-A/, \"-D\"); print}' |",
        "    while read -r rule; do \"$ipt\" -w $rule; done",
        f"  \"$ipt\" -w -F {q(chain)}",
        f"  \"$ipt\" -w -X {q(chain)}",
        "  echo \"removed the old rendezvous guard ($ipt chain " + plain(chain) + ")\"",
        "done",
    ]


def apply_script(spec: TableSpec) -> str:
    """On the node: the ruleset checked by the node's nft (`nft -c`; a file it refuses is never
    written), written, the unit written and enabled, the table loaded (atomically), the old
    iptables guard removed and the load recorded. Fails, changing nothing, without nft."""
    names = spec.names
    table, file, rec = table_name(names), ruleset_path(names), record_path(names)
    new = file + ".new"
    unit = unit_path(names)
    lines = [
        "set -eu",
        f"command -v nft >/dev/null 2>&1 || [ -x {NFT} ] || {{ echo \"firewall "
        f"{plain(spec.node)}: nft is not installed, so the stack's ports would answer on every "
        "address (apt-get install nftables)\" >&2; exit 1; }",
        "PATH=/usr/sbin:/sbin:$PATH",
        "umask 077",
        f"mkdir -p {q(firewall_dir(names))}",
        f"chmod 700 {q(names.dir)} {q(firewall_dir(names))}",
        f"rm -f {q(new)}",
        *_heredoc(new, render(spec), "SPARK_VLLM_NFT"),
        f"if ! err=$(nft -c -f {q(new)} 2>&1); then",
        f"  rm -f {q(new)}",
        f"  echo \"firewall {plain(spec.node)}: nft refused the table, nothing was changed: "
        "$err\" >&2",
        "  exit 1",
        "fi",
        f"mv {q(new)} {q(file)}",
        f"rm -f {q(unit + '.new')}",
        *_heredoc(unit + ".new", render_unit(names), "SPARK_VLLM_UNIT"),
        f"chmod 644 {q(unit + '.new')}",
        f"mv {q(unit + '.new')} {q(unit)}",
        # with systemd running it reads the unit again; without it (a container, a chroot)
        # `enable` still makes the links the next boot follows
        "[ ! -d /run/systemd/system ] || systemctl daemon-reload",
        f"systemctl enable --quiet {q(unit_name(names))}",
        f"nft -f {q(file)}",
        *legacy_guard_remove(names),
        f"f=$(sha256sum < {q(file)} | cut -c1-64)",
        f"t=$(nft -s list table inet {q(table)} | sha256sum | cut -c1-64)",
        f"printf '%s %s\\n' \"$f\" \"$t\" > {q(rec)}",
        f"echo \"firewall {plain(spec.node)}: table inet {plain(table)} loaded "
        f"({len(spec.rules)} port rules), {plain(unit_name(names))} enabled\"",
    ]
    return "\n".join(lines)


def remove_script(names: StackNames, node: str) -> str:
    """On the node: the table, the unit and the stack's firewall files gone (`destroy`)."""
    table, unit = table_name(names), unit_name(names)
    return "\n".join([
        "set -eu",
        "PATH=/usr/sbin:/sbin:$PATH",
        f"if command -v nft >/dev/null 2>&1 && nft list table inet {q(table)} >/dev/null 2>&1; "
        "then",
        f"  nft delete table inet {q(table)}",
        "fi",
        f"if [ -e {q(unit_path(names))} ]; then",
        f"  systemctl disable --quiet {q(unit)} 2>/dev/null || true",
        f"  rm -f {q(unit_path(names))}",
        "  [ ! -d /run/systemd/system ] || systemctl daemon-reload",
        "fi",
        f"rm -f {q(ruleset_path(names))} {q(record_path(names))}",
        f"rmdir {q(firewall_dir(names))} {q(names.dir)} 2>/dev/null || true",
        f"echo \"firewall {plain(node)}: table inet {plain(table)} removed\"",
    ])


def check_script(names: StackNames) -> str:
    """Recon (read-only): the table's digest as the kernel lists it (counters left out), the
    file's, the unit's, whether the unit is enabled, and the last load's record. One line each:
    `<what> <sha256 | absent | yes | no>`; `record <file sha256> <table sha256>`."""
    table = table_name(names)
    return "\n".join([
        "PATH=/usr/sbin:/sbin:$PATH",
        "command -v nft >/dev/null 2>&1 || exit 127",
        f"if t=$(nft -s list table inet {q(table)} 2>/dev/null); then",
        "  echo \"table $(printf '%s\\n' \"$t\" | sha256sum | cut -c1-64)\"",
        "else echo 'table absent'; fi",
        f"for f in file:{q(ruleset_path(names))} unit:{q(unit_path(names))}; do",
        "  if [ -s \"${f#*:}\" ]; then echo \"${f%%:*} $(sha256sum < \"${f#*:}\" | cut -c1-64)\"",
        "  else echo \"${f%%:*} absent\"; fi",
        "done",
        f"if systemctl is-enabled --quiet {q(unit_name(names))} 2>/dev/null; then "
        "echo 'enabled yes'; else echo 'enabled no'; fi",
        f"if [ -s {q(record_path(names))} ]; then echo \"record $(head -c 200 "
        f"{q(record_path(names))})\"; else echo 'record absent'; fi",
    ])


def counters_script(names: StackNames) -> str:
    """`spark-vllm status` (read-only): the table as JSON, its drop counters in it; `absent`
    when it is not loaded."""
    return (f"PATH=/usr/sbin:/sbin:$PATH; nft -j list table inet {q(table_name(names))} "
            "2>/dev/null || echo absent")


def probe_launcher() -> str:
    """The shell line the vLLM launcher runs first: with PROBE_ENV set, vLLM starts only when
    the stack's table answers its probe (payloads/firewall_probe.py)."""
    return (f"if [ -n \"${{{PROBE_ENV}:-}}\" ]; then python3 -c {q(_PROBE_PY)} "
            f"\"${PROBE_ENV}\" || exit 1; fi")
