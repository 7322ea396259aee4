"""The model at the hub: which commit a revision is, its files with sizes, and its shape.

The only network calls the program makes itself (huggingface_hub's HfApi, against the hub or the
`HF_ENDPOINT` mirror), before any resource is registered: the commit and the file list drive the
model commands, the total size feeds preflight, and the commit's config.json gives the model's
shape (inspection/memory_fit.py: the layers that hold a KV cache, KV heads, head dim, fixed
per-sequence state), which makes preflight's and the policy pack's memory fit KV-aware.
`cache_intact` compares what recon found in a node's HF cache with that manifest. No Pulumi
resources here. The manifest travels as an argument: __main__ hands it to preflight.run and to
build_stack, which hands it to the components that use its files, commit or shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from config.forms import is_commit
from config.paths import local_state_dir
from hostscripts.models import ModelFile, listing_problem
from inspection.facts import NodeFacts
from inspection.memory_fit import ModelShape, shape_from_config

CONFIG_FILE = "config.json"
CONFIG_CACHE = "hub-configs"  # under local_state_dir(): config.json per commit
CONFIG_MAX_BYTES = 4 * 1024 * 1024  # a config.json is kilobytes; refuse to read anything huge


class ModelResolutionError(pulumi.RunError):
    pass


@dataclass(frozen=True)
class ModelManifest:
    repo: str
    revision: str
    commit: str
    files: tuple[ModelFile, ...]  # sorted by path
    # the commit's config.json read into a shape; None when it was not read (see resolve_model)
    shape: ModelShape | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def read_config(api: Any, repo: str, commit: str, files: tuple[ModelFile, ...]) -> ModelShape:
    """The commit's config.json (hf_hub_download through `api`: its endpoint and token) read
    into a ModelShape.

    The download goes to a cache of this tool's own, `$SPARK_VLLM_HOME/hub-configs` (no HF cache
    an operator uses changes). A commit's files never change, and for a commit hash
    huggingface_hub answers from that cache without asking the hub, so only the first run that
    meets a commit downloads its config: a no-op `up` fetches nothing.

    A commit without config.json, a huge or unparsable one: a shape whose `problem` says so (the
    memory fit then has no KV figure and says why). A failed download raises: the hub listed the
    file, so not getting it is the same fault as not getting the listing.
    """
    listed = next((f for f in files if f.path == CONFIG_FILE), None)
    if listed is None:
        return ModelShape(problem=f"{repo}@{commit} has no {CONFIG_FILE}")
    if listed.size > CONFIG_MAX_BYTES:
        return ModelShape(problem=f"{CONFIG_FILE} is {listed.size} bytes, more than a config "
                                  f"({CONFIG_MAX_BYTES}); not read")
    path = api.hf_hub_download(repo_id=repo, filename=CONFIG_FILE, revision=commit,
                               cache_dir=str(local_state_dir() / CONFIG_CACHE))
    raw = Path(str(path)).read_bytes()[: CONFIG_MAX_BYTES + 1]
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return ModelShape(problem=f"{CONFIG_FILE} is not JSON ({exc})")
    return shape_from_config(config)


def _etag(entry: Any) -> Any:
    lfs = getattr(entry, "lfs", None)
    return getattr(lfs, "sha256", None) if lfs else getattr(entry, "blob_id", None)


def listed_files(repo: str, commit: str, where: str, entries: list[Any]) -> tuple[ModelFile, ...]:
    """The hub's listing of `repo@commit` as ModelFiles sorted by path, every value checked at
    this boundary (hostscripts.models.ModelFile: the etag 40 or 64 lowercase hex, the path
    relative and normalised, the size a byte count; no path twice or as another's folder, one
    size per etag). The values name files that
    the nodes remove and replace as root, and a mirror (`model.endpoint`, plain http in dev) or
    whoever sits on the path to it controls them: anything else fails the run before a node is
    touched."""
    files: list[ModelFile] = []
    for e in entries:
        path: Any = getattr(e, "path", None)
        size: Any = getattr(e, "size", None)
        try:
            f = ModelFile(path=path, size=size, etag=_etag(e))
        except ValueError as exc:
            raise ModelResolutionError(
                f"spark-vllm:model: the listing of {repo}@{commit} at {where} is refused: "
                f"{str(exc).removeprefix('a model file the hub lists is refused: ')}"
            ) from None
        files.append(f)
    problem = listing_problem(files)
    if problem is not None:
        raise ModelResolutionError(
            f"spark-vllm:model: the listing of {repo}@{commit} at {where} is refused: {problem}")
    if not files:
        raise ModelResolutionError(f"spark-vllm:model: {repo}@{commit} lists no files")
    return tuple(sorted(files, key=lambda f: f.path))


def resolve_model(
    repo: str, revision: str, endpoint: str | None, token: str | None
) -> ModelManifest:
    """Ask the hub which commit `revision` is, which files (with sizes) it holds, and read the
    commit's config.json into the manifest's shape (`read_config`).

    When the revision already is a commit the file list is still fetched (sizes are what verify
    checks). Unit tests replace this function (tests/unit/conftest.py fixed_model).
    """
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token or None)
    where = endpoint or "https://huggingface.co"
    try:
        commit = revision if is_commit(revision) else api.model_info(repo, revision=revision).sha
        entries = [e for e in api.list_repo_tree(repo, revision=commit, recursive=True)
                   if isinstance(e, RepoFile)]
    except Exception as exc:  # network, auth, unknown repo/revision: the message is the report
        raise ModelResolutionError(
            f"spark-vllm:model: cannot resolve {repo}@{revision} at {where}: {exc}"
        ) from None
    if not is_commit(commit):
        raise ModelResolutionError(
            f"spark-vllm:model: hub returned no commit for {repo}@{revision}"
        )
    listing = listed_files(repo, str(commit), where, entries)
    try:
        shape = read_config(api, repo, str(commit), listing)
    except Exception as exc:  # network, auth, a mirror without the file
        raise ModelResolutionError(
            f"spark-vllm:model: cannot read {CONFIG_FILE} of {repo}@{commit} at {where} (the "
            f"memory fit needs the model's shape): {exc}"
        ) from None
    return ModelManifest(repo, revision, str(commit), listing, shape)


def cache_intact(facts: NodeFacts | None, manifest: ModelManifest) -> bool:
    """Recon found the commit's snapshot on the node holding every file of the manifest at its
    size (through its links), at least the manifest's bytes in blobs, and no blob the stack
    verified gone or changed (size or mtime) since.

    A deleted snapshot folder, a wiped repo, a snapshot short of a file (a partly filled cache:
    config and tokenizer there, the weights not, whatever other revisions' blobs fill the
    folder) and a blob written to after the check are caught here (the model commands then run
    again and repair it); a change that keeps a blob's size and mtime is only found by the
    verify step's hash when it runs. A repo whose files recon did not list is not intact: what
    was not seen is fetched again (only the missing files move).
    """
    repo = facts.hf_repo(manifest.repo) if facts is not None else None
    if repo is None or repo.snapshot_files is None:
        return False
    held = repo.snapshot_files.get(manifest.commit)
    return (
        held is not None
        and manifest.commit in repo.snapshots
        and all(held.get(f.path) == f.size for f in manifest.files)
        and repo.size_bytes >= manifest.total_bytes
        and repo.changed_blobs == 0
    )
