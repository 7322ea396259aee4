"""The gateway image (lab/deb_images.py's recipe, lab/image.py's build) without a lab: its key, what
`docker import` gives it, the check a build must pass before the push (the smoke config through
the local haproxy), and that a warm `up` only asks the registry. The build itself runs on the lab
(`lab.py up`)."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest

from lab import deb_images, image, registry
from lab.layout import GATEWAY_REPO, REGISTRY, STACK_TAG
from tests.conftest import haproxy_binary

DIGEST = "sha256:" + "a" * 64


def test_the_key_follows_the_recipe():
    key = image.deb_key(deb_images.GATEWAY)
    assert key == image.deb_key(deb_images.GATEWAY) and len(key) == 16
    for name, value in (("pkgs", ("haproxy", "curl")), ("rev", 2),
                        ("key_parts", (deb_images.GATEWAY_SMOKE_CFG + "#\n", deb_images.GATEWAY_VERSION)),
                        ("trim", ())):
        assert image.deb_key(dataclasses.replace(deb_images.GATEWAY, **{name: value})) != key, name
    assert key != image.base_key()  # its own image, not the serving one's


def test_the_import_makes_haproxy_the_entrypoint_and_labels_the_key():
    changes = image.import_changes(deb_images.GATEWAY, "k" * 16)
    pairs = dict(zip(changes[::2], changes[1::2], strict=True))
    assert set(pairs) == {"-c"}
    lines = changes[1::2]
    assert 'ENTRYPOINT ["haproxy"]' in lines
    assert 'CMD ["-W", "-db", "-f", "/etc/spark-vllm/gateway/conf/haproxy.cfg"]' in lines
    assert any(x.startswith("LABEL ") and f"spark-vllm.lab.gateway={'k' * 16}" in x
               for x in lines)
    assert not any(x.startswith("USER ") for x in lines)  # root: haproxy drops to its user


def test_the_build_check_wants_haproxy_2_6_with_openssl_and_the_smoke_config_valid():
    vv = ("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/\n"
          "Built with OpenSSL version : OpenSSL 3.0.22\n")
    assert deb_images.gateway_check(vv, 0, "") == []
    assert "expected HAProxy 2.6.x" in deb_images.gateway_check(
        vv.replace("2.6.12", "2.4.22"), 0, "")[0]
    assert "without OpenSSL" in deb_images.gateway_check(vv.replace("OpenSSL", "WolfSSL"), 0, "")[0]
    assert "smoke config failed: [ALERT] x" in deb_images.gateway_check(vv, 1, "[ALERT] x")[0]


def test_the_smoke_config_passes_the_local_haproxy():
    """What the build checks in the new image, checked here with this machine's Debian haproxy
    (the same package the image is built from)."""
    done = subprocess.run([haproxy_binary(), "-c", "-f", "/dev/stdin"],
                          input=deb_images.GATEWAY_SMOKE_CFG, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr


def test_a_warm_up_only_asks_the_registry(monkeypatch):
    asked = []

    def digest(tag, repo):
        asked.append((tag, repo))
        return DIGEST

    monkeypatch.setattr(image, "registry_digest", digest)
    monkeypatch.setattr(image, "build_deb_image",
                        lambda *a: pytest.fail("built although cached"))
    assert image.ensure_deb_image(deb_images.GATEWAY) == f"{REGISTRY}/{GATEWAY_REPO}@{DIGEST}"
    assert asked == [(image.deb_key(deb_images.GATEWAY), GATEWAY_REPO)]


def test_a_cold_up_builds_pushes_and_drops_older_keys(monkeypatch):
    pushed: list[str] = []
    pruned: list[dict] = []
    monkeypatch.setattr(image, "registry_digest",
                        lambda tag, repo: DIGEST if pushed else None)
    monkeypatch.setattr(image, "build_deb_image", lambda b, img, key: pushed.append(key))
    monkeypatch.setattr(image, "registry_prune", pruned.append)

    class FakeBuilder:
        pass

    assert image.ensure_deb_image(deb_images.GATEWAY, FakeBuilder()) == \
        f"{REGISTRY}/{GATEWAY_REPO}@{DIGEST}"
    assert pushed == [image.deb_key(deb_images.GATEWAY)]
    assert pruned == [{GATEWAY_REPO: [image.deb_key(deb_images.GATEWAY)]}]


def test_the_stack_tag_is_pointed_in_the_images_own_repository(monkeypatch):
    moved = []
    monkeypatch.setattr(registry, "registry_digest", lambda tag, repo: None)
    monkeypatch.setattr(registry, "registry_retag",
                        lambda src, dst, repo: moved.append((src, dst, repo)))
    registry.ensure_stack_tag(f"{REGISTRY}/{GATEWAY_REPO}@{DIGEST}")
    assert moved == [(DIGEST, STACK_TAG, GATEWAY_REPO)]
