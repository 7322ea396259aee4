"""ModelCache: the model snapshot at one commit, in every node's Hugging Face cache.

Why this shape:
* The revision (a branch or tag) is resolved to a 40-hex commit with huggingface_hub at deploy
  time, together with the file list and sizes. Everything downstream names the commit, so a moved
  branch is a visible diff, never a silent change, and vLLM loads exactly that commit offline.
* The hub (or the `HF_ENDPOINT` mirror) is contacted ONCE, from the head, by the serving image's
  own python (`snapshot_download`, incremental). The token goes through stdin.
* The other nodes get the files over the fabric from a short-lived, read-only seeder on the
  head, and only the files whose blob they do not have (scripts.model_sync), so a new revision
  moves just the changed files and a new node never causes a second hub download.
* A verify step on every node checks every file of the commit with its size.
* Weights are expensive to move: the fetch and sync commands are `retain_on_delete`, so
  `pulumi destroy` leaves the cache in place.
* Commands have no Read, so a cache wiped behind the stack's back would stay wiped. Recon looks
  at every node's cache before the run; where the commit's snapshot is missing or its blobs are
  short of the manifest (`cache_intact`), that node's fetch/sync, the seeder and its verify get a
  fresh repair token in `triggers` and run again (only the missing files move). Where the cache is
  intact, `ignore_changes=["triggers"]` keeps whatever token the state holds: no diff.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import pulumi
from pulumi_command import remote

from components import scripts
from components.facts import NodeFacts
from components.spark_node import SparkNode

_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class ModelResolutionError(pulumi.RunError):
    pass


@dataclass(frozen=True)
class ModelManifest:
    repo: str
    revision: str
    commit: str
    files: tuple[dict[str, Any], ...]  # {"path", "size", "etag"} sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files)


def resolve_model(
    repo: str, revision: str, endpoint: str | None, token: str | None
) -> ModelManifest:
    """Ask the hub which commit `revision` is and which files (with sizes) it holds.

    The only network call the program makes itself; unit tests replace this function. When the
    revision already is a commit the file list is still fetched (sizes are what verify checks).
    """
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi(endpoint=endpoint, token=token or None)
    try:
        if _COMMIT.match(revision):
            commit = revision
        else:
            commit = api.model_info(repo, revision=revision).sha
        files = [
            {
                "path": e.path,
                "size": int(e.size),
                # The HF cache names blobs by etag: the LFS sha256, else the git blob id.
                "etag": e.lfs.sha256 if e.lfs else e.blob_id,
            }
            for e in api.list_repo_tree(repo, revision=commit, recursive=True)
            if isinstance(e, RepoFile)
        ]
    except Exception as exc:  # network, auth, unknown repo/revision
        where = endpoint or "https://huggingface.co"
        raise ModelResolutionError(
            f"spark-vllm:model: cannot resolve {repo}@{revision} at {where}: {exc}"
        ) from None
    if not commit or not _COMMIT.match(commit):
        raise ModelResolutionError(
            f"spark-vllm:model: hub returned no commit for {repo}@{revision}"
        )
    if not files:
        raise ModelResolutionError(f"spark-vllm:model: {repo}@{commit} lists no files")
    return ModelManifest(repo, revision, commit, tuple(sorted(files, key=lambda f: f["path"])))


def cache_intact(facts: NodeFacts | None, manifest: ModelManifest) -> bool:
    """Recon found the commit's snapshot on the node and at least the manifest's bytes in blobs.

    Deliberately coarse (one recon round trip has no per-file sizes): a deleted snapshot folder
    or a wiped repo is caught; a single corrupted file is the verify step's job.
    """
    repo = facts.hf_repo(manifest.repo) if facts is not None else None
    return (
        repo is not None
        and manifest.commit in repo.snapshots
        and repo.size_bytes >= manifest.total_bytes
    )


def repair_token(now: Callable[[], int] = time.time_ns) -> str:
    """A value never seen before: set as `triggers` it makes the engine run a command again."""
    return f"repair-{now()}"


@dataclass
class ModelCacheArgs:
    repo: str
    revision: str
    cache_dir: str
    endpoint: str | None
    nodes: list[SparkNode]  # the head first
    image_ids: dict[str, pulumi.Input[str]]  # per node: the serving image (has huggingface_hub)
    labels: dict[str, str]  # ownership labels for helper containers
    hf_token: pulumi.Output[str] | None = None
    # Resolved before any resource is registered (__main__ needs its size for preflight); when
    # absent the component resolves it itself.
    manifest: ModelManifest | None = None


class ModelCache(pulumi.ComponentResource):
    commit: pulumi.Output[str]
    model_bytes: pulumi.Output[int]
    fetch: remote.Command
    syncs: dict[str, remote.Command]
    verifies: dict[str, remote.Command]

    def __init__(self, name: str, args: ModelCacheArgs, opts: pulumi.ResourceOptions | None = None):
        token = args.hf_token if args.hf_token is not None else pulumi.Output.secret("")
        # Resolution reads the (secret) token, so its result is secret by contagion; the commit
        # and the file list are not secret, so unwrap them deliberately.
        if args.manifest is not None:
            manifest: pulumi.Output[ModelManifest] = pulumi.Output.from_input(args.manifest)
        else:
            manifest = pulumi.Output.unsecret(
                token.apply(
                    lambda t: resolve_model(args.repo, args.revision, args.endpoint, t or None)
                )
            )
        commit = manifest.apply(lambda m: m.commit)
        model_bytes = manifest.apply(lambda m: m.total_bytes)
        super().__init__(
            "spark-vllm:model_cache:ModelCache",
            name,
            {
                "repo": args.repo,
                "revision": args.revision,
                "commit": commit,
                "modelBytes": model_bytes,
                "cacheDir": args.cache_dir,
            },
            opts,
        )
        # Assigned after super().__init__, which sets an attribute per prop key (`commit`) to an
        # Output that depends on this component; children using that one would depend on their
        # own parent (a cycle).
        self.commit = commit
        self.model_bytes = model_bytes
        head, others = args.nodes[0], args.nodes[1:]
        targets = [n.name for n in others]
        child = pulumi.ResourceOptions(parent=self)
        # Per node: None when recon found the cache intact, else a fresh repair token.
        self.repairs: dict[str, str | None] = {}
        if args.manifest is not None:
            for n in args.nodes:
                intact = cache_intact(n.facts, args.manifest)
                self.repairs[n.name] = None if intact else repair_token()

        def again_if_wiped(names: list[str]) -> dict[str, Any]:
            """`triggers` + `ignore_changes` for a command that must re-run when any of these
            nodes lost its copy; no-op (the state's token kept) when all are intact."""
            if args.manifest is None:  # resolved inside: recon cannot be compared to it
                return {"triggers": None, "ignore_changes": None}
            tokens = [self.repairs[n] for n in names if self.repairs[n]]
            if tokens:
                return {"triggers": [" ".join(tokens)], "ignore_changes": None}
            return {"triggers": ["intact"], "ignore_changes": ["triggers"]}

        fetch_again = again_if_wiped([head.name])
        self.fetch = remote.Command(
            f"{name}-fetch",
            connection=head.connection,
            add_previous_output_in_env=False,  # see scripts.py
            create=pulumi.Output.all(manifest, args.image_ids[head.name]).apply(
                lambda a: scripts.model_fetch(
                    a[1],
                    args.cache_dir,
                    args.repo,
                    a[0].commit,
                    args.revision,
                    args.endpoint,
                    {**args.labels, "spark-vllm.role": "model-fetch"},
                )
            ),
            stdin=token,
            logging=remote.Logging.NONE,
            triggers=fetch_again["triggers"],
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    retain_on_delete=True,
                    additional_secret_outputs=["stdout", "stderr"],
                    ignore_changes=fetch_again["ignore_changes"],
                ),
            ),
        )
        self.syncs = {}
        self.depends_on: dict[str, list[pulumi.Resource]] = {}
        seed_start = seed_stop = None
        if others:
            self.depends_on[f"{name}-seed"] = [self.fetch]
            seed_again = again_if_wiped(targets)
            seed_start = remote.Command(
                f"{name}-seed",
                connection=head.connection,
                add_previous_output_in_env=False,  # see scripts.py
                create=pulumi.Output.all(manifest, args.image_ids[head.name]).apply(
                    lambda a: scripts.model_seeder_start(
                        a[1],
                        args.cache_dir,
                        args.repo,
                        head.fabric_ip,
                        {**args.labels, "spark-vllm.role": "model-seeder"},
                        targets,
                        a[0].commit,
                    )
                ),
                triggers=seed_again["triggers"],
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=self.depends_on[f"{name}-seed"],
                    ignore_changes=seed_again["ignore_changes"],
                ),
            )
            for node in others:
                self.depends_on[f"{name}-sync-{node.name}"] = [seed_start]
                sync_again = again_if_wiped([node.name])
                self.syncs[node.name] = remote.Command(
                    f"{name}-sync-{node.name}",
                    connection=node.connection,
                    add_previous_output_in_env=False,  # see scripts.py
                    create=pulumi.Output.from_input(args.image_ids[node.name]).apply(
                        lambda image: scripts.model_sync(
                            image, args.cache_dir, {**args.labels, "spark-vllm.role": "model-sync"}
                        )
                    ),
                    stdin=manifest.apply(
                        lambda m: scripts.model_manifest_json(
                            m.repo, m.commit, m.revision, m.files, head.fabric_ip
                        )
                    ),
                    triggers=sync_again["triggers"],
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        depends_on=self.depends_on[f"{name}-sync-{node.name}"],
                        retain_on_delete=True,
                        ignore_changes=sync_again["ignore_changes"],
                    ),
                )
            self.depends_on[f"{name}-seed-stop"] = list(self.syncs.values())
            seed_stop = remote.Command(
                f"{name}-seed-stop",
                connection=head.connection,
                add_previous_output_in_env=False,  # see scripts.py
                create=pulumi.Output.all(self.commit, args.image_ids[head.name]).apply(
                    lambda a: scripts.model_seeder_stop(targets, a[0], a[1])
                ),
                triggers=seed_again["triggers"],
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=self.depends_on[f"{name}-seed-stop"],
                    ignore_changes=seed_again["ignore_changes"],
                ),
            )
        self.seeder = (seed_start, seed_stop)

        self.verifies = {}
        for node in args.nodes:
            landed = self.fetch if node is head else self.syncs[node.name]
            self.depends_on[f"{name}-verify-{node.name}"] = [landed]
            verify_again = again_if_wiped([node.name])
            self.verifies[node.name] = remote.Command(
                f"{name}-verify-{node.name}",
                connection=node.connection,
                add_previous_output_in_env=False,  # see scripts.py
                create=manifest.apply(
                    lambda m: scripts.model_verify(args.cache_dir, m.repo, m.commit, m.files)
                ),
                triggers=verify_again["triggers"],
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=self.depends_on[f"{name}-verify-{node.name}"],
                    ignore_changes=verify_again["ignore_changes"],
                ),
            )
        self.register_outputs(
            {
                # repo/revision too: stack-level policies (prod-pinned) read outputs
                "repo": args.repo,
                "revision": args.revision,
                "commit": self.commit,
                "modelBytes": self.model_bytes,
                "files": manifest.apply(lambda m: len(m.files)),
                "verified": {n: c.stdout for n, c in self.verifies.items()},
            }
        )
