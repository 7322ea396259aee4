"""The node's firewall on the lab (issue 45), on the session's shared stack (Ray, 2 nodes).

In order:
1. the operator's own services on a node keep answering with the firewall on: a container the
   stack does not own, on the worker's host network, answers on the management address and on
   the fabric (to the lab's outsider too), and one whose port Docker publishes in the kernel's
   ephemeral range answers the management network; the stack's own ports there do not, and
   `spark-vllm status` counts what its rules dropped;
2. a table edited by hand (a rule added on the worker) shows in the preview as that node's
   table replaced, with why, and nothing else; the `up` puts it back;
3. the head's table deleted by hand: a vLLM started again by hand (`docker restart`) refuses to
   start (its launcher's probe finds no table), the preview shows the head's table replaced
   with why, and the `up` loads it: vLLM serves again, a second preview wants nothing.

Where the scans of what answers are: test_lab_stack (Ray) and test_gateway (mp, a service);
the reboot of the head: test_self_healing; the old rendezvous guard removed: test_executor_mp.
"""

from __future__ import annotations

import time

import pytest

from lab.deployments import complete
from tests.e2e.ports import from_outsider, scan

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
SERVE = "spark-vllm-dev-serve"
TABLE = "spark-vllm-dev"
OPERATOR = "operator-service"  # a container the stack does not own
OPERATOR_PORT = 18999
PUBLISHED = "operator-published"  # another, its port published by Docker in the ephemeral range
PUBLISHED_PORT = 45999
REFUSED = "firewall is not loaded on this node"


def _preview_ops(d) -> dict[str, str]:
    d.run("preview")
    return d.ops()


def _logged(d, text: str) -> bool:
    return any(text in str(getattr(getattr(e, "diagnostic_event", None), "message", ""))
               for e in d.events)


def test_the_operators_own_services_keep_answering(stack, lab_cfg):
    d = stack
    worker = next(n for n in lab_cfg["nodes"] if n["name"] == WORKER)
    image = d.stack.outputs()["imageIds"].value[WORKER]
    d.ssh(WORKER, f"docker rm -f {OPERATOR} {PUBLISHED} >/dev/null 2>&1; "
                  f"docker run -d --name {OPERATOR} --network host --entrypoint python3 {image} "
                  f"-m http.server {OPERATOR_PORT} >/dev/null && "
                  f"docker run -d --name {PUBLISHED} -p {PUBLISHED_PORT}:8000 "
                  f"--entrypoint python3 {image} -m http.server 8000 >/dev/null")
    try:
        reach = (f"python3 -c 'import socket,sys\nfor h in sys.argv[1:]:\n socket."
                 f"create_connection((h, {OPERATOR_PORT}), 3).close()\nprint(\"ok\")' ")
        deadline = time.monotonic() + 60
        while "ok" not in d.ssh(WORKER, reach + "127.0.0.1", check=False):
            assert time.monotonic() < deadline, "the operator's service did not start"
            time.sleep(1)
        # from the lab host on the management network, from the head, from the outsider
        assert scan(worker["host"], range(OPERATOR_PORT, OPERATOR_PORT + 1)) == [OPERATOR_PORT]
        # a port Docker publishes in the ephemeral range (DNAT: the forward hook, not the
        # table's input chain) answers the management network too
        deadline = time.monotonic() + 60
        while scan(worker["host"], range(PUBLISHED_PORT, PUBLISHED_PORT + 1)) != [PUBLISHED_PORT]:
            assert time.monotonic() < deadline, "the published operator service does not answer"
            time.sleep(1)
        assert d.ssh(HEAD, reach + " ".join(f["ip"] for f in worker["fabric"])).strip() == "ok"
        fabric = [(f["ip"], OPERATOR_PORT) for f in worker["fabric"]]
        assert from_outsider(fabric) == ["reached", "reached"], fabric
        # while the stack's own ports on the same addresses answer neither
        assert from_outsider([(f["ip"], 20000) for f in worker["fabric"]]) == \
            ["blocked", "blocked"]
        assert scan(worker["host"], range(20000, 20001)) == []
        # what `spark-vllm status` shows: each rule's drops, those just made among them
        _, st = d.status()
        dropped = st["nodes"][WORKER]["dropped"]
        print(f"[observed] spark-vllm status: {WORKER} dropped {dropped}")
        assert dropped["ray"] >= 3 and set(dropped) >= {"ray", "data-plane", "seeders"}, dropped
    finally:
        d.ssh(WORKER, f"docker rm -f {OPERATOR} {PUBLISHED} >/dev/null 2>&1", check=False)


def test_a_table_edited_by_hand_is_put_back_touching_nothing_else(stack):
    d = stack
    d.ssh(WORKER, f"nft insert rule inet {TABLE} input tcp dport 20000 accept")
    ops = _preview_ops(d)
    assert ops == {f"firewall-{WORKER}-table": "replace"}, ops
    assert _logged(d, f"firewall {WORKER}: not as the stack loaded it: table inet {TABLE} was "
                      "changed by hand"), [str(e) for e in d.events][-5:]
    ops = d.timed_up("firewall: a table edited by hand")
    assert ops == {f"firewall-{WORKER}-table": "replace"}, ops
    assert "dport 20000 accept" not in d.ssh(WORKER, f"nft list table inet {TABLE}")
    d.run("preview", expect_no_changes=True)


def test_a_table_deleted_by_hand_keeps_vllm_from_starting_until_the_up_loads_it(stack):
    d = stack
    d.ssh(HEAD, f"nft delete table inet {TABLE}")
    t0 = time.time()
    d.ssh(HEAD, f"docker restart -t 60 {SERVE} >/dev/null")  # an operator's manual start
    deadline = time.monotonic() + 90
    while REFUSED not in d.ssh(HEAD, f"docker logs --since {int(t0)} {SERVE} 2>&1"):
        assert time.monotonic() < deadline, "vLLM's launcher did not refuse without the table"
        time.sleep(2)
    refused = [ln for ln in d.ssh(HEAD, f"docker logs --since {int(t0)} {SERVE} 2>&1")
               .splitlines() if REFUSED in ln]
    print(f"[observed] {refused[0]}")
    assert "answered ECONNREFUSED" in refused[0], refused[0]
    # the head's table; vLLM's and the gateway's gates when recon caught vLLM's container
    # between two starts (not running), with the deployment the gate verified (issue 49) and
    # the NCCL log check that follows the gate (seen on the lab); nothing else
    allowed = {f"firewall-{HEAD}-table", "vllm-health", "gateway-health", "vllm-nccl-log",
               *(f"vllm-deployment-{n}" for n in (HEAD, "spark-2"))}
    ops = _preview_ops(d)
    assert ops.get(f"firewall-{HEAD}-table") == "replace" and set(ops) <= allowed, ops
    assert _logged(d, f"firewall {HEAD}: not as the stack loaded it: table inet {TABLE} is not "
                      "loaded"), [str(e) for e in d.events][-5:]
    ops = d.timed_up("firewall: the head's table deleted by hand")
    assert ops.get(f"firewall-{HEAD}-table") == "replace" and set(ops) <= allowed, ops
    assert f"table inet {TABLE}" in d.ssh(HEAD, "nft list tables")
    # Docker starts vLLM again after the watchdog's backoff (health.liveness): it serves
    deadline, last = time.monotonic() + 600, None
    while time.monotonic() < deadline:
        try:
            if complete(d, "Say hello after the firewall came back"):
                break
        except Exception as e:  # still starting
            last = e
        time.sleep(3)
    else:
        pytest.fail(f"vLLM does not serve 600 s after the table came back: {last!r}")
    print(f"[observed] serving {time.time() - t0:.0f} s after the manual restart")
    d.run("preview", expect_no_changes=True)
