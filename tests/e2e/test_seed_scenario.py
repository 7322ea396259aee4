"""Issue 6 on the lab's seed scenario: foreign containers on the head, through the real engine.

`lab.py seed` makes spark-1 look like the reference machine: vllm_node, reranker and
vllm_embeddings running from a locally built `vllm-node` image, holding memory, and a partly
filled HF cache. On the session's shared stack (tests/e2e/conftest.py: converged; the last module
to use it, so its destroy is the stack's last step). Ordered on purpose:

  (a) default `preflight.foreignContainers: fail`: preview fails naming each container and the
      memory it holds, and nothing changed on the hosts;
  (b) `stop`: preview plans one stop per container, up stops them and serves; a second preview
      keeps the stops (the stopped containers are no longer running, yet stay in the plan);
  (c) destroy starts them again, removes every container of the stack and keeps the model
      cache on every node.

The seeded containers are removed at the end of the module, pass or fail, so later modules see
the lab as before.
"""

from __future__ import annotations

import re
import time

import pulumi.automation as auto
import pytest

from lab.deployments import complete, lab

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
FOREIGN = ("vllm_node", "reranker", "vllm_embeddings")
# lab/seed.py: the memory each seeded container holds (MiB)
SEEDED_MIB = {"vllm_node": 256, "reranker": 64, "vllm_embeddings": 96}


@pytest.fixture(scope="module")
def seeded(stack, shared):
    """The shared stack, after `lab.py seed`; the seeded containers are removed afterwards."""
    t0 = time.monotonic()
    lab("seed")
    print(f"lab seed: {time.monotonic() - t0:.1f} s")
    yield stack
    # Before the seeded containers go: the stack is destroyed first (done by test c when it
    # ran), so a stop command's delete still finds its container to start again.
    try:
        if not shared.destroyed:
            shared.destroyed = True
            stack.run("destroy")
    finally:
        r = lab("ssh", HEAD, "sh", "-c", f"docker rm -f {' '.join(FOREIGN)}; "
                f"cd /var/lib/spark-vllm/stopped 2>/dev/null && rm -f {' '.join(FOREIGN)}",
                check=False)
        print(f"removed seeded containers: rc={r.returncode} {r.stderr.strip()}")


def _state(d, node: str = HEAD) -> dict[str, str]:
    """name -> docker state (running, exited, ...) of the seeded containers on a node."""
    out = d.ssh(node, "docker ps -a --format '{{.Names}} {{.State}}'")
    rows = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
    return {n: rows.get(n, "absent").strip() for n in FOREIGN}


def test_default_preview_fails_naming_foreign_containers_and_memory(seeded):
    d = seeded
    assert _state(d) == {n: "running" for n in FOREIGN}
    before = d.snapshot()
    t0 = time.monotonic()
    with pytest.raises(auto.CommandError) as exc:
        d.run("preview")
    print(f"failing preview: {time.monotonic() - t0:.1f} s")
    text = str(exc.value)
    assert "preflight failed" in text and "nothing was changed" in text, text[-2000:]
    for name in FOREIGN:
        line = next((ln for ln in text.splitlines() if f"foreign container {name} " in ln), None)
        assert line is not None, f"{name} not named:\n{text[-2000:]}"
        assert line.lstrip(" -").startswith(f"{HEAD}: "), line
        # "holds 262 MiB": at least what seed.py allocated (docker stats adds the interpreter)
        m = re.search(r"holds ([\d.]+) (MiB|GiB)", line)
        assert m, line
        mib = float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)
        assert mib >= SEEDED_MIB[name], line
        assert "foreignContainers: stop" in line, line  # the fix is named too
    # nothing changed on the hosts
    assert _state(d) == {n: "running" for n in FOREIGN}
    assert d.snapshot() == before, "a failed preview must not touch the stack's containers"


def test_stop_mode_previews_stops_then_up_serves(seeded):
    d = seeded
    d.set("preflight.foreignContainers", "stop")
    d.run("preview")
    ops = d.ops()
    for name in FOREIGN:
        assert ops.get(f"{HEAD}-stop-{name}") == "create", ops
    assert not any(k.startswith(f"{WORKER}-stop-") for k in ops), ops
    assert _state(d) == {n: "running" for n in FOREIGN}, "preview must not stop anything"

    t0 = time.monotonic()
    r = d.run("up")
    print(f"up with stops: {time.monotonic() - t0:.1f} s")
    assert r.summary.result == "succeeded"
    ops = d.ops()
    for name in FOREIGN:
        assert ops.get(f"{HEAD}-stop-{name}") == "create", ops
    assert _state(d) == {n: "exited" for n in FOREIGN}
    assert complete(d)
    stopped = d.stack.outputs()["nodes"].value[HEAD]["stoppedContainers"]
    assert sorted(stopped) == sorted(FOREIGN), stopped
    for name in FOREIGN:  # what was stopped is recorded on the host
        assert d.ssh(HEAD, f"cat /var/lib/spark-vllm/stopped/{name}").strip() == "spark-vllm/dev"


def test_stops_are_kept_on_the_next_run(seeded):
    """The stopped containers no longer run; the plan must still hold their stops, otherwise the
    next up deletes the stop commands and starts them again (docs/contract.md)."""
    d = seeded
    d.run("preview")
    assert d.ops() == {}, d.ops()
    assert _state(d) == {n: "exited" for n in FOREIGN}


def test_destroy_starts_them_again(seeded, shared):
    d = seeded
    t0 = time.monotonic()
    shared.destroyed = True  # whatever the outcome: nothing after this test may use the stack
    d.run("destroy")
    print(f"destroy: {time.monotonic() - t0:.1f} s")
    assert _state(d) == {n: "running" for n in FOREIGN}
    assert all(d.containers(n) == {} for n in (HEAD, WORKER)), d.snapshot()
    assert d.ssh(HEAD, "ls -A /var/lib/spark-vllm/stopped 2>/dev/null || true").strip() == ""
    for n in (HEAD, WORKER):  # destroy keeps what is expensive to fetch again
        assert "models--spark-lab--tiny-moe" in d.ssh(n, "ls /root/.cache/huggingface/hub"), n
    # issue 45: the stack's firewall goes (its table, its unit and the unit's links, its file)
    for n in (HEAD, WORKER):
        assert "spark-vllm-dev" not in d.ssh(n, "nft list tables"), n
        left = d.ssh(n, "find /etc/systemd/system /var/lib/spark-vllm -name '*firewall*' "
                        "2>/dev/null || true")
        assert left.strip() == "", (n, left)
    # issue 33: the stack's fabric configuration goes (its netplan files, its addresses); the
    # MTU it set stays, and nothing of another stack was there to keep
    for n in (HEAD, WORKER):
        assert d.ssh(n, "ls /etc/netplan | grep -c spark-vllm-dev || true").strip() == "0", n
        for iface in ("enp1s0f1np1", "enP2p1s0f1np1"):
            assert d.ssh(n, f"ip -o -4 addr show dev {iface}").strip() == "", (n, iface)
