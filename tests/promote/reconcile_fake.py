"""A FAKE spark-vllm program for tools/reconcile.py's engine tests: cheap enough to preview and
`up` in seconds, with resources whose names fall in the reconcile's repair classes or not.

Every resource is a declared file (a dynamic provider): `create`/`update` write the declared
content, `read` (a refresh) reads the file as it is, so a file edited or removed behind the
stack is drift the next preview with a refresh shows (an update, a create) and the `up`
repairs. Resources:
- `fabric-spark-2-enP2p1s0f1np1`: named like a NodeFabric interface (repair class `fabric`);
- `guard-spark-1-rules`: named like a NodeGuard's (class `guard`);
- `model-verify-spark-2`: named like a model check (in no class: reported, never applied);
- `serve`: its content is the stack's `vllm` config, so an edited stack file changes it.
The real program's resources (containers, commands) are judged by the same table in the unit
tier (tests/unit/tools/test_reconcile.py); what this fake proves is the engine's part: the
history, the refresh and preview, the events read back, the `up` made or withheld.
"""

from __future__ import annotations

import json
import os
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

FABRIC = "fabric-spark-2-enP2p1s0f1np1"
GUARD = "guard-spark-1-rules"
MODEL = "model-verify-spark-2"
NAMES = (FABRIC, GUARD, MODEL)


class DeclaredFile(ResourceProvider):
    def create(self, props):
        Path(props["path"]).write_text(props["content"])
        return CreateResult("file-" + Path(props["path"]).name, dict(props))

    def read(self, id, props):
        path = Path(props["path"])
        if not path.exists():
            return ReadResult(None, {})
        state = {**props, "content": path.read_text()}
        return ReadResult(id, state, state)

    def diff(self, id, olds, news):
        changed = [k for k in ("path", "content") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=[])

    def update(self, id, olds, news):
        Path(news["path"]).write_text(news["content"])
        return UpdateResult(dict(news))

    def delete(self, id, props):
        Path(props["path"]).unlink(missing_ok=True)


class File(Resource):
    def __init__(self, name: str, path: Path, content: str):
        super().__init__(DeclaredFile(), name, {"path": str(path), "content": content})


def program_for(folder: Path):
    """The inline program; `folder` holds the declared files."""

    def program() -> None:
        if (folder / "FAIL").exists():
            raise RuntimeError("the fake program fails on purpose (FAIL file present)")
        conf = pulumi.Config("spark-vllm")
        for name in NAMES:
            File(name, folder / f"{name}.txt", f"declared {name}")
        File("serve", folder / "serve.txt",
             json.dumps(conf.require_object("vllm"), sort_keys=True))
        pulumi.export("files", sorted(os.listdir(folder)))

    return program


# A policy pack of its own for the violation case: a mandatory policy that fails every run while
# the workspace's environment says so (the CLI hands the pack its environment).
PACK_MAIN = '''
import os
from pulumi_policy import EnforcementLevel, PolicyPack, ResourceValidationPolicy

def check(args, report_violation):
    if os.environ.get("RECONCILE_TEST_VIOLATION") == "1" and args.name == "serve":
        report_violation("the test asked for a violation")

PolicyPack(name="reconcile-test", enforcement_level=EnforcementLevel.MANDATORY, policies=[
    ResourceValidationPolicy(name="reconcile-test-violation",
                             description="fails while RECONCILE_TEST_VIOLATION=1",
                             validate=check)])
'''


def write_pack(folder: Path, policy_venv: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "PulumiPolicy.yaml").write_text(
        f"runtime:\n  name: python\n  options:\n    virtualenv: {policy_venv}\n"
        "version: 0.0.1\n")
    (folder / "__main__.py").write_text(PACK_MAIN)
    return folder
