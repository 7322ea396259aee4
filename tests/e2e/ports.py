"""What answers where on the lab's nodes (issue 45), for the modules that scan them.

- `scan(host, ports)`: a TCP connect scan from the lab host (the machine, on the management
  bridge): the ports that accept a connection;
- `listeners(d, node)`: what listens on a node (`ss -Hltnp`): address, port, process;
- `from_outsider(targets)`: connections from the lab's outsider (netns svl-outsider, .250 on
  each fabric bridge: a host on the fabric subnets that is no node, lab/net.ensure_outsider),
  each `reached` or `blocked`;
- `outsider_finds(d, nodes)`: every socket listening on a node, tried from the outsider at each
  of the node's fabric addresses it listens on: the ones that answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import subprocess
import sys
from typing import NamedTuple

OUTSIDER_NS = "svl-outsider"  # lab/layout.OUTSIDER_NS


async def _scan(host: str, ports: range, limit: int, timeout: float) -> list[int]:
    gate = asyncio.Semaphore(limit)
    found: list[int] = []

    async def one(port: int) -> None:
        async with gate:
            try:
                _, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            except (TimeoutError, OSError):
                return
            found.append(port)
            w.close()

    await asyncio.gather(*(one(p) for p in ports))
    return sorted(found)


def scan(host: str, ports: range = range(1, 65536), limit: int = 4000,
         timeout: float = 1.0) -> list[int]:
    """The ports of `host` that accept a TCP connection from the lab host (a dropped SYN costs
    `timeout`; `limit` of them at once, as many as this process may open files allows). On the
    lab's bridge a node's kernel answers a SYN in well under a millisecond (a refused port at
    once), so a second is ample for one to answer; 512 at 1.5 s made a scan of every port of a
    node whose firewall drops cost ~90 s, 4000 at 1 s ~17 s."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limit + 256  # the connections and what the process holds besides
    if soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return asyncio.run(_scan(host, ports, max(1, min(limit, soft - 256)), timeout))


def scan_expecting(host: str, expected: list[int]) -> list[int]:
    """`scan` of every port of `host`, each expected port it missed tried once more alone with
    a longer timeout (a connect scan on the lab's two shared cores can miss one under load: seen
    once with sshd): the ports that answer, sorted."""
    found = set(scan(host))
    for port in set(expected) - found:
        found |= set(scan(host, range(port, port + 1), timeout=10))
    return sorted(found)


class Listener(NamedTuple):
    address: str  # as ss prints it, brackets removed: *, 0.0.0.0, ::, 10.77.0.11, ...
    port: int
    process: str


def listeners(d, node: str) -> list[Listener]:
    out = []
    for line in d.ssh(node, "ss -Hltnp").splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        addr, _, port = cols[3].rpartition(":")
        proc = re.search(r'users:\(\("([^"]*)"', line)
        out.append(Listener(addr.strip("[]").removeprefix("::ffff:"), int(port),
                            proc.group(1) if proc else "?"))
    return out


CONNECT = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def one(t):
    host, port = t
    s = socket.socket()
    s.settimeout(2.0)
    try:
        s.connect((host, port))
        return "reached"
    except OSError:
        return "blocked"
    finally:
        s.close()
todo = json.loads(sys.argv[1])
with ThreadPoolExecutor(128) as pool:
    print(json.dumps(list(pool.map(one, [tuple(t) for t in todo]))))
"""


def from_outsider(targets: list[tuple[str, int]]) -> list[str]:
    """Each (address, port) tried from the outsider at once: `reached` or `blocked` (2 s)."""
    if not targets:
        return []
    done = subprocess.run(["ip", "netns", "exec", OUTSIDER_NS, sys.executable, "-c", CONNECT,
                           json.dumps(targets)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def outsider_finds(d, nodes: list[dict]) -> dict[str, list[tuple[str, int, str]]]:
    """Per node: the (fabric address, port, process) of its listening sockets the outsider
    reaches. A socket on every address (`*`, 0.0.0.0, ::) is tried at each of the node's
    fabric addresses, one on a fabric address there; loopback and management ones are not the
    fabric's."""
    found: dict[str, list[tuple[str, int, str]]] = {}
    for n in nodes:
        fabric = [f["ip"] for f in n["fabric"]]
        todo = []
        for ln in listeners(d, n["name"]):
            at = fabric if ln.address in ("*", "0.0.0.0", "::") else (
                [ln.address] if ln.address in fabric else [])
            todo += [(a, ln.port, ln.process) for a in at]
        todo = sorted(set(todo))
        results = from_outsider([(a, p) for a, p, _ in todo])
        found[n["name"]] = [t for t, r in zip(todo, results, strict=True) if r == "reached"]
    return found
