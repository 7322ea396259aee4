"""The lab's Docker registry (Debian's docker-registry, distribution 2.8) on 10.77.0.1:5000.

Storage lives in the cache (content addressed, so an image digest survives down/up). The helpers
speak the registry HTTP API
(https://github.com/opencontainers/distribution-spec/blob/main/spec.md).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from lab.cgroups import cg_kill_remove, spawn
from lab.layout import CACHE, IMAGE_REPO, LAB, REGISTRY, STACK_TAG
from lab.util import http_get, log, run, wait_for, write

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def registry_running() -> bool:
    try:
        return http_get(f"http://{REGISTRY}/v2/", timeout=2).status == 200
    except Exception:  # a probe: any failure means "not up"
        return False


def ensure_registry() -> None:
    if registry_running():
        return
    cg_kill_remove("registry")
    storage = os.path.join(CACHE, "registry")  # content-addressed: kept across down/up
    os.makedirs(storage, exist_ok=True)
    cfg = os.path.join(LAB, "registry", "config.yml")
    write(cfg, f"""version: 0.1
log:
  level: info
  fields: {{service: registry}}
storage:
  filesystem: {{rootdirectory: {storage}}}
  delete: {{enabled: true}}
http:
  addr: {REGISTRY}
""")
    spawn(["docker-registry", "serve", cfg], os.path.join(LAB, "registry", "registry.log"),
          "registry")
    wait_for(registry_running, 20, f"registry on {REGISTRY} (see {LAB}/registry/registry.log)")


def registry_digest(tag: str, repo: str = IMAGE_REPO) -> str | None:
    """The digest `tag` of a lab repository names, or None when there is no such tag."""
    try:
        r = http_get(f"http://{REGISTRY}/v2/{repo}/manifests/{tag}", method="HEAD",
                     headers={"Accept": MANIFEST_V2})
        return r.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError:
        return None


def image_ref(digest: str, repo: str = IMAGE_REPO) -> str:
    return f"{REGISTRY}/{repo}@{digest}"


def registry_retag(src_tag: str, dst_tag: str, repo: str = IMAGE_REPO) -> None:
    """Point `dst_tag` at the manifest `src_tag` names (the registry API; no image moves)."""
    url = f"http://{REGISTRY}/v2/{repo}/manifests"
    req = urllib.request.Request(f"{url}/{src_tag}", headers={"Accept": MANIFEST_V2})
    with urllib.request.urlopen(req, timeout=30) as r:
        body, ctype = r.read(), r.headers.get("Content-Type", MANIFEST_V2)
    req = urllib.request.Request(f"{url}/{dst_tag}", data=body, method="PUT",
                                 headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=30):
        pass


def ensure_stack_tag(ref: str) -> None:
    """Point the tag the dev stack names (STACK_TAG) at `ref` (an image reference by digest in
    the lab registry: the serving image's or the gateway's repository)."""
    name, digest = ref.split("@", 1)
    repo = name.removeprefix(f"{REGISTRY}/")
    if registry_digest(STACK_TAG, repo) != digest:
        registry_retag(digest, STACK_TAG, repo)
        log(f"image: {REGISTRY}/{repo}:{STACK_TAG} -> {digest}")


def registry_prune(keep: dict) -> None:
    """Drop old lab images from the registry: in each repository of `keep` ({repo: tags to
    keep}), every manifest no kept tag names is deleted, then the registry is stopped for
    `garbage-collect` (which frees the blobs nothing references any more) and started again.
    Called after a new base was pushed, so each base rebuild does not leave ~3.4 GB behind.
    Other repositories (e.g. what tests push) are left alone."""
    dropped = 0
    for repo, tags in keep.items():
        try:
            with http_get(f"http://{REGISTRY}/v2/{repo}/tags/list", timeout=10) as r:
                have = json.load(r).get("tags") or []
        except urllib.error.HTTPError:
            continue
        kept = {registry_digest(t, repo) for t in tags}
        for t in have:
            dg = registry_digest(t, repo)
            if dg and dg not in kept:
                req = urllib.request.Request(f"http://{REGISTRY}/v2/{repo}/manifests/{dg}",
                                             method="DELETE")
                try:
                    urllib.request.urlopen(req, timeout=30).close()
                    dropped += 1
                except urllib.error.HTTPError as e:
                    if e.code != 404:  # two old tags may name one manifest
                        raise
    if not dropped:
        return
    log(f"registry: {dropped} old lab manifest(s) deleted; garbage-collecting the blobs")
    cg_kill_remove("registry")
    run(["docker-registry", "garbage-collect", os.path.join(LAB, "registry", "config.yml")],
        quiet=True)
    ensure_registry()
