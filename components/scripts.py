"""The shell scripts the stack runs on the nodes, as pure functions returning text.

Why here and not inline in components: every remote step is reviewable in one place, the text is
what `pulumi preview` diffs (so a changed script is a visible change), and the lab tests can run
the very same scripts against the simulated Sparks. Rules every script follows:

* POSIX sh, `set -eu`, idempotent (safe to re-run after a partial failure).
* Every value interpolated into a script goes through `shlex.quote`.
* Secrets are never interpolated: they arrive on stdin (the Command's `stdin`) and are piped
  straight into the process that needs them.
* Helper containers the scripts start carry the ownership labels, so recon never reports them
  as foreign containers.
* No script reads the provider's PULUMI_COMMAND_STDOUT/STDERR, so every Command sets
  `add_previous_output_in_env=False`: sshd refuses variables outside its AcceptEnv (Ubuntu's
  default is LANG LC_*) and the provider would warn on every update.

Moving bytes between nodes without node-to-node SSH trust: the head runs a short-lived HTTP
seeder bound to its fabric address (the model cache served read-only by the serving image's
python, or `docker save` of the image streamed by the host's python3), each other node pulls from
it with its own command, and a last command on the head stops the seeder. The seeder also stops
on its own after `SEED_TIMEOUT_SECONDS`, so a failed run leaves nothing behind for long.
"""

from __future__ import annotations

import hashlib

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence

HF_MOUNT = "/root/.cache/huggingface"  # HF_HOME inside every container
IMAGE_SEED_PORT = 18471
MODEL_SEED_PORT = 18472
SEED_TIMEOUT_SECONDS = 3600
MODEL_SEEDER = "spark-vllm-model-seeder"
STOPPED_DIR = "/var/lib/spark-vllm/stopped"  # markers of foreign containers the stack stopped
VLLM_LOG = "/var/log/spark-vllm/vllm-serve.log"  # inside the head Ray container
VLLM_PID = "/run/spark-vllm/vllm-serve.pid"
VLLM_KEY = "/run/spark-vllm/api-key"
VLLM_ARGV = "/run/spark-vllm/vllm-serve.argv"  # hash of the argv the running vLLM was given
VLLM_CONFIG_ROOT = "/run/spark-vllm/vllm-config"  # the stack's own VLLM_CONFIG_ROOT

q = shlex.quote


def repo_dir(repo: str) -> str:
    """The Hugging Face cache folder name of a model repo: models--<org>--<name>."""
    return "models--" + repo.replace("/", "--")


def label_flags(labels: Mapping[str, str]) -> str:
    return " ".join(f"--label {q(f'{k}={v}')}" for k, v in sorted(labels.items()))


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    """One OpenSSH known_hosts line for a pinned key (`[host]:port` form when port != 22)."""
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {host_key.strip()}"


# ---------------------------------------------------------------------------------------------
# Foreign containers


def stop_foreign_container(name: str, stack: str) -> str:
    """Stop a container the stack does not own, leaving a marker so recon keeps reporting it."""
    return "\n".join(
        [
            "set -eu",
            f"mkdir -p {q(STOPPED_DIR)}",
            f"printf '%s\\n' {q(stack)} > {q(STOPPED_DIR + '/' + name)}",
            f"docker stop {q(name)} >/dev/null",
            f"echo stopped {q(name)}",
        ]
    )


def start_foreign_container(name: str) -> str:
    """Give back a container the stack stopped (runs on destroy)."""
    return "\n".join(
        [
            "set -eu",
            f"docker start {q(name)} >/dev/null",
            f"rm -f {q(STOPPED_DIR + '/' + name)}",
            f"echo started {q(name)}",
        ]
    )


# ---------------------------------------------------------------------------------------------
# Image copy from the head (image.source = head)

# Both seeders bind with _NO_FQDN: http.server's HTTPServer.server_bind looks the bind address
# up with socket.getfqdn (reverse DNS). For a fabric address no resolver knows, that lookup
# times out: measured 10 s on the lab before the seeder listened, on every converge.
_NO_FQDN = """
class Server(http.server.ThreadingHTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
"""

_IMAGE_SEEDER_PY = r"""
import http.server, socketserver, subprocess, sys
""" + _NO_FQDN + r"""
ref = sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        p = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.end_headers()
        while True:
            b = p.stdout.read(1 << 20)
            if not b:
                break
            self.wfile.write(b)
        p.wait()
Server((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""


def image_seeder_start(ref: str, bind_ip: str, targets: Sequence[str]) -> str:
    """On the head: serve `docker save <ref>` over HTTP on the fabric address, in the background.

    `targets` is part of the text on purpose: adding a node changes it, so the seeder runs again
    for the new node's pull.
    """
    pidfile = "/run/spark-vllm-image-seeder.pid"
    return "\n".join(
        [
            "set -eu",
            f"# targets: {' '.join(targets)}",
            f"docker image inspect {q(ref)} >/dev/null",
            f"if [ -f {pidfile} ]; then kill \"$(cat {pidfile})\" 2>/dev/null || true; fi",
            f"setsid nohup timeout {SEED_TIMEOUT_SECONDS} python3 -c {q(_IMAGE_SEEDER_PY)} "
            f"{q(bind_ip)} {IMAGE_SEED_PORT} {q(ref)} </dev/null "
            ">/var/log/spark-vllm-image-seeder.log 2>&1 &",
            f"echo $! > {pidfile}",
            f"echo image seeder on {bind_ip}:{IMAGE_SEED_PORT}",
        ]
    )


def image_seeder_stop(targets: Sequence[str], ref: str) -> str:
    """Stops what image_seeder_start started. Carries `ref` as well as the targets: whatever
    makes the seeder run again must make the stop run again, or the seeder stays up."""
    pidfile = "/run/spark-vllm-image-seeder.pid"
    return "\n".join(
        [
            "set -eu",
            f"# targets: {' '.join(targets)} ref: {ref}",
            f"if [ -f {pidfile} ]; then kill \"$(cat {pidfile})\" 2>/dev/null || true; "
            f"rm -f {pidfile}; fi",
            "echo image seeder stopped",
        ]
    )


_FETCH_PY = r"""
import shutil, sys, time, urllib.request
url, deadline = sys.argv[1], time.time() + 120
while True:
    try:
        r = urllib.request.urlopen(url, timeout=60)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(1)
shutil.copyfileobj(r, sys.stdout.buffer, 1 << 20)
"""


def image_pull_from_head(ref: str, seed_ip: str, expect_id: str) -> str:
    """On another node: load the head's image from its seeder unless the same ID is present."""
    url = f"http://{seed_ip}:{IMAGE_SEED_PORT}/image.tar"
    return "\n".join(
        [
            "set -eu",
            f"have=$(docker image inspect --format '{{{{.Id}}}}' {q(ref)} 2>/dev/null || true)",
            f"if [ \"$have\" = {q(expect_id)} ]; then echo image present; exit 0; fi",
            f"python3 -c {q(_FETCH_PY)} {q(url)} | docker load",
            f"have=$(docker image inspect --format '{{{{.Id}}}}' {q(ref)})",
            f"if [ \"$have\" != {q(expect_id)} ]; then",
            f"  echo \"image {ref} has ID $have after load, head has {expect_id}\" >&2; exit 1",
            "fi",
            "echo image loaded",
        ]
    )


# ---------------------------------------------------------------------------------------------
# Model cache

_SNAPSHOT_PY = r"""
import sys
from huggingface_hub import snapshot_download
token = sys.stdin.read().strip() or None
print(snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2], token=token))
"""


def model_fetch(
    image: str,
    cache_dir: str,
    repo: str,
    commit: str,
    revision: str,
    endpoint: str | None,
    labels: Mapping[str, str],
) -> str:
    """On the head: download the snapshot at `commit` from the hub (or mirror) once.

    Runs the serving image's python (it ships huggingface_hub); the token is read from stdin by
    that python, never from the command line or an environment variable on the host.
    Incremental: files already in the cache are not downloaded again.
    """
    env = f"-e HF_ENDPOINT={q(endpoint)} " if endpoint else ""
    refs = f"{cache_dir}/hub/{repo_dir(repo)}/refs"
    lines = [
        "set -eu",
        f"mkdir -p {q(cache_dir)}",
        f"docker run -i --rm --network host {label_flags(labels)} "
        f"-v {q(cache_dir)}:{HF_MOUNT} -e HF_HOME={HF_MOUNT} -e HF_HUB_DISABLE_TELEMETRY=1 {env}"
        f"--entrypoint python3 {q(image)} -c {q(_SNAPSHOT_PY)} {q(repo)} {q(commit)}",
    ]
    if revision != commit:
        ref_file = f"{refs}/{revision}"
        lines += [
            f"mkdir -p \"$(dirname {q(ref_file)})\"",
            f"printf %s {q(commit)} > {q(ref_file)}",
        ]
    return "\n".join(lines)


# The model seeder: http.server's file handler, with the body sent by the kernel (sendfile)
# instead of 64 KiB Python copies; on a 200 Gb/s link the copy loop, not the wire, is the limit.
_MODEL_SEEDER_PY = r"""
import functools, http.server, socketserver, sys
""" + _NO_FQDN + r"""
class H(http.server.SimpleHTTPRequestHandler):
    def copyfile(self, source, outputfile):
        outputfile.flush()
        self.connection.sendfile(source)
bind, port, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
handler = functools.partial(H, directory=root)
Server((bind, port), handler).serve_forever()
"""


def model_seeder_start(
    image: str,
    cache_dir: str,
    repo: str,
    bind_ip: str,
    labels: Mapping[str, str],
    targets: Sequence[str],
    commit: str,
) -> str:
    """On the head: serve the repo's cache folder read-only over HTTP on the fabric address.

    `targets` and `commit` are in the text so the seeder runs again whenever a pull will.
    """
    root = f"{HF_MOUNT}/hub/{repo_dir(repo)}"
    return "\n".join(
        [
            "set -eu",
            f"# commit {commit} for: {' '.join(targets)}",
            f"docker rm -f {MODEL_SEEDER} >/dev/null 2>&1 || true",
            f"docker run -d --rm --name {MODEL_SEEDER} --network host {label_flags(labels)} "
            f"-v {q(cache_dir)}:{HF_MOUNT}:ro --entrypoint timeout {q(image)} "
            f"{SEED_TIMEOUT_SECONDS} python3 -c {q(_MODEL_SEEDER_PY)} "
            f"{q(bind_ip)} {MODEL_SEED_PORT} {q(root)} >/dev/null",
            f"echo model seeder on {bind_ip}:{MODEL_SEED_PORT}",
        ]
    )


def model_seeder_stop(targets: Sequence[str], commit: str, image: str) -> str:
    """Stops what model_seeder_start started. Carries the same inputs (targets, commit and the
    image the seeder runs): an image change re-runs the start, and without the image here the
    stop would not run again and the seeder would stay up after the update."""
    return "\n".join(
        [
            "set -eu",
            f"# commit {commit} for: {' '.join(targets)} image: {image}",
            f"docker rm -f {MODEL_SEEDER} >/dev/null 2>&1 || true",
            "echo model seeder stopped",
        ]
    )


_SYNC_PY = r"""
import json, os, sys, time, urllib.parse, urllib.request
m = json.load(sys.stdin)
root = "/root/.cache/huggingface/hub/" + m["repoDir"]
snap = root + "/snapshots/" + m["commit"]
base = "http://%s:%d/snapshots/%s/" % (m["seedIp"], m["seedPort"], m["commit"])
deadline = time.time() + 120
moved = 0
for f in m["files"]:
    blob = root + "/blobs/" + f["etag"]
    if not (os.path.isfile(blob) and os.path.getsize(blob) == f["size"]):
        os.makedirs(root + "/blobs", exist_ok=True)
        tmp = blob + ".incomplete"
        while True:
            try:
                r = urllib.request.urlopen(base + urllib.parse.quote(f["path"]), timeout=60)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(1)
        buf = bytearray(1 << 22)
        view = memoryview(buf)
        with open(tmp, "wb") as out:
            while True:
                n = r.readinto(buf)
                if not n:
                    break
                out.write(view[:n])
        if os.path.getsize(tmp) != f["size"]:
            sys.exit("size mismatch for %s: %d != %d"
                     % (f["path"], os.path.getsize(tmp), f["size"]))
        os.replace(tmp, blob)
        moved += f["size"]
    link = snap + "/" + f["path"]
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
if m["revision"] != m["commit"]:
    ref = root + "/refs/" + m["revision"]
    os.makedirs(os.path.dirname(ref), exist_ok=True)
    with open(ref, "w") as out:
        out.write(m["commit"])
print(json.dumps({"files": len(m["files"]), "bytesMoved": moved}))
"""


def model_manifest_json(
    repo: str, commit: str, revision: str, files: Iterable[Mapping], seed_ip: str
) -> str:
    """The stdin of a sync command: what to fetch, from where, at which commit."""
    return json.dumps(
        {
            "repoDir": repo_dir(repo),
            "commit": commit,
            "revision": revision,
            "seedIp": seed_ip,
            "seedPort": MODEL_SEED_PORT,
            "files": [{"path": f["path"], "size": f["size"], "etag": f["etag"]} for f in files],
        },
        sort_keys=True,
    )


def model_sync(image: str, cache_dir: str, labels: Mapping[str, str]) -> str:
    """On another node: pull missing/changed files from the head's seeder (manifest on stdin).

    Files land in the Hugging Face cache layout (blobs named by etag, snapshot symlinks, refs), so
    a later revision moves only the files whose content changed.
    """
    return "\n".join(
        [
            "set -eu",
            f"mkdir -p {q(cache_dir)}",
            f"docker run -i --rm --network host {label_flags(labels)} "
            f"-v {q(cache_dir)}:{HF_MOUNT} --entrypoint python3 {q(image)} -c {q(_SYNC_PY)}",
        ]
    )


def model_verify(cache_dir: str, repo: str, commit: str, files: Iterable[Mapping]) -> str:
    """On every node: every file of the commit present with the size the hub lists."""
    snap = f"{cache_dir}/hub/{repo_dir(repo)}/snapshots/{commit}"
    files = list(files)
    lines = [
        "set -eu",
        f"d={q(snap)}",
        "fail=0",
        "check() {",
        "  have=$(stat -L -c %s \"$d/$1\" 2>/dev/null || echo missing)",
        "  if [ \"$have\" != \"$2\" ]; then echo \"$d/$1: have $have bytes, want $2\" >&2; "
        "fail=1; fi",
        "}",
    ]
    lines += [f"check {q(f['path'])} {int(f['size'])}" for f in files]
    total = sum(int(f["size"]) for f in files)
    lines += [
        "if [ $fail -ne 0 ]; then echo \"model snapshot incomplete at $d\" >&2; exit 1; fi",
        f"echo verified {len(files)} files, {total} bytes at {commit}",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Ray


def ray_ready(container: str, nodes: int, gpus: int, timeout: int, container_ids: str) -> str:
    """On the head: poll `ray status` until every node and GPU has joined, or fail loudly."""
    return "\n".join(
        [
            "set -eu",
            f"# ray containers: {container_ids}",
            f"end=$(( $(date +%s) + {int(timeout)} ))",
            "while :; do",
            f"  out=$(docker exec {q(container)} ray status 2>&1) || true",
            "  n=$(printf '%s\\n' \"$out\" | awk '/^Active:/{a=1;next} /^[A-Za-z]/{a=0} "
            "a && /node_/{n++} END{print n+0}')",
            "  g=$(printf '%s\\n' \"$out\" | awk '$2==\"GPU\"{split($1,p,\"/\"); "
            "print int(p[2]); exit}')",
            "  g=${g:-0}",
            f"  if [ \"$n\" -ge {nodes} ] && [ \"$g\" -ge {gpus} ]; then",
            "    echo \"ray ready: $n nodes, $g GPUs\"; exit 0",
            "  fi",
            "  if [ \"$(date +%s)\" -ge \"$end\" ]; then",
            f"    echo \"ray cluster not ready after {int(timeout)}s: want {nodes} nodes and "
            f"{gpus} GPUs, have $n nodes and $g GPUs. ray status:\" >&2",
            "    printf '%s\\n' \"$out\" >&2; exit 1",
            "  fi",
            "  sleep 2",
            "done",
        ]
    )


# ---------------------------------------------------------------------------------------------
# vLLM


def vllm_argv(
    *,
    model: str,
    served_model_name: str,
    revision: str,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    max_num_seqs: int | None,
    kv_cache_dtype: str,
    enable_prefix_caching: bool,
    load_format: str,
    speculative_config: Mapping | None,
    enforce_eager: bool,
    host: str,
    port: int,
    extra_args: Sequence[str],
) -> list[str]:
    """The `vllm serve` command line. The API key is not here: it comes from VLLM_API_KEY."""
    argv = [
        "vllm",
        "serve",
        model,
        "--served-model-name",
        served_model_name,
        "--revision",
        revision,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--pipeline-parallel-size",
        str(pipeline_parallel_size),
        "--distributed-executor-backend",
        "ray",
        "--gpu-memory-utilization",
        f"{gpu_memory_utilization:g}",
    ]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    argv += ["--kv-cache-dtype", kv_cache_dtype]
    argv += ["--enable-prefix-caching" if enable_prefix_caching else "--no-enable-prefix-caching"]
    argv += ["--load-format", load_format]
    if speculative_config:
        argv += [
            "--speculative-config",
            json.dumps(dict(speculative_config), sort_keys=True, separators=(",", ":")),
        ]
    if enforce_eager:
        argv += ["--enforce-eager"]
    argv += ["--host", host, "--port", str(port)]
    argv += list(extra_args)
    return argv


_HEALTH_PY = r"""
import json, os, sys, time, urllib.request
url, name, prompt, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
key_file, pid_file = sys.argv[5], sys.argv[6]
key = open(key_file).read().strip() if os.path.exists(key_file) else ""
hdr = {"Content-Type": "application/json"}
if key:
    hdr["Authorization"] = "Bearer " + key
def call(path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=hdr)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read()
def alive():
    try:
        os.kill(int(open(pid_file).read()), 0)
        return True
    except (OSError, ValueError):
        return False
end, last = time.time() + timeout, ""
while True:
    try:
        if call("/health")[0] == 200:
            break
    except Exception as e:
        last = repr(e)
    if not alive():
        sys.exit("vllm serve exited before /health answered (%s)" % last)
    if time.time() > end:
        sys.exit("vllm serve not healthy after %ds: %s" % (timeout, last))
    time.sleep(3)
ids = [m["id"] for m in json.loads(call("/v1/models")[1])["data"]]
if name not in ids:
    sys.exit("/v1/models lists %s, not %s" % (ids, name))
out = json.loads(call("/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 8})[1])
print(json.dumps({"health": "ok", "models": ids, "smoke": out["choices"][0]["text"]}))
"""


def _stop_vllm_in(container: str) -> str:
    inner = (
        f"if [ -f {VLLM_PID} ]; then p=$(cat {VLLM_PID}); kill $p 2>/dev/null || true; "
        "i=0; while kill -0 $p 2>/dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done; "
        f"kill -9 $p 2>/dev/null || true; rm -f {VLLM_PID}; fi"
    )
    return f"docker exec {q(container)} sh -c {q(inner)} || true"


def vllm_start(
    container: str,
    argv: Sequence[str],
    health_url: str,
    served_model_name: str,
    smoke_prompt: str,
    timeout: int,
    ray_ready_stdout_marker: str,
    non_carry_over: Sequence[str] = (),
) -> str:
    """On the head: make `vllm serve` run `argv` inside the head Ray container, gate on health.

    Idempotent: a vLLM that is alive with the same argv and the same API key is left running and
    only re-checked, so running the command again never costs a restart. It runs again when its
    text changes (new flags, a replaced Ray container: `ray_ready_stdout_marker` holds their IDs)
    or when recon found the cluster under vLLM broken (VllmServer's restart marker).

    stdin carries the API key (possibly empty); it is written to a root-only file inside the
    container and exported as VLLM_API_KEY by the shell that execs vLLM, so it is never on a
    command line.

    `non_carry_over`: env keys vLLM's Ray executor must not copy from the head to the workers
    (per-node values, nccl.PER_NODE_KEYS). vLLM reads them from
    $VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json; the stack keeps its own config root so
    a file the image may carry elsewhere is left alone.
    """
    serve = " ".join(q(a) for a in argv)
    keep = json.dumps(sorted(non_carry_over))
    want = hashlib.sha256(f"{serve}\n{keep}".encode()).hexdigest()[:16]
    launch = (
        f"mkdir -p $(dirname {VLLM_LOG}) {VLLM_CONFIG_ROOT}; echo $$ > {VLLM_PID}; "
        f"printf '%s\\n' {q(keep)} > {VLLM_CONFIG_ROOT}/ray_non_carry_over_env_vars.json; "
        f"VLLM_CONFIG_ROOT={VLLM_CONFIG_ROOT}; export VLLM_CONFIG_ROOT; "
        f"if [ -s {VLLM_KEY} ]; then VLLM_API_KEY=$(cat {VLLM_KEY}); export VLLM_API_KEY; fi; "
        f"exec {serve} >> {VLLM_LOG} 2>&1"
    )
    store_key = f"umask 077; mkdir -p $(dirname {VLLM_KEY}); cat > {VLLM_KEY}.new"
    same = (
        f"test -s {VLLM_PID} && kill -0 $(cat {VLLM_PID}) 2>/dev/null && "
        f"[ \"$(cat {VLLM_ARGV} 2>/dev/null)\" = {want} ] && cmp -s {VLLM_KEY}.new {VLLM_KEY}"
    )
    adopt = f"mv {VLLM_KEY}.new {VLLM_KEY} && echo {want} > {VLLM_ARGV}"
    return "\n".join(
        [
            "set -eu",
            f"# ray containers: {ray_ready_stdout_marker}",
            f"docker exec -i {q(container)} sh -c {q(store_key)}",
            f"if docker exec {q(container)} sh -c {q(same)}; then",
            f"  docker exec {q(container)} rm -f {VLLM_KEY}.new",
            "  echo 'vllm serve already runs this configuration: not restarted'",
            "else",
            "  " + _stop_vllm_in(container).replace("\n", "\n  "),
            f"  docker exec {q(container)} sh -c {q(adopt)}",
            f"  docker exec -d {q(container)} sh -c {q(launch)}",
            "fi",
            f"if ! docker exec {q(container)} python3 -c {q(_HEALTH_PY)} {q(health_url)} "
            f"{q(served_model_name)} {q(smoke_prompt)} {int(timeout)} {VLLM_KEY} {VLLM_PID}; then",
            f"  echo '--- last 50 lines of {VLLM_LOG} in {container} ---' >&2",
            f"  docker exec {q(container)} tail -n 50 {VLLM_LOG} >&2 || true",
            "  exit 1",
            "fi",
        ]
    )


def vllm_stop(container: str) -> str:
    return "\n".join(["set -eu", _stop_vllm_in(container), "echo vllm serve stopped"])
