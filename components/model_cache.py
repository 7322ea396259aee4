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
* Both ConnectX-7 twins carry the copy: the seeder listens on each head twin a worker pairs
  with, and each worker's manifest lists those addresses with its own twin in the same fabric
  subnet (`seeds_for`; by index where no subnet is known). Only twins recon saw with carrier
  count, at plan time; the sync drops a twin that does not answer and goes on over the others.
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
  fresh trigger (components/rerun.py) and run again (only the missing files move). Where the
  cache is intact, `ignore_changes=["triggers"]` keeps whatever value the state holds: no diff.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components import rerun
from components.nccl import carrier_up
from components.rerun import Again
from components.spark_node import Cluster, SparkNode
from config import ModelConfig
from contract import labels as lbl
from contract import types
from contract.props import ModelCacheProps
from hostscripts.models import (
    Seed,
    drop_page_cache,
    model_fetch,
    model_manifest_json,
    model_seeder_start,
    model_seeder_stop,
    model_sync,
    model_verify,
)
from hostscripts.paths import StackNames
from inspection.hub import ModelManifest, cache_intact


def seeds_for(
    head: SparkNode, node: SparkNode, subnets: Sequence[str] = ()
) -> list[Seed]:
    """The head's seeder addresses `node` pulls from: for each of the node's carrier-up twins
    (in its config order), the head's carrier-up twin in the same fabric subnet, or, where the
    twin's address is in none of `subnets`, the head's twin at the same index. Each head address
    once. No pair at all: the head's primary address, the source left to the kernel (the
    single-stream copy of before)."""
    nets = [ipaddress.IPv4Network(s) for s in subnets]

    def net(ip: str) -> ipaddress.IPv4Network | None:
        return next((n for n in nets if ipaddress.IPv4Address(ip) in n), None)

    head_up = carrier_up(head)
    head_ifaces = [f.interface for f in head.node.fabric]
    out: list[Seed] = []
    for iface, ip in carrier_up(node):
        mine = net(ip)
        if mine is not None:
            peer = next((hip for _h, hip in head_up if net(hip) == mine), None)
        else:
            i = [f.interface for f in node.node.fabric].index(iface)
            peer = next((hip for h, hip in head_up
                         if head_ifaces.index(h) == i and net(hip) is None), None)
        if peer is not None and all(s.ip != peer for s in out):
            out.append(Seed(peer, ip))
    return out or [Seed(head.fabric_ip)]


def seeder_binds(head: SparkNode, seeds: Sequence[Sequence[Seed]]) -> list[str]:
    """Every head address some worker pulls from, in the head's twin order."""
    used = {s.ip for node_seeds in seeds for s in node_seeds}
    order = [f.ip for f in head.node.fabric]
    return sorted(used, key=lambda ip: order.index(ip) if ip in order else len(order))


@dataclass
class ModelCacheArgs:
    model: ModelConfig
    manifest: ModelManifest  # resolved at the hub before any resource (inspection/hub.py)
    cluster: Cluster
    names: StackNames  # the seeder's container name
    image_ids: Mapping[str, pulumi.Input[str]]  # per node: the serving image (huggingface_hub)
    labels: Mapping[str, str]  # ownership labels for helper containers
    hf_token: pulumi.Output[str] | None = None
    # nccl.fabricSubnets: which twins of a worker and of the head share a subnet (seeds_for)
    fabric_subnets: Sequence[str] = ()
    # what the fetch (and so every step after it) waits for: the collective gate's verdict,
    # which must not share the fabric with the model's copy, nor pass a change it stopped
    after: Sequence[pulumi.Resource] = ()


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
        props: ModelCacheProps = {
            "repo": args.model.repo,
            "revision": args.model.revision,
            "commit": m.commit,
            "modelBytes": m.total_bytes,
            "cacheDir": args.model.cache_dir,
        }
        super().__init__(types.MODEL_CACHE, name, props, opts)
        # Assigned after super().__init__, which sets an attribute per prop key (`commit`) to an
        # Output that depends on this component; children using that one would depend on their
        # own parent (a cycle).
        self.commit = pulumi.Output.from_input(m.commit)
        self.model_bytes = pulumi.Output.from_input(m.total_bytes)
        self._args = args
        self.config: ModelConfig = args.model  # what it holds: the repo and the revision
        # Per node: None when recon found the cache intact, else a fresh trigger (rerun.Again).
        self.repairs: dict[str, str | None] = {
            n.name: None if cache_intact(n.facts, m) else rerun.fresh_trigger()
            for n in args.cluster.nodes
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
                "cacheDir": args.model.cache_dir,
                "files": len(m.files),
                "verified": {n: c.stdout for n, c in self.verifies.items()},
            }
        )

    def _again(self, nodes: Sequence[SparkNode]) -> Again:
        return Again.when_wiped([t for n in nodes if (t := self.repairs[n.name])])

    def _image(self, node: SparkNode) -> pulumi.Output[str]:
        return pulumi.Output.from_input(self._args.image_ids[node.name])

    def _labels(self, role: str) -> dict[str, str]:
        return {**self._args.labels, lbl.ROLE: role}

    def _fetch(self, name: str) -> remote.Command:
        """Once, on the head: the snapshot from the hub (the token on stdin, never logged; the
        download's progress on stderr, shown in the `up`)."""
        a, head = self._args, self._args.cluster.head
        again = self._again([head])
        token = a.hf_token if a.hf_token is not None else pulumi.Output.secret("")
        return head.command(
            f"{name}-fetch",
            self,
            create=self._image(head).apply(
                lambda image: model_fetch(
                    image, a.model.cache_dir, a.model.repo, a.manifest.commit, a.model.revision,
                    a.model.endpoint, self._labels(lbl.MODEL_FETCH), a.manifest.files,
                    a.names.model_record_dir,
                )
            ),
            stdin=token,
            # its progress lines (stderr: sizes and rates, never the token) show in the `up`
            logging=remote.Logging.STDERR,
            depends_on=list(a.after),
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
        seeds = {n.name: seeds_for(head, n, a.fabric_subnets) for n in workers}
        binds = seeder_binds(head, list(seeds.values()))
        def start_text(image: str) -> str:
            return model_seeder_start(a.names, image, a.model.cache_dir, a.model.repo, binds,
                                      self._labels(lbl.MODEL_SEEDER), targets, a.manifest.commit)

        start = head.command(
            f"{name}-seed",
            self,
            create=self._image(head).apply(start_text),
            triggers=again.triggers,
            ignore_changes=again.ignore_changes,
            depends_on=[self.fetch],
            # its stdout is the run's token (the seeder answers no one without it): a secret,
            # never logged, handed to the syncs on stdin
            secret_outputs=["stdout"],
            logging=remote.Logging.STDERR,
        )
        for node in workers:
            node_again = self._again([node])
            def with_token(out: str | None, n: str = node.name) -> str:
                return model_manifest_json(a.model.repo, a.manifest.commit, a.model.revision,
                                           a.manifest.files, seeds[n],
                                           token=(out or "").strip())

            plain_manifest: pulumi.Output[str] = start.stdout.apply(with_token)
            manifest: pulumi.Output[str] = pulumi.Output.secret(plain_manifest)
            self.syncs[node.name] = node.command(
                f"{name}-sync-{node.name}",
                self,
                create=self._image(node).apply(
                    lambda image: model_sync(image, a.model.cache_dir, self._labels("model-sync"),
                                             a.names.model_record_dir)
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
                lambda image: model_seeder_stop(a.names, targets, a.manifest.commit, image,
                                                binds, start=start_text(image))
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
                                a.manifest.files, a.names.model_record_dir),
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
