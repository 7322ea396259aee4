"""The Prometheus, node exporter and Alertmanager images (lab/deb_images.py's recipes, lab/
image.py's builds; and what the four images of Debian packages share) without a lab: their keys,
what `docker import` gives them, the checks a build must pass before the push, what `up`, `down`
and stack.json do with them. The builds run on the lab (`lab.py up`);
tests/lab/test_monitoring_images.py runs the images there."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml

from lab import deb_images, hosts, image, state
from lab.layout import REGISTRY, STACK_TAG

DIGEST = "sha256:" + "b" * 64
ROOT = Path(__file__).resolve().parents[3]
# what bookworm's packages answer (recorded in a debootstrap of each package)
PROMETHEUS_V = ("prometheus, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5+deb12u1)\n"
                "  build user:       team+pkg-go@tracker.debian.org\n"
                "  go version:       go1.19.8\n  platform:         linux/amd64\n")
PROMTOOL_V = PROMETHEUS_V.replace("prometheus, version", "promtool, version", 1)
NODE_EXPORTER_V = ("node_exporter, version 1.5.0 (branch: debian/sid, revision: 1.5.0-1+b6)\n"
                   "  go version:       go1.19.8\n  platform:         linux/amd64\n")
# bookworm's prometheus-alertmanager 0.25.0-1+b4, as installed on this machine
# (scripts/host_packages.sh): the server and amtool print their own names
ALERTMANAGER_V = ("alertmanager, version 0.25.0 (branch: debian/sid, revision: 0.25.0-1+b4)\n"
                  "  build user:       team+pkg-go@tracker.debian.org\n")
AMTOOL_V = ALERTMANAGER_V.replace("alertmanager, version", "amtool, version", 1)
IMAGES = list(deb_images.DEB_IMAGES.values())


def done(rc: int, out: str = "", err: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], rc, out, err)


def changes(img: deb_images.DebImage, key: str = "k" * 16) -> list:
    got = image.import_changes(img, key)
    assert set(got[::2]) == {"-c"}
    return got[1::2]


# --------------------------------------------------------------------------- recipes and keys
def test_each_image_has_its_own_key_and_repository():
    keys = [image.deb_key(img) for img in IMAGES]
    assert len(set(keys)) == 4 and all(len(k) == 16 for k in keys)
    assert len({img.repo for img in IMAGES}) == len({img.label for img in IMAGES}) == 4
    assert image.base_key() not in keys


def test_the_gateway_key_does_not_hash_what_it_predates():
    """Its cached image stays valid: only what its key hashed before the recipes were shared."""
    g = deb_images.GATEWAY
    assert image.deb_key(dataclasses.replace(g, setup="true\n")) == image.deb_key(g)
    assert image.deb_key(dataclasses.replace(g, key_has_config=True)) != image.deb_key(g)


@pytest.mark.parametrize("img", [deb_images.PROMETHEUS, deb_images.NODE_EXPORTER, deb_images.ALERTMANAGER],
                         ids=lambda i: i.label)
def test_the_monitoring_keys_follow_the_whole_recipe(img):
    key = image.deb_key(img)
    for name, value in (("pkgs", (*img.pkgs, "curl")), ("rev", img.rev + 1),
                        ("key_parts", ("9.9.",)), ("trim", ()), ("setup", img.setup + "true\n"),
                        ("user", "root"), ("workdir", "/srv"), ("entrypoint", ("sh",)),
                        ("cmd", ("--help",)), ("probes", ()), ("env", ("LANG=C",))):
        assert image.deb_key(dataclasses.replace(img, **{name: value})) != key, name


def test_prometheus_is_packaged_like_upstreams_image():
    lines = changes(deb_images.PROMETHEUS)
    assert 'ENTRYPOINT ["prometheus"]' in lines  # found on PATH: /usr/bin/prometheus
    assert 'CMD ["--config.file=/etc/prometheus/prometheus.yml", ' \
           '"--storage.tsdb.path=/prometheus"]' in lines
    assert "USER nobody" in lines and "WORKDIR /prometheus" in lines
    assert "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in lines
    assert any(x.startswith("LABEL ") and "spark-vllm.lab.prometheus=" + "k" * 16 in x
               for x in lines)
    assert deb_images.PROMETHEUS.pkgs == ("prometheus",)
    # its data folder exists and belongs to the user it runs as
    assert "mkdir -p /prometheus" in deb_images.PROMETHEUS.setup
    assert "chown nobody:nogroup /prometheus" in deb_images.PROMETHEUS.setup


def test_prometheus_sheds_the_tzdata_json_of_its_web_ui_and_what_every_image_sheds():
    assert set(deb_images.DEB_TRIM) <= set(deb_images.PROMETHEUS.trim)
    assert "usr/share/javascript/moment-timezone/data" in deb_images.PROMETHEUS.trim
    assert deb_images.NODE_EXPORTER.trim == deb_images.GATEWAY.trim == deb_images.DEB_TRIM


def test_the_node_exporter_answers_to_upstreams_binary_name():
    lines = changes(deb_images.NODE_EXPORTER, "e" * 16)
    assert 'ENTRYPOINT ["node_exporter"]' in lines and "USER nobody" in lines
    assert not any(x.startswith("CMD ") for x in lines)  # the stack passes its flags
    assert any("spark-vllm.lab.node-exporter=" + "e" * 16 in x for x in lines)
    assert deb_images.NODE_EXPORTER.pkgs == ("prometheus-node-exporter",)
    assert deb_images.NODE_EXPORTER.setup.split() == \
        ["ln", "-s", "/usr/bin/prometheus-node-exporter", "/usr/local/bin/node_exporter"]


def test_alertmanager_is_packaged_like_upstreams_image():
    """Upstream's prom/alertmanager: `alertmanager` on PATH (Debian's binary is
    prometheus-alertmanager), amtool beside it, user nobody, its data in /alertmanager."""
    lines = changes(deb_images.ALERTMANAGER, "a" * 16)
    assert 'ENTRYPOINT ["alertmanager"]' in lines
    assert 'CMD ["--config.file=/etc/prometheus/alertmanager.yml", ' \
           '"--storage.path=/alertmanager"]' in lines
    assert "USER nobody" in lines and "WORKDIR /alertmanager" in lines
    assert any("spark-vllm.lab.alertmanager=" + "a" * 16 in x for x in lines)
    assert deb_images.ALERTMANAGER.pkgs == ("prometheus-alertmanager",)
    assert "ln -s /usr/bin/prometheus-alertmanager /usr/local/bin/alertmanager" in \
        deb_images.ALERTMANAGER.setup
    assert "chown nobody:nogroup /alertmanager" in deb_images.ALERTMANAGER.setup


def test_the_alertmanager_check_wants_0_25_and_a_working_amtool():
    assert deb_images.alertmanager_check(0, ALERTMANAGER_V, 0, AMTOOL_V) == []
    assert deb_images.alertmanager_check(0, ALERTMANAGER_V.replace("0.25.0", "0.24.0"), 0,
                                    AMTOOL_V)[0].startswith("expected alertmanager 0.25.x")
    assert deb_images.alertmanager_check(0, ALERTMANAGER_V, 127, "no amtool")[0].startswith(
        "amtool --version exited 127")


def test_the_images_are_named_as_pulumi_dev_yaml_and_stack_json_name_them():
    cfg = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    tag = {field: f"{REGISTRY}/{img.repo}:{STACK_TAG}" for field, img in deb_images.DEB_IMAGES.items()}
    assert cfg["spark-vllm:gateway"]["image"]["ref"] == tag["gatewayImage"]
    assert cfg["spark-vllm:monitoring"]["prometheus"]["ref"] == tag["prometheusImage"]
    assert cfg["spark-vllm:monitoring"]["nodeExporter"]["ref"] == tag["nodeExporterImage"]
    assert cfg["spark-vllm:monitoring"]["alertmanager"]["ref"] == tag["alertmanagerImage"]


# --------------------------------------------------------------------------- the checks
def test_the_prometheus_check_wants_2_42_and_a_working_promtool():
    assert deb_images.prometheus_check(0, PROMETHEUS_V, 0, PROMTOOL_V) == []
    old = PROMETHEUS_V.replace("2.42.0", "2.33.5")
    assert deb_images.prometheus_check(0, old, 0, PROMTOOL_V) == \
        ["expected prometheus 2.42.x, got 'prometheus, version 2.33.5+ds (branch: debian/sid, "
         "revision: 2.33.5+ds-5+deb12u1)'"]
    missing = 'exec: "promtool": executable file not found in $PATH'
    got = deb_images.prometheus_check(0, PROMETHEUS_V, 127, missing)
    assert len(got) == 1 and got[0].startswith("promtool --version exited 127") and missing in got[0]
    # the other program's answer is not enough
    assert deb_images.prometheus_check(0, PROMETHEUS_V, 0, PROMETHEUS_V)[0].startswith(
        "expected promtool 2.42.x")
    assert deb_images.prometheus_check(1, "", 0, PROMTOOL_V)[0].startswith(
        "prometheus --version exited 1")


def test_the_node_exporter_check_wants_1_5():
    assert deb_images.node_exporter_check(0, NODE_EXPORTER_V) == []
    assert deb_images.node_exporter_check(0, NODE_EXPORTER_V.replace("1.5.0", "1.6.1")) == \
        ["expected node_exporter 1.5.x, got 'node_exporter, version 1.6.1 (branch: debian/sid, "
         "revision: 1.6.1-1+b6)'"]
    assert deb_images.node_exporter_check(0, "") == ["expected node_exporter 1.5.x, got ''"]
    assert deb_images.node_exporter_check(126, "permission denied")[0].startswith(
        "node_exporter --version exited 126")


def test_each_recipe_checks_what_its_probes_answer():
    """The probes the build runs in the new image, and the recipe's check reading their answers
    in that order."""
    p = deb_images.PROMETHEUS
    assert [(x.args, x.entrypoint) for x in p.probes] == [(("--version",), ""),
                                                          (("--version",), "promtool")]
    assert p.check([done(0, PROMETHEUS_V), done(0, PROMTOOL_V)]) == []
    assert p.check([done(0, PROMETHEUS_V), done(1, "", "no promtool")])
    n = deb_images.NODE_EXPORTER
    assert [(x.args, x.entrypoint) for x in n.probes] == [(("--version",), "")]
    assert n.check([done(0, "", NODE_EXPORTER_V)]) == []  # stdout or stderr: either counts
    assert n.check([done(0, "node_exporter, version 1.7.0")])
    g = deb_images.GATEWAY
    assert [(x.args, x.user, x.input) for x in g.probes] == \
        [(("-vv",), "", None), (("-c", "-f", "/dev/stdin"), "0", deb_images.GATEWAY_SMOKE_CFG)]
    vv = "HAProxy version 2.6.12-1+deb12u4 2026/10/17\nBuilt with OpenSSL version : OpenSSL 3\n"
    assert g.check([done(0, vv), done(0)]) == []
    assert "smoke config failed: [ALERT] bad" in g.check([done(0, vv), done(1, "", "[ALERT] bad")])[0]


# --------------------------------------------------------------------------- build, up, down
class FakeBuilder:
    def docker(self) -> list:
        return ["docker", "-H", "unix:///fake.sock"]


@pytest.mark.parametrize("img", IMAGES, ids=lambda i: i.label)
def test_the_build_probes_the_new_image_offline_and_pushes_only_when_it_passes(monkeypatch, img):
    ran: list = []
    answers = {"prometheus": [done(0, PROMETHEUS_V), done(0, PROMTOOL_V)],
               "node-exporter": [done(0, NODE_EXPORTER_V)],
               "alertmanager": [done(0, ALERTMANAGER_V), done(0, AMTOOL_V)],
               "gateway": [done(0, "HAProxy version 2.6.12\nBuilt with OpenSSL\n"), done(0)]}
    replies = iter(answers[img.label])

    def fake_run(argv, **kw):
        ran.append((argv, kw.get("input")))
        return next(replies) if "run" in argv else done(0)

    monkeypatch.setattr(image, "deb_tree", lambda i, work: None)
    monkeypatch.setattr(image, "_docker_import", lambda *a: None)
    monkeypatch.setattr(image, "run", fake_run)
    image.build_deb_image(FakeBuilder(), img, "c" * 16)
    name = f"{REGISTRY}/{img.repo}:{'c' * 16}"
    runs = [a for a, _ in ran if "run" in a]
    assert len(runs) == len(img.probes)
    for argv, probe in zip(runs, img.probes, strict=True):
        assert argv[:5] == [*FakeBuilder().docker(), "run", "--rm"]
        assert argv[argv.index("--network") + 1] == "none"
        assert ("-i" in argv) == (probe.input is not None)
        assert (argv[argv.index("--user") + 1] if "--user" in argv else "") == probe.user
        assert argv[argv.index(name) + 1:] == list(probe.args)
        if probe.entrypoint:
            assert argv[argv.index("--entrypoint") + 1] == probe.entrypoint
    assert ran[-1][0] == [*FakeBuilder().docker(), "push", name]

    # a failing check stops the build before the push
    ran.clear()
    replies = iter([done(1, "boom")] * len(img.probes))
    with pytest.raises(SystemExit):
        image.build_deb_image(FakeBuilder(), img, "c" * 16)
    assert not any("push" in a for a, _ in ran)


@pytest.mark.parametrize("img", IMAGES, ids=lambda i: i.label)
def test_a_warm_up_only_asks_the_registry_and_a_cold_one_builds_and_prunes(monkeypatch, img):
    asked = []
    monkeypatch.setattr(image, "registry_digest", lambda tag, repo: asked.append((tag, repo))
                        or DIGEST)
    monkeypatch.setattr(image, "build_deb_image",
                        lambda *a: pytest.fail("built although cached"))
    assert image.ensure_deb_image(img) == f"{REGISTRY}/{img.repo}@{DIGEST}"
    assert asked == [(image.deb_key(img), img.repo)]

    built, pruned = [], []
    monkeypatch.setattr(image, "registry_digest", lambda tag, repo: DIGEST if built else None)
    monkeypatch.setattr(image, "build_deb_image", lambda b, i, key: built.append((i, key)))
    monkeypatch.setattr(image, "registry_prune", pruned.append)
    assert image.ensure_deb_image(img, FakeBuilder()) == f"{REGISTRY}/{img.repo}@{DIGEST}"
    assert built == [(img, image.deb_key(img))]
    assert pruned == [{img.repo: [image.deb_key(img)]}]


def test_stack_json_names_every_image_and_its_tag(monkeypatch):
    refs = {field: f"{REGISTRY}/{img.repo}@{DIGEST}" for field, img in deb_images.DEB_IMAGES.items()}
    monkeypatch.setattr(state, "state", lambda: {"nodes": 1, "image": "img", **refs})
    monkeypatch.setattr(state, "host_key", lambda name: "ssh-ed25519 AAAA")
    monkeypatch.setattr(state.hub, "commits", lambda repo=None: {})
    cfg = state.stack_config()
    assert cfg["prometheusImage"] == {"ref": refs["prometheusImage"],
                                      "tag": f"{REGISTRY}/spark-lab/prometheus:{STACK_TAG}"}
    assert cfg["nodeExporterImage"] == {"ref": refs["nodeExporterImage"],
                                        "tag": f"{REGISTRY}/spark-lab/node-exporter:{STACK_TAG}"}
    assert cfg["gatewayImage"] == {"ref": refs["gatewayImage"],
                                   "tag": f"{REGISTRY}/spark-lab/haproxy:{STACK_TAG}"}
    assert cfg["alertmanagerImage"] == {"ref": refs["alertmanagerImage"],
                                        "tag": f"{REGISTRY}/spark-lab/alertmanager:{STACK_TAG}"}


def test_down_keeps_every_image_of_debian_packages(monkeypatch):
    """scrub_docker (what `down` does to a node's Docker data) keeps the pulled images of the
    four recipes whatever their key, and the serving image on the current base only."""
    pulled = {"sha256:g": f'["{REGISTRY}/spark-lab/haproxy@{DIGEST}"]',
              "sha256:a": f'["{REGISTRY}/spark-lab/alertmanager@{DIGEST}"]',
              "sha256:p": f'["{REGISTRY}/spark-lab/prometheus@{DIGEST}"]',
              "sha256:n": f'["{REGISTRY}/spark-lab/node-exporter@{DIGEST}"]',
              "sha256:v": f'["{REGISTRY}/spark-lab/vllm-spark@{DIGEST}"]',
              "sha256:o": f'["{REGISTRY}/spark-lab/vllm-spark@sha256:{"0" * 64}"]',
              "sha256:x": '["docker.io/library/busybox@sha256:1"]'}
    base = {"sha256:v": "cur", "sha256:o": "old"}
    removed = []

    def fake_out(argv, check=True):
        if "ps" in argv:
            return ""
        if "images" in argv:
            return "\n".join(pulled)
        return "\n".join(f"{i} {base.get(i, '<no value>')} {d}" for i, d in pulled.items())

    monkeypatch.setattr(hosts, "node_docker", lambda name: ["docker"])
    monkeypatch.setattr(hosts, "out", fake_out)
    monkeypatch.setattr(hosts, "run", lambda argv, **kw: removed.extend(
        a for a in argv if a.startswith("sha256:")) or done(0))
    hosts.scrub_docker("spark-1", "cur")
    assert sorted(removed) == ["sha256:o", "sha256:x"]
