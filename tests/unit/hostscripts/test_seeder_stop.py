"""A seeder's stop command must run again whenever its start command does.

Found by tests/e2e/test_change_image_and_nodes.py: an image change re-ran `model-seed` (its
script names the image) but not `model-seed-stop` (its script named only the commit and the
targets), so the model seeder stayed up on the head after the update. The image seeder
(`image.source: head`) had the same shape: its start names the ref, its stop did not.
"""

from __future__ import annotations

import pulumi

from hostscripts import images, models
from hostscripts.paths import StackNames
from tests.conftest import fake_image_id
from tests.unit.conftest import settled

LABELS = {"spark-vllm.managed": "true"}
NAMES = StackNames("dev")


def _model_pair(image="sha256:" + "a" * 64, commit="c" * 40, targets=("spark-2",),
                binds=("192.168.177.11", "192.168.178.11")):
    start = models.model_seeder_start(
        NAMES, image, "/root/.cache/huggingface", "o/m", binds, LABELS, targets, commit
    )
    return start, models.model_seeder_stop(NAMES, targets, commit, image, binds)


def test_model_seeder_stop_changes_with_every_start_input():
    base_start, base_stop = _model_pair()
    changes = ({"image": "sha256:" + "b" * 64}, {"commit": "d" * 40},
               {"targets": ("spark-2", "spark-3")}, {"binds": ("192.168.177.11",)})
    for changed in changes:
        start, stop = _model_pair(**changed)
        assert start != base_start, changed
        assert stop != base_stop, f"{changed}: the seeder would run again but not be stopped"


def test_image_seeder_stop_changes_with_every_start_input():
    def pair(ref="r:1", targets=("spark-2",)):
        return (
            images.image_seeder_start(NAMES, ref, "192.168.177.11", targets),
            images.image_seeder_stop(NAMES, targets, ref),
        )

    base_start, base_stop = pair()
    for changed in ({"ref": "r:2"}, {"targets": ("spark-2", "spark-3")}):
        start, stop = pair(**changed)
        assert start != base_start and stop != base_stop, changed


@pulumi.runtime.test
def test_model_seed_stop_names_the_head_image_like_the_seed(build, mocks):
    h = build(3)

    def check(_):
        image_id = fake_image_id(mocks.named("image-spark-1").inputs["name"])
        assert image_id in mocks.named("model-seed").inputs["create"]
        assert image_id in mocks.named("model-seed-stop").inputs["create"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_image_seed_stop_names_the_ref_like_the_seed(build, mocks):
    h = build(3, image={"source": "head"})

    def check(_):
        ref = mocks.named("image-spark-1").inputs["name"]
        assert ref in mocks.named("image-seed").inputs["create"]
        assert ref in mocks.named("image-seed-stop").inputs["create"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_change_of_the_seeders_program_runs_the_stop_again_too(build, mocks, monkeypatch):
    """Issue 31 changed the seeders' programs (the run's token): the starts' text changed while
    the stops' did not, so an upgrade would start a seeder that no stop ends (it would listen
    for an hour and hold its port against another stack). Each stop carries a digest of its
    start's whole text now: whatever re-runs the start re-runs the stop."""
    builds = {}
    for variant in ("before", "after"):
        if variant == "after":
            monkeypatch.setattr(models, "_MODEL_SEEDER_PY", models._MODEL_SEEDER_PY + "\n# x")
            monkeypatch.setattr(images, "_IMAGE_SEEDER_PY", images._IMAGE_SEEDER_PY + "\n# x")
        ref = "vllm-node:local"
        start = images.image_seeder_start(NAMES, ref, "192.168.177.11", ["spark-2"])
        builds[variant] = (
            models.model_seeder_stop(NAMES, ["spark-2"], "c" * 40, "sha256:" + "a" * 64,
                                     ["192.168.177.11"], start=models.model_seeder_start(
                                         NAMES, "sha256:" + "a" * 64, "/c", "o/m",
                                         ["192.168.177.11"], LABELS, ["spark-2"], "c" * 40)),
            images.image_seeder_stop(NAMES, ["spark-2"], ref, start=start),
        )
    assert builds["before"][0] != builds["after"][0]
    assert builds["before"][1] != builds["after"][1]
    h = build(2, image={"ref": "vllm-node:local", "source": "head", "plainHttpRegistry": False})

    def check(_):
        import hashlib

        for what in ("model", "image"):
            start = mocks.named(f"{what}-seed").inputs["create"]
            stop = mocks.named(f"{what}-seed-stop").inputs["create"]
            assert hashlib.sha256(start.encode()).hexdigest()[:16] in stop, what

    return settled(h).apply(check)
