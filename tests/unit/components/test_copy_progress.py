"""The long copies' progress in the `up`: each worker's model sync and image copy runs its payload
with the progress interval and the node's name (tests/unit/hostscripts/test_copy_progress.py
runs the payloads), and the command's logging shows stderr, where the progress lines go.
`logging` unset is the provider's default, stdout and stderr both (pulumi_command's
Command: "Defaults to logging both stdout and stderr")."""

from __future__ import annotations

import pulumi

from hostscripts.images import COPY_PROGRESS_SECONDS
from hostscripts.models import SYNC_PROGRESS_SECONDS
from tests.unit.conftest import settled

SHOWS_STDERR = (None, "stderr", "stdoutAndStderr")


@pulumi.runtime.test
def test_each_workers_model_sync_shows_its_progress_in_the_up(build, mocks):
    h = build(3)

    def check(_):
        for w in ("spark-2", "spark-3"):
            sync = mocks.named(f"model-sync-{w}").inputs
            assert sync.get("logging") in SHOWS_STDERR, sync.get("logging")
            assert f' {SYNC_PROGRESS_SECONDS} "$(uname -n)" < "$m"' in sync["create"]
        # the head copies nothing: no sync there
        assert not [r for r in mocks.resources if r.name == "model-sync-spark-1"]

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_image_copy_shows_its_progress_in_the_up(build, mocks):
    h = build(2, image={"ref": "vllm-node:local", "source": "head", "plainHttpRegistry": False})

    def check(_):
        copy = mocks.named("image-copy-spark-2").inputs
        assert copy.get("logging") in SHOWS_STDERR, copy.get("logging")
        # into the stack's scratch file, checked, then loaded (issue 46)
        assert (f"/image.tar {COPY_PROGRESS_SECONDS} 'image copy' \"$(uname -n)\" > \"$f\""
                in copy["create"])
        assert 'docker load -i "$f"' in copy["create"]

    return settled(h).apply(check)
