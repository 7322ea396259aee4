"""Faults, bad input and secrets on the lab: errors name the cause, nothing breaks, nothing leaks.

Ordered on purpose, on the session's shared stack (tests/e2e/conftest.py: converged, serving):

1. three faults caught by a preview (worker unreachable, fabric link cut, wrong pinned host
   key): the preview fails naming the node and the cause, nothing changes (state and hosts);
2. an `up` with every secret set: no plaintext secret (or its base64) in the raw state files,
   the stack YAML, the engine's events and output, or any command's stdout/stderr; the API key
   is enforced;
3. a vLLM flag the image's vLLM rejects: the serve check in the image (issue 32) fails the `up`
   with vLLM's own message before the vLLM container is replaced, the old one keeps serving;
   putting the last good value back converges without touching it; a setting the parser
   accepts but vLLM dies of at start: the gate notices in seconds, the last verified vLLM is
   put back in the same `up`, which fails with vLLM's log tail (issue 49: the time without
   service measured); with health.onFailure keep it crash-loops instead, and `spark-vllm
   rollback` brings the last verified flag back;
4. two `up`s at once: the second is refused by the stack lock, the first completes, the stack is
   quiet afterwards;
5. the worker lost in the middle of an `up`, and Ctrl-C during the health gate: the next `up`
   converges with no operator step.

Every case undoes its fault in a `finally` (sshd-start, fabric-restore, the right host key), so
a failure leaves the lab as it found it. Measured results: docs/faults.md.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from lab.deployments import LAB_CACHE, Outage, lab
from tests import reporting

pytestmark = [pytest.mark.lab, pytest.mark.engine]

HEAD, WORKER = "spark-1", "spark-2"
SSH_KEY_FILE = LAB_CACHE / "id_ed25519"
# Distinctive fake values: any hit in a search is a leak, never a coincidence.
RUN = uuid.uuid4().hex[:12]
HF_TOKEN = f"hf_FaultsFakeToken{RUN}XyZ"
API_KEY = f"sk-faults-fake-api-key-{RUN}"

TIMES: dict[str, float] = {}  # this module's measured times (also in the run's report)


# ---------------------------------------------------------------------------- the deployment


@pytest.fixture(scope="module")
def deployment(stack):
    """The shared stack; a lock left by an interrupted case is cleared at the end of the module
    (`pulumi cancel`), so the modules after this one find it unlocked."""
    state = stack.workdir / "state"
    yield stack
    if list((state / ".pulumi").glob("locks/**/*.json")):
        cancel_stale_lock(stack)


# ---------------------------------------------------------------------------- helpers


@contextmanager
def fault(verb: str, undo: str, node: str):
    """Apply a lab chaos verb to a node and always undo it, even when the test fails."""
    lab(verb, node)
    try:
        yield
    finally:
        lab(undo, node)


@contextmanager
def timed(name: str):
    t0 = time.monotonic()
    try:
        yield
    finally:
        TIMES[name] = round(time.monotonic() - t0, 1)
        reporting.record(f"faults: {name}", TIMES[name])


def failed_preview(d) -> str:
    """Run a preview that must fail; return the engine's whole text (stdout + stderr)."""
    import pulumi.automation as auto

    with pytest.raises(auto.CommandError) as info:
        d.run("preview")
    return str(info.value)


def resources(d) -> dict[str, dict]:
    """URN -> the stack state's record of every resource (inputs, outputs)."""
    return {r["urn"]: {k: r.get(k) for k in ("inputs", "outputs")}
            for r in d.stack.export_stack().deployment.get("resources") or []}


def nothing_changed(d, state: dict, snapshot: dict) -> None:
    """A failed preview changed no resource in the stack's state and no container on a node."""
    assert resources(d) == state, "a failed preview changed the stack's state"
    assert d.snapshot() == snapshot, "a failed preview changed containers on a node"


def http(url: str, body: dict | None = None, key: str | None = None,
         timeout: int = 30) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def complete(d, key: str | None = API_KEY) -> tuple[int, str]:
    return http(d.endpoint() + "/completions",
                {"model": "tiny-moe", "prompt": "Say hello", "max_tokens": 8}, key=key)


def plain(obj, depth: int = 0):
    """An engine event (nested SDK objects) as JSON-able data, every field kept."""
    if depth > 40:
        return repr(obj)
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [plain(v, depth + 1) for v in obj]
    if hasattr(obj, "__dict__"):
        return {k: plain(v, depth + 1) for k, v in vars(obj).items()}
    return repr(obj)


def needles(secrets: dict[str, str]) -> dict[str, str]:
    """What must not appear: each value, its base64, and each long line of a multi-line value."""
    out = {}
    for name, value in secrets.items():
        out[name] = value
        out[f"{name} (base64)"] = base64.b64encode(value.encode()).decode()
        out[f"{name} (base64, no newline)"] = base64.b64encode(value.strip().encode()).decode()
        for i, line in enumerate(value.splitlines()):
            if len(line) >= 20 and not line.startswith("-----"):
                out[f"{name} (line {i})"] = line
    return out


def leaks(text: str, what: dict[str, str]) -> list[str]:
    # JSON escapes newlines and '/' may appear as \/: search the raw text and its unescaped form
    forms = {text, text.replace("\\n", "\n").replace("\\/", "/")}
    return sorted({name for name, needle in what.items() for t in forms if needle in t})


def raw_state_files(state: Path) -> dict[str, str]:
    """Every file of the file backend as text (gzip-decompressed when compressed)."""
    out = {}
    for f in sorted(state.rglob("*")):
        if not f.is_file():
            continue
        data = f.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        out[str(f.relative_to(state))] = data.decode(errors="replace")
    return out


# ---------------------------------------------------------------------------- 1. preview faults


def test_worker_unreachable_at_preview(deployment):
    d = deployment
    state, before = resources(d), d.snapshot()
    with fault("sshd-stop", "sshd-start", WORKER), timed("worker unreachable preview"):
        text = failed_preview(d)
    m = re.search(rf"{WORKER}: unreachable[^\n]*", text)
    assert m, f"no 'spark-2: unreachable' in the error:\n{text[-3000:]}"
    assert "refused" in m.group(0).lower(), m.group(0)
    print(f"[observed] {m.group(0).strip()}")
    nothing_changed(d, state, before)
    d.run("preview", expect_no_changes=True)  # and once the node is back, preview passes


def test_fabric_link_cut_fails_preflight(deployment):
    d = deployment
    state, before = resources(d), d.snapshot()
    with fault("fabric-cut", "fabric-restore", WORKER), timed("fabric cut preview"):
        text = failed_preview(d)
    found = re.findall(rf"{WORKER}[^\n]*fabric interface (\S+) is down \(no carrier\)", text)
    assert found, f"no carrier finding for {WORKER}:\n{text[-3000:]}"
    assert "enp1s0f1np1" in found or "enP2p1s0f1np1" in found, found
    print(f"[observed] {WORKER}: no carrier on {sorted(set(found))}")
    nothing_changed(d, state, before)


def _config(d, path: str) -> str:
    """One config value of the stack, as the CLI prints it."""
    return d.stack.get_config(f"spark-vllm:{path}", path=True).value


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def test_wrong_host_key_refused_without_tofu(deployment, tmp_path, lab_cfg):
    d = deployment
    right = next(n["hostKey"] for n in lab_cfg["nodes"] if n["name"] == WORKER)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)
    wrong = " ".join((tmp_path / "k.pub").read_text().split()[:2])
    assert wrong != right
    user_known_hosts = Path.home() / ".ssh" / "known_hosts"
    known_before = user_known_hosts.read_text() if user_known_hosts.exists() else None
    stack_known = Path.home() / ".cache" / "spark-vllm" / "known_hosts" / "spark-vllm.dev"
    stack_known_before = _read(stack_known)
    state, before = resources(d), d.snapshot()
    d.set("nodes[1].hostKey", wrong)
    try:
        with timed("wrong host key preview"):
            text = failed_preview(d)
        m = re.search(rf"{WORKER}: host key mismatch[^\n]*", text)
        assert m, f"no host key error for {WORKER}:\n{text[-3000:]}"
        print(f"[observed] {m.group(0).strip()}")
        assert "do not proceed" in text
        # no trust on first use: recon's ssh runs with StrictHostKeyChecking=yes against a
        # temporary known_hosts holding only the pinned key, and the presented key is recorded
        # nowhere: the stack's known_hosts (written only after preflight passes) and the
        # user's are unchanged
        assert _read(stack_known) == stack_known_before, "the stack's known_hosts changed"
        known_after = user_known_hosts.read_text() if user_known_hosts.exists() else None
        assert known_after == known_before, "~/.ssh/known_hosts was changed"
        nothing_changed(d, state, before)
    finally:
        d.set("nodes[1].hostKey", right)


# ---------------------------------------------------------------------------- 2. secrets


def test_secrets_never_in_plaintext_and_api_key_enforced(deployment):
    import pulumi.automation as auto

    d = deployment
    ssh_key = SSH_KEY_FILE.read_text()
    secrets = {"hfToken": HF_TOKEN, "vllmApiKey": API_KEY, "sshPrivateKey": ssh_key}
    for key, value in secrets.items():
        d.stack.set_config(f"spark-vllm:{key}", auto.ConfigValue(value, secret=True))

    output: list[str] = []

    def on_output(line: str) -> None:
        output.append(line)
        print(line, flush=True)

    with timed("full up with secrets"):
        r = d.run("up", on_output=on_output)
    assert r.summary.result == "succeeded"
    # each secret's path ran in this up (the stack was converged without them): the HF token
    # is model-fetch's stdin, the API key the key file and vLLM's launcher, the SSH key every
    # connection
    ops = d.ops()
    print(f"[observed] the up with secrets ran: {sorted(ops)}")
    assert {"model-fetch", "vllm-api-key", "vllm-serve"} <= set(ops), ops
    events = [plain(e) for e in d.events]
    # the Ray cluster token the stack made: on every node only in its root-only file
    token = d.ssh(HEAD, "cat /var/lib/spark-vllm/stacks/dev/ray/auth-token").strip()
    assert len(token) == 64, "the Ray token file is missing on the head"
    mode = d.ssh(HEAD, "stat -c %a /var/lib/spark-vllm/stacks/dev/ray/auth-token").strip()
    assert mode == "600", mode
    secrets = {**secrets, "rayToken": token}
    what = needles(secrets)

    found: dict[str, list[str]] = {}
    state_files = raw_state_files(d.workdir / "state")
    assert any(n.endswith("dev.json") for n in state_files), sorted(state_files)
    for name, text in state_files.items():
        if hit := leaks(text, what):
            found[f"state file {name}"] = hit
    stack_yaml = (d.workdir / "Pulumi.dev.yaml").read_text()
    assert "secure:" in stack_yaml
    if hit := leaks(stack_yaml, what):
        found["Pulumi.dev.yaml"] = hit
    if hit := leaks(json.dumps(events), what):
        found["engine events"] = hit
    if hit := leaks("\n".join(output) + r.stdout + r.stderr, what):
        found["engine output"] = hit

    # every command's stdout/stderr as the state holds it (a secret output is ciphertext there)
    checkpoint = json.loads(next(t for n, t in state_files.items()
                                 if n.endswith("stacks/spark-vllm/dev.json")))
    resources = checkpoint["checkpoint"]["latest"]["resources"]
    commands = [res for res in resources if res["type"].startswith("command:")]
    streams = 0
    for res in commands:
        for field in ("stdout", "stderr"):
            value = (res.get("outputs") or {}).get(field)
            if value is None:
                continue
            streams += 1
            if hit := leaks(json.dumps(value), what):
                found[f"{res['urn'].split('::')[-1]}.{field}"] = hit
    # on the nodes: no container's config (vLLM's included: the key is a mounted file its
    # launcher exports), process list or log carries a secret either
    for node, container in ((HEAD, "spark-vllm-dev-ray-head"), (HEAD, "spark-vllm-dev-serve"),
                            (WORKER, "spark-vllm-dev-ray-worker")):
        inspect = d.ssh(node, f"docker inspect {container}; docker exec {container} "
                              "sh -c 'cat /proc/[0-9]*/cmdline | tr \"\\0\" \" \"'; "
                              f"docker logs {container} 2>&1")
        if hit := leaks(inspect, {"vllmApiKey": API_KEY, "hfToken": HF_TOKEN, "rayToken": token}):
            found[f"{container} inspect/cmdline/log"] = hit
    print(f"[observed] searched {len(state_files)} state files, the stack YAML, {len(events)} "
          f"events, {len(output)} output lines, {streams} stdout/stderr of {len(commands)} "
          f"commands: leaks={found}")
    assert not found, found

    # the key is enforced
    status, body = complete(d, key=API_KEY)
    assert status == 200 and json.loads(body)["choices"][0]["text"], (status, body)
    status, _ = complete(d, key=None)
    assert status == 401, status
    status, _ = complete(d, key="sk-wrong")
    assert status == 401, status


# ---------------------------------------------------------------------------- 3. bad vLLM flag


def test_vllm_bad_flag_is_refused_by_the_images_vllm_before_vllm_is_replaced(deployment):
    """Issue 32: the serve argv goes through the image's own vLLM parser on every node
    (`vllm-serve-check-<node>`) before the vLLM container is replaced: a flag vLLM rejects
    fails the `up` with vLLM's own message while the old container keeps serving. (Before,
    the container was replaced and the health gate showed its log tail.)"""
    import pulumi.automation as auto

    d = deployment
    before = d.snapshot()
    # `config set --path vllm.extraArgs '["--bogus-flag"]'` would store a STRING (the program
    # refuses it: "spark-vllm:vllm.extraArgs: got '[...]'; expected a list"); set the element
    d.stack.set_config("spark-vllm:vllm.extraArgs[0]", auto.ConfigValue("--bogus-flag"),
                       path=True)
    try:
        with timed("up with --bogus-flag (fails)"), pytest.raises(auto.CommandError) as info:
            d.run("up")
        text = str(info.value)
        m = re.search(r"serve check failed: the image's vLLM rejects the serve command: "
                      r"[^\n]*unrecognized arguments: --bogus-flag[^\n]*", text)
        assert m, f"vLLM's own error is not in the failure:\n{text[-3000:]}"
        print(f"[observed] {m.group(0).strip()}")
        assert d.snapshot() == before, "a container changed although the serve check failed"
        status, body = complete(d)  # the old vLLM still serves
        assert status == 200, (status, body)
    finally:  # back to the last good config: extraArgs: []
        d.stack.remove_config("spark-vllm:vllm.extraArgs[0]", path=True)
    assert "extraArgs: []" in (d.workdir / "Pulumi.dev.yaml").read_text()
    with timed("up back to extraArgs []"):
        r = d.run("up")
    assert r.summary.result == "succeeded"
    assert "vllm-serve" not in d.ops(), d.ops()  # it never changed
    assert d.snapshot() == before
    d.run("preview", expect_no_changes=True)


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_a_flag_vllm_dies_of_puts_the_last_verified_deployment_back_in_the_same_up(deployment):
    """Issue 49. A serve setting vLLM's parser accepts but the model cannot serve (a context far
    beyond the lab model's 4096 positions): the serve check passes, vLLM's container is replaced
    and vLLM exits at start. With a plain `up` (health.onFailure restore, the default) the gate
    puts the last verified vLLM back on the head and the `up` fails naming the new version's
    failure (vLLM's log tail) and "serving the last verified deployment again"; a completion is
    served again with no human, and the time without service is measured (goal: the restored
    vLLM's own start plus under 30 s). The state stays truthful: the next preview replaces the
    restored container. Then with health.onFailure keep the failing version stays, crash-loops
    and `spark-vllm status` says so (issue 34); `spark-vllm rollback` puts the last verified
    flag back and serves it."""
    import pulumi.automation as auto

    d = deployment
    verified = d.stack.outputs()["deployment"].value
    assert verified["model"]["commit"] == d.stack.outputs()["modelCommit"].value, verified
    d.set("vllm.maxModelLen", 1048576)
    try:
        with Outage(d) as outage, timed("up with maxModelLen 1048576, restored (fails)"), \
                pytest.raises(auto.CommandError) as info:
            d.run("up")
        text = str(info.value)
        assert ("the new version failed its health gate: vllm serve exited while the gate "
                "waited" in text), text[-3000:]
        assert ("--- vllm serve in spark-vllm-dev-serve: its log's error lines, then its last "
                "lines ---" in text), text[-3000:]
        m = re.search(r"[^\n]*(max_model_len|max seq len)[^\n]*", text)
        assert m, f"vLLM's own error is not in the failure:\n{text[-3000:]}"
        print(f"[observed] {m.group(0).strip()}")
        m = re.search(r"serving the last verified deployment again \([^\n]*", text)
        assert m and verified["deployment"] in m.group(0), text[-3000:]
        print(f"[observed] {m.group(0)}")
        # served again by the last verified deployment, with no human: vLLM's argv is its own
        status, body = complete(d, key=d.api_key())
        assert status == 200, (status, body)
        assert outage.answered_at_the_end, outage.samples[-5:]
        assert _serve_argv(d) == verified["argv"]
        start = verified["gate"]["seconds"]
        reporting.record("faults: without service, a flag vLLM dies of (restored in the up)",
                         outage.longest, f"the restored vLLM's own start: {start:.1f} s")
        assert outage.longest < start + 30, (outage.longest, start)
        # the state is truthful: the restored container is replaced by the next up, nothing else
        d.run("preview")
        ops = d.ops()
        assert ops.get("vllm-serve") == "replace" and "ray-head" not in ops, ops
        code, data = d.status()
        shown = data["models"][0]["deployment"]
        assert code == 0 and shown["matches"] is True, data
        print(d.cli("status", "-s", "dev").stdout)  # what the README's day-two section shows
        assert shown["verified"]["deployment"] == verified["deployment"]
        assert shown["verified"]["restoredAt"], shown

        # health.onFailure keep: the failing version stays, for diagnosis
        d.set("health.onFailure", "keep")
        with timed("up with maxModelLen 1048576, kept (fails)"), \
                pytest.raises(auto.CommandError) as info:
            d.run("up")
        text = str(info.value)
        assert "not put back: health.onFailure is keep: the failing version stays" in text, \
            text[-3000:]
        timeout = int(d.stack.get_config("spark-vllm:health.timeoutSeconds", path=True).value)
        took = TIMES["up with maxModelLen 1048576, kept (fails)"]
        assert took < timeout, f"the failing up took {took} s: the gate waited for its timeout"
        # Docker keeps starting it and vLLM keeps exiting: the watchdog waits longer before each
        # start (dev: 2 s doubling) and, past the dev stack's crashLoopRestarts (2 in 300 s),
        # `spark-vllm status` says crash-looping and exits 1 (issue 34)
        with timed("status says crash-looping"):
            main = _until_crash_looping(d, within=300)
        assert "restarts in the last 300 s (more than 2)" in main["why"], main
        said = [ln for ln in _serve_log(d) if "spark-vllm liveness:" in ln]
        assert any("waiting 2s before starting it" in ln for ln in said), said
        assert any("waiting 4s before starting it" in ln for ln in said), said
        assert any("crash-looping: " in ln for ln in said), said
        code, data = d.status()
        assert data["models"][0]["deployment"]["matches"] is False, data  # not verified

        # `spark-vllm rollback`: the last verified config back, and the up that serves it
        with timed("spark-vllm rollback -s dev --yes"):
            r = d.cli("rollback", "-s", "dev", "--yes", timeout=900)
        print(r.stdout[-4000:], r.stderr[-2000:])
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        assert "planned change to Pulumi.dev.yaml (back to deployment 1" in r.stdout
        assert "-    maxModelLen: 1048576" in r.stdout
        # the up that follows a crash loop says so (preflight's warning, before it replaces vLLM)
        assert re.search(r"preflight: spark-1: spark-vllm-dev-serve is crash-looping: \d+ "
                         r"restarts", r.stdout), r.stdout[-3000:]
    finally:  # the stack file's own values (the recipe's maxModelLen, the default onFailure)
        for key in ("vllm.maxModelLen", "health.onFailure"):
            d.stack.remove_config(f"spark-vllm:{key}", path=True)
    status, body = complete(d, key=d.api_key())
    assert status == 200, (status, body)
    code, data = d.status()
    assert code == 0 and data["models"][0]["deployment"]["matches"] is True, data
    with timed("up back to the default onFailure"):
        r = d.run("up")
    assert r.summary.result == "succeeded"
    assert "vllm-serve" not in d.ops(), d.ops()  # onFailure is no container's input
    d.run("preview", expect_no_changes=True)


def _serve_argv(d) -> list[str]:
    """The argv of the head's vLLM container (its Cmd), as Docker holds it."""
    return json.loads(d.ssh("spark-1", "docker inspect -f '{{json .Config.Cmd}}' "
                                       "spark-vllm-dev-serve"))


def _until_crash_looping(d, within: float) -> dict:
    """Poll `spark-vllm status` until the main model is crash-looping; -> its JSON row."""
    end = time.monotonic() + within
    while True:
        code, data = d.status()
        main = data["models"][0]
        if main["state"] == "crash-looping":
            assert code == 1 and data["serving"] is False, data
            return main
        assert main["state"] != "serving", main
        assert time.monotonic() < end, f"not crash-looping after {within} s: {main}"
        time.sleep(5)


def _serve_log(d) -> list[str]:
    return d.ssh("spark-1", "docker logs spark-vllm-dev-serve 2>&1").splitlines()


def test_fabric_short_of_the_mtu_stops_the_up_before_any_change(deployment):
    """Issue 17: one node's switch port carries less than the MTU both ends report. Recon sees
    MTU 9000 with carrier on both nodes; only the don't-fragment ping between them finds it.
    The lab's "switch port" is the bridge end of spark-2's first fabric veth."""
    import pulumi.automation as auto

    d = deployment
    port = "svf1-s2"  # lab/net.py host_ifs(2)["svl-fab1"]: spark-2's enp1s0f1np1 at the bridge
    before = d.snapshot()
    subprocess.run(["ip", "link", "set", port, "mtu", "1500"], check=True)
    try:
        d.set("nccl.minMtu", 8000)  # a fabric config change: the check runs again at 8000
        with timed("up with a 1500-byte switch port (fails)"), \
                pytest.raises(auto.CommandError) as info:
            d.run("up")
        text = str(info.value)
        m = re.search(r"fabric check failed: spark-1 enp1s0f1np1 -> spark-2 192\.168\.177\.12 "
                      r"does not carry MTU 8000 unfragmented; the largest that passed is MTU "
                      r"(\d+)", text)
        assert m, text[-3000:]
        print(f"[observed] {m.group(0)}")
        assert 1400 <= int(m.group(1)) <= 1504, m.group(0)
        # both directions are checked, and the twin that carries the MTU is not reported
        assert "fabric check failed: spark-2 enp1s0f1np1 -> spark-1 192.168.177.11" in text
        assert "enP2p1s0f1np1 -> spark-2 192.168.178.12 does not carry" not in text
        assert d.snapshot() == before, "a container changed although the fabric check failed"
    finally:
        subprocess.run(["ip", "link", "set", port, "mtu", "9000"], check=True)
    with timed("up after the port is back to 9000"):
        r = d.run("up")
    assert r.summary.result == "succeeded"
    changed = set(d.ops())
    assert changed <= {"nccl", "nccl-fabric-spark-1", "nccl-fabric-spark-2"}, changed
    assert d.snapshot() == before
    d.set("nccl.minMtu", 9000)  # the stack file's own value again
    d.run("up")
    d.run("preview", expect_no_changes=True)


# ---------------------------------------------------------------------------- 4. concurrent ups


def test_two_ups_at_once_second_refused_by_lock(deployment):
    import pulumi.automation as auto

    d = deployment
    first: dict = {"events": [], "result": None, "error": None}

    def run_first():
        try:
            first["result"] = d.stack.up(
                on_event=first["events"].append,
                on_output=lambda line: print(f"[first] {line}", flush=True))
        except Exception as e:  # reported by the assertions below
            first["error"] = e

    t0 = time.monotonic()
    worker = threading.Thread(target=run_first, daemon=True)
    worker.start()
    deadline = time.monotonic() + 120
    while not first["events"] and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)  # the first update holds the lock once the engine emits its first event
    assert first["events"], f"the first up never started: {first['error']!r}"
    with pytest.raises(auto.CommandError) as info:
        d.stack.up(on_output=lambda line: print(f"[second] {line}", flush=True))
    err = info.value
    print(f"[observed] second up: {type(err).__name__}: "
          f"{next((line for line in str(err).splitlines() if 'locked' in line), '')}")
    assert isinstance(err, auto.ConcurrentUpdateError) or "currently locked" in str(err), str(err)
    worker.join(timeout=600)
    reporting.record("faults: two ups at once", time.monotonic() - t0)
    assert first["error"] is None, first["error"]
    assert first["result"].summary.result == "succeeded"
    d.run("preview", expect_no_changes=True)
    status, _ = complete(d)
    assert status == 200


# ---------------------------------------------------------------------------- 5. interrupted up

def test_worker_lost_mid_up_then_next_up_converges(deployment):
    """The worker becomes unreachable after recon passed, while the engine replaces the Ray
    containers (an NCCL change): the up fails on the worker's steps and says why; once the
    worker is back, the next up converges with no operator step in between."""
    import pulumi.automation as auto

    d = deployment
    # another NCCL_DEBUG than the stack has: replaces ray-head, ray-worker-spark-2, then vLLM's
    d.set("nccl.debug", "WARN" if _config(d, "nccl.debug") == "INFO" else "INFO")
    cut = threading.Event()
    lines: list[str] = []

    def watch(line: str) -> None:
        lines.append(line)
        print(f"[mid-up] {line}", flush=True)
        if not cut.is_set() and "ray-head" in line and re.search(r"(replacing|creating)", line):
            lab("sshd-stop", WORKER)  # new SSH connections to spark-2 are refused from now on
            cut.set()

    t0 = time.monotonic()
    try:
        with pytest.raises(auto.CommandError) as info:
            d.run("up", on_output=watch)
    finally:
        if cut.is_set():
            lab("sshd-start", WORKER)
    assert cut.is_set(), "the ray-head step never started:\n" + "\n".join(lines[-30:])
    text = str(info.value)
    assert "10.77.0.12" in text or WORKER in text, text[-3000:]
    print(f"[observed] up failed {time.monotonic() - t0:.1f} s after start; "
          f"error mentions: {[x.strip() for x in text.splitlines() if '10.77.0.12' in x][:3]}")
    pending, locks = _pending_and_locks(d)
    print(f"[observed] after the failed up: pending_operations={len(pending)} lock files={locks}")
    assert locks == [], locks  # a failed up releases its lock: no operator step needed
    with timed("up after worker came back"):
        r = d.run("up")
    assert r.summary.result == "succeeded"
    assert "spark-vllm-dev-ray-worker" in d.containers(WORKER)
    d.run("preview", expect_no_changes=True)
    status, _ = complete(d)
    assert status == 200
    reporting.record("faults: worker lost mid-up case", time.monotonic() - t0)


def _pending_and_locks(d) -> tuple[list, list[str]]:
    files = raw_state_files(d.workdir / "state")
    checkpoint = json.loads(next(t for n, t in files.items()
                                 if n.endswith("stacks/spark-vllm/dev.json")))
    pending = checkpoint["checkpoint"]["latest"].get("pending_operations") or []
    locks = [n for n in files if "/locks/" in n or n.startswith(".pulumi/locks")]
    return pending, locks


def cancel_stale_lock(d) -> None:
    """`pulumi cancel --yes --stack dev` with the stack's backend: removes the DIY backend lock."""
    env = {**os.environ, **d.stack.workspace.env_vars}
    r = subprocess.run(["pulumi", "cancel", "--yes", "--stack", "dev"], cwd=d.workdir, env=env,
                       text=True, capture_output=True, timeout=60, check=False)
    print(f"[operator] pulumi cancel: rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()}")


@pytest.mark.long  # docs/testing.md "Only in make test-all"
def test_up_interrupted_with_sigint_then_next_up_converges(deployment):
    """Ctrl-C in the operator's terminal (SIGINT to the process group of `pulumi up`, the plain
    CLI running the program through the language host) while vLLM restarts: during the health
    gate, which waits for the replaced vLLM container to serve (the longest step of the up)."""
    import signal

    d = deployment
    # another maxNumSeqs than the stack has: vllm-serve is replaced, then vllm-health waits
    d.set("vllm.maxNumSeqs", 6 if _config(d, "vllm.maxNumSeqs") != "6" else 5)
    env = {**os.environ, **d.stack.workspace.env_vars}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["pulumi", "up", "--yes", "--stack", "dev"], cwd=d.workdir, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    seen, sent = [], None
    try:
        for line in proc.stdout:
            seen.append(line.rstrip())
            print(f"[interrupted] {line.rstrip()}", flush=True)
            # the gate's create (not the delete of its previous run, which comes first)
            if sent is None and re.search(r"\bvllm-health\b.*\b(creating|updating)\b", line):
                time.sleep(5)
                os.killpg(proc.pid, signal.SIGINT)
                sent = time.monotonic()
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if sent is None:
            cancel_stale_lock(d)
    assert sent is not None, "the vllm-health step never started:\n" + "\n".join(seen[-30:])
    print(f"[observed] pulumi exit code {rc}, {time.monotonic() - sent:.1f} s after SIGINT")
    pending, locks = _pending_and_locks(d)
    pending_ops = [(p["type"], p["resource"]["urn"].split("::")[-1]) for p in pending]
    print(f"[observed] after SIGINT: pending_operations={pending_ops} lock files={locks}")
    assert locks == [], "Ctrl-C must leave no lock behind (the CLI cancels and releases it)"
    with timed("up after SIGINT"):
        r = d.run("up")
    assert r.summary.result == "succeeded"
    pending, locks = _pending_and_locks(d)
    assert pending == [] and locks == [], (pending, locks)
    d.run("preview", expect_no_changes=True)
    status, _ = complete(d)
    assert status == 200
    reporting.record("faults: sigint case", time.monotonic() - t0)
