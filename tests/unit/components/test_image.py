"""VllmImage: what every node pulls, and the probe of what the image carries (issue 17). A tag is
resolved to its digest at the registry (through the head's docker provider) and every node pulls
`<repo>@<digest>`; a digest ref is pulled as is."""

from __future__ import annotations

import json

import pulumi
import pytest

from components.vllm_image import ImageMismatchError, pinned_ref, registry_host, repository
from tests.conftest import config_raw, fake_image_id, monitoring_pinned, reveal
from tests.unit.conftest import settled

TAG = "10.77.0.1:5000/spark-lab/vllm-spark:lab"
DIGEST_REF = "10.77.0.1:5000/spark-lab/vllm-spark@sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("ref", "repo", "registry"),
    [
        (TAG, "10.77.0.1:5000/spark-lab/vllm-spark", "10.77.0.1:5000"),
        ("localhost:5000/x", "localhost:5000/x", "localhost:5000"),
        ("nvcr.io/nvidia/vllm:26.05-py3", "nvcr.io/nvidia/vllm", "nvcr.io"),
        ("vllm/vllm-openai:v0.32.0", "vllm/vllm-openai", "docker.io"),
        (DIGEST_REF, "10.77.0.1:5000/spark-lab/vllm-spark", "10.77.0.1:5000"),
    ],
)
def test_repository_and_registry_of_a_ref(ref, repo, registry):
    assert repository(ref) == repo
    assert registry_host(ref) == registry


def test_pinned_ref_refuses_what_is_not_a_digest():
    assert pinned_ref(TAG, "sha256:" + "0" * 64) == "10.77.0.1:5000/spark-lab/vllm-spark@sha256:" + "0" * 64
    for bad in ("", "latest", "sha256:xyz", "sha256:" + "0" * 63, "sha256:" + "0" * 64 + "\n"):
        with pytest.raises(ImageMismatchError):
            pinned_ref(TAG, bad)


@pulumi.runtime.test
def test_a_tag_is_resolved_once_and_every_node_pulls_the_digest(build, mocks):
    h = build(3)

    def check(_):
        want = f"10.77.0.1:5000/spark-lab/vllm-spark@{fake_image_id(TAG)}"
        pulls = {r.name: r.inputs["name"] for r in mocks.of_type("docker:index/remoteImage:RemoteImage")
                 if r.name.startswith("image-")}  # the serving image's (not the gateway's, ...)
        assert pulls == {f"image-spark-{i}": want for i in (1, 2, 3)}
        # the lab's registry speaks plain HTTP: every provider knows, with no credentials
        for p in mocks.of_type("pulumi:providers:docker"):
            auth = json.loads(reveal(p.inputs["registryAuth"]))  # provider config is JSON
            assert auth == [{"address": "http://10.77.0.1:5000", "authDisabled": True}], auth

    return settled(h).apply(check)


@pulumi.runtime.test
def test_a_digest_ref_is_pulled_as_it_is(build, mocks):
    gateway = "registry.example:5000/haproxy@sha256:" + "b" * 64
    monitoring = monitoring_pinned(config_raw(2)["monitoring"])
    h = build(2, image={"ref": DIGEST_REF, "plainHttpRegistry": False},
              gateway={"image": {"ref": gateway}}, monitoring=monitoring)

    def check(_):
        pulls = {r.inputs["name"] for r in mocks.of_type("docker:index/remoteImage:RemoteImage")}
        assert pulls == {DIGEST_REF, gateway, monitoring["prometheus"]["ref"],
                         monitoring["nodeExporter"]["ref"], monitoring["alertmanager"]["ref"]}
        assert all("registryAuth" not in p.inputs for p in mocks.of_type("pulumi:providers:docker"))

    return settled(h).apply(check)


@pulumi.runtime.test
def test_image_probe_per_node_then_the_check_before_ray(build, mocks, dependencies):
    h = build(2)

    def check(_):
        for n in ("spark-1", "spark-2"):
            probe = mocks.named(f"image-probe-{n}").inputs["create"]
            assert "docker run --rm --network none" in probe
            assert "--label spark-vllm.role=image-probe" in probe
            assert f"image-{n}" in dependencies[f"image-probe-{n}"]
        assert {"image-probe-spark-1", "image-probe-spark-2"} <= dependencies["image-check"]
        assert "image-check" in dependencies["ray-head"]
        assert "image-check" in dependencies["ray-worker-spark-2"]
        text = mocks.named("image-check").inputs["create"]
        assert "exit 1" not in text and "spark-2: python 3.12.3, torch 2.13.0" in text

    return settled(h).apply(check)
