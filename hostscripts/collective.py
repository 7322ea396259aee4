"""The collective bandwidth gate on the nodes: one rank per node in a short-lived container of
the serving image (payloads/collective_bench.py), and the check on the head that reports the
verdict and leaves its record (components/collective.py; `spark-vllm fabric test` runs the same
rank script over ssh).

The rank's container runs as the stack's GPU containers do (components/node_runtime.py): host
network (the fabric), host IPC, every GPU, the RDMA device, IPC_LOCK and unlimited memlock when
RDMA is on, and the node's NCCL environment (components/nccl.node_env) with NCCL's INFO lines on
the network (written to a file the rank reads back: the verdict names the transport NCCL chose).
The script never fails by itself: a rank that could not run says so on stdout and the verdict
decides (inspection/collective.judge: it stops the up where the gate is enforced).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hostscripts.common import image_id, label_flags, payload, q, verdict_script
from hostscripts.paths import StackNames

_BENCH_PY = payload("collective_bench.py")
FAILED = "collective rank failed:"  # the first line of a rank that could not run
# NCCL's INFO lines on init and the network (what the transport check reads), for the gate only
GATE_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def rank_request(*, rank: int, world: int, master: str, port: int, sizes: Sequence[int],
                 deadline: int, connect_timeout: int = 120) -> dict[str, Any]:
    """What one rank is asked (the payload's argv[1])."""
    return {"rank": rank, "world": world, "localRank": 0, "master": master, "port": port,
            "sizes": list(sizes), "ops": ["all_gather", "all_reduce"], "deadline": deadline,
            "connectTimeout": min(connect_timeout, deadline)}


def collective_rank(names: StackNames, image: str, env: Mapping[str, str],
                    request: Mapping[str, Any], labels: Mapping[str, str], *,
                    devices: Sequence[str] = (), cap_add: Sequence[str] = (),
                    memlock_unlimited: bool = False, nofile: int | None = None) -> str:
    """On one node: its rank of the gate, in the image `image` (an ID, as the daemon reports it).
    Prints the rank's JSON line, or `collective rank failed: exit N` and its stderr's tail; exits
    0 either way. A leftover container of an earlier gate of this stack is removed first."""
    image = image_id(image)
    name = q(names.collective)
    flags = ["--rm", f"--name {name}", "--network host", "--ipc host", "--gpus all"]
    flags += [f"--device {q(d + ':' + d)}" for d in devices]
    flags += [f"--cap-add {q(c)}" for c in cap_add]
    if memlock_unlimited:
        flags.append("--ulimit memlock=-1:-1")
    if nofile is not None:
        flags.append(f"--ulimit nofile={int(nofile)}:{int(nofile)}")
    merged = {**env, **GATE_ENV}
    flags += [f"-e {q(f'{k}={v}')}" for k, v in sorted(merged.items())]
    run = (f"docker run {' '.join(flags)} {label_flags(labels)} --entrypoint python3 {q(image)} "
           f"-c {q(_BENCH_PY)} {q(json.dumps(dict(request), sort_keys=True))}")
    return "\n".join([
        "set -u",
        f"docker rm -f {name} >/dev/null 2>&1 || true",
        'err=$(mktemp)',
        f"{run} 2>\"$err\"",
        "rc=$?",
        "if [ \"$rc\" -ne 0 ]; then",
        f"  echo \"{FAILED} exit $rc\"",
        "  tail -n 8 \"$err\" | sed 's/^/stderr: /'",
        "fi",
        "rm -f \"$err\"",
        "exit 0",
    ])


def collective_check(names: StackNames, lines: Sequence[str], problems: Sequence[str],
                     warnings: Sequence[str], record: Mapping[str, Any]) -> str:
    """On the head: the verdict (inspection/collective.judge) with its record left in the
    stack's folder first (root only), then the lines, warnings and problems; exit 1 with
    problems. Its text changes exactly when the verdict does."""
    path = names.collective_record
    folder = path.rsplit("/", 1)[0]
    text = json.dumps(dict(record), sort_keys=True)
    write = [
        "umask 077",
        f"mkdir -p {q(folder)}",
        f"printf '%s\\n' {q(text)} > {q(path + '.new')}",
        f"mv {q(path + '.new')} {q(path)}",
    ]
    verdict = verdict_script("collective gate", lines, problems, warnings).split("\n")
    return "\n".join([verdict[0], *write, *verdict[1:]])


def collective_record_remove(names: StackNames) -> str:
    """`destroy` (and a new verdict, delete before create): the record goes."""
    return f"rm -f {q(names.collective_record)}"
