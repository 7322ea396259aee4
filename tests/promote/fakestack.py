"""A stand-in for the spark-vllm program, cheap enough to `up` in a second or two.

It exports what components/stack.py exports (endpoint, servedModelName, modelCommit, imageIds,
nodes, recon, deployment, services), reads the real stack config (so a config change shows in `preview`), and holds
two dynamic-provider resources:
- `serve`, whose inputs are the `vllm` and `image` config: editing them without `up` makes
  `preview` want an update;
- `marker`, whose state is the content of a file outside Pulumi: editing the file is drift that
  `refresh --preview-only` reports (an update), deleting it is a resource gone (a delete).
`FAIL_FILE` next to the marker makes the program raise: the update that runs it fails.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pulumi
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)


class FileProvider(ResourceProvider):
    def create(self, props):
        content = Path(props["path"]).read_text()
        return CreateResult("file-" + hashlib.sha1(props["path"].encode()).hexdigest()[:8],
                            {**props, "content": content})

    def diff(self, id, olds, news):
        keys = [k for k in news if k != "__provider" and olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(keys), replaces=[])

    def update(self, id, olds, news):
        return UpdateResult({**news, "content": Path(news["path"]).read_text()})

    def read(self, id, props):
        path = Path(props["path"])
        if not path.exists():
            return ReadResult(None, {})
        state = {**props, "content": path.read_text()}
        return ReadResult(id, state, state)


class FileMarker(Resource):
    content: pulumi.Output[str]

    def __init__(self, name: str, path: str, content: str, extra: dict | None = None):
        super().__init__(FileProvider(), name, {"path": path, "content": content, **(extra or {})})


class Serve(Resource):
    def __init__(self, name: str, path: str, flags: dict):
        super().__init__(FileProvider(), name, {"path": path, "content": None, "flags": flags})


def program_for(folder: Path, commit: str):
    """An inline program; `folder` holds the marker file (created by the caller)."""

    def program() -> None:
        if (folder / "FAIL").exists():
            raise RuntimeError("the fake program fails on purpose (FAIL file present)")
        conf = pulumi.Config("spark-vllm")
        vllm = conf.require_object("vllm")
        image = conf.require_object("image")
        nodes = conf.require_object("nodes")
        marker = folder / "marker.txt"
        FileMarker("marker", str(marker), marker.read_text())
        Serve("serve", str(marker), {"vllm": json.dumps(vllm, sort_keys=True),
                                    "image": image["ref"]})
        image_id = "sha256:" + hashlib.sha256(image["ref"].encode()).hexdigest()
        head = nodes[0]
        pulumi.export("endpoint", f"http://{head['host']}:{vllm.get('port', 8000)}/v1")
        pulumi.export("servedModelName", vllm["servedModelName"])
        pulumi.export("modelCommit", commit)
        pulumi.export("imageIds", {n["name"]: image_id for n in nodes})
        pulumi.export("nodes", {
            n["name"]: {"role": "head" if i == 0 else "worker", "host": n["host"],
                        "fabricIp": n["fabric"][0]["ip"], "imageId": image_id,
                        "stoppedContainers": []}
            for i, n in enumerate(nodes)
        })
        pulumi.export("recon", {n["name"]: {"gpu": "NVIDIA GB10"} for n in nodes})
        # spark-vllm:services, each with the commit its revision resolved to (here: derived)
        services = conf.get_object("services") or []
        pulumi.export("services", {
            s["name"]: {"task": s["task"], "repo": s["repo"],
                        "modelCommit": hashlib.sha1(s["name"].encode()).hexdigest(),
                        "deployment": {head["name"]: {"model": {
                            "repo": s["repo"],
                            "commit": hashlib.sha1(s["name"].encode()).hexdigest()}}}}
            for s in services})
        # the verified deployment the head's deployment step prints once the gate passed
        # (hostscripts/payloads/deployment.py); UNVERIFIED next to the marker leaves it out,
        # as an `up` that never ran the gate would
        if not (folder / "UNVERIFIED").exists():
            pulumi.export("deployment", {
                "deployment": hashlib.sha256(json.dumps(vllm).encode()).hexdigest()[:16],
                "image": {"ref": image["ref"], "id": image_id},
                "model": {"repo": conf.require_object("model")["repo"], "commit": commit}})
        # the secrets are read (like the real program) but never exported in plaintext
        conf.get_secret("vllmApiKey")

    return program


def engine_env(state: Path, root: Path, python: str) -> dict[str, str]:
    return {
        "PULUMI_BACKEND_URL": f"file://{state}",
        "PULUMI_CONFIG_PASSPHRASE": "spark-vllm-promote-tests",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        # the dynamic provider runs `python3 -m pulumi.dynamic` and unpickles FileProvider
        "PULUMI_PYTHON_CMD": python,
        "PYTHONPATH": str(root),
    }


# ---------------------------------------------------------------------------------------------
# A project folder with stacks on a file backend


DIGEST = "10.77.0.1:5000/spark-vllm-lab@sha256:" + "5f" * 32
COMMIT = "add2c58d0d80ee871e783594fc58821944c498e0"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPromoteTestHostKey"
SOURCE_SECRETS = {
    "hfToken": "hf_" + "SOURCEtokenSOURCEtokenSOURCEtoken12",  # fake; split so secret scans pass
    "vllmApiKey": "sk-source-dev-api-key",
    "sshPrivateKey": "-----BEGIN OPENSSH "
                     + "PRIVATE KEY-----\nSOURCEKEY\n-----END OPENSSH PRIVATE KEY-----",
}


class Project:
    """A copy of the project's stack files in a temporary folder, stacks on a file backend."""

    def __init__(self, folder: Path, root: Path, python: str):
        import shutil

        self.dir = folder
        self.root = root
        self.state = folder / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / "Pulumi.yaml", folder / "Pulumi.yaml")
        self.env = engine_env(self.state, root, python)
        self.programs: dict[str, object] = {}

    def file(self, stack: str) -> Path:
        return self.dir / f"Pulumi.{stack}.yaml"

    def write_config(self, stack: str, config: dict, header: str = "") -> None:
        import yaml

        body = yaml.safe_dump({"config": {f"spark-vllm:{k}": v for k, v in config.items()}},
                              sort_keys=False)
        self.file(stack).write_text(header + body)

    def stack(self, name: str, commit: str = COMMIT):
        import pulumi.automation as auto

        folder = self.dir / f"files-{name}"
        folder.mkdir(exist_ok=True)
        marker = folder / "marker.txt"
        if not marker.exists():
            marker.write_text("v1")
        program = program_for(folder, commit)
        self.programs[name] = program
        return auto.create_or_select_stack(
            stack_name=name, project_name="spark-vllm", program=program,
            opts=auto.LocalWorkspaceOptions(work_dir=str(self.dir), env_vars=self.env),
        )

    def set_secrets(self, stack, secrets: dict[str, str]) -> None:
        import pulumi.automation as auto

        for k, v in secrets.items():
            stack.set_config(f"spark-vllm:{k}", auto.ConfigValue(v, secret=True))

    def folder(self, name: str) -> Path:
        return self.dir / f"files-{name}"


def dev_config(root: Path, **over) -> dict:
    """Pulumi.dev.yaml as `lab config --write-stack` leaves it (host keys and digest filled in)."""
    import copy

    import yaml

    data = yaml.safe_load((root / "Pulumi.dev.yaml").read_text())["config"]
    raw = {k.split(":", 1)[1]: copy.deepcopy(v) for k, v in data.items()}
    for n in raw["nodes"]:
        n["hostKey"] = HOST_KEY
    raw["image"]["ref"] = DIGEST
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return raw
