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
