"""The remote scripts, run locally with sh against recorded outputs and temp files."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from components import nccl
from hostscripts import common, foreign, images, models, monitoring, paths, ray, vllm
from hostscripts.deployment import GateRestore, Held, NodeDeployment
from hostscripts.models import ModelFile
from tests.conftest import ROOT

ID_A, ID_B = "a1" * 32, "b2" * 32  # container IDs as the daemon reports them (64 hex)
NAMES = paths.StackNames("dev")
KEY = NAMES.vllm_key_file

RAY_STATUS = ROOT / "tests" / "fixtures" / "gb10" / "ray-status-oshlabs.txt"


def _fake_docker(tmp_path: Path, body: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n" + body)
    docker.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _ray_status_text() -> str:
    if not RAY_STATUS.exists():
        pytest.skip("recorded ray status fixture not present")
    return "".join(RAY_STATUS.read_text().splitlines(keepends=True)[1:])  # drop the header


def test_ray_ready_accepts_the_recorded_two_node_status(tmp_path):
    status = tmp_path / "status.txt"
    status.write_text(_ray_status_text())
    env = _fake_docker(tmp_path, f"cat {status}\n")
    out = subprocess.run(["sh", "-c", ray.ray_ready("head", 2, 2, 5, f"{ID_A} {ID_B}")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ray ready: 2 nodes, 2 GPUs"


def test_ray_ready_times_out_with_a_clear_error(tmp_path):
    status = tmp_path / "status.txt"
    status.write_text(_ray_status_text())
    env = _fake_docker(tmp_path, f"cat {status}\n")
    out = subprocess.run(["sh", "-c", ray.ray_ready("head", 3, 3, 1, f"{ID_A} {ID_B} {ID_A}")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "want 3 nodes and 3 GPUs, have 2 nodes and 2 GPUs" in out.stderr


_FAKE_RAY = """# FAKE ray module for the drain payload's test: three alive nodes, one of them gone
def init(**_kw): pass
def shutdown(): pass
def nodes():
    return [{"Alive": True, "NodeManagerAddress": ip, "NodeID": "id-" + ip}
            for ip in ("192.168.177.11", "192.168.177.12", "192.168.177.13")] + [
            {"Alive": False, "NodeManagerAddress": "192.168.177.14", "NodeID": "id-dead"}]
"""


def _three_node_status() -> str:
    """The recorded 2-node `ray status` with a third active node (one that left the stack)."""
    lines = _ray_status_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if "node_" in line)
    return "".join([*lines[: i + 1], lines[i].replace("node_", "node_ffff"), *lines[i + 1:]])


def _drain_env(tmp_path: Path, ray_cli: str) -> tuple[dict[str, str], Path]:
    """A docker whose `exec ... python3` runs locally with the FAKE ray module, a FAKE `ray` CLI
    that logs its arguments, and a 3-node status."""
    status = tmp_path / "status.txt"
    status.write_text(_three_node_status())
    env = _fake_docker(tmp_path, 'if [ "$1" = exec ] && [ "$3" = python3 ]; then shift 3; '
                                 f'exec python3 "$@"; fi\ncat {status}\n')
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "ray.py").write_text(_FAKE_RAY)
    log = tmp_path / "ray-cli.log"
    cli = tmp_path / "bin" / "ray"
    cli.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n{ray_cli}")
    cli.chmod(0o755)
    return {**env, "PYTHONPATH": str(tmp_path / "mod")}, log


def test_ray_ready_drains_a_node_that_left_the_stack_once(tmp_path):
    """Issue 28's node-leaves case: Pulumi deletes the leaving node's Ray container last, after
    vLLM's new container placed its ranks; the ray-ready step drains it first."""
    env, log = _drain_env(tmp_path, "exit 0\n")
    script = ray.ray_ready("head", 2, 2, 5, f"{ID_A} {ID_B}", ["192.168.177.11", "192.168.177.12"])
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["drained Ray node 192.168.177.13: not one of the stack's nodes",
                                       "ray ready: 3 nodes, 2 GPUs"]
    assert log.read_text().splitlines() == [
        "drain-node --node-id id-192.168.177.13 --reason DRAIN_NODE_REASON_PREEMPTION "
        "--reason-message it left the spark-vllm stack"]


def test_ray_ready_fails_with_rays_message_when_a_drain_is_refused(tmp_path):
    env, _ = _drain_env(tmp_path, "echo 'node is not alive' >&2; exit 1\n")
    script = ray.ray_ready("head", 2, 2, 5, f"{ID_A} {ID_B}", ["192.168.177.11", "192.168.177.12"])
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "ray drain-node of 192.168.177.13 (id-192.168.177.13) failed: node is not alive" in out.stderr


def test_ray_ready_drains_nothing_when_every_node_is_the_stacks(tmp_path):
    env, log = _drain_env(tmp_path, "exit 0\n")
    (tmp_path / "status.txt").write_text(_ray_status_text())
    script = ray.ray_ready("head", 2, 2, 5, f"{ID_A} {ID_B}", ["192.168.177.11", "192.168.177.12"])
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ray ready: 2 nodes, 2 GPUs", out
    assert not log.exists()


def test_ray_ready_refuses_an_address_that_is_not_ipv4():
    with pytest.raises(ValueError):
        ray.ray_ready("head", 2, 2, 5, f"{ID_A} {ID_B}", ["192.168.177.11; rm -rf /"])


def _hf_cache(root, files: dict[str, bytes], commit: str = "c" * 40) -> list[ModelFile]:
    """A real HF cache layout: blobs named by the hub's etag (LFS sha256 for *.safetensors, the
    git blob id otherwise), snapshot symlinks."""
    import hashlib

    repo = root / "hub" / "models--org--m"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    out = []
    for path, data in files.items():
        if path.endswith(".safetensors"):
            etag = hashlib.sha256(data).hexdigest()
        else:
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / etag).write_bytes(data)
        link = repo / "snapshots" / commit / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(repo / "blobs" / etag, link.parent))
        out.append(ModelFile(path, len(data), etag))
    return out


def test_model_verify_checks_size_and_content_and_records_what_it_hashed(tmp_path):
    files = _hf_cache(tmp_path, {"config.json": b"abc", "sub/w.safetensors": b"12345"})
    script = models.model_verify(str(tmp_path), "org/m", "c" * 40, files,
                                 str(tmp_path / "stack" / "models"))
    ok = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"files": 2, "bytes": 8, "hashed": 2, "bad": []}
    again = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert json.loads(again.stdout)["hashed"] == 0, "verified blobs are not hashed again"
    # one byte changed in place, same size: found by content, the blob removed, vLLM not started
    blob = tmp_path / "hub" / "models--org--m" / "blobs" / files[1].etag
    blob.write_bytes(b"12346")
    bad = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1
    assert f"sub/w.safetensors: content does not match {files[1].etag}" in bad.stderr
    assert not blob.exists()
    # a short file: by size
    blob.write_bytes(b"1234")
    bad = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "sub/w.safetensors: 4 bytes, want 5" in bad.stderr


def test_recon_sees_a_verified_blob_changed_later_so_the_model_is_repaired(tmp_path):
    """model_verify records each blob it checked; recon's hf_cache snippet counts recorded blobs
    gone or changed (size or mtime) since, and cache_intact turns false, so the next `up` runs
    the model commands again (their prune step removes the bad blob)."""
    from inspection import parsers
    from inspection.facts import NodeFacts
    from inspection.hub import ModelManifest, cache_intact
    from inspection.recon import snippet

    commit = "c" * 40
    files = _hf_cache(tmp_path, {"config.json": b"abc", "w.safetensors": b"12345"}, commit)
    manifest = ModelManifest("org/m", "main", commit, tuple(files))
    records = tmp_path / "stack" / "models"
    script = models.model_verify(str(tmp_path), "org/m", commit, files, str(records))
    assert subprocess.run(["sh", "-c", script], capture_output=True, timeout=30).returncode == 0

    def seen() -> NodeFacts:
        out = subprocess.run(["bash", "-c", snippet("hf_cache.sh"), "_", str(tmp_path),
                              str(records), "models--org--m"],  # the stack's repo: its files
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return NodeFacts.model_construct(hf_cache=parsers.parse_hf_cache(out.stdout))

    facts = seen()
    assert facts.hf_cache[0].changed_blobs == 0 and cache_intact(facts, manifest)
    link = tmp_path / "hub" / "models--org--m" / "snapshots" / commit / files[1].path
    target = link.readlink()
    link.unlink()  # the weights' link gone, its blob still there: not intact either
    assert not cache_intact(seen(), manifest)
    link.symlink_to(target)
    assert cache_intact(seen(), manifest)
    blob = tmp_path / "hub" / "models--org--m" / "blobs" / files[1].etag
    with open(blob, "r+b") as fh:  # one byte, in place: same size, a new mtime
        fh.seek(2)
        fh.write(b"X")
    facts = seen()
    assert facts.hf_cache[0].changed_blobs == 1
    assert not cache_intact(facts, manifest)
    blob.unlink()  # gone is changed too
    assert seen().hf_cache[0].changed_blobs == 1


def test_the_verified_record_holds_only_the_served_commits_blobs(tmp_path):
    """After a revision change the old commit's blobs may go (a wiped repo restored with the
    new commit only, a pruned cache): had the record kept them, recon would count them as
    changed and plan a repair on every `up` (seen on the lab)."""
    from inspection import parsers
    from inspection.recon import snippet

    records = tmp_path / "stack" / "models"
    old = _hf_cache(tmp_path, {"config.json": b"abc", "w.safetensors": b"12345"}, "a" * 40)
    ok = subprocess.run(["sh", "-c", models.model_verify(str(tmp_path), "org/m", "a" * 40, old,
                                                         str(records))],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    new = _hf_cache(tmp_path, {"config.json": b"abc", "w.safetensors": b"67890"}, "b" * 40)
    ok = subprocess.run(["sh", "-c", models.model_verify(str(tmp_path), "org/m", "b" * 40, new,
                                                         str(records))],
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    record = (records / "verified-models--org--m").read_text().split("\n")
    assert sorted(line.split()[0] for line in record if line) == sorted(f.etag for f in new)
    (tmp_path / "hub" / "models--org--m" / "blobs" / old[1].etag).unlink()  # the old weights go
    out = subprocess.run(["bash", "-c", snippet("hf_cache.sh"), "_", str(tmp_path),
                          str(records)], capture_output=True, text=True, timeout=30)
    assert parsers.parse_hf_cache(out.stdout)[0].changed_blobs == 0


def test_sync_prunes_a_corrupted_blob_before_copying(tmp_path):
    """The prune step of model_sync/model_fetch: a wrong blob goes, the command succeeds (the
    copy that follows fetches the file again)."""
    files = _hf_cache(tmp_path, {"w.safetensors": b"abcdef"})
    blob = tmp_path / "hub" / "models--org--m" / "blobs" / files[0].etag
    blob.write_bytes(b"abcdeX")
    manifest = models.verify_manifest_json("org/m", "c" * 40, files)
    done = subprocess.run(["python3", "-c", models._VERIFY_PY, str(tmp_path),
                           str(tmp_path / "records"), "--prune"],
                          input=manifest, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert not blob.exists()
    assert "model_verify.py" not in models.model_sync("sha256:" + "a" * 64, "/c", {}, "/r"), \
        "the payload is inlined, not referenced by file name"
    assert "--prune" in models.model_sync("sha256:" + "a" * 64, "/c", {}, "/r")


def test_the_launcher_keeps_the_key_off_every_command_line(tmp_path):
    """The vLLM container runs `sh -c LAUNCHER LAUNCHER_NAME <argv>`: the key file's content
    becomes VLLM_API_KEY of the exec'd argv only, and the argv runs exactly as given."""
    key = tmp_path / "api-key"
    key.write_text("sk-unit\n")
    launcher = vllm.LAUNCHER.replace(paths.VLLM_KEY, str(key))
    argv = ["sh", "-c", 'printf "%s|" "$VLLM_API_KEY" "$@"', "x", "a b", "$(id)"]
    out = subprocess.run(["sh", "-c", launcher, vllm.LAUNCHER_NAME, *argv],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [vllm.START_MARKER, "sk-unit|a b|$(id)|"]
    assert "--api-key" not in vllm.LAUNCHER and "sk-unit" not in vllm.LAUNCHER


def test_the_non_carry_over_list_keeps_per_node_env_on_the_workers():
    """vLLM's Ray executor copies NCCL_*/UCX_* from the head to every worker unless they are
    listed in $VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json (https://github.com/spark-arena/sparkrun issue #135)."""
    assert "NCCL_IB_HCA" in nccl.PER_NODE_KEYS and "NCCL_SOCKET_IFNAME" in nccl.PER_NODE_KEYS
    text = vllm.non_carry_over_json(nccl.PER_NODE_KEYS)
    assert json.loads(text) == sorted(nccl.PER_NODE_KEYS)
    assert text == vllm.non_carry_over_json(tuple(reversed(nccl.PER_NODE_KEYS)))  # stable


def _gate(tmp_path: Path, states: list[str], probe: str) -> subprocess.CompletedProcess[str]:
    """Run vllm_health_gate against a fake docker: `docker inspect` answers `states` in turn
    (the last one repeats), `docker exec` runs `probe`, `docker logs` prints a line. Its
    verdict goes to tmp_path/deployment (health.onFailure keep: nothing is put back)."""
    (tmp_path / "states").write_text("\n".join(states) + "\n")
    env = _fake_docker(tmp_path, f"""
case "$1" in
  inspect) case "$3" in
    *Running*) echo true ;;
    *Status*) s=$(head -n 1 {tmp_path}/states); [ "$(wc -l < {tmp_path}/states)" -gt 1 ] &&
              sed -i 1d {tmp_path}/states; echo "$s" ;;
    *) echo 0 ;;
  esac ;;
  exec) {probe} ;;
  logs) echo "vllm: error: unrecognized arguments: --bogus" ;;
esac
""")
    keep = GateRestore(NodeDeployment(str(tmp_path / "deployment"), (Held("serve"),)),
                       api="serve", shape={"spark-1": ["serve"]}, on_failure="keep")
    script = vllm.vllm_health_gate("serve", "head", ID_A, "http://127.0.0.1:8000", "m", "hi", 60,
                                   key_file=KEY, deployment=keep)
    script = script.replace(KEY, "/dev/null")
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_gate_prints_the_probe_and_a_new_deployment_id_when_vllm_answers(tmp_path):
    ok = _gate(tmp_path, ["running 0"], 'echo \'{"health": "ok", "seconds": 3.0}\'')
    assert ok.returncode == 0, ok.stderr
    answer = json.loads(ok.stdout.strip().splitlines()[-1])
    assert answer["health"] == "ok" and answer["seconds"] == 3.0, answer
    assert re.fullmatch(r"[0-9a-f]{16}", answer["deployment"]), answer
    kept = json.loads((tmp_path / "deployment" / "verdict.json").read_text())
    assert kept["deployment"] == answer["deployment"]
    assert (tmp_path / "deployment" / "verdict.json").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "deployment").stat().st_mode & 0o777 == 0o700


def test_the_gate_stops_at_once_when_vllm_exits_and_keeps_the_log_tail_on_the_node(tmp_path):
    """A setting vLLM dies of: vLLM exits, Docker restarts the container. The probe would wait
    for the whole timeout; the gate stops within seconds. It reports the failure (the `up` fails
    at the model's deployment step, issue 49) and keeps vLLM's log tail in its verdict on the
    node, not in its output (the state)."""
    import time

    t0 = time.monotonic()
    bad = _gate(tmp_path, ["running 0", "running 0", "restarting 1"], "sleep 50")
    assert bad.returncode == 0, bad.stderr
    assert time.monotonic() - t0 < 30
    answer = json.loads(bad.stdout.strip().splitlines()[-1])
    assert answer["health"] == "failed"
    assert answer["why"] == "vllm serve exited while the gate waited (now: restarting 1)"
    assert answer["notRestored"] == "health.onFailure is keep: the failing version stays"
    assert "unrecognized arguments" not in bad.stdout
    kept = json.loads((tmp_path / "deployment" / "verdict.json").read_text())
    assert "unrecognized arguments: --bogus" in kept["log"]


def test_foreign_container_stop_and_start_are_inverse():
    stop = foreign.stop_foreign_container("vllm_node", "spark-vllm/dev")
    start = foreign.start_foreign_container("vllm_node")
    assert "docker stop vllm_node" in stop and "docker start vllm_node" in start


@pytest.mark.parametrize("bad", ["sha256:$(touch /tmp/x)", "sha256:" + "a" * 63,
                                 "sha256:" + "a" * 64 + "\nid", "latest"])
def test_an_image_id_read_from_a_host_must_be_of_its_exact_form(bad):
    """The head's image ID is pasted into the workers' scripts: only sha256:<64 hex> may pass."""
    with pytest.raises(common.RemoteValueError, match="not an image ID"):
        images.image_pull_from_head(NAMES, "repo:tag", "192.168.177.11", bad)
    with pytest.raises(common.RemoteValueError):
        models.model_seeder_stop(NAMES, ["spark-2"], "c" * 40, bad, ["192.168.177.11"])


@pytest.mark.parametrize("bad", [f"{ID_A}\nrm -rf /", "ray-head-id", f"{ID_A} $(id)", ""])
def test_container_ids_read_from_a_host_must_be_ids_before_a_comment(bad):
    with pytest.raises(common.RemoteValueError, match="not container IDs"):
        vllm.vllm_health_gate("serve", "head", bad, "http://127.0.0.1:8000", "m", "hi", 60,
                              key_file=KEY, deployment=GateRestore(
                                  NodeDeployment("/d", (Held("serve"),)), api="serve",
                                  shape={"spark-1": ["serve"]}, on_failure="keep"))
    with pytest.raises(common.RemoteValueError):
        ray.ray_ready("head", 2, 2, 5, bad)


@pytest.mark.parametrize("bad", ["../../etc/passwd", "a b", "x\ny", "-rm"])
def test_foreign_container_names_from_recon_are_checked(bad):
    with pytest.raises(common.RemoteValueError, match="not a container name"):
        foreign.stop_foreign_container(bad, "spark-vllm/dev")


def test_the_image_pull_quotes_every_value_in_its_message():
    script = images.image_pull_from_head(NAMES, "repo:tag", "192.168.177.11",
                                         "sha256:" + "c" * 64)
    assert "printf 'image %s has ID %s after load, head has %s\\n' repo:tag" in script


def _fake_ping(bin_dir, carries: int, reachable: set[str]):
    """A `ping` that answers when the destination is in `reachable` and `-s` <= `carries`."""
    bin_dir.mkdir(exist_ok=True)
    reach = " ".join(sorted(reachable))
    (bin_dir / "ping").write_text(
        "#!/bin/sh\nsize=56\nwhile [ $# -gt 1 ]; do\n"
        '  case $1 in -s) size=$2; shift ;; -I|-c|-W|-w|-i|-M) shift ;; esac\n  shift\ndone\n'
        f'case " {reach} " in *" $1 "*) ;; *) exit 1 ;; esac\n'
        f'[ "$size" -le {carries} ]\n')
    (bin_dir / "ping").chmod(0o755)


def test_fabric_check_names_both_nodes_the_interface_and_the_largest_size(tmp_path):
    from hostscripts.fabric import FabricPair, fabric_check

    script = fabric_check("spark-1", [FabricPair("enp1s0f1np1", "spark-2", "192.168.177.12"),
                                      FabricPair("enP2p1s0f1np1", "spark-2", "192.168.178.12")],
                          9000)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    _fake_ping(tmp_path / "bin", 8972, {"192.168.177.12", "192.168.178.12"})
    ok = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        "ok spark-1 enp1s0f1np1 -> spark-2 192.168.177.12 at MTU 9000",
        "ok spark-1 enP2p1s0f1np1 -> spark-2 192.168.178.12 at MTU 9000"]
    # a path that carries 1500 only, and a twin that does not answer at all
    _fake_ping(tmp_path / "bin", 1472, {"192.168.177.12"})
    bad = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert bad.returncode == 1
    assert ("fabric check failed: spark-1 enp1s0f1np1 -> spark-2 192.168.177.12 does not carry "
            "MTU 9000 unfragmented; the largest that passed is MTU 1500;") in bad.stderr
    assert ("fabric check failed: spark-1 enP2p1s0f1np1 -> spark-2 192.168.178.12: no reply at "
            "any size") in bad.stderr


def test_nccl_lines_are_read_from_the_current_vllm_run_only(tmp_path):
    """vllm_nccl_lines: the transport lines of the container's log after the last start
    marker (Docker keeps one log across the container's restarts), nothing else."""
    log = tmp_path / "vllm-serve.log"
    log.write_text(
        "spark-1:1:2 [0] NCCL INFO NET/IB : Using [0]old:1/RoCE [RO]; OOB x\n"
        f"{vllm.START_MARKER}\nINFO: other vLLM output\n"
        "spark-1:1:2 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.177.11<0>\n"
        "(RayWorkerWrapper pid=5, ip=192.168.177.12) spark-2:5:6 [0] NCCL INFO Channel 00/0 : "
        "1[0] -> 0[0] [send] via NET/Socket/0\n")
    script = vllm.vllm_nccl_lines("serve", "abc123")
    assert "# vllm-serve: abc123" in script
    env = _fake_docker(tmp_path, f'[ "$1 $2" = "logs serve" ] && cat {log}\n')
    out = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "spark-1:1:2 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.177.11<0>",
        "(RayWorkerWrapper pid=5, ip=192.168.177.12) spark-2:5:6 [0] NCCL INFO Channel 00/0 : "
        "1[0] -> 0[0] [send] via NET/Socket/0"]


def test_page_cache_drop_runs_again_only_when_the_model_changes():
    a = models.drop_page_cache("org/m", "c" * 40, [ModelFile("w.safetensors", 5, "e" * 64)])
    assert a == models.drop_page_cache("org/m", "c" * 40,
                                       [ModelFile("w.safetensors", 5, "e" * 64)])
    assert a != models.drop_page_cache("org/m", "d" * 40,
                                       [ModelFile("w.safetensors", 5, "e" * 64)])
    assert a != models.drop_page_cache("org/m", "c" * 40,
                                       [ModelFile("w.safetensors", 5, "f" * 64)])
    assert "sync\nif ! echo 3 > /proc/sys/vm/drop_caches; then" in a


def test_page_cache_drop_fails_clearly_when_it_cannot_write(tmp_path):
    script = models.drop_page_cache("org/m", "c" * 40, []).replace(
        "echo 3 > /proc/sys/vm/drop_caches", f"echo 3 > {tmp_path / 'no' / 'such' / 'file'}")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "cannot drop the page cache (/proc/sys/vm/drop_caches is not writable)" in out.stderr


def test_every_name_and_file_of_a_stack_is_its_own():
    """Two stacks on the same nodes share no container name and no file (hostscripts/paths
    StackNames), their compile caches included (issue 31)."""
    dev, prod = paths.StackNames("dev"), paths.StackNames("prod")
    assert (dev.serve, dev.ray_head, dev.ray_worker, dev.model_seeder) == (
        "spark-vllm-dev-serve", "spark-vllm-dev-ray-head", "spark-vllm-dev-ray-worker",
        "spark-vllm-dev-model-seeder")
    assert dev.service("embed") == "spark-vllm-dev-embed"
    assert dev.vllm_key_file == "/var/lib/spark-vllm/stacks/dev/vllm/api-key"
    assert dev.ray_token_file == "/var/lib/spark-vllm/stacks/dev/ray/auth-token"
    assert dev.ray_session_dir == "/run/spark-vllm/stacks/dev/ray-session"
    assert dev.service_key_file("embed") == "/var/lib/spark-vllm/stacks/dev/services/embed/api-key"
    assert dev.image_seeder_pid == "/run/spark-vllm-dev-image-seeder.pid"
    assert dev.gateway == "spark-vllm-dev-gateway"
    assert dev.gateway_key_file == "/var/lib/spark-vllm/stacks/dev/gateway/secrets/api-key.map"
    assert dev.gateway_tls_file == "/var/lib/spark-vllm/stacks/dev/gateway/secrets/tls.pem"
    assert (dev.prometheus, dev.node_exporter) == ("spark-vllm-dev-prometheus",
                                                   "spark-vllm-dev-node-exporter")
    assert dev.monitoring_key_file == "/var/lib/spark-vllm/stacks/dev/monitoring/secrets/api-key"
    assert dev.prometheus_data_dir == "/var/lib/spark-vllm/stacks/dev/prometheus-data"
    assert dev.collective == "spark-vllm-dev-collective"
    assert dev.collective_record == "/var/lib/spark-vllm/stacks/dev/collective-gate.json"
    assert dev.image_probe_record("sha256:" + "ab" * 32) == \
        "/var/lib/spark-vllm/stacks/dev/image-probe/" + "ab" * 32 + ".json"

    def every(s: paths.StackNames) -> list[str]:
        return [s.serve, s.ray_head, s.ray_worker, s.model_seeder, s.gateway, s.prometheus,
                s.node_exporter, s.collective, s.alertmanager, s.vllm_key_file,
                s.ray_token_file, s.ray_session_dir, s.image_seeder_pid, s.image_seeder_log,
                s.compile_cache_dir, s.gateway_dir, s.gateway_key_file, s.gateway_tls_file,
                s.monitoring_dir, s.monitoring_key_file, s.prometheus_data_dir,
                s.collective_record, s.image_probe_dir, s.image_probe_record("sha256:" + "ab" * 32),
                s.alertmanager_dir, s.alertmanager_data_dir, monitoring.textfile_dir(s.stack)]

    own, theirs = every(dev), every(prod)
    assert not set(own) & set(theirs) and len(set(own)) == len(own)
    assert dev.alertmanager == "spark-vllm-dev-alertmanager"
    assert dev.alertmanager_dir == "/var/lib/spark-vllm/stacks/dev/alertmanager"
    assert monitoring.textfile_dir("dev") == "/var/lib/spark-vllm-textfile/dev"
    # the stack's own containers' names are exactly the ones no service may take
    from config.forms import STACK_CONTAINERS
    assert own[:9] == [f"spark-vllm-dev-{w}" for w in STACK_CONTAINERS]
    with pytest.raises(ValueError, match="may not be named 'serve'"):
        dev.service("serve")
    for bad in ("", "a/b", "-x", "a b", "..", "x;rm"):
        with pytest.raises(ValueError):
            paths.StackNames(bad)


def _in(root: Path, script: str) -> str:
    """The script with the nodes' /var/lib/spark-vllm moved under `root` (a sandbox)."""
    return script.replace("/var/lib/spark-vllm", f"{root}/var/lib/spark-vllm")


@pytest.mark.parametrize("which", ["api key", "ray token"])
def test_the_secret_moves_into_the_stacks_folder_and_no_old_copy_stays(tmp_path, which):
    """Upgrade from the fixed paths (/var/lib/spark-vllm/vllm/api-key, .../ray/auth-token): the
    command that writes the stack's file removes the old one (and its folder when empty), so no
    copy of the secret is left behind; its delete removes the stack's file and empty folders."""
    names = paths.StackNames("dev")
    if which == "api key":
        write, remove = vllm.main_key_write(names), vllm.main_key_remove(names)
        new, old = names.vllm_key_file, paths.LEGACY_VLLM_KEY_FILE
    else:
        write, remove = ray.ray_token_write(names), ray.ray_token_remove(names)
        new, old = names.ray_token_file, paths.LEGACY_RAY_TOKEN_FILE
    assert f"rm -f {old}" in write
    legacy = Path(f"{tmp_path}{old}")
    legacy.parent.mkdir(parents=True)
    legacy.write_text("the-old-secret\n")
    done = subprocess.run(["sh", "-c", _in(tmp_path, write)], input="the-secret\n",
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    target = Path(f"{tmp_path}{new}")
    assert target.read_text() == "the-secret\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert not legacy.exists() and not legacy.parent.exists()
    assert done.stdout.split()[-1] == hashlib.sha256(b"the-secret\n").hexdigest()
    # a second run (an update) finds no old file and is just as happy
    again = subprocess.run(["sh", "-c", _in(tmp_path, write)], input="the-secret\n",
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 0, again.stderr
    # the delete removes the stack's file and its folders, up to the stack's, when empty
    gone = subprocess.run(["sh", "-c", _in(tmp_path, remove)], capture_output=True, text=True,
                          timeout=30)
    assert gone.returncode == 0, gone.stderr
    assert not target.exists() and not Path(f"{tmp_path}{names.dir}").exists()
    assert Path(f"{tmp_path}{paths.STACK_DIR}").is_dir()  # other stacks' folder stays


# --- removing a path of the stack's folder (hostscripts.common.stack_path_remove) -------------


def test_a_stack_path_goes_with_its_folders_up_to_the_stacks(tmp_path):
    names = paths.StackNames("t")
    folder = f"{names.dir}/gateway/secrets"
    assert common.stack_path_remove(names, f"{folder}/key") == (
        f"rm -f {folder}/key; rmdir {folder} {names.dir}/gateway {names.dir} "
        "2>/dev/null || true")
    assert common.stack_path_remove(names, f"{folder}/a", f"{folder}/b", tree=True) == (
        f"rm -rf {folder}/a {folder}/b; rmdir {folder} {names.dir}/gateway {names.dir} "
        "2>/dev/null || true")
    # run: the files go, a folder that still holds another file of the stack stays
    root = tmp_path / "stack"
    (root / "gateway" / "secrets").mkdir(parents=True)
    (root / "gateway" / "secrets" / "key").write_text("x")
    (root / "other").write_text("kept")
    text = common.stack_path_remove(names, f"{folder}/key").replace(names.dir, str(root))
    assert subprocess.run(["sh", "-c", text]).returncode == 0
    assert not (root / "gateway").exists() and (root / "other").read_text() == "kept"


@pytest.mark.parametrize("outside", [
    "/var/lib/other", "var/lib/spark-vllm/stacks/t/x", "{dir}", "{dir}x/data", "{dir}/../other/data",
    "{dir}/a/../../other", "{dir}/./data", "{dir}//data", "{dir}/data/", "relative/{dir}/x"])
def test_a_path_outside_the_stacks_folder_or_not_plain_is_refused(outside):
    names = paths.StackNames("t")
    with pytest.raises(ValueError, match="not in the stack's folder"):
        common.stack_path_remove(names, outside.format(dir=names.dir))


def test_paths_of_two_folders_or_none_are_refused():
    names = paths.StackNames("t")
    with pytest.raises(ValueError, match="one folder"):
        common.stack_path_remove(names, f"{names.dir}/a/x", f"{names.dir}/b/y")
    with pytest.raises(ValueError, match="no path"):
        common.stack_path_remove(names)
