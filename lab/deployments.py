"""Driving the lab from a test or bench process: the lab CLI, the lab lock, stacks on the lab, HTTP.

Used by tests/e2e, tests/promote, tests/lab (the lock) and bench/bench.py. Stdlib at import time:
Pulumi (`pulumi.automation`) and PyYAML are imported inside the functions that need them, so
`import lab.deployments` works with the system python3 too. Importing it puts the project's
toolchain (`~/.cache/spark-vllm/toolchain/bin`, see docs/toolchain.md) on PATH when present.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lab.layout import SESSION_ENV, SESSION_LOCK
from lab.util import session_held_by_parent

ROOT = Path(__file__).resolve().parents[1]
LAB = [sys.executable, str(ROOT / "lab" / "lab.py")]
LAB_CACHE = Path("/root/.cache/spark-vllm/lab")
TOOLCHAIN_BIN = Path.home() / ".cache" / "spark-vllm" / "toolchain" / "bin"
# The Automation API looks `pulumi` up on this process's PATH (not the workspace env_vars), and
# the CLI finds the language host beside itself.
if (TOOLCHAIN_BIN / "pulumi").exists():
    os.environ["PATH"] = f"{TOOLCHAIN_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


def lab(*args: str, check: bool = True, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LAB, *args], check=check, text=True, capture_output=True, timeout=timeout
    )


LAB_LOCK = SESSION_LOCK


_LOCK = {"fh": None, "holders": 0}


class _Held:
    """One holder's share of the lab lock; the flock is released when the last one closes."""

    def __init__(self) -> None:
        self.open = True

    def close(self) -> None:
        if self.open:
            self.open = False
            _LOCK["holders"] -= 1
            if _LOCK["holders"] == 0:
                _LOCK["fh"].close()
                _LOCK["fh"] = None
                if os.environ.get(SESSION_ENV) == str(os.getpid()):
                    os.environ.pop(SESSION_ENV, None)


def lock_lab() -> _Held:
    """Hold the lab for this process (an exclusive flock): one user of the lab at a time.

    Re-entrant within a process: tests/lab, tests/e2e and tests/promote may run in one pytest
    session, and a second flock on another open file would wait for the first forever.
    """
    import fcntl

    if _LOCK["fh"] is None:
        fh = open(LAB_LOCK, "a")  # noqa: SIM115  (held until the last holder closes it)
        if not session_held_by_parent(SESSION_ENV):  # else the test runner holds it for us
            fcntl.flock(fh, fcntl.LOCK_EX)
            os.environ[SESSION_ENV] = str(os.getpid())  # the lab.py runs of this session
        _LOCK["fh"] = fh
    _LOCK["holders"] += 1
    return _Held()


def _plugin_installed(name: str) -> bool:
    home = Path(os.environ.get("PULUMI_HOME", Path.home() / ".pulumi"))
    return any((home / "plugins").glob(f"resource-{name}-v*/pulumi-resource-{name}"))


@dataclass
class Deployment:
    """One stack on the lab, with the helpers tests use to observe the hosts."""

    stack: object
    workdir: Path
    cfg: dict
    events: list = field(default_factory=list)

    # ---- engine
    def run(self, op: str, **kwargs):
        self.events = []
        fn = getattr(self.stack, op)
        kwargs.setdefault("on_output", lambda line: print(line, flush=True))
        if op in ("up", "preview", "refresh", "destroy"):
            kwargs["on_event"] = self.events.append
        return fn(**kwargs)

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`spark-vllm <args>` (the console entry point of this checkout's venv) in the stack's
        folder, where it reads Pulumi.<stack>.yaml, with the stack's backend and passphrase in
        its environment: as an operator runs it."""
        exe = ROOT / "venv" / "bin" / "spark-vllm"
        env = {**os.environ, **(self.stack.workspace.env_vars or {})}
        return subprocess.run([str(exe), *args], cwd=self.workdir, capture_output=True,
                              text=True, timeout=timeout, env=env)

    def cli_follow(self, *args: str) -> subprocess.Popen:
        """`spark-vllm <args>` started in the stack's folder and left running (`logs -f`); its
        output is read by the caller, which ends it with SIGINT (Ctrl-C)."""
        import signal

        exe = ROOT / "venv" / "bin" / "spark-vllm"
        # Ctrl-C as in a terminal: a test run started in the background (CI) ignores SIGINT,
        # and a child inherits that; the operator's shell never does
        return subprocess.Popen([str(exe), *args], cwd=self.workdir, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def status(self) -> tuple[int, dict]:
        """`spark-vllm status --json` of this stack: (exit code, the JSON)."""
        r = self.cli("status", "-s", self.stack.name, "--json")
        try:
            return r.returncode, json.loads(r.stdout)
        except ValueError:
            raise AssertionError(f"status printed no JSON (rc {r.returncode}):\n{r.stdout}\n"
                                 f"{r.stderr}") from None

    def timed_up(self, what: str) -> dict[str, str]:
        """`up`, its wall time printed (`WALL <what>: ... s`), asserted to succeed; -> ops()."""
        t0 = time.monotonic()
        r = self.run("up")
        print(f"WALL {what}: {time.monotonic() - t0:.1f} s", flush=True)
        assert r.summary.result == "succeeded", r.summary.result
        return self.ops()

    def ops(self) -> dict[str, str]:
        """URN name -> engine op for every step that was not `same` in the last run."""
        result = {}
        for e in self.events:
            pre = getattr(e, "resource_pre_event", None)
            if pre is None or pre.metadata is None:
                continue
            op = str(getattr(pre.metadata.op, "value", pre.metadata.op))
            if op in ("same", "read"):
                continue
            # delete-before-replace shows as delete-replaced + create-replacement
            if op in ("create-replacement", "delete-replaced", "replace", "discard-replaced"):
                op = "replace"
            result[pre.metadata.urn.split("::")[-1]] = op
        return result

    def set(self, path: str, value) -> None:
        """Set one config value by path, e.g. set("vllm.maxNumSeqs", 8)."""
        import pulumi.automation as auto

        text = value if isinstance(value, str) else json.dumps(value)
        self.stack.set_config(f"spark-vllm:{path}", auto.ConfigValue(text), path=True)

    # ---- hosts
    def ssh(self, node: str, cmd: str, check: bool = True) -> str:
        r = lab("ssh", node, "sh", "-c", cmd, check=False, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"{node}: `{cmd}` failed: {r.stderr.strip()}")
        return r.stdout

    def containers(self, node: str) -> dict[str, tuple[str, str]]:
        """name -> (id, started at) of the running containers this stack manages on a node
        (another stack's, sharing the node, are not listed)."""
        out = self.ssh(
            node,
            "docker ps --filter label=spark-vllm.managed=true "
            f"--filter label=spark-vllm.stack=spark-vllm/{self.stack.name} "
            "--format '{{.Names}}' | "
            "xargs -r docker inspect -f '{{.Name}} {{.Id}} {{.State.StartedAt}}'",
        )
        rows = [line.split() for line in out.splitlines() if line.strip()]
        return {r[0].lstrip("/"): (r[1], r[2]) for r in rows}

    def snapshot(self) -> dict[str, dict]:
        return {n["name"]: self.containers(n["name"]) for n in self.cfg["nodes"]}

    def endpoint(self) -> str:
        return self.stack.outputs()["endpoint"].value

    def api_key(self) -> str:
        """The stack's vLLM API key (configured, or the one the stack made): a secret output."""
        return self.stack.outputs()["vllmApiKey"].value


def destroy_unless_kept(*deployments: Deployment) -> None:
    """A test module's teardown: destroy each deployment in turn unless E2E_KEEP=1 (to look at
    the lab afterwards). Every deployment is tried; a failed destroy then fails the teardown
    (pytest reports it as an error of the test that owns the fixture), so a destroy regression
    cannot pass unseen."""
    import pulumi.automation as auto

    if os.environ.get("E2E_KEEP") == "1":
        return
    failed = []
    for d in deployments:
        try:
            d.stack.destroy(on_output=print)
        except auto.CommandError as e:
            failed.append(f"{d.stack.name}: {e}")
    if failed:
        raise AssertionError("destroy failed at teardown:\n" + "\n".join(failed))


def remove_leftover_stack_containers(cfg: dict) -> None:
    """The lab is a test fixture: stack containers left by `make demo` or an interrupted run
    would collide with a test's own (the demo's stack is `dev` too: the same container names,
    ports and memory), so they go."""
    for node in cfg["nodes"]:
        left = lab("ssh", node["name"], "sh", "-c",
                   "docker ps -aq --filter label=spark-vllm.managed=true | xargs -r docker rm -f",
                   check=False)
        if left.stdout.strip():
            print(f"{node['name']}: removed leftover stack containers {left.stdout.split()}")


# The lab's embedding model (lab/tinymodel.py --arch qwen3embed: 128-dim, last-token pooling,
# normalized) as a `spark-vllm:services` entry beside the main model: on the head, port 8100, a
# 5% share with a small KV cache. `embed_service(revision)` adds the revision (a lab commit).
EMBED_REPO = "spark-lab/tiny-embed"
EMBED_CONTAINER = "spark-vllm-dev-embed"  # hostscripts/paths.StackNames("dev").service("embed")
_EMBED = {"name": "embed", "repo": EMBED_REPO, "task": "embed", "port": 8100,
          "servedModelName": "tiny-embed", "gpuMemoryUtilization": 0.05,
          "kvCacheMemoryBytes": 67108864, "maxNumSeqs": 2, "maxModelLen": 512,
          "enforceEager": True}


def embed_service(revision: str, **over) -> dict:
    return {**_EMBED, "revision": revision, **over}


def changed_bytes(endpoint: str, repo: str, old: str, new: str) -> tuple[int, int]:
    """(bytes of the files whose content differs between two revisions, bytes of `new`), from
    the hub's listing, as the program reads it (inspection/hub.resolve_model)."""
    from inspection.hub import resolve_model

    before, after = ({f.path: (f.etag, f.size)
                      for f in resolve_model(repo, r, endpoint, None).files} for r in (old, new))
    changed = sum(size for path, (etag, size) in after.items()
                  if before.get(path, ("", 0))[0] != etag)
    return changed, sum(size for _etag, size in after.values())


def hf_file_bytes() -> int:
    """Bytes of model files the lab's HF endpoint served (`/resolve/` downloads).

    The program asks the hub which commit the revision is on every run (small API calls under
    /api/); what must not repeat is moving the model's files.
    """
    paths = json.loads(lab("hf-bytes", "--json").stdout)["paths"]
    return sum(v["bytes"] for p, v in paths.items() if "/resolve/" in p)


def http(url: str, body: dict | None = None, timeout: int = 30,
         key: str | None = None) -> tuple[int, str]:
    """POST `body` (or GET) to the vLLM API; `key` goes as the Bearer token."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()




def complete(d: Deployment, prompt: str = "Say hello") -> str:
    """One completion from the served model (the lab's tiny-moe)."""
    _, body = http(
        d.endpoint() + "/completions",
        {"model": "tiny-moe", "prompt": prompt, "max_tokens": 8},
        key=d.api_key(),
    )
    return json.loads(body)["choices"][0]["text"]


def set_nodes(d: Deployment, nodes: list[dict]) -> None:
    """Write the node list (and TP = node count) into the stack file; d.cfg follows."""
    import yaml

    path = d.workdir / f"Pulumi.{d.stack.name}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["spark-vllm:nodes"] = [
        {k: n[k] for k in ("name", "host", "port", "user", "hostKey", "fabric")} for n in nodes
    ]
    doc["config"]["spark-vllm:vllm"]["tensorParallelSize"] = len(nodes)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    d.cfg = {**d.cfg, "nodes": nodes}


def sync_bytes_moved(d: Deployment, node: str) -> int | None:
    """`bytesMoved` printed by the last run of model-sync-<node> (from the stack's state)."""
    for r in d.stack.export_stack().deployment["resources"]:
        if r["urn"].endswith(f"::model-sync-{node}"):
            out = (r.get("outputs") or {}).get("stdout")
            if isinstance(out, str):
                for line in reversed(out.splitlines()):
                    if line.startswith("{") and "bytesMoved" in line:
                        return json.loads(line)["bytesMoved"]
    return None


def second_image(d: Deployment, node: str, base_ref: str, repo: str) -> tuple[str, str]:
    """The lab image plus a label, pushed as `repo`:v2: (ref by digest, image ID).

    Another image ID with the same layers. Built on `node`'s dockerd with the legacy builder:
    FROM a local image needs no network.
    """
    return _variant(d, node, base_ref, repo, "v2", ["LABEL spark-vllm.test=v2"])


FAULT = ROOT / "lab" / "faults" / "fail_at_model_load.py"


def faulty_image(d: Deployment, node: str, base_ref: str, repo: str) -> tuple[str, str]:
    """The lab image with one more layer whose vLLM fails while it loads the model (LAB ONLY
    FAULT, lab/faults/fail_at_model_load.py appended to the lab's platform plugin), pushed as
    `repo`:fail-at-model-load: (ref by digest, image ID). Its vLLM, Ray, serve check and image
    probe are the lab image's; only building the model fails, in every rank (issue 49)."""
    import base64

    code = base64.b64encode(FAULT.read_bytes()).decode()
    return _variant(d, node, base_ref, repo, "fail-at-model-load", [
        "LABEL spark-vllm.test=fail-at-model-load",
        "COPY fault.py /tmp/spark-lab-fault.py",
        "RUN set -e; plugin=$(python3 -c 'import os, vllm_lab_cpu; "
        "print(os.path.dirname(vllm_lab_cpu.__file__))'); "
        "cat /tmp/spark-lab-fault.py >> $plugin/platform.py; rm /tmp/spark-lab-fault.py",
    ], files={"fault.py": code})


def _variant(d: Deployment, node: str, base_ref: str, repo: str, tag: str, lines: list[str],
             files: dict[str, str] | None = None) -> tuple[str, str]:
    """`FROM base_ref` + `lines` built on `node`'s dockerd (the legacy builder: FROM a local
    image needs no network) with `files` (name -> base64) in its context, pushed as
    `repo`:`tag`: (ref by digest, image ID)."""
    import shlex

    dockerfile = "\n".join([f"FROM {base_ref}", *lines]) + "\n"
    put = "".join(f"printf %s {shlex.quote(b64)} | base64 -d > $ctx/{name}; "
                  for name, b64 in (files or {}).items())
    script = (
        f"set -e; docker pull -q {base_ref} >/dev/null; "
        f"ctx=$(mktemp -d); printf %s {shlex.quote(dockerfile)} > $ctx/Dockerfile; {put}"
        f"DOCKER_BUILDKIT=0 docker build -q --network none -t {repo}:{tag} $ctx >/dev/null; "
        "rm -rf $ctx; "
        f"docker push -q {repo}:{tag} >/dev/null 2>&1 || docker push {repo}:{tag} >/dev/null; "
        f"docker inspect --format '{{{{index .RepoDigests 0}}}} {{{{.Id}}}}' {repo}:{tag}"
    )
    ref, image_id = d.ssh(node, script).split()
    assert ref.startswith(repo + "@sha256:"), ref
    return ref, image_id


class Outage:
    """Completions through the stack's endpoint every `every` seconds in a thread while the
    block runs (an `up`) and, when the last one before the block's end failed, on until one
    answers (at most `settle` seconds more: the gateway's health check sees a vLLM that came
    back within 5 s): how long the model did not answer. `longest` is the longest stretch from
    the last answer before a run of failures to the first answer after it (the end of the
    polling when none came back), in seconds."""

    def __init__(self, d: Deployment, every: float = 0.5, model: str = "tiny-moe",
                 settle: float = 60) -> None:
        self.d, self.every, self.model, self.settle = d, every, model, settle
        self.samples: list[tuple[float, bool]] = []
        self._stop = None  # threading.Event, made on enter

    def __enter__(self) -> Outage:
        import threading

        url, key = self.d.endpoint() + "/completions", self.d.api_key()
        self._stop = threading.Event()

        def poll() -> None:
            while not self._stop.is_set():
                t = time.monotonic()
                try:
                    ok = http(url, {"model": self.model, "prompt": "Say hello", "max_tokens": 4},
                              timeout=5, key=key)[0] == 200
                except Exception:  # any failure (a 503, a timeout) is a moment without service
                    ok = False
                self.samples.append((t, ok))
                self._stop.wait(max(0.0, self.every - (time.monotonic() - t)))

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        end = time.monotonic() + self.settle
        while time.monotonic() < end and not (self.samples and self.samples[-1][1]):
            time.sleep(self.every)
        self._stop.set()
        self._thread.join(timeout=30)

    @property
    def longest(self) -> float:
        worst, last_ok, down = 0.0, None, False
        for t, ok in self.samples:
            if ok:
                if down and last_ok is not None:
                    worst = max(worst, t - last_ok)
                last_ok, down = t, False
            else:
                down = True
        if down and last_ok is not None and self.samples:
            worst = max(worst, self.samples[-1][0] - last_ok)
        return worst

    @property
    def answered_at_the_end(self) -> bool:
        return bool(self.samples) and self.samples[-1][1]


def project_dir(work: Path) -> Path:
    """A project folder for this checkout's program: Pulumi.yaml in `work` whose `main` is the
    checkout and whose virtualenv is the checkout's, so the CLI runs `__main__.py` through the
    Python language host exactly as `pulumi up` in the checkout does, with stack files in `work`."""
    import yaml

    doc = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    doc["main"] = str(ROOT)
    doc["runtime"]["options"]["virtualenv"] = str(ROOT / "venv")
    work.mkdir(parents=True, exist_ok=True)
    (work / "Pulumi.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return work


def new_deployment(work: Path, cfg: dict, passphrase: str = "spark-vllm-e2e",
                   stack_name: str = "dev", monitoring: bool = False) -> Deployment:
    """A fresh stack on the lab (`dev` unless named): the project's Pulumi.dev.yaml copied into
    `work` as the stack's file (the repository's is never touched), a file backend in
    `work/state`, the program run by the CLI through the language host. The copy keeps
    everything but the committed encryption salt: this stack has its own passphrase and state.

    `monitoring` (Pulumi.dev.yaml turns it on for `make demo`): off unless asked, so the tests'
    change tables measure the stack's own changes and stacks beside each other need no
    Prometheus ports of their own; tests/e2e/test_monitoring.py turns it on."""
    import pulumi.automation as auto

    project_dir(work)
    text = (ROOT / "Pulumi.dev.yaml").read_text().splitlines(keepends=True)
    drop = ("encryptionsalt:", "secretsprovider:", "encryptedkey:")
    kept = "".join(line for line in text if not line.startswith(drop))
    (work / f"Pulumi.{stack_name}.yaml").write_text(kept)
    state = work / "state"
    state.mkdir()
    env = {
        "PULUMI_BACKEND_URL": f"file://{state}",
        "PULUMI_CONFIG_PASSPHRASE": passphrase,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
    }
    stack = auto.create_or_select_stack(
        stack_name=stack_name, work_dir=str(work), opts=auto.LocalWorkspaceOptions(env_vars=env)
    )
    d = Deployment(stack=stack, workdir=work, cfg=cfg)
    if not monitoring:
        d.set("monitoring.enabled", False)
    return d
