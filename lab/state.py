"""What the lab records and exports: lab.json (its size and image), stack.json and known_hosts.

lab.json lives in the lab state (removed by `down`); stack.json and known_hosts live in the
cache, where Pulumi.dev.yaml (`ssh.knownHostsFile`) and the tests find them.
"""

from __future__ import annotations

import json
import os

from lab import hub
from lab.deb_images import DEB_IMAGES
from lab.layout import (
    FAB_MTU,
    FABRIC,
    HF_ENDPOINT,
    HF_REPO,
    HF_REPOS,
    IMAGE_REPO,
    KNOWN_HOSTS,
    LAB,
    LAB_KEY,
    REGISTRY,
    STACK_JSON,
    STACK_TAG,
    fab_ip,
    host_key_path,
    mgmt_ip,
    node_name,
)
from lab.util import die, write

LAB_JSON = os.path.join(LAB, "lab.json")


def state() -> dict:
    try:
        with open(LAB_JSON) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return {}


def save_state(st: dict) -> None:
    write(LAB_JSON, json.dumps(st, indent=1))


def host_key(name: str) -> str:
    """A node's public host key as `type base64` (what stack.json and known_hosts pin)."""
    with open(host_key_path(name) + ".pub") as f:
        pub = f.read().split()
    return f"{pub[0]} {pub[1]}"


def stack_config() -> dict:
    st = state()
    if not st.get("nodes"):
        die("the lab is not up (run: python3 lab/lab.py up)")
    nodes = []
    for i in range(1, st["nodes"] + 1):
        name = node_name(i)
        nodes.append({"name": name, "host": mgmt_ip(i), "port": 22, "user": "root",
                      "hostKey": host_key(name),
                      "fabric": [{"interface": nif, "ip": fab_ip(pfx, i), "hca": hca}
                                 for _br, nif, pfx, hca in FABRIC]})
    return {"nodes": nodes, "sshKeyPath": LAB_KEY, "knownHostsFile": KNOWN_HOSTS,
            "image": {"ref": st.get("image"), "tag": f"{REGISTRY}/{IMAGE_REPO}:{STACK_TAG}",
                      "source": "registry"},
            # gatewayImage, prometheusImage, nodeExporterImage, alertmanagerImage
            **{field: {"ref": st.get(field), "tag": f"{REGISTRY}/{img.repo}:{STACK_TAG}"}
               for field, img in DEB_IMAGES.items()},
            "registry": REGISTRY, "hfEndpoint": HF_ENDPOINT,
            "model": {"repo": HF_REPO, "commits": hub.commits()},
            "models": {r: {"commits": hub.commits(r)} for r in HF_REPOS},
            "fabricSubnets": [f"{pfx}.0/24" for _b, _n, pfx, _h in FABRIC], "mtu": FAB_MTU,
            "rdma": False}


def write_stack_json() -> dict:
    """Write stack.json for the live lab and return it."""
    cfg = stack_config()
    write(STACK_JSON, json.dumps(cfg, indent=1))
    return cfg


def write_known_hosts() -> None:
    """The nodes' host keys in OpenSSH form: what Pulumi.dev.yaml pins (ssh.knownHostsFile)."""
    n = state().get("nodes") or 0
    write(KNOWN_HOSTS, "".join(f"{mgmt_ip(j)} {host_key(node_name(j))}\n"
                               for j in range(1, n + 1)))
