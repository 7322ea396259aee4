"""The lab's network: host bridges, veth pairs into each node's netns, iptables FORWARD rules.

Management: bridge svl-mgmt (10.77.0.1/24 on the host), node end enP7s7. Fabric: bridges
svl-fab1 / svl-fab2 (no host address, MTU 9000), node ends named like a Spark's ConnectX-7 ports,
left unconfigured (no address, MTU 1500) for the stack to configure.
"""

from __future__ import annotations

from lab.layout import (
    FAB_MTU,
    FABRIC,
    MGMT_BR,
    MGMT_IF,
    MGMT_IP,
    OUTSIDER_IFS,
    OUTSIDER_NS,
    mgmt_ip,
    netns,
    outsider_ip,
)
from lab.util import ok, out, run

BRIDGES = [MGMT_BR] + [f[0] for f in FABRIC]


def link_exists(name: str, ns: str | None = None) -> bool:
    cmd = ["ip"] + (["-n", ns] if ns else []) + ["link", "show", name]
    return ok(cmd)


def netns_exists(ns: str) -> bool:
    return ns in out(["ip", "netns", "list"], check=False).split()


def ensure_bridge(name: str, mtu: int, addr: str | None) -> None:
    if not link_exists(name):
        run(["ip", "link", "add", name, "type", "bridge"])
    run(["ip", "link", "set", name, "mtu", str(mtu)])
    if addr and addr.split("/")[0] not in out(["ip", "-o", "addr", "show", "dev", name]):
        run(["ip", "addr", "add", addr, "dev", name])
    run(["ip", "link", "set", name, "up"])


def ensure_veth(host_if: str, bridge: str, ns: str, node_if: str, mtu: int, addr: str | None,
                mac: str | None = None, node_mtu: int | None = None) -> None:
    """A veth from `bridge` into node `ns` as `node_if`. `mtu`: the host end's (the "switch
    port"); `node_mtu`, `addr`: the node end's, set when the link is made (None: the kernel's
    MTU, no address: a fabric port nobody configured yet; the stack configures it, and a later
    `up` of the lab never undoes what the stack set)."""
    made = False
    if not link_exists(node_if, ns):
        if link_exists(host_if):
            run(["ip", "link", "del", host_if])
        run(["ip", "link", "add", host_if, "mtu", str(mtu), "type", "veth",
             "peer", "name", "svltmp0", "mtu", str(node_mtu or 1500)])
        run(["ip", "link", "set", "svltmp0", "netns", ns])
        run(["ip", "-n", ns, "link", "set", "svltmp0", "name", node_if])
        made = True
    run(["ip", "link", "set", host_if, "master", bridge, "mtu", str(mtu), "up"])
    if mac:  # stable across re-creation, so peers' neighbour caches stay valid after a recovery
        run(["ip", "-n", ns, "link", "set", node_if, "address", mac])
    if made and node_mtu:
        run(["ip", "-n", ns, "link", "set", node_if, "mtu", str(node_mtu)])
    run(["ip", "-n", ns, "link", "set", node_if, "up"])
    if addr and addr.split("/")[0] not in out(["ip", "-n", ns, "-o", "addr", "show", "dev",
                                                node_if]):
        run(["ip", "-n", ns, "addr", "add", addr, "dev", node_if])


def host_ifs(i: int) -> dict:
    """Host ends of node i's veths, keyed by "mgmt" and the fabric bridge names."""
    return {"mgmt": f"svm-s{i}", "svl-fab1": f"svf1-s{i}", "svl-fab2": f"svf2-s{i}"}


def ensure_host_net() -> None:
    ensure_bridge(MGMT_BR, 1500, f"{MGMT_IP}/24")
    for br, _if, _pfx, _hca in FABRIC:
        ensure_bridge(br, FAB_MTU, None)
    # lab bridges must forward even if br_netfilter + a restrictive FORWARD policy exist
    if ok(["iptables", "-S", "FORWARD"]):
        for br in BRIDGES:
            rule = ["FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"]
            if not ok(["iptables", "-C", *rule]):
                run(["iptables", "-I", *rule])


def remove_host_net() -> None:
    """Drop the FORWARD rules and the bridges ensure_host_net made (safe when already gone)."""
    for br in BRIDGES:
        if ok(["iptables", "-S", "FORWARD"]):
            while ok(["iptables", "-C", "FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"]):
                run(["iptables", "-D", "FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"],
                    check=False)
        if link_exists(br):
            run(["ip", "link", "del", br], check=False)


def ensure_ns_net(name: str, i: int, with_fabric: bool = True, ip: str | None = None) -> None:
    """Node i's netns with its management veth (and fabric veths), addresses, default route.
    i == 0 is the build host: management only, host end svm-build."""
    ns = netns(name)
    if ns not in out(["ip", "netns", "list"]).split():
        run(["ip", "netns", "add", ns])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    hifs = host_ifs(i) if i > 0 else {"mgmt": "svm-build"}
    # MACs follow the Spark pattern: enP7s7 = base, enp1s0f1np1 = base+2, enP2p1s0f1np1 = base+6
    base = f"02:5b:00:00:{i:02x}:"
    ensure_veth(hifs["mgmt"], MGMT_BR, ns, MGMT_IF, 1500, f"{ip or mgmt_ip(i)}/24", base + "00",
                node_mtu=1500)
    if with_fabric:
        # the ConnectX-7 ports as a fresh Spark has them: no address, the default MTU (the
        # stack's fabric.manage configures them, components/fabric.py); the bridge ("switch")
        # carries jumbo frames
        for (br, nif, _pfx, _hca), off in zip(FABRIC, ("02", "06"), strict=True):
            ensure_veth(hifs[br], br, ns, nif, FAB_MTU, None, base + off)
    if "default" not in out(["ip", "-n", ns, "route", "show", "default"]):
        run(["ip", "-n", ns, "route", "add", "default", "via", MGMT_IP])


def remove_ns_net(name: str, i: int) -> None:
    ns = netns(name)
    if netns_exists(ns):
        run(["ip", "netns", "del", ns], check=False)
    hifs = list(host_ifs(i).values()) if i > 0 else ["svm-build"]
    for h in hifs:
        if link_exists(h):
            run(["ip", "link", "del", h], check=False)


def set_fabric_carrier(i: int, up: bool) -> None:
    """Cut or restore node i's fabric: the host ends go down, so the node's own interfaces stay
    admin-up but lose carrier, as when the QSFP cable is pulled (one cable carries both twins)."""
    for br, _nif, _p, _h in FABRIC:
        run(["ip", "link", "set", host_ifs(i)[br], "up" if up else "down"])


def ensure_outsider() -> None:
    """A host on the fabric that is no node (issue 45): netns OUTSIDER_NS with a leg on each
    fabric bridge at .250 of its /24 (no route elsewhere, no service). The tests scan the
    nodes' fabric addresses from here: no stack port may answer it."""
    if OUTSIDER_NS not in out(["ip", "netns", "list"]).split():
        run(["ip", "netns", "add", OUTSIDER_NS])
    run(["ip", "-n", OUTSIDER_NS, "link", "set", "lo", "up"])
    for (br, _nif, pfx, _hca), host_if, i in zip(FABRIC, OUTSIDER_IFS, (1, 2), strict=True):
        ensure_veth(host_if, br, OUTSIDER_NS, f"fab{i}", FAB_MTU, f"{outsider_ip(pfx)}/24",
                    node_mtu=FAB_MTU)


def remove_outsider() -> None:
    if netns_exists(OUTSIDER_NS):
        run(["ip", "netns", "del", OUTSIDER_NS], check=False)
    for h in OUTSIDER_IFS:
        if link_exists(h):
            run(["ip", "link", "del", h], check=False)
