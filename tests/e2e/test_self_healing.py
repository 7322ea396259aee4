"""The stack heals itself on the lab: after a crash it serves again with no `up`, and the engine
finds nothing to do afterwards.

Docker supervises every container of the stack (restart `unless-stopped`). vLLM runs in its own
container on the head (spark-vllm-dev-serve, a Ray driver): it exits when its Ray executor loses a
worker, and it waits for the cluster's GPUs when it starts. On the session's shared stack
(tests/e2e/conftest.py: converged, Ray, 2 nodes); then, ordered on purpose, three faults, none
followed by an `up` before the stack serves again:

(a) vLLM crashes: `lab crash` sends kill -9 to its container's main process in the node.
    A crash, not `docker kill`/`docker stop`: Docker counts those as a manual stop and its
    restart policy leaves such a container stopped (that case is the drift test in
    test_lab_stack.py);
(b) the Ray worker on spark-2 crashes the same way: the worker restarts, vLLM's Ray executor
    notices its dead worker, vLLM exits and Docker starts it again;
(c) the head restarts as it would reboot (`lab dockerd-restart`): its dockerd is stopped
    (SIGTERM: it stops its containers, as a shutdown does), its kernel's rules are forgotten
    (the nftables ruleset emptied), the units Docker's start waits for run (the stack's
    firewall unit: the lab FAKES systemd here, lab/hosts.py) and dockerd starts the stack's
    containers again: the firewall's table is loaded before vLLM starts (issue 45), and vLLM's
    launcher never found it missing;
(d) vLLM's engine process is frozen (SIGSTOP), as a hung engine looks from outside: the API
    server and its /health answer 200, the container runs, and no completion is ever served, so
    Docker alone would never act. The liveness watchdog in the vLLM container
    (health.liveness, hostscripts/payloads/vllm_liveness.py) stops it and Docker starts it again.

After each: a completion within the stack's health.timeoutSeconds of the fault (the recovery
time is printed), every container kept its ID (restarted by Docker, not replaced: the restart
counts are in the messages), `refresh` finds no drift, `preview` plans no change and an `up`
changes nothing and restarts nothing.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from lab.deployments import complete, lab
from tests import reporting

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
SERVE, RAY_HEAD, RAY_WORKER = (
    "spark-vllm-dev-serve", "spark-vllm-dev-ray-head", "spark-vllm-dev-ray-worker")
GATEWAY = "spark-vllm-dev-gateway"  # issue 30: HAProxy on the head, the stack's endpoint
# every container of the stack, by node
STACK = {HEAD: (RAY_HEAD, SERVE, GATEWAY), WORKER: (RAY_WORKER,)}
POLL_SECONDS = 2


Key = tuple[str, str]  # (node, container)


# ---------------------------------------------------------------------------- helpers


def _inspect(d) -> dict[Key, dict]:
    """(node, container) -> id, status, start time and restart count of every stack container
    that exists (a node whose dockerd is down has none)."""
    fmt = "{{.Name}} {{.Id}} {{.State.Status}} {{.State.StartedAt}} {{.RestartCount}}"
    res: dict[Key, dict] = {}
    for node, names in STACK.items():
        out = d.ssh(node, f"docker inspect -f '{fmt}' {' '.join(names)} 2>/dev/null", check=False)
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 5:
                name, cid, status, started, restarts = parts
                res[(node, name.lstrip("/"))] = {"id": cid, "status": status,
                                                 "started": started, "restarts": int(restarts)}
    return res


def _fmt(states: dict[Key, dict]) -> str:
    return "; ".join(f"{node}/{name}: {s['status']}, restarts {s['restarts']}, "
                     f"started {s['started']}, id {s['id'][:12]}"
                     for (node, name), s in sorted(states.items())) or "none"


def _restarts(before: dict[Key, dict], after: dict[Key, dict]) -> str:
    """The restart counts before -> after, for the assertion messages."""
    keys = sorted(set(before) | set(after))
    return ", ".join(f"{n}/{c} {before.get((n, c), {}).get('restarts', '-')} -> "
                     f"{after.get((n, c), {}).get('restarts', '-')}" for n, c in keys)


def _fault(*args: str) -> None:
    """Run a lab chaos verb; print what it did."""
    done = lab(*args, check=False, timeout=600)
    assert done.returncode == 0, f"lab {' '.join(args)} failed: {done.stderr.strip()}"
    print(f"[fault] {done.stdout.strip()}", flush=True)


def _health_timeout(d) -> int:
    return int(d.stack.get_config("spark-vllm:health.timeoutSeconds", path=True).value)


def _serve_log(d) -> str:
    """vLLM's log tail, and the gateway's state and log tail (the completions go through it)."""
    return (d.ssh(HEAD, f"docker logs --tail 50 {SERVE} 2>&1", check=False)
            + f"\n--- {GATEWAY}: state, then docker logs --tail 20 ---\n"
            + d.ssh(HEAD, f"docker inspect -f '{{{{json .State}}}}' {GATEWAY} 2>&1; "
                          f"docker logs --tail 20 {GATEWAY} 2>&1", check=False))


def _serving_before(d, what: str) -> dict[Key, dict]:
    """The stack serves and every container runs, before the fault (else an earlier case left
    it broken: that case's failure is the one to read)."""
    states = _inspect(d)
    assert set(states) == {(n, c) for n, cs in STACK.items() for c in cs} and all(
        s["status"] == "running" for s in states.values()), \
        f"before {what}: the stack's containers are not all running: {_fmt(states)}"
    try:
        assert complete(d)
    except Exception as e:  # reported with vLLM's log
        pytest.fail(f"before {what}: the stack does not serve ({e!r}); an earlier case left "
                    f"it broken?\n--- docker logs --tail 50 {SERVE} ---\n{_serve_log(d)}")
    return states


def _wait_serving(d, what: str, t0: float, before: dict[Key, dict],
                  restarted: set[Key]) -> tuple[float, dict[Key, dict]]:
    """Poll until every container in `restarted` runs with a new start time and a completion
    answers; fail after the stack's health.timeoutSeconds (counted from the fault at `t0`)
    with the vLLM container's log tail. Returns the seconds from the fault and the states."""
    timeout = _health_timeout(d)
    deadline = t0 + timeout
    last: object = "no container restarted yet"
    states = before
    while time.monotonic() < deadline:
        states = _inspect(d)
        fresh = [k for k in restarted if k in states and states[k]["status"] == "running"
                 and states[k]["started"] != before[k]["started"]]
        if len(fresh) == len(restarted):
            try:
                if complete(d, f"Say hello after {what}"):
                    return time.monotonic() - t0, states
                last = "an empty completion"
            except Exception as e:  # not yet: vLLM is still starting
                last = e
        else:
            last = f"not restarted yet: {sorted(set(restarted) - set(fresh))}"
        time.sleep(POLL_SECONDS)
    pytest.fail(
        f"{what}: not serving {timeout} s (health.timeoutSeconds) after the fault; last: "
        f"{last!r}\ncontainers: {_fmt(states)}\nrestart counts: {_restarts(before, states)}\n"
        f"--- docker logs --tail 50 {SERVE} ---\n{_serve_log(d)}")


def _same_ids(before: dict[Key, dict], after: dict[Key, dict], what: str) -> None:
    """Restarted by Docker, never replaced: every container has the ID it had."""
    assert set(after) == set(before), f"{what}: containers {_fmt(before)} -> {_fmt(after)}"
    changed = {k: (before[k]["id"][:12], after[k]["id"][:12]) for k in before
               if after[k]["id"] != before[k]["id"]}
    assert not changed, f"{what}: containers were replaced: {changed}"


def _kept(before: dict[Key, dict], after: dict[Key, dict], keys: list[Key], what: str) -> None:
    """These containers did not restart (same start time and restart count)."""
    moved = [f"{n}/{c}" for n, c in keys
             if (after[(n, c)]["started"], after[(n, c)]["restarts"])
             != (before[(n, c)]["started"], before[(n, c)]["restarts"])]
    assert not moved, (f"{what}: {moved} restarted too (restart counts "
                       f"{_restarts(before, after)}; {_fmt(after)})")


def _record(what: str, secs: float, before: dict[Key, dict], after: dict[Key, dict]) -> None:
    reporting.record(f"self-healing: {what} -> serving again", secs,
                     f"restart counts {_restarts(before, after)}")


def _quiet_afterwards(d, what: str) -> None:
    """No `up` was needed: refresh finds no drift, preview plans nothing, up changes nothing
    and restarts nothing, and the stack still serves."""
    states = _inspect(d)
    assert all(s["status"] == "running" for s in states.values()), _fmt(states)
    r = d.run("refresh")
    assert r.summary.result == "succeeded", r.summary.result
    changes = dict(r.summary.resource_changes or {})
    print(f"[observed] refresh after {what}: {changes}")
    assert set(changes) <= {"same"}, f"refresh after {what} found drift: {changes}"
    d.run("preview", expect_no_changes=True)
    r = d.run("up")
    assert r.summary.result == "succeeded"
    assert d.ops() == {}, f"up after {what} changed: {d.ops()}"
    after = _inspect(d)
    assert after == states, (f"refresh/preview/up after {what} restarted something: "
                             f"{_fmt(states)} -> {_fmt(after)}")
    assert complete(d)


# ---------------------------------------------------------------------------- tests


def test_the_stack_serves_under_dockers_supervision(stack):
    d = stack
    states = _inspect(d)
    assert set(states) == {(n, c) for n, cs in STACK.items() for c in cs}, _fmt(states)
    for (node, name) in states:
        policy = d.ssh(node, f"docker inspect -f '{{{{.HostConfig.RestartPolicy.Name}}}}' {name}")
        assert policy.strip() == "unless-stopped", (node, name, policy)
    assert all(s["status"] == "running" for s in states.values()), _fmt(states)
    assert complete(d)


class _Followed:
    """`spark-vllm logs -s dev tiny-moe -f --tail 0` running, its lines collected by threads."""

    def __init__(self, d) -> None:
        self.p = d.cli_follow("logs", "-s", "dev", "tiny-moe", "-f", "--tail", "0")
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, text: str, within: float) -> None:
        end = time.monotonic() + within
        while not any(text in line for line in self.out):
            assert self.p.poll() is None, (self.p.returncode, self.out[-20:], self.err)
            assert time.monotonic() < end, f"no {text!r} followed in {within} s: {self.out[-20:]}"
            time.sleep(0.5)

    def end(self) -> int:
        self.p.send_signal(signal.SIGINT)  # Ctrl-C
        return self.p.wait(timeout=30)


def test_vllm_crash_serves_again_by_itself(stack):
    d = stack
    what = "vLLM crash (kill -9)"
    before = _serving_before(d, what)
    followed = _Followed(d)  # issue 34: `logs -f` follows the head's vLLM across its restart
    time.sleep(3)  # its node sessions are open before the crash
    t0 = time.monotonic()
    _fault("crash", HEAD, SERVE)
    secs, after = _wait_serving(d, what, t0, before, {(HEAD, SERVE)})
    try:
        # the new start's lines: the launcher's marker and the watchdog's first answer
        followed.wait_for("spark-1/serve | === spark-vllm: vllm serve starts ===", within=30)
        followed.wait_for("spark-1/serve | spark-vllm liveness: vLLM answers at", within=30)
    finally:
        code = followed.end()
    assert code == 0, (code, followed.err)
    starts = [ln for ln in followed.out if "vllm serve starts" in ln]
    assert len(starts) == 1, starts  # the crash's restart once: nothing printed twice
    _record(what, secs, before, after)
    _same_ids(before, after, what)
    assert after[(HEAD, SERVE)]["restarts"] == before[(HEAD, SERVE)]["restarts"] + 1, \
        f"{what}: Docker's restart count of {SERVE}: {_restarts(before, after)}"
    # Ray did not go with it
    _kept(before, after, [(HEAD, RAY_HEAD), (WORKER, RAY_WORKER), (HEAD, GATEWAY)], what)
    _quiet_afterwards(d, what)


def test_ray_worker_crash_restarts_worker_and_vllm_by_themselves(stack):
    d = stack
    what = f"Ray worker crash on {WORKER} (kill -9)"
    before = _serving_before(d, what)
    t0 = time.monotonic()
    _fault("crash", WORKER, RAY_WORKER)
    # the worker comes back, and vLLM, which lost a tensor-parallel rank, starts again
    secs, after = _wait_serving(d, what, t0, before, {(WORKER, RAY_WORKER), (HEAD, SERVE)})
    _record(what, secs, before, after)
    _same_ids(before, after, what)
    worker = (WORKER, RAY_WORKER)
    assert after[worker]["restarts"] == before[worker]["restarts"] + 1, \
        f"{what}: Docker's restart count of {RAY_WORKER}: {_restarts(before, after)}"
    assert after[(HEAD, SERVE)]["restarts"] > before[(HEAD, SERVE)]["restarts"], \
        f"{what}: vLLM was not restarted by Docker: {_restarts(before, after)}"
    _kept(before, after, [(HEAD, RAY_HEAD), (HEAD, GATEWAY)], what)
    _quiet_afterwards(d, what)


def test_head_dockerd_restart_brings_everything_back(stack):
    d = stack
    what = f"dockerd restart on {HEAD}"
    before = _serving_before(d, what)
    t0, wall0 = time.monotonic(), time.time()
    _fault("dockerd-restart", HEAD)
    print(f"[time] dockerd of {HEAD} stopped and answering again: {time.monotonic() - t0:.1f} s")
    # dockerd starts the head's containers again (they were not stopped by hand)
    secs, after = _wait_serving(d, what, t0, before,
                                {(HEAD, RAY_HEAD), (HEAD, SERVE), (HEAD, GATEWAY)})
    _record(what, secs, before, after)
    _same_ids(before, after, what)
    worker = "restarted" if after[(WORKER, RAY_WORKER)]["started"] != \
        before[(WORKER, RAY_WORKER)]["started"] else "kept running"
    print(f"[observed] {WORKER}/{RAY_WORKER} {worker} while the head's dockerd restarted "
          f"(restart counts {_restarts(before, after)})")
    # issue 45: the reboot forgot the table, the stack's unit loaded it again before dockerd
    # started, so before vLLM's container did; its launcher never found it missing, and the
    # table is the one the last `up` loaded (the preview below finds no drift)
    boot = [ln.split(" ", 1) for ln in
            open(f"/var/lib/spark-vllm-lab/{HEAD}/logs/boot.log").read().splitlines()]
    last = max(i for i, (_, e) in enumerate(boot) if e.startswith("nftables ruleset flushed"))
    events = [e for _, e in boot[last:]]
    assert events[1] == ("spark-vllm-dev-firewall.service: ExecStart=/usr/sbin/nft -f "
                         "/var/lib/spark-vllm/stacks/dev/firewall/table.nft rc=0"), events
    assert events[2] == "dockerd starts", events
    loaded_at = float(boot[last + 1][0])
    started = d.ssh(HEAD, f"date -d $(docker inspect -f '{{{{.State.StartedAt}}}}' {SERVE}) +%s.%N")
    assert loaded_at < float(started), (loaded_at, started)
    assert "table inet spark-vllm-dev" in d.ssh(HEAD, "nft list tables")
    refused = [ln for ln in d.ssh(HEAD, f"docker logs --since {int(wall0)} {SERVE} 2>&1")
               .splitlines() if "firewall is not loaded" in ln]
    assert not refused, refused
    _quiet_afterwards(d, what)


def _engine_pid(d) -> int:
    """The host PID of vLLM's engine process in the head's vLLM container (`docker top`)."""
    out = d.ssh(HEAD, f"docker top {SERVE} -eo pid,args")
    pids = [int(line.split()[0]) for line in out.splitlines()[1:] if "EngineCore" in line]
    assert len(pids) == 1, f"vLLM's engine process in {SERVE}: {out}"
    return pids[0]


def test_a_hung_engine_is_restarted_by_the_liveness_watchdog(stack):
    d = stack
    what = "vLLM's engine frozen (SIGSTOP)"
    before = _serving_before(d, what)
    liveness = json.loads(d.stack.get_config("spark-vllm:health").value)["liveness"]
    pid = _engine_pid(d)
    t0 = time.monotonic()
    d.ssh(HEAD, f"kill -STOP {pid}")
    try:
        # what Docker sees: the container runs and vLLM's /health answers
        health = d.ssh(HEAD, "python3 -c \"import urllib.request; print(urllib.request.urlopen("
                             "'http://127.0.0.1:8000/health', timeout=10).status)\"")
        assert health.strip() == "200", health
        assert _inspect(d)[(HEAD, SERVE)]["status"] == "running"
        secs, after = _wait_serving(d, what, t0, before, {(HEAD, SERVE)})
    finally:  # whatever happened, no frozen process stays behind
        d.ssh(HEAD, f"kill -CONT {pid} 2>/dev/null || true", check=False)
    _record(what, secs, before, after)
    _same_ids(before, after, what)
    assert after[(HEAD, SERVE)]["restarts"] == before[(HEAD, SERVE)]["restarts"] + 1, \
        f"{what}: Docker's restart count of {SERVE}: {_restarts(before, after)}"
    _kept(before, after, [(HEAD, RAY_HEAD), (WORKER, RAY_WORKER), (HEAD, GATEWAY)], what)
    said = [line for line in d.ssh(HEAD, f"docker logs {SERVE} 2>&1").splitlines()
            if line.startswith("spark-vllm liveness:")]
    print("[observed] " + "\n".join(said[-6:]))
    print(f"[observed] serving again {secs:.0f} s after the freeze (liveness "
          f"{liveness['intervalSeconds']} s interval, {liveness['probeTimeoutSeconds']} s probe "
          f"timeout, {liveness['failures']} failures)")
    assert any("vLLM is alive but does not serve; stopping it" in line for line in said), said
    assert sum(f"of {liveness['failures']} failed" in line for line in said) >= \
        liveness["failures"], said
    gone = d.ssh(HEAD, f"test -e /proc/{pid} && echo alive || echo gone").strip()
    assert gone == "gone", f"the frozen engine process {pid} outlived its container's restart"
    _quiet_afterwards(d, what)
