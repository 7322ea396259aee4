"""VllmImage: the serving image present on every node, with one image ID everywhere.

Per node a `docker.RemoteImage` on that node's provider; containers reference its `image_id`,
never the name (a name makes the provider show a perpetual diff, and a moved tag would silently
change what runs). `keep_locally=True`: destroying the stack must not delete a 20 GB image the
operator may still want.

Sources:
* `registry`: every node pulls `image.ref` by digest. A ref given by tag (dev, staging) is
  resolved to its digest at the registry first (the docker provider's getRegistryImage, through
  the head's provider), like a model revision is resolved to a commit: the nodes pull
  `<repo>@<digest>`, and a tag moved to another image shows in the preview as an image change.
* `head`: the image was built on the head; the other nodes get it over the fabric
  (hostscripts/images.py: a short-lived seeder on the head, a pull on each other node, a stop).
  Then the RemoteImage on that node finds the image locally.

The component fails the update if the nodes end up with different image IDs: TP ranks running
different builds fail in ways that are much harder to read later.

Once per image ID on every node, `image-probe-<node>` asks the image's own python what it
carries (Python, torch and its CUDA, vLLM, Ray, libibverbs; hostscripts/payloads/image_probe.py),
and `image-check` on the head reports them and fails, before Ray starts, on an image without
Ray or vLLM, a Ray too old for token authentication, versions that differ between nodes, or
no libibverbs with RDMA on (inspection/image_probe.judge), and on nodes whose vLLM loads
different NCCL builds (nccl_findings: the probe also reports the libnccl vLLM loads, its
version, GNU build ID and whether pip or the system ships it, payloads/nccl_library.py, and
leaves its answer in the stack's folder for recon); when loadFormat fastsafetensors
meets an image whose loader the probe does not show handling several nodes (or no
fastsafetensors at all) it fails in prod and warns elsewhere (image_probe.loader_findings).
The probes are stack outputs. The serve command itself is checked with the same payload by
VllmServer's `vllm-serve-check-<node>` (components/vllm_server.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.spark_node import Cluster, SparkNode
from config import ImageConfig
from config.forms import is_digest_ref, is_image_id
from contract import labels as lbl
from contract import types
from contract.props import VllmImageProps
from hostscripts.images import (
    image_check,
    image_probe,
    image_probe_remove,
    image_pull_from_head,
    image_seeder_start,
    image_seeder_stop,
)
from hostscripts.paths import StackNames
from inspection.image_probe import (
    ImageProbe,
    ImageProbeError,
    judge,
    loader_findings,
    nccl_findings,
    parse_probe,
)


class ImageMismatchError(pulumi.RunError):
    pass


def _same_id(ids: dict[str, str]) -> str:
    distinct = sorted(set(ids.values()))
    if len(distinct) > 1:
        detail = ", ".join(f"{n}={i}" for n, i in sorted(ids.items()))
        raise ImageMismatchError(
            f"the serving image differs between nodes ({detail}); every node must run the "
            "same image: pin spark-vllm:image.ref by digest"
        )
    return distinct[0] if distinct else ""


def repository(ref: str) -> str:
    """`registry:5000/org/name:tag` -> `registry:5000/org/name` (a port is not a tag)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return ref[: len(ref) - len(last)] + last.split(":", 1)[0]


def registry_host(ref: str) -> str:
    """The registry part of an image ref, as Docker reads it (`docker.io` when there is none)."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def pinned_ref(ref: str, digest: str) -> str:
    """The ref the nodes pull: the repository at the digest the registry reported for the tag."""
    if not is_image_id(digest):
        raise ImageMismatchError(
            f"spark-vllm:image.ref: the registry reported {digest!r} for {ref!r}; expected "
            "sha256:<64 hex>"
        )
    return f"{repository(ref)}@{digest}"


def pull_ref(parent: pulumi.Resource, ref: str, node: SparkNode) -> pulumi.Output[str]:
    """The image by digest: `ref` itself when pinned, else the repository at the digest its tag
    names now (read from the registry through `node`'s Docker provider; pinned_ref). The serving
    image's and the head daemons' (components/daemon.py)."""
    if is_digest_ref(ref):
        return pulumi.Output.from_input(ref)
    return docker.get_registry_image_output(
        name=ref, opts=pulumi.InvokeOutputOptions(parent=parent, provider=node.provider),
    ).apply(lambda r: pinned_ref(ref, r.sha256_digest))


@dataclass
class VllmImageArgs:
    image: ImageConfig
    cluster: Cluster
    names: StackNames  # the image seeder's pid and log files on the head
    labels: Mapping[str, str]  # ownership labels for the probe's throw-away container
    rdma: bool  # nccl.rdma: the image must carry libibverbs
    load_format: str = "auto"  # vllm.loadFormat: fastsafetensors needs a patched image
    environment: str = "dev"  # prod: an image not shown to load fastsafetensors across nodes stops
    # what must be done before any image moves (the fabric check): every child waits for it
    after: list[pulumi.Resource] = field(default_factory=list)


class VllmImage(pulumi.ComponentResource):
    """`image_ids[node]` is the ID to run on that node; `image_id` the common one (checked)."""

    images: dict[str, docker.RemoteImage]
    image_ids: dict[str, pulumi.Output[str]]
    image_id: pulumi.Output[str]
    copies: dict[str, remote.Command]
    probes: dict[str, remote.Command]
    check: remote.Command
    probe_summary: pulumi.Output[dict[str, str]]
    nccl: pulumi.Output[dict[str, Any]]

    def __init__(
        self, name: str, args: VllmImageArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        image, cluster = args.image, args.cluster
        # Props can only hold values known before the children exist (a component registers
        # before its children, which need its URN); the image IDs are outputs (register_outputs).
        props: VllmImageProps = {"ref": image.ref, "source": image.source, "nodes": cluster.names}
        super().__init__(types.VLLM_IMAGE, name, props, opts)
        self.images = {}
        self.copies = {}
        self.after = list(args.after)
        self.names = args.names
        self.pull_ref = self._pull_ref(image, cluster.head)

        self.images[cluster.head.name] = self._remote_image(name, cluster.head, [])
        self.seeder: tuple[remote.Command | None, remote.Command | None] = (None, None)
        if image.source == "head" and cluster.workers:
            self._copy_from_head(name, image.ref, cluster)
        for node in cluster.workers:
            after: list[pulumi.Resource] = []
            if node.name in self.copies:
                after.append(self.copies[node.name])
            self.images[node.name] = self._remote_image(name, node, after)

        self.image_ids = {n: img.image_id for n, img in self.images.items()}
        all_ids = pulumi.Output.all(**self.image_ids)
        self.image_id = all_ids.apply(_same_id)
        self._probe(name, args)
        # ref/source are outputs too: stack-level policies (prod-pinned) read outputs.
        self.register_outputs(
            {
                "ref": image.ref,
                "source": image.source,
                "nodes": cluster.names,  # a prop: a stack policy reads the outputs
                "pulledRef": self.pull_ref,
                "imageIds": all_ids,
                "imageId": self.image_id,
                "probes": self.probe_summary,
            }
        )

    def _probe(self, name: str, args: VllmImageArgs) -> None:
        """A probe per node (its text holds the image ID, so it runs once per ID) and the check
        on the head that judges them all."""
        labels = {**args.labels, lbl.ROLE: lbl.IMAGE_PROBE}
        self.probes = {
            node.name: node.command(
                f"{name}-probe-{node.name}",
                self,
                create=self.image_ids[node.name].apply(
                    lambda i: image_probe(i or "", labels, record=self.names)),
                delete=self.image_ids[node.name].apply(
                    lambda i: image_probe_remove(self.names, i or "")),
            )
            for node in args.cluster.nodes
        }
        outs = pulumi.Output.all(**{n: c.stdout for n, c in self.probes.items()})

        def verdict(stdouts: dict[str, str]) -> tuple[dict[str, str], list[str], list[str],
                                                      dict[str, Any]]:
            probes: dict[str, ImageProbe] = {}
            problems = []
            for node, text in sorted(stdouts.items()):
                try:
                    probes[node] = parse_probe(node, text)
                except ImageProbeError as exc:
                    problems.append(str(exc))
            lines = {n: p.line() for n, p in probes.items()}
            stop, warned = loader_findings(probes, load_format=args.load_format,
                                           nodes=len(args.cluster.nodes),
                                           prod=args.environment == "prod")
            bad, unsure = nccl_findings(probes, strict=args.environment != "dev")
            nccl = {n: p.nccl.model_dump(by_alias=True) if p.nccl else None
                    for n, p in probes.items()}
            return (lines, problems + judge(probes, rdma=args.rdma) + stop + bad,
                    warned + unsure, nccl)

        judged = outs.apply(verdict)
        self.probe_summary = judged.apply(lambda v: v[0])
        # per node, the NCCL its serving vLLM loads (payloads/nccl_library.py): the collective
        # gate's props, which the policy pack's nccl-build-advisory reads
        self.nccl = judged.apply(lambda v: v[3])
        self.check = args.cluster.head.command(
            f"{name}-check",
            self,
            create=judged.apply(
                lambda v: image_check(
                    [f"{n}: {line}" for n, line in sorted(v[0].items())], v[1], v[2]
                )
            ),
        )

    def _pull_ref(self, image: ImageConfig, head: SparkNode) -> pulumi.Output[str]:
        """What every node pulls: an image built on the head by its ref, else `pull_ref`."""
        if image.source != "registry":
            return pulumi.Output.from_input(image.ref)
        return pull_ref(self, image.ref, head)

    def _remote_image(
        self, name: str, node: SparkNode, after: list[pulumi.Resource]
    ) -> docker.RemoteImage:
        return docker.RemoteImage(
            f"{name}-{node.name}",
            name=self.pull_ref,
            keep_locally=True,
            opts=pulumi.ResourceOptions(
                parent=self, provider=node.provider, depends_on=[*self.after, *after] or None
            ),
        )

    def _copy_from_head(self, name: str, ref: str, cluster: Cluster) -> None:
        """A seeder on the head, a pull on each worker, and a stop once every pull is done."""
        head = cluster.head
        targets = [n.name for n in cluster.workers]
        start_text = image_seeder_start(self.names, ref, head.fabric_ip, targets)
        start = head.command(
            f"{name}-seed",
            self,
            create=start_text,
            depends_on=[*self.after, self.images[head.name]],
            # its stdout is the run's token (the seeder answers no one without it): a secret,
            # never logged, handed to the pulls on stdin
            secret_outputs=["stdout"],
            logging=remote.Logging.STDERR,
        )
        run_token: pulumi.Output[str] = start.stdout.apply(lambda out: (out or "").strip() + "\n")
        token: pulumi.Output[str] = pulumi.Output.secret(run_token)
        for node in cluster.workers:
            self.copies[node.name] = node.command(
                f"{name}-copy-{node.name}",
                self,
                create=self.images[head.name].image_id.apply(
                    lambda i: image_pull_from_head(self.names, ref, head.fabric_ip, i or "")
                ),
                stdin=token,
                depends_on=[*self.after, start],
            )
        stop = head.command(
            f"{name}-seed-stop",
            self,
            create=image_seeder_stop(self.names, targets, ref, start=start_text),
            depends_on=list(self.copies.values()),
        )
        self.seeder = (start, stop)
