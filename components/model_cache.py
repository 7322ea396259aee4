"""ModelCache: the model snapshot at one commit, in every node's Hugging Face cache.

Why this shape:
* The revision (a branch or tag) was resolved to a 40-hex commit with huggingface_hub before
  any resource was registered (inspection/hub.py), together with the file list and sizes.
  Everything downstream names the commit, so a moved branch is a visible diff, never a silent
  change, and vLLM loads exactly that commit offline.
* The hub (or the `HF_ENDPOINT` mirror) is contacted ONCE, from the head, by the serving image's
  own python (`snapshot_download`, incremental). The token goes through stdin.
* The other nodes get the files over the fabric from a short-lived, read-only seeder on the
  head, and only the files whose blob they do not have (hostscripts/models.py), so a new
  revision moves just the changed files and a new node never causes a second hub download.
* A verify step on every node checks every file of the commit with its size.
* Unified memory: on every node where the model moved (and was read again by the verify), the
  page cache is dropped before Ray and vLLM start (`drop-cache-<node>`, hostscripts/models.py:
  drop_page_cache). Its text and triggers are the verify's, so a no-op `up` or a serve-flag
  change does not drop anything.
* Weights are expensive to move: the fetch and sync commands are `retain_on_delete`, so
  `pulumi destroy` leaves the cache in place.
* Commands have no Read, so a cache wiped behind the stack's back would stay wiped. Recon looks
  at every node's cache before the run; where the commit's snapshot is missing or its blobs are
  short of the manifest (`cache_intact`), that node's fetch/sync, the seeder and its verify get a
  fresh repair token in `triggers` and run again (only the missing files move). Where the cache is
  intact, `ignore_changes=["triggers"]` keeps whatever token the state holds: no diff.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components.spark_node import Cluster, SparkNode
from config import ModelConfig
from hostscripts.models import (
    drop_page_cache,
    model_fetch,
    model_manifest_json,
    model_seeder_start,
    model_seeder_stop,
    model_sync,
    model_verify,
)
from inspection.hub import ModelManifest, cache_intact


def repair_token(now: Callable[[], int] = time.time_ns) -> str:
    """A value never seen before: set as `triggers` it makes the engine run a command again."""
    return f"repair-{now()}"


@dataclass(frozen=True)
class Again:
    """`triggers` + `ignore_changes` for a command that must run again when a node lost its copy
    (a fresh token), and must not diff when every node is intact (the state's token is kept)."""

    triggers: list[str]
    ignore_changes: list[str] | None

    @staticmethod
    def when_wiped(tokens: Sequence[str]) -> Again:
        if tokens:
            return Again([" ".join(tokens)], None)
        return Again(["intact"], ["triggers"])


@dataclass
class ModelCacheArgs:
    model: ModelConfig
    manifest: ModelManifest  # resolved at the hub before any resource (inspection/hub.py)
    cluster: Cluster
    image_ids: Mapping[str, pulumi.Input[str]]  # per node: the serving image (huggingface_hub)
    labels: Mapping[str, str]  # ownership labels for helper containers
    hf_token: pulumi.Output[str] | None = None


class ModelCache(pulumi.ComponentResource):
    commit: pulumi.Output[str]
    model_bytes: pulumi.Output[int]
    fetch: remote.Command
    syncs: dict[str, remote.Command]
    verifies: dict[str, remote.Command]
    drops: dict[str, remote.Command]

    def __init__(
        self, name: str, args: ModelCacheArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        m = args.manifest
        super().__init__(
            "spark-vllm:model_cache:ModelCache",
            name,
            {
                "repo": args.model.repo,
                "revision": args.model.revision,
                "commit": m.commit,
                "modelBytes": m.total_bytes,
                "cacheDir": args.model.cache_dir,
            },
            opts,
        )
        # Assigned after super().__init__, which sets an attribute per prop key (`commit`) to an
        # Output that depends on this component; children using that one would depend on their
        # own parent (a cycle).
        self.commit = pulumi.Output.from_input(m.commit)
        self.model_bytes = pulumi.Output.from_input(m.total_bytes)
        self._args = args
        # Per node: None when recon found the cache intact, else a fresh repair token.
        self.repairs: dict[str, str | None] = {
            n.name: None if cache_intact(n.facts, m) else repair_token() for n in args.cluster.nodes
        }
        self.fetch = self._fetch(name)
        self.syncs = {}
        self.seeder: tuple[remote.Command | None, remote.Command | None] = (None, None)
        if args.cluster.workers:
            self._fan_out(name)
        self.verifies = {n.name: self._verify(name, n) for n in args.cluster.nodes}
        self.drops = {n.name: self._drop(name, n) for n in args.cluster.nodes}
        self.register_outputs(
            {
                # repo/revision too: stack-level policies (prod-pinned) read outputs
                "repo": args.model.repo,
                "revision": args.model.revision,
                "commit": self.commit,
                "modelBytes": self.model_bytes,
                "files": len(m.files),
                "verified": {n: c.stdout for n, c in self.verifies.items()},
            }
        )

    def _again(self, nodes: Sequence[SparkNode]) -> Again:
        return Again.when_wiped([t for n in nodes if (t := self.repairs[n.name])])

    def _image(self, node: SparkNode) -> pulumi.Output[str]:
        return pulumi.Output.from_input(self._args.image_ids[node.name])

    def _labels(self, role: str) -> dict[str, str]:
        return {**self._args.labels, "spark-vllm.role": role}

    def _fetch(self, name: str) -> remote.Command:
        """Once, on the head: the snapshot from the hub (the token on stdin, never logged)."""
        a, head = self._args, self._args.cluster.head
        again = self._again([head])
        token = a.hf_token if a.hf_token is not None else pulumi.Output.secret("")
        return head.command(
            f"{name}-fetch",
            self,
            create=self._image(head).apply(
                lambda image: model_fetch(
                    image, a.model.cache_dir, a.model.repo, a.manifest.commit, a.model.revision,
                    a.model.endpoint, self._labels("model-fetch"), a.manifest.files,
                )
            ),
            stdin=token,
            logging=remote.Logging.NONE,
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            retain_on_delete=True,
            secret_outputs=["stdout", "stderr"],
        )

    def _fan_out(self, name: str) -> None:
        """The seeder on the head, a sync on every worker, and the seeder's stop after them."""
        a, head, workers = self._args, self._args.cluster.head, self._args.cluster.workers
        targets = [n.name for n in workers]
        again = self._again(workers)
        start = head.command(
            f"{name}-seed",
            self,
            create=self._image(head).apply(
                lambda image: model_seeder_start(
                    image, a.model.cache_dir, a.model.repo, head.fabric_ip,
                    self._labels("model-seeder"), targets, a.manifest.commit,
                )
            ),
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            depends_on=[self.fetch],
        )
        manifest = model_manifest_json(
            a.model.repo, a.manifest.commit, a.model.revision, a.manifest.files, head.fabric_ip
        )
        for node in workers:
            node_again = self._again([node])
            self.syncs[node.name] = node.command(
                f"{name}-sync-{node.name}",
                self,
                create=self._image(node).apply(
                    lambda image: model_sync(image, a.model.cache_dir, self._labels("model-sync"))
                ),
                stdin=manifest,
                triggers=node_again.triggers,
                ignore_changes=node_again.ignore_changes,
                depends_on=[start],
                retain_on_delete=True,
            )
        stop = head.command(
            f"{name}-seed-stop",
            self,
            create=self._image(head).apply(
                lambda image: model_seeder_stop(targets, a.manifest.commit, image)
            ),
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            depends_on=list(self.syncs.values()),
        )
        self.seeder = (start, stop)

    def _verify(self, name: str, node: SparkNode) -> remote.Command:
        """On every node, after its own fetch or sync: every file of the commit, with its size."""
        a = self._args
        landed = self.fetch if node is a.cluster.head else self.syncs[node.name]
        again = self._again([node])
        return node.command(
            f"{name}-verify-{node.name}",
            self,
            create=model_verify(a.model.cache_dir, a.model.repo, a.manifest.commit,
                                a.manifest.files),
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            depends_on=[landed],
        )

    def _drop(self, name: str, node: SparkNode) -> remote.Command:
        """After the verify on that node: the page cache the copy and the hashing filled."""
        a = self._args
        again = self._again([node])
        return node.command(
            f"{name}-drop-cache-{node.name}",
            self,
            create=drop_page_cache(a.model.repo, a.manifest.commit, a.manifest.files),
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            depends_on=[self.verifies[node.name]],
        )
