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
* `head`: the image was built on the head; the other nodes get it over the fabric. Nodes do not
  trust each other over SSH, so the head runs a short-lived HTTP seeder on its fabric address that
  streams `docker save`, each other node pipes it into `docker load`, and the seeder is stopped
  (see components/scripts.py). Then the RemoteImage on that node finds the image locally.

The component fails the update if the nodes end up with different image IDs: TP ranks running
different builds fail in ways that are much harder to read later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import scripts
from components.spark_node import SparkNode


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


_DIGEST_REF = re.compile(r"@sha256:[0-9a-f]{64}\Z")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


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
    if not _DIGEST.fullmatch(digest or ""):
        raise ImageMismatchError(
            f"spark-vllm:image.ref: the registry reported {digest!r} for {ref!r}; expected "
            "sha256:<64 hex>"
        )
    return f"{repository(ref)}@{digest}"


@dataclass
class VllmImageArgs:
    ref: str
    source: str  # "registry" | "head"
    nodes: list[SparkNode]  # the head first


class VllmImage(pulumi.ComponentResource):
    """`image_ids[node]` is the ID to run on that node; `image_id` the common one (checked)."""

    images: dict[str, docker.RemoteImage]
    image_ids: dict[str, pulumi.Output[str]]
    image_id: pulumi.Output[str]
    copies: dict[str, remote.Command]

    def __init__(self, name: str, args: VllmImageArgs, opts: pulumi.ResourceOptions | None = None):
        if args.source not in ("registry", "head"):
            raise ValueError(f"VllmImage {name}: source must be registry or head")
        # Props can only hold values known before the children exist (a component registers
        # before its children, which need its URN); the image IDs are outputs (register_outputs).
        super().__init__(
            "spark-vllm:vllm_image:VllmImage",
            name,
            {"ref": args.ref, "source": args.source, "nodes": [n.name for n in args.nodes]},
            opts,
        )
        head, others = args.nodes[0], args.nodes[1:]
        self.images = {}
        self.copies = {}

        # What every node pulls: the ref itself when pinned (or built on the head), else the
        # repository at the digest its tag points to now.
        pull: pulumi.Input[str] = args.ref
        if args.source == "registry" and not _DIGEST_REF.search(args.ref):
            pull = docker.get_registry_image_output(
                name=args.ref,
                opts=pulumi.InvokeOutputOptions(parent=self, provider=head.provider),
            ).apply(lambda r: pinned_ref(args.ref, r.sha256_digest))
        self.pull_ref = pulumi.Output.from_input(pull)

        self.images[head.name] = docker.RemoteImage(
            f"{name}-{head.name}",
            name=self.pull_ref,
            keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=head.provider),
        )
        targets = [n.name for n in others]
        seeder_start = seeder_stop = None
        if args.source == "head" and others:
            seeder_start = remote.Command(
                f"{name}-seed",
                connection=head.connection,
                add_previous_output_in_env=False,  # see scripts.py
                create=scripts.image_seeder_start(args.ref, head.fabric_ip, targets),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.images[head.name]]),
            )
        for node in others:
            deps: list[pulumi.Resource] = []
            if seeder_start is not None:
                copy = remote.Command(
                    f"{name}-copy-{node.name}",
                    connection=node.connection,
                    add_previous_output_in_env=False,  # see scripts.py
                    create=self.images[head.name].image_id.apply(
                        lambda i: scripts.image_pull_from_head(args.ref, head.fabric_ip, i or "")
                    ),
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[seeder_start]),
                )
                self.copies[node.name] = copy
                deps.append(copy)
            self.images[node.name] = docker.RemoteImage(
                f"{name}-{node.name}",
                name=self.pull_ref,
                keep_locally=True,
                opts=pulumi.ResourceOptions(parent=self, provider=node.provider, depends_on=deps),
            )
        if self.copies:
            seeder_stop = remote.Command(
                f"{name}-seed-stop",
                connection=head.connection,
                add_previous_output_in_env=False,  # see scripts.py
                create=scripts.image_seeder_stop(targets, args.ref),
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.copies.values())),
            )
        self.seeder = (seeder_start, seeder_stop)

        self.image_ids = {n: img.image_id for n, img in self.images.items()}
        all_ids = pulumi.Output.all(**self.image_ids)
        self.image_id = all_ids.apply(_same_id)
        # ref/source are outputs too: stack-level policies (prod-pinned) read outputs.
        self.register_outputs(
            {
                "ref": args.ref,
                "source": args.source,
                "pulledRef": self.pull_ref,
                "imageIds": all_ids,
                "imageId": self.image_id,
            }
        )
