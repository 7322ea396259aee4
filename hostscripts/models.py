"""The model snapshot in every node's Hugging Face cache: fetched once on the head, fanned out
over the fabric from a read-only seeder, verified on every node.

The head downloads with the serving image's huggingface_hub (payloads/snapshot_download.py,
the token on stdin); a seeder container serves the head's cache folder on its fabric address
(payloads/model_seeder.py); every other node pulls only the files whose blob it lacks
(payloads/model_sync.py, manifest on stdin); the seeder is stopped by a last command.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from hostscripts.common import label_flags, payload, q, repo_dir
from hostscripts.paths import HF_MOUNT, MODEL_SEED_PORT, MODEL_SEEDER, SEED_TIMEOUT_SECONDS
from inspection.hub import ModelFile

_SNAPSHOT_PY = payload("snapshot_download.py")
_MODEL_SEEDER_PY = payload("model_seeder.py")
_SYNC_PY = payload("model_sync.py")


def model_fetch(
    image: str,
    cache_dir: str,
    repo: str,
    commit: str,
    revision: str,
    endpoint: str | None,
    labels: Mapping[str, str],
) -> str:
    """On the head: download the snapshot at `commit` from the hub (or mirror) once.

    Runs the serving image's python (it ships huggingface_hub); the token is read from stdin by
    that python, never from the command line or an environment variable on the host.
    Incremental: files already in the cache are not downloaded again.
    """
    env = f"-e HF_ENDPOINT={q(endpoint)} " if endpoint else ""
    refs = f"{cache_dir}/hub/{repo_dir(repo)}/refs"
    lines = [
        "set -eu",
        f"mkdir -p {q(cache_dir)}",
        f"docker run -i --rm --network host {label_flags(labels)} "
        f"-v {q(cache_dir)}:{HF_MOUNT} -e HF_HOME={HF_MOUNT} -e HF_HUB_DISABLE_TELEMETRY=1 {env}"
        f"--entrypoint python3 {q(image)} -c {q(_SNAPSHOT_PY)} {q(repo)} {q(commit)}",
    ]
    if revision != commit:
        ref_file = f"{refs}/{revision}"
        lines += [
            f"mkdir -p \"$(dirname {q(ref_file)})\"",
            f"printf %s {q(commit)} > {q(ref_file)}",
        ]
    return "\n".join(lines)


def model_seeder_start(
    image: str,
    cache_dir: str,
    repo: str,
    bind_ip: str,
    labels: Mapping[str, str],
    targets: Sequence[str],
    commit: str,
) -> str:
    """On the head: serve the repo's cache folder read-only over HTTP on the fabric address.

    `targets` and `commit` are in the text so the seeder runs again whenever a pull will.
    """
    root = f"{HF_MOUNT}/hub/{repo_dir(repo)}"
    return "\n".join(
        [
            "set -eu",
            f"# commit {commit} for: {' '.join(targets)}",
            f"docker rm -f {MODEL_SEEDER} >/dev/null 2>&1 || true",
            f"docker run -d --rm --name {MODEL_SEEDER} --network host {label_flags(labels)} "
            f"-v {q(cache_dir)}:{HF_MOUNT}:ro --entrypoint timeout {q(image)} "
            f"{SEED_TIMEOUT_SECONDS} python3 -c {q(_MODEL_SEEDER_PY)} "
            f"{q(bind_ip)} {MODEL_SEED_PORT} {q(root)} >/dev/null",
            f"echo model seeder on {bind_ip}:{MODEL_SEED_PORT}",
        ]
    )


def model_seeder_stop(targets: Sequence[str], commit: str, image: str) -> str:
    """Stops what model_seeder_start started. Carries the same inputs (targets, commit and the
    image the seeder runs): an image change re-runs the start, and without the image here the
    stop would not run again and the seeder would stay up after the update."""
    return "\n".join(
        [
            "set -eu",
            f"# commit {commit} for: {' '.join(targets)} image: {image}",
            f"docker rm -f {MODEL_SEEDER} >/dev/null 2>&1 || true",
            "echo model seeder stopped",
        ]
    )


def model_manifest_json(
    repo: str, commit: str, revision: str, files: Iterable[ModelFile], seed_ip: str
) -> str:
    """The stdin of a sync command: what to fetch, from where, at which commit."""
    return json.dumps(
        {
            "repoDir": repo_dir(repo),
            "commit": commit,
            "revision": revision,
            "seedIp": seed_ip,
            "seedPort": MODEL_SEED_PORT,
            "files": [{"path": f.path, "size": f.size, "etag": f.etag} for f in files],
        },
        sort_keys=True,
    )


def model_sync(image: str, cache_dir: str, labels: Mapping[str, str]) -> str:
    """On another node: pull missing/changed files from the head's seeder (manifest on stdin).

    Files land in the Hugging Face cache layout (blobs named by etag, snapshot symlinks, refs), so
    a later revision moves only the files whose content changed.
    """
    return "\n".join(
        [
            "set -eu",
            f"mkdir -p {q(cache_dir)}",
            f"docker run -i --rm --network host {label_flags(labels)} "
            f"-v {q(cache_dir)}:{HF_MOUNT} --entrypoint python3 {q(image)} -c {q(_SYNC_PY)}",
        ]
    )


def model_verify(cache_dir: str, repo: str, commit: str, files: Iterable[ModelFile]) -> str:
    """On every node: every file of the commit present with the size the hub lists."""
    snap = f"{cache_dir}/hub/{repo_dir(repo)}/snapshots/{commit}"
    files = list(files)
    lines = [
        "set -eu",
        f"d={q(snap)}",
        "fail=0",
        "check() {",
        "  have=$(stat -L -c %s \"$d/$1\" 2>/dev/null || echo missing)",
        "  if [ \"$have\" != \"$2\" ]; then echo \"$d/$1: have $have bytes, want $2\" >&2; "
        "fail=1; fi",
        "}",
    ]
    lines += [f"check {q(f.path)} {int(f.size)}" for f in files]
    total = sum(int(f.size) for f in files)
    lines += [
        "if [ $fail -ne 0 ]; then echo \"model snapshot incomplete at $d\" >&2; exit 1; fi",
        f"echo verified {len(files)} files, {total} bytes at {commit}",
    ]
    return "\n".join(lines)
