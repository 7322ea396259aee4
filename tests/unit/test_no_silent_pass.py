"""The harness must fail when an assertion inside an apply fails.

(Pulumi's unit-testing guide: https://www.pulumi.com/docs/using-pulumi/testing/unit/ ; an
undecorated test or unknown outputs let an apply's assertion never run.)

A test that forgets `@pulumi.runtime.test`, or lets outputs stay unknown, passes whatever its
applies assert. These tests run deliberately failing test bodies through the same decorator and
fixtures the suite uses, and require them to raise.
"""

from __future__ import annotations

import pulumi
import pytest

from tests.unit.conftest import settled


def test_failing_assert_in_apply_fails_the_decorated_test(mocks):
    @pulumi.runtime.test
    def broken():
        return pulumi.Output.from_input(1).apply(lambda v: _fail(v == 2))

    with pytest.raises(AssertionError, match="inside apply"):
        broken()


def test_failing_assert_on_a_mocked_resource_output_fails(build, mocks):
    @pulumi.runtime.test
    def broken():
        h = build(2)
        # imageId comes from the recording mocks, so the apply runs (preview=False)
        return settled(h, h.image.image_id).apply(lambda v: _fail(v[0] == "wrong"))

    with pytest.raises(AssertionError, match="inside apply"):
        broken()


def test_outputs_are_known_so_applies_run(build, mocks):
    ran = []

    @pulumi.runtime.test
    def body():
        h = build(2)
        return settled(h, h.model.commit, h.vllm.serve.command, h.vllm.health.create).apply(
            ran.append)

    body()
    assert ran and ran[0][0] and ran[0][1][:2] == ["vllm", "serve"] and "/health" in ran[0][2]


def _fail(ok: bool) -> None:
    assert ok, "inside apply"
