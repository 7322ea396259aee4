"""The model at the hub: which commit a revision is, and its files with sizes.

The only network call the program makes itself (huggingface_hub's HfApi, against the hub or the
`HF_ENDPOINT` mirror), before any resource is registered: the commit and the file list drive the
model commands, and the total size feeds preflight. `cache_intact` compares what recon found in a
node's HF cache with that manifest. No Pulumi resources here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from config.forms import is_commit
from inspection.facts import NodeFacts


class ModelResolutionError(pulumi.RunError):
    pass


@dataclass(frozen=True)
class ModelFile:
    """One file of a model commit as the hub lists it. The HF cache names its blob by `etag`:
    the LFS sha256 for large files, else the git blob id."""

    path: str
    size: int
    etag: str


@dataclass(frozen=True)
class ModelManifest:
    repo: str
    revision: str
    commit: str
    files: tuple[ModelFile, ...]  # sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def resolve_model(
    repo: str, revision: str, endpoint: str | None, token: str | None
) -> ModelManifest:
    """Ask the hub which commit `revision` is and which files (with sizes) it holds.

    When the revision already is a commit the file list is still fetched (sizes are what verify
    checks). Unit tests replace this function.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token or None)
    try:
        commit = revision if is_commit(revision) else api.model_info(repo, revision=revision).sha
        files = [
            ModelFile(path=e.path, size=int(e.size), etag=e.lfs.sha256 if e.lfs else e.blob_id)
            for e in api.list_repo_tree(repo, revision=commit, recursive=True)
            if isinstance(e, RepoFile)
        ]
    except Exception as exc:  # network, auth, unknown repo/revision: the message is the report
        where = endpoint or "https://huggingface.co"
        raise ModelResolutionError(
            f"spark-vllm:model: cannot resolve {repo}@{revision} at {where}: {exc}"
        ) from None
    if not is_commit(commit):
        raise ModelResolutionError(
            f"spark-vllm:model: hub returned no commit for {repo}@{revision}"
        )
    if not files:
        raise ModelResolutionError(f"spark-vllm:model: {repo}@{commit} lists no files")
    return ModelManifest(repo, revision, str(commit), tuple(sorted(files, key=lambda f: f.path)))


def cache_intact(facts: NodeFacts | None, manifest: ModelManifest) -> bool:
    """Recon found the commit's snapshot on the node, at least the manifest's bytes in blobs,
    and no blob the stack verified gone or changed (size or mtime) since.

    A deleted snapshot folder, a wiped repo and a blob written to after the check are caught
    here (the model commands then run again and repair it); a change that keeps a blob's size
    and mtime is only found by the verify step's hash when it runs.
    """
    repo = facts.hf_repo(manifest.repo) if facts is not None else None
    return (
        repo is not None
        and manifest.commit in repo.snapshots
        and repo.size_bytes >= manifest.total_bytes
        and repo.changed_blobs == 0
    )
