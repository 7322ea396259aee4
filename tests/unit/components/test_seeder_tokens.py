"""The seeders' run token through the program (issue 31, item 6): the start's stdout is a secret
never logged, and it reaches the syncs' and pulls' stdin, a secret too."""

from __future__ import annotations

import hashlib
import json

import pulumi

from tests.conftest import is_secret, reveal
from tests.unit.conftest import settled


def _logged(mocks, name: str) -> object:
    return mocks.named(name).inputs.get("logging")


@pulumi.runtime.test
def test_the_model_seeders_token_goes_to_the_syncs_as_a_secret(build, mocks):
    h = build(3)

    def check(_):
        assert _logged(mocks, "model-seed") == "stderr"  # its stdout (the token) not logged
        token = hashlib.sha256(b"model-seed").hexdigest()  # what the mocks' seed printed
        for w in ("spark-2", "spark-3"):
            stdin = mocks.named(f"model-sync-{w}").inputs["stdin"]
            assert is_secret(stdin) and json.loads(reveal(stdin))["token"] == token

    return settled(h).apply(check)


@pulumi.runtime.test
def test_the_image_seeders_token_goes_to_the_pulls_as_a_secret(build, mocks):
    h = build(2, image={"ref": "vllm-node:local", "source": "head", "plainHttpRegistry": False})

    def check(_):
        assert _logged(mocks, "image-seed") == "stderr"
        stdin = mocks.named("image-copy-spark-2").inputs["stdin"]
        assert is_secret(stdin)
        assert reveal(stdin) == hashlib.sha256(b"image-seed").hexdigest() + "\n"
        assert "python3 -c" in mocks.named("image-copy-spark-2").inputs["create"]

    return settled(h).apply(check)
