"""The fabric's configuration on a node: one ConnectX-7 interface, as the stack declares it.

Two states are kept in step (components/fabric.py runs these per interface):
- persistent: a netplan file of the stack's own per interface,
  /etc/netplan/40-spark-vllm-<stack>-<interface>.yaml (mode 0600), what the node's OS applies
  at boot (netplan: https://netplan.readthedocs.io/en/stable/netplan-yaml/);
- running: the interface's IPv4 addresses (exactly the declared one), its MTU and link state,
  set with iproute2 on that interface only.

Why not `netplan apply`: it regenerates and restarts networking for every interface the node
has (systemd-networkd or NetworkManager reconfigures them all), the management one included,
which is the connection the change arrives on. Applying the declared interface's state with
`ip` touches nothing else; the file makes it survive a reboot. The file is validated first by
the node's own netplan, against the node's other netplan files (`netplan generate --root-dir`
on a copy): a configuration netplan would reject at boot is never written.

Refused before any change: an interface that carries the address this SSH session arrived on
(the management interface), an interface the route to the control machine goes through, and
an address whose subnet holds the control machine (adding it would move that route onto the
fabric). A failure after the first change restores the previous file, MTU and addresses, and
says which node and interface failed.

The stack owns a managed fabric interface's IPv4 addresses: the apply leaves exactly the
declared one (and a link-local 169.254/16 one, which the kernel or NetworkManager manages).
`delete` removes the stack's file and the declared address, unless another stack's file on the
node declares the same address on the same interface (two stacks on one pair of Sparks share
the fabric); the MTU is left as it is.

On a node where NetworkManager manages the port, a link event can make it re-apply its own
profile until the next boot applies the netplan file; the next `up` sees that as drift and
repairs it (components/fabric.py).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from hostscripts.common import q
from hostscripts.paths import StackNames

NETPLAN_DIR = "/etc/netplan"
FILE_PREFIX = "40-spark-vllm-"


@dataclass(frozen=True)
class InterfaceSpec:
    """One declared fabric interface of one node."""

    node: str
    stack: str
    interface: str
    address: str  # CIDR: the fabric IP with its fabric subnet's prefix, e.g. 192.168.177.11/24
    mtu: int

    @property
    def ip(self) -> str:
        return self.address.split("/", 1)[0]

    @property
    def path(self) -> str:
        return StackNames(self.stack).fabric_netplan(self.interface)


def netplan_sha256(spec: InterfaceSpec) -> str:
    """What `sha256sum` prints for the file the apply writes (recon compares: drift)."""
    import hashlib

    return hashlib.sha256(netplan_yaml(spec).encode()).hexdigest()


def netplan_yaml(spec: InterfaceSpec) -> str:
    """The stack's netplan file for one interface (netplan merges it with the node's others)."""
    if "/" not in spec.address or ipaddress.IPv4Interface(spec.address).network.prefixlen > 30:
        raise ValueError(f"a fabric address is IPv4 CIDR with its subnet's prefix (/16 to /30), "
                         f"got {spec.address!r}")
    return (
        f"# spark-vllm stack {spec.stack}: fabric interface {spec.interface} of node {spec.node}\n"
        "# written by spark-vllm (hostscripts/fabric_config.py); `pulumi up` keeps it in step\n"
        "network:\n"
        "  version: 2\n"
        "  ethernets:\n"
        f"    {spec.interface}:\n"
        "      dhcp4: false\n"
        f"      addresses: [{spec.address}]\n"
        f"      mtu: {int(spec.mtu)}\n"
    )


# The guard: the interface this SSH session uses, the route to the control machine, and the
# subnet of the new address (SSH_CONNECTION: client-ip client-port server-ip server-port).
_IN_SUBNET = ("import ipaddress,sys; a=ipaddress.ip_address(sys.argv[1]); "
              "sys.exit(a not in ipaddress.ip_interface(sys.argv[2]).network)")
_GUARD = "\n".join([
    'set -- ${SSH_CONNECTION:-}',
    'if [ "$#" -ge 4 ]; then',
    '  client=$1; server=$3',
    '  if ip -o -4 addr show dev "$iface" | awk \'{print $4}\' | cut -d/ -f1 '
    '| grep -qxF "$server"; then',
    '    fail "carries the management address $server (this SSH session\'s): a fabric '
    'interface is never the management one; nothing changed"',
    '  fi',
    '  via=$(ip -o route get "$client" 2>/dev/null | sed -n \'s/.* dev \\([^ ]*\\).*/\\1/p\')',
    '  if [ "$via" = "$iface" ]; then',
    '    fail "the route to the control machine $client goes through it: nothing changed"',
    '  fi',
    f'  if python3 -c {q(_IN_SUBNET)} "$client" "$addr"; then',
    '    fail "$addr\'s subnet holds the control machine $client: adding it would move that '
    'route onto the fabric; nothing changed"',
    '  fi',
    'fi',
])


def apply_script(spec: InterfaceSpec) -> str:
    """Bring the interface to the declared state (idempotent: a second run changes nothing)."""
    lines = [
        "set -eu",
        f"me={q(spec.node)}; iface={q(spec.interface)}; addr={q(spec.address)}; "
        f"mtu={int(spec.mtu)}; file={q(spec.path)}",
        'fail() { echo "fabric $me $iface: $*" >&2; exit 1; }',
        "command -v ip >/dev/null || fail 'ip (iproute2) is not installed'",
        "command -v netplan >/dev/null || fail 'netplan is not installed (apt-get install "
        "netplan.io), which validates the file before it is written'",
        "command -v python3 >/dev/null || fail 'python3 is not installed (the guard of the "
        "management route needs it)'",
        '[ -e "/sys/class/net/$iface" ] || fail "no such interface on this node"',
        _GUARD,
        f"mkdir -p {NETPLAN_DIR}",
        "umask 077",
        'tmp=$(mktemp -d); trap \'rm -rf "$tmp"\' EXIT',
        f'mkdir -p "$tmp{NETPLAN_DIR}"',
        # the node's other files too: the whole configuration must be one netplan accepts
        f'for f in {NETPLAN_DIR}/*.yaml; do [ -e "$f" ] && [ "$f" != "$file" ] && '
        f'cp -p "$f" "$tmp{NETPLAN_DIR}/"; done; true',
        f'printf %s {q(netplan_yaml(spec))} > "$tmp$file"',
        'if ! netplan generate --root-dir "$tmp" >"$tmp/out" 2>&1; then',
        '  fail "the node\'s netplan rejects the configuration with the stack\'s file '
        '(nothing changed): $(grep -v WARNING "$tmp/out" | sed "s|$tmp||g" | tail -n 4 '
        '| tr \'\\n\' \' \')"',
        "fi",
        # what to restore if a step below fails
        'old_mtu=$(cat "/sys/class/net/$iface/mtu")',
        'old_addrs=$(ip -o -4 addr show dev "$iface" | awk \'{print $4}\')',
        'had_file=0; [ -f "$file" ] && { cp -p "$file" "$tmp/previous"; had_file=1; }',
        "rollback() {",
        '  echo "fabric $me $iface: $1; restoring the previous file, MTU and addresses" >&2',
        '  if [ "$had_file" = 1 ]; then cp -p "$tmp/previous" "$file"; else rm -f "$file"; fi',
        '  ip link set dev "$iface" mtu "$old_mtu" 2>/dev/null || true',
        '  for a in $(ip -o -4 addr show dev "$iface" | awk \'{print $4}\'); do',
        '    printf "%s\\n" "$old_addrs" | grep -qxF "$a" || ip addr del "$a" dev "$iface" || true',
        "  done",
        '  for a in $old_addrs; do ip addr replace "$a" dev "$iface" 2>/dev/null || true; done',
        "  exit 1",
        "}",
        'cp "$tmp$file" "$file.spark-vllm-new" && chmod 600 "$file.spark-vllm-new" '
        '&& mv -f "$file.spark-vllm-new" "$file" || rollback "cannot write $file"',
        'ip link set dev "$iface" mtu "$mtu" || rollback "cannot set MTU $mtu"',
        'ip addr replace "$addr" dev "$iface" || rollback "cannot add $addr"',
        # every other IPv4 address but a link-local one (169.254/16, the kernel's or
        # NetworkManager's own on a port it manages: removing it would only start a tug of war)
        'for a in $(ip -o -4 addr show dev "$iface" | awk \'{print $4}\'); do',
        '  case "$a" in "$addr"|169.254.*) continue;; esac',
        '  ip addr del "$a" dev "$iface" || rollback "cannot remove $a"',
        "done",
        'ip link set dev "$iface" up || rollback "cannot bring the link up"',
        '[ "$(cat "/sys/class/net/$iface/mtu")" = "$mtu" ] || rollback "the MTU did not take"',
        'echo "fabric $me $iface: $addr mtu $mtu ($file)"',
    ]
    return "\n".join(lines) + "\n"


def remove_script(spec: InterfaceSpec) -> str:
    """Remove the stack's file and address (kept when another stack's file declares it)."""
    return "\n".join([
        "set -eu",
        f"me={q(spec.node)}; iface={q(spec.interface)}; addr={q(spec.address)}; "
        f"ip4={q(spec.ip)}; file={q(spec.path)}",
        'rm -f "$file"',
        f'for f in {NETPLAN_DIR}/{FILE_PREFIX}*-"$iface".yaml; do',
        '  if [ -e "$f" ] && grep -qF "[$addr]" "$f"; then',
        '    echo "fabric $me $iface: $addr kept: $f declares it too"; exit 0',
        "  fi",
        "done",
        'if ip -o -4 addr show dev "$iface" 2>/dev/null | awk \'{print $4}\' | grep -qxF "$addr";'
        ' then ip addr del "$addr" dev "$iface"; fi',
        'echo "fabric $me $iface: $addr and $file removed"',
    ]) + "\n"
