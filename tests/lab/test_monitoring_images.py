"""The lab's Prometheus, node exporter and Alertmanager images (lab/deb_images.py PROMETHEUS,
NODE_EXPORTER, ALERTMANAGER: Debian's prometheus 2.42, prometheus-node-exporter 1.5 and
prometheus-alertmanager 0.25) run on the nodes by the tags Pulumi.dev.yaml names, as the stack
runs upstream's prom/prometheus, prom/node-exporter and prom/alertmanager: the versions, the
binaries on PATH under upstream's names, user nobody, and each one serving HTTP on 127.0.0.1 in a
container without a network (`docker run --network none`; the images have no curl, so the node's
own curl asks, from inside the container's network namespace).
"""
import shlex
import urllib.request
import uuid

import pytest

pytestmark = pytest.mark.lab

FIELDS = ("prometheusImage", "nodeExporterImage", "alertmanagerImage")
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def _image(lab, field: str) -> str:
    """The image's `lab` tag (what Pulumi.dev.yaml names), pulled on every node."""
    assert field in lab.cfg, f"stack.json has no {field}: run `python3 lab/lab.py up`"
    tag = lab.cfg[field]["tag"]
    for node in lab.nodes:
        lab.ssh(node, f"docker pull -q {shlex.quote(tag)}", timeout=600)
    return tag


def _run(lab, node: str, args: str) -> str:
    """`docker run --rm --network none <args>` on the node: its output (stdout and stderr)."""
    return lab.ssh(node, f"docker run --rm --network none {args} 2>&1", timeout=120).stdout


def _serve_and_get(lab, node: str, run_args: str, url: str, tries: int = 30) -> str:
    """Start `docker run -d --network none <run_args>` on the node, then GET `url` (an address on
    the container's own 127.0.0.1) with the node's curl inside the container's network namespace
    until it answers; the answer. The container is removed in any case."""
    name = f"svl-test-{uuid.uuid4().hex[:10]}"
    script = f"""set -e
docker run -d --name {name} --network none {run_args} >/dev/null
for i in $(seq {tries}); do
  if [ "$(docker inspect -f '{{{{.State.Running}}}}' {name})" != true ]; then
    echo "{name} is not running" >&2; docker logs --tail 40 {name} >&2; exit 1
  fi
  pid=$(docker inspect -f '{{{{.State.Pid}}}}' {name})
  if nsenter --net=/proc/$pid/ns/net curl -sf --max-time 5 {shlex.quote(url)}; then exit 0; fi
  sleep 1
done
echo "no answer from {url} in {tries} s" >&2; docker logs --tail 40 {name} >&2; exit 1
"""
    try:
        return lab.ssh(node, f"sh -c {shlex.quote(script)}", timeout=tries + 120).stdout
    finally:
        lab.ssh(node, f"docker rm -f {name}", check=False)


def test_tags_name_the_images_up_recorded(lab):
    """`up` points each `lab` tag at the image it built (stack.json's `ref`, by digest)."""
    for field in FIELDS:
        assert field in lab.cfg, f"stack.json has no {field}: run `python3 lab/lab.py up`"
        ref, tag = lab.cfg[field]["ref"], lab.cfg[field]["tag"]
        registry, rest = tag.split("/", 1)
        repo, name = rest.rsplit(":", 1)
        assert name == "lab" and "@" not in tag
        req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{name}",
                                     method="HEAD", headers={"Accept": MANIFEST_V2})
        with urllib.request.urlopen(req, timeout=10) as r:
            digest = r.headers["Docker-Content-Digest"]
        assert ref == f"{registry}/{repo}@{digest}", (field, ref, digest)


def test_prometheus_image_versions_and_default_command(lab):
    tag = _image(lab, "prometheusImage")
    node = next(iter(lab.nodes))  # the head: where the stack runs Prometheus
    q = shlex.quote(tag)
    out = _run(lab, node, q + " --version")
    assert out.startswith("prometheus, version 2.42."), out
    out = _run(lab, node, f"--entrypoint promtool {q} --version")
    assert out.startswith("promtool, version 2.42."), out
    assert _run(lab, node, f"--entrypoint id {q} -un").strip() == "nobody"
    out = _run(lab, node, f"--entrypoint promtool {q} check config /etc/prometheus/prometheus.yml")
    assert "SUCCESS" in out, out
    # its own ENTRYPOINT and CMD: as nobody, its data in /prometheus, the API on :9090
    ready = _serve_and_get(lab, node, q, "http://127.0.0.1:9090/-/ready")
    assert "Ready" in ready, ready


def test_node_exporter_image_version_and_metrics(lab):
    tag = _image(lab, "nodeExporterImage")
    q = shlex.quote(tag)
    for node in lab.nodes:  # the stack runs one on every node
        out = _run(lab, node, q + " --version")
        assert out.startswith("node_exporter, version 1.5."), (node, out)
        assert _run(lab, node, f"--entrypoint id {q} -un").strip() == "nobody"
        link = _run(lab, node, f"--entrypoint readlink {q} -f /usr/local/bin/node_exporter")
        assert link.strip() == "/usr/bin/prometheus-node-exporter"
        metrics = _serve_and_get(lab, node, f"{q} --web.listen-address=127.0.0.1:9100",
                                 "http://127.0.0.1:9100/metrics")
        lines = metrics.splitlines()
        build = [x for x in lines if x.startswith("node_exporter_build_info{")]
        assert build and 'version="1.5.0"' in build[0], (node, build)
        assert sum(x.startswith("node_") for x in lines) > 100, (node, metrics[:2000])
        assert any(x.startswith("node_memory_MemTotal_bytes ") for x in lines), node


def test_alertmanager_image_versions_and_api(lab):
    tag = _image(lab, "alertmanagerImage")
    node = next(iter(lab.nodes))  # the head: where the stack runs Alertmanager
    q = shlex.quote(tag)
    out = _run(lab, node, q + " --version")
    assert out.startswith("alertmanager, version 0.25."), out
    out = _run(lab, node, f"--entrypoint amtool {q} --version")
    assert out.startswith("amtool, version 0.25."), out
    assert _run(lab, node, f"--entrypoint id {q} -un").strip() == "nobody"
    out = _run(lab, node, f"--entrypoint amtool {q} check-config /etc/prometheus/alertmanager.yml")
    assert "SUCCESS" in out, out
    # as the stack runs it (components/monitoring.py): its cluster off, its API on loopback
    ready = _serve_and_get(lab, node, f"{q} --config.file=/etc/prometheus/alertmanager.yml "
                           "--storage.path=/alertmanager --cluster.listen-address= "
                           "--web.listen-address=127.0.0.1:9093",
                           "http://127.0.0.1:9093/api/v2/status")
    assert '"cluster":{' in ready and '"status":"disabled"' in ready, ready
