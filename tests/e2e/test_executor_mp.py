"""`vllm.executor: mp` on the lab with the real vLLM: vLLM's own multi-node executor, no Ray.

One vLLM container per node (`spark-vllm-dev-serve`): the head's serves the API, the others run
`--headless` under the rank watcher (payloads/vllm_rank_watch.py). On the session's shared stack
(tests/e2e/conftest.py: converged with Ray, 2 nodes), which this module switches to mp and
leaves there for the last module. Ordered on purpose; every `up` and every recovery prints its
wall time (`WALL ...`).

The ranks of vLLM's mp executor do not find each other again by themselves; the cases here are
the ways they are brought back together: a crashed head (the headless follow its restart), a
crashed headless rank (the head's next request fails, vLLM exits, Docker restarts it, the
headless follow), a headless rank stopped by hand (`up --refresh` restarts every rank).

Marked `long` (make test-all only; docs/testing.md says why): a second no-op up (each recovery
here ends with one), a serve flag change (test_lab_stack proves it with Ray; the mp argv is the
unit tier's), the switch back to Ray and to mp again and a third node (make bench's change
table measures both switches; the 3-node argv is the unit tier's).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from lab.deployments import LAB_CACHE, complete, lab, set_nodes

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER, NEW = "spark-1", "spark-2", "spark-3"
SERVE = "spark-vllm-dev-serve"
GATEWAY = "spark-vllm-dev-gateway"  # issue 30: the stack's only listener beyond a node, on the head


@pytest.fixture(scope="module")
def mp(stack):
    stack.set("vllm.executor", "mp")
    # two serve keys the promotion round trip (the next module) must carry from a verified dev:
    # set with the switch, they cost no vLLM restart of their own
    stack.set("vllm.reasoningParser", "granite")
    stack.set("vllm.maxNumBatchedTokens", 2048)
    return stack


def _up(d, what: str):
    t0 = time.monotonic()
    r = d.run("up")
    print(f"WALL mp {what}: {time.monotonic() - t0:.1f} s")
    assert r.summary.result == "succeeded"
    return d.ops()


def _argv(d, node: str) -> list[str]:
    return json.loads(d.ssh(node, f"docker inspect -f '{{{{json .Config.Cmd}}}}' {SERVE}"))


def _running(d, nodes) -> dict[str, set[str]]:
    return {n: set(d.containers(n)) for n in nodes}


# What the rendezvous guard of issue 31 (iptables) left on the head: the chain and its jump,
# as hostscripts/firewall.py made them before the nodes' firewall (issue 45) replaced it; its
# apply removes what is left of it
OLD_CHAIN = "SVLLM-MP-" + hashlib.sha256(b"dev").hexdigest()[:12]
OLD_GUARD = "; ".join(
    f"{ipt} -w -N {OLD_CHAIN}; {ipt} -w -A {OLD_CHAIN} -i lo -j RETURN; "
    f"{ipt} -w -A {OLD_CHAIN} -j DROP; {ipt} -w -I INPUT -p tcp --dport 29501 -j {OLD_CHAIN}"
    for ipt in ("iptables", "ip6tables"))


def test_mp_switch_from_ray_serves_and_moves_no_image_or_model(mp):
    d = mp
    d.ssh(HEAD, OLD_GUARD)  # as an upgrade from the iptables guard finds the head
    ops = _up(d, "executor ray -> mp")
    assert {"vllm-serve", f"vllm-serve-{WORKER}", "vllm-health"} <= set(ops), ops
    assert ops["vllm-serve"] == "replace" and ops[f"vllm-serve-{WORKER}"] == "create", ops
    assert all(v == "delete" for k, v in ops.items() if k.startswith("ray")), ops
    assert not [k for k in ops if k.startswith(("image", "model"))], ops
    # nothing of Ray's on either node: one vLLM container each
    assert _running(d, (HEAD, WORKER)) == {HEAD: {SERVE, GATEWAY}, WORKER: {SERVE}}
    head, worker = _argv(d, HEAD), _argv(d, WORKER)
    assert head[head.index("--distributed-executor-backend") + 1] == "mp"
    assert head[head.index("--node-rank") + 1] == "0" and "--headless" not in head
    assert worker[worker.index("--node-rank") + 1] == "1" and "--headless" in worker
    assert complete(d)
    # issue 31: the rendezvous (torch's TCPStore on the head's master port, every address) is
    # reached over the fabric and not from the management network: the head's table gained
    # its rule (an update of both nodes' tables: Ray's ports went), and the old guard is gone
    assert ops.get("firewall-spark-1-table") == ops.get("firewall-spark-2-table") == "update", ops
    for ipt in ("iptables", "ip6tables"):
        assert OLD_CHAIN not in d.ssh(HEAD, f"{ipt} -w -S"), ipt
    port = head[head.index("--master-port") + 1]
    probe = ("python3 -c 'import socket,sys\ntry:\n socket.create_connection((sys.argv[1], "
             "int(sys.argv[2])), 3).close(); print(\"reached\")\nexcept OSError as e: "
             "print(\"blocked\", e)' ")
    fabric_ip, mgmt_ip = head[head.index("--master-addr") + 1], d.cfg["nodes"][0]["host"]
    assert d.ssh(WORKER, probe + f"{fabric_ip} {port}").startswith("reached")
    assert d.ssh(WORKER, probe + f"{mgmt_ip} {port}").startswith("blocked")


def test_mp_ranks_keep_their_shared_memory_in_their_container(mp):
    """Issue 46, item 3, with mp: every rank of a node in one container with its own IPC
    namespace and /dev/shm (never the node's): vLLM's psm_* segments are there, none in the
    node's /dev/shm, and TP=2 serves."""
    d = mp
    assert complete(d)
    for node in (HEAD, WORKER):
        mode = d.ssh(node, f"docker inspect -f '{{{{.HostConfig.IpcMode}}}}' {SERVE}").strip()
        assert mode == "private", (node, mode)
        inside = set(d.ssh(node, f"docker exec {SERVE} ls /dev/shm").split())
        psm = {n for n in inside if n.startswith("psm_")}
        on_node = set(d.ssh(node, "ls /dev/shm").split())
        print(f"[observed] {node}: {len(psm)} psm_* segments in {SERVE}, "
              f"{len(psm & on_node)} of them in the node's /dev/shm")
        assert not psm & on_node
        if node == HEAD:
            assert psm, f"vLLM made no psm_* segment in its /dev/shm: {sorted(inside)}"


@pytest.mark.long
def test_mp_second_up_changes_nothing(mp):
    d = mp
    snap = d.snapshot()
    d.run("preview", expect_no_changes=True)
    ops = _up(d, "no-op")
    assert ops == {}, ops
    assert d.snapshot() == snap, "a no-op up restarted something"


@pytest.mark.long
def test_mp_serve_flag_replaces_only_the_vllm_containers(mp):
    d = mp
    before = d.snapshot()
    d.set("vllm.maxNumSeqs", 6)
    ops = _up(d, "serve flag")
    assert ops.get("vllm-serve") == "replace" and ops.get(f"vllm-serve-{WORKER}") == "replace", ops
    # vLLM's steps, and the gateway's gate, which runs again for a new vLLM behind it
    assert all(k.startswith("vllm") or k == "gateway-health" for k in ops), ops
    after = d.snapshot()
    assert all(after[n][SERVE][0] != before[n][SERVE][0] for n in (HEAD, WORKER))
    assert _argv(d, WORKER)[_argv(d, WORKER).index("--max-num-seqs") + 1] == "6"
    assert complete(d)


def _started(d, nodes) -> dict[str, str]:
    return {n: d.containers(n)[SERVE][1] for n in nodes}


def _serves_again(d, what: str, t0: float, before: dict[str, str], nodes) -> None:
    """Poll (no `up`) until every node's vLLM started again and a completion answers, within
    the stack's health timeout from the fault at t0. Requests that fail on the way (a head
    that still holds a dead rank) are counted and printed."""
    timeout = int(d.stack.get_config("spark-vllm:health.timeoutSeconds", path=True).value)
    failed, last = 0, None
    while time.monotonic() < t0 + timeout:
        try:
            now = _started(d, nodes)
        except (AssertionError, KeyError) as e:  # a container between its runs
            last, now = e, {}
        if now and all(now[n] != before[n] for n in nodes):
            try:
                if complete(d, f"Say hello after {what}"):
                    print(f"WALL mp {what} -> serving again: {time.monotonic() - t0:.1f} s "
                          f"({failed} failed requests on the way)", flush=True)
                    return
            except Exception as e:  # not yet: the ranks are still meeting
                failed, last = failed + 1, e
        else:
            try:  # the request that makes a head with a dead rank notice it
                complete(d, "are you there")
            except Exception as e:
                failed, last = failed + 1, e
        time.sleep(3)
    logs = "\n".join(f"--- {n} ---\n" + d.ssh(n, f"docker logs --tail 30 {SERVE} 2>&1",
                                                  check=False) for n in nodes)
    pytest.fail(f"mp {what}: not serving {timeout} s after the fault; last: {last!r}\n{logs}")


def _quiet(d, what: str) -> None:
    """After a recovery with no `up`: no drift, nothing planned, nothing restarted."""
    r = d.run("refresh")
    assert set(r.summary.resource_changes or {}) <= {"same"}, r.summary.resource_changes
    d.run("preview", expect_no_changes=True)
    snap = d.snapshot()
    assert _up(d, f"no-op after {what}") == {}
    assert d.snapshot() == snap


# the head's rank: long (docs/testing.md "Only in make test-all"); the worker's, the headless
# rank a crash must bring back without the head, in make test
@pytest.mark.parametrize("node", [pytest.param(HEAD, marks=pytest.mark.long), WORKER])
def test_mp_a_crashed_rank_serves_again_by_itself(mp, node):
    """kill -9 of a vLLM container's main process (a crash, restarted by Docker's policy)."""
    d = mp
    what = f"{'head' if node == HEAD else 'headless'} crash"
    before = _started(d, (HEAD, WORKER))
    t0 = time.monotonic()
    done = lab("crash", node, SERVE, check=False, timeout=600)
    assert done.returncode == 0, done.stderr
    _serves_again(d, what, t0, before, (HEAD, WORKER))
    _quiet(d, what)


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_mp_a_headless_rank_stopped_by_hand_comes_back_with_up_refresh(mp):
    """`docker stop` is a manual stop: Docker leaves it. recon's reason restarts every rank."""
    d = mp
    d.ssh(WORKER, f"docker stop {SERVE}")
    t0 = time.monotonic()
    r = d.run("up", refresh=True)
    print(f"WALL mp up --refresh after a headless stop: {time.monotonic() - t0:.1f} s")
    assert r.summary.result == "succeeded"
    ops = {k: v for k, v in d.ops().items() if v != "refresh"}  # --refresh reads every resource
    assert ops.get("vllm-ranks-restart") == "update" and ops.get("vllm-health") == "replace", ops
    # vLLM's steps, and the gateway's gate, which runs again for a new vLLM behind it
    assert all(k.startswith("vllm") or k == "gateway-health" for k in ops), ops
    assert complete(d)
    d.run("preview", expect_no_changes=True)
    assert _up(d, "no-op after up --refresh") == {}


@pytest.mark.long
def test_mp_switch_to_ray_and_back_moves_no_image_or_model(mp):
    d = mp
    for executor, gone, come in (("ray", {SERVE}, {"spark-vllm-dev-ray-worker"}),
                                 ("mp", {"spark-vllm-dev-ray-worker"}, {SERVE})):
        d.set("vllm.executor", executor)
        ops = _up(d, f"executor -> {executor}")
        assert not [k for k in ops if k.startswith(("image", "model"))], ops
        assert ops.get("vllm-serve") == "replace", ops
        assert set(d.containers(WORKER)) == come, d.containers(WORKER)
        assert not gone & set(d.containers(WORKER))
        assert complete(d)


@pytest.mark.long
def test_mp_on_three_nodes(mp):
    """A third node joins as rank 2 (headless); every rank's --nnodes changes, so every vLLM
    container is replaced; then a no-op and the way back to 2 nodes."""
    d = mp
    lab("up", "--nodes", "3")
    try:
        lab3 = json.loads((Path(LAB_CACHE) / "stack.json").read_text())["nodes"][:3]
        set_nodes(d, lab3)
        ops = _up(d, "add a third node")
        assert {"vllm-serve", f"vllm-serve-{WORKER}", f"vllm-serve-{NEW}"} <= set(ops), ops
        third = _argv(d, NEW)
        assert third[third.index("--node-rank") + 1] == "2" and "--headless" in third
        assert third[third.index("--nnodes") + 1] == "3"
        assert complete(d)
        d.run("preview", expect_no_changes=True)
        set_nodes(d, lab3[:2])
        _up(d, "back to 2 nodes")
        assert d.containers(NEW) == {}, "the third node's vLLM is left"
        assert complete(d)
    finally:
        lab("up", "--nodes", os.environ.get("E2E_NODES", "2"))
