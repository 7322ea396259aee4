"""Security round 4 (issue 46) on the lab, where the harm is on a node: on the session's shared
stack (tests/e2e/conftest.py: converged, Ray, 2 nodes, the model's `main`), each case undoing
what it plants in a `finally`.

1. Shared memory (item 3): no container of the stack shares the node's IPC namespace; vLLM's
   `psm_*` segments (its shared-memory broadcast, which its readers unpickle) are in its
   container's /dev/shm, none in the node's, and TP=2 serves. (The same with mp:
   tests/e2e/test_executor_mp.py.)
2. The token (item 6): a `token` left in the cache folder by `hf auth login` reaches no
   container: they mount the cache's hub/ only.
3. Links in the model cache (item 1): a link planted at each name root writes there, on the
   head and on the worker, changes nothing outside the cache and fails the `up` naming that path;
   the verify's record is the stack's own, never the cache's; the undone cache converges.
4. An image's own labels (item 7): a container of an image built with the stack's labels is
   foreign to preflight, and the preview fails naming it.
5. The gateway (item 5): 600 idle connections without the key from the worker's address while
   the lab machine's authenticated client gets completions at once; `spark-vllm status` counts
   what the gateway refused.

The image copy (item 4) is proved against a real Docker daemon in the engine tier
(tests/engine/test_image_copy.py: a forged `docker save` stream that would retag another image);
the lab's dev stack pulls its image from the registry.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pulumi.automation as auto
import pytest

from lab.deployments import complete
from tests.conftest import ROOT
from tests.e2e.conftest import HEAD, MODEL_DIR, WORKER

pytestmark = [pytest.mark.lab, pytest.mark.engine]

CACHE = "/root/.cache/huggingface"
SERVE, RAY_HEAD, RAY_WORKER = ("spark-vllm-dev-serve", "spark-vllm-dev-ray-head",
                               "spark-vllm-dev-ray-worker")
VICTIM = "/root/spark-vllm-issue46-victim"
VICTIM_TEXT = "a file outside the cache"
RECORD = "/var/lib/spark-vllm/stacks/dev/models/verified-models--spark-lab--tiny-moe"


@pytest.fixture(scope="module")
def sec(stack):
    return stack


def _ipc_modes(d, node: str) -> dict[str, str]:
    out = d.ssh(node, "docker ps -q --filter label=spark-vllm.stack=spark-vllm/dev | xargs -r "
                      "docker inspect -f '{{.Name}} {{.HostConfig.IpcMode}}'")
    return dict(line.lstrip("/").split() for line in out.splitlines() if line.strip())


def test_vllm_shared_memory_is_the_stacks_own_not_the_nodes(sec):
    d = sec
    assert complete(d)  # TP=2 serves (and vLLM's queues are in use)
    modes = {n: _ipc_modes(d, n) for n in (HEAD, WORKER)}
    print(f"[observed] IPC modes: {modes}")
    assert modes[HEAD][RAY_HEAD] == "shareable" and modes[WORKER][RAY_WORKER] == "private"
    assert modes[HEAD][SERVE].startswith("container:")  # the Ray head's
    assert not [m for node in modes.values() for m in node.values() if m == "host"], modes
    inside = set(d.ssh(HEAD, f"docker exec {SERVE} ls /dev/shm").split())
    psm = {n for n in inside if n.startswith("psm_")}
    assert psm, f"vLLM made no psm_* segment in its /dev/shm: {sorted(inside)}"
    # the node's /dev/shm: another filesystem, and none of vLLM's segments (segments left there
    # by runs before this change may remain: they are not these)
    node = set(d.ssh(HEAD, "ls /dev/shm").split())
    assert not psm & node, sorted(psm & node)
    dev_node = d.ssh(HEAD, "stat -c %d /dev/shm").strip()
    dev_inside = d.ssh(HEAD, f"docker exec {SERVE} stat -c %d /dev/shm").strip()
    assert dev_node != dev_inside
    print(f"[observed] vLLM's segments in its container: {len(psm)}, in the node's /dev/shm: 0")


def test_a_token_in_the_cache_folder_reaches_no_container(sec):
    d = sec
    d.ssh(HEAD, f"printf hf_issue46_planted > {CACHE}/token")
    try:
        for c in (SERVE, RAY_HEAD):
            assert d.ssh(HEAD, f"docker exec {c} sh -c 'test -e {CACHE}/token && echo seen || "
                               f"echo absent; test -d {MODEL_DIR} && echo hub'").split() == [
                "absent", "hub"], c
        for node in (HEAD, WORKER):
            out = d.ssh(node, "docker ps -q --filter label=spark-vllm.stack=spark-vllm/dev | "
                              "xargs -r docker inspect -f '{{json .Mounts}}'")
            sources = {m["Source"] for line in out.splitlines() for m in json.loads(line)}
            assert CACHE not in sources and f"{CACHE}/hub" in sources, sources
    finally:
        d.ssh(HEAD, f"rm -f {CACHE}/token")


def _failed_up(d) -> str:
    t0 = time.monotonic()
    with pytest.raises(auto.CommandError) as info:
        d.run("up")
    print(f"WALL security: a failed up: {time.monotonic() - t0:.1f} s")
    return str(info.value)


def _smallest_blob(d, node: str) -> str:
    return d.ssh(node, f"ls -S {MODEL_DIR}/blobs | grep -v incomplete | tail -1").strip()


def test_root_follows_no_link_planted_in_the_model_cache(sec):
    """The reproduction (issue 46): `refs/main` linked to a file elsewhere on the head; the
    fetch wrote the commit into it. Then a blob on the worker linked to a file outside, which
    the prune read and removed as root, and the record's old folder in the cache."""
    d = sec
    ref, victim_dir = f"{MODEL_DIR}/refs/main", VICTIM + "-dir"
    commit = d.ssh(HEAD, f"cat {ref}").strip()
    head_blob, worker_blob = _smallest_blob(d, HEAD), _smallest_blob(d, WORKER)
    # A stack pinned to a commit (test_lab_stack leaves it so) writes no ref: the head's link
    # is then a blob, which the head's verify reads and would prune as root, like the worker's.
    pinned = re.fullmatch(r"[0-9a-f]{40}", d.stack.get_config(
        "spark-vllm:model.revision", path=True).value) is not None
    head_link = f"{MODEL_DIR}/blobs/{head_blob}" if pinned else ref
    print(f"[observed] the stack's revision is {'a commit' if pinned else 'main'}: the head's "
          f"link is {head_link}")
    for node in (HEAD, WORKER):
        d.ssh(node, f"printf '{VICTIM_TEXT}' > {VICTIM}; rm -rf {victim_dir}; "
                    f"mkdir {victim_dir}; rm -rf {CACHE}/.spark-vllm; "
                    f"ln -s {victim_dir} {CACHE}/.spark-vllm")
    try:
        # the head: a blob gone (so the fetch runs again) and refs/main a link, or (pinned)
        # that blob a link
        d.ssh(HEAD, f"rm {MODEL_DIR}/blobs/{head_blob} && rm -f {head_link} && "
                    f"ln -s {VICTIM} {head_link}")
        text = _failed_up(d)
        assert f"refused: {head_link} is a symbolic link" in text, text[-3000:]
        assert d.ssh(HEAD, f"cat {VICTIM}") == VICTIM_TEXT
        d.ssh(HEAD, f"rm {head_link}")
        # the worker: a blob a link to a file outside the cache
        d.ssh(WORKER, f"rm {MODEL_DIR}/blobs/{worker_blob} && "
                      f"ln -s {VICTIM} {MODEL_DIR}/blobs/{worker_blob}")
        text = _failed_up(d)
        assert f"refused: {MODEL_DIR}/blobs/{worker_blob} is a symbolic link" in text, \
            text[-3000:]
        assert d.ssh(WORKER, f"cat {VICTIM}") == VICTIM_TEXT
        d.ssh(WORKER, f"rm {MODEL_DIR}/blobs/{worker_blob}")
        # undone: the next up converges, the blobs fetched again, the ref a file of its own
        ops = d.timed_up("security: the cache undone")
        assert f"model-sync-{WORKER}" in ops, ops  # (the head's fetch ran in the second up)
        assert d.ssh(HEAD, f"test -f {ref} && test ! -L {ref} && cat {ref}").strip() == commit
        for node in (HEAD, WORKER):
            assert d.ssh(node, f"cat {VICTIM}") == VICTIM_TEXT
            # the verify's record is in the stack's own folder, not in the cache's
            assert d.ssh(node, f"ls -A {victim_dir}").strip() == "", node
            assert d.ssh(node, f"stat -c '%a %U' {RECORD}").strip() == "600 root", node
        assert complete(d)
    finally:
        for node in (HEAD, WORKER):
            d.ssh(node, f"if [ -L {ref} ]; then rm {ref}; fi; "
                        f"for b in {MODEL_DIR}/blobs/*; do [ -L \"$b\" ] && rm \"$b\"; done; "
                        f"rm -rf {VICTIM} {victim_dir} {CACHE}/.spark-vllm; true")
    d.run("preview", expect_no_changes=True)


def test_an_image_with_the_stacks_labels_runs_no_container_of_the_stacks(sec):
    """A container inherits its image's labels: one built with `LABEL spark-vllm.managed=true
    spark-vllm.stack=spark-vllm/dev` (or a docker commit of a stack's container) counted as the
    stack's and passed preflight unseen. It is foreign now."""
    d = sec
    image = d.ssh(HEAD, f"docker inspect -f '{{{{.Image}}}}' {SERVE}").strip()
    labels = ("spark-vllm.managed=true spark-vllm.stack=spark-vllm/dev "
              "spark-vllm.role=vllm-serve")
    d.ssh(HEAD, f"printf 'FROM {image}\\nLABEL {labels}\\n' | docker build -q -t svl46-heir - "
                ">/dev/null && docker run -d --name svl46-heir --entrypoint sleep svl46-heir "
                "600 >/dev/null")
    try:
        with pytest.raises(auto.CommandError) as info:
            d.run("preview")
        text = str(info.value)
        assert "foreign container svl46-heir (image svl46-heir)" in text, text[-3000:]
    finally:
        d.ssh(HEAD, "docker rm -f svl46-heir >/dev/null; docker rmi svl46-heir >/dev/null")
    d.run("preview", expect_no_changes=True)


# 600 connections opened from the worker to the gateway and held, then how each ended: closed
# by the gateway (reset or EOF) within the wait, or still open
_IDLE = """
import socket, sys, time
host, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks, refused = [], 0
for _ in range(n):
    try:
        socks.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        refused += 1
print("opened", len(socks), "refused", refused, flush=True)
end, closed = time.time() + hold, 0
for s in socks:
    s.settimeout(max(0.01, end - time.time()))
    try:
        while s.recv(4096):
            pass
        closed += 1
    except ConnectionResetError:
        closed += 1
    except OSError:
        pass
print("closed", closed, "open", len(socks) - closed, flush=True)
"""


def test_600_idle_connections_without_the_key_leave_an_authenticated_client_served(sec):
    d = sec
    host = d.cfg["nodes"][0]["host"]
    port = int(d.endpoint().rsplit(":", 1)[1].split("/")[0])
    code, before = d.status()
    refused_before = (before.get("gateway") or {}).get("refused", 0)
    idle = subprocess.Popen([sys.executable, str(ROOT / "lab" / "lab.py"), "ssh", WORKER,
                             "python3", "-c",
                             _IDLE, host, str(port), "600", "15"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # the connections are opened (and the gateway has judged them)
        times = []
        for _ in range(5):
            t0 = time.monotonic()
            assert complete(d)
            times.append(time.monotonic() - t0)
        out, err = idle.communicate(timeout=120)
    finally:
        if idle.poll() is None:
            idle.kill()
    print(f"[measured] 600 idle connections from {WORKER}: {out.strip()}; completions meanwhile "
          f"{', '.join(f'{t:.2f}' for t in times)} s")
    opened = int(out.split()[1])
    assert "closed" in out and int(out.split()[-1]) == 0, out + err  # none held beyond 15 s
    assert max(times) < 5, times
    code, after = d.status()
    gw = after["gateway"]
    print(f"[observed] spark-vllm status: gateway {gw}")
    assert gw["refused"] - refused_before >= 600 - 64, (gw, refused_before, opened)
    assert code == 0 and after["serving"] is True
