"""The model snapshot in every node's Hugging Face cache: fetched once on the head, fanned out
over the fabric from a read-only seeder, verified on every node.

The head downloads with the serving image's huggingface_hub (payloads/snapshot_download.py,
the token on stdin); a seeder container serves the head's cache folder read-only on each of its
carrier-up fabric addresses (payloads/model_seeder.py, HTTP with byte ranges); every other node
pulls only the files whose blob it lacks (payloads/model_sync.py, manifest on stdin), over every
twin it shares with the head at once: big files as byte ranges, small ones whole, a few streams
per twin, a twin that does not answer dropped for the others. The seeder is stopped by a last
command.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from config.forms import check_model_file
from contract import manifest
from hostscripts.common import MAKE_TOKEN, image_id, label_flags, payload, plain, q, repo_dir
from hostscripts.paths import HF_MOUNT, MODEL_SEED_PORT, SEED_TIMEOUT_SECONDS, StackNames

# Every root write, remove and rename under a cache goes through cache_fs.py's Tree (issue 46):
# the payloads that make them carry its text in front of their own, and those that read a
# manifest contract/manifest.py's rules (their `# Prelude:` line; common.payload joins them).
_SNAPSHOT_PY = payload("snapshot_download.py")
# The hub download prints its progress (bytes, rate, time left) into the `up` this often: the
# 122B's 119 GB take minutes even on a fast uplink.
FETCH_PROGRESS_SECONDS = 10
_MODEL_SEEDER_PY = payload("model_seeder.py")
_SYNC_PY = payload("model_sync.py")
_VERIFY_PY = payload("model_verify.py")
_REF_PY = payload("model_ref.py")

# The sync's pieces: files above this size are fetched as byte ranges of it, spread over the
# twins; the rest whole. Two streams per twin: one TCP stream does not fill a 100G twin.
SYNC_CHUNK_BYTES = 128 << 20
SYNC_STREAMS_PER_SEED = 2
# How long the sync waits for a first seeder address to answer (the seeder may be starting).
SYNC_WAIT_SECONDS = 120
# The fan-out prints its progress (bytes of the missing files' total, rate, time left) into the
# `up` this often, and once at the end: 119 GB take minutes over the fabric too.
SYNC_PROGRESS_SECONDS = 10


@dataclass(frozen=True)
class ModelFile:
    """One file of a model commit as the hub lists it (inspection/hub.py reads the listing). The
    HF cache names its blob by `etag`: the LFS sha256 for large files, else the git blob id.

    Every value comes from the hub (or a mirror, or whoever sits on the path to it) and ends up
    in a root file operation on every node (payloads/model_verify.py removes a wrong blob,
    model_sync.py replaces snapshot links): it is refused here unless the etag is 40 or 64
    lowercase hex, the path relative and normalised and the size a byte count
    (config.forms.check_model_file; ValueError). The payloads check again."""

    path: str
    size: int
    etag: str

    def __post_init__(self) -> None:
        checked(self)


class Seed(NamedTuple):
    """One address of the head's seeder as a node reaches it: `ip` on the head, `via` the node's
    own twin in the same subnet (the streams' source address; None: the kernel's choice)."""

    ip: str
    via: str | None = None


def checked(f: ModelFile) -> ModelFile:
    """`f`, or ValueError naming what the stack refuses in it (config.forms.check_model_file).
    Called when a ModelFile is made and again by every builder that puts one into a manifest."""
    problem = check_model_file(f.path, f.size, f.etag)
    if problem is not None:
        raise ValueError(f"a model file the hub lists is refused: {problem}")
    return f


def listing_problem(files: Iterable[ModelFile]) -> str | None:
    """Why a commit's files cannot all live in one snapshot folder, or None: a path listed
    twice, a path that is also a folder of another path, an etag listed with two sizes (one
    blob per etag). The rule is contract/manifest.py's, which the payloads run too."""
    return manifest.listing_problem([(f.path, f.size, f.etag) for f in files])


def _files_json(files: Iterable[ModelFile]) -> list[dict[str, object]]:
    """The files as the payloads read them, each checked again (ModelFile's checks and the
    listing's: `checked`, `listing_problem`)."""
    listed = [checked(f) for f in files]
    problem = listing_problem(listed)
    if problem is not None:
        raise ValueError(f"a model listing is refused: {problem}")
    return [{"path": f.path, "size": f.size, "etag": f.etag} for f in listed]


def verify_manifest_json(repo: str, commit: str, files: Iterable[ModelFile]) -> str:
    """What model_verify.py checks: the commit's files with size and hub etag."""
    return json.dumps(
        {
            "repoDir": repo_dir(repo),
            "commit": commit,
            "files": _files_json(files),
        },
        sort_keys=True,
    )


def _prune(cache_dir: str, record_dir: str, manifest: str) -> str:
    """Delete the blobs whose content is not what the hub lists, so the copy that follows
    fetches them again (a corrupted file is repaired by the same command); make the cache and
    its hub/ when they are missing (what the containers mount). Through cache_fs.py's Tree."""
    return (f"printf '%s' {q(manifest)} | python3 -c {q(_VERIFY_PY)} {q(cache_dir)} "
            f"{q(record_dir)} --prune")


def hub_mount(cache_dir: str, read_only: bool = False) -> str:
    """The `-v` of a container of the model commands: the cache's hub/ only, never the cache
    folder (HF_HOME) itself, where `hf auth login` leaves the node's token (issue 46)."""
    return q(f"{cache_dir}/hub:{HF_MOUNT}/hub" + (":ro" if read_only else ""))


def model_fetch(
    image: str,
    cache_dir: str,
    repo: str,
    commit: str,
    revision: str,
    endpoint: str | None,
    labels: Mapping[str, str],
    files: Iterable[ModelFile],
    record_dir: str,
) -> str:
    """On the head: download the snapshot at `commit` from the hub (or mirror) once.

    Runs the serving image's python (it ships huggingface_hub); the token is read from stdin by
    that python, never from the command line or an environment variable on the host.
    Incremental: files already in the cache are not downloaded again, so blobs whose content
    is not what the hub lists are deleted first (payloads/model_verify.py --prune, which records
    what it hashed in `record_dir`, the stack's own folder). Its progress goes to stderr every
    FETCH_PROGRESS_SECONDS (sizes and rates only: payloads/snapshot_download.py), which the
    component shows in the `up`. The container mounts the cache's hub/ only (hub_mount); the ref
    of a revision that is not the commit is written by payloads/model_ref.py through
    cache_fs.py's Tree, never with a shell `>` that would follow a link planted there.
    """
    files = list(files)
    image = image_id(image)  # the daemon's answer: its exact form before any shell
    env = f"-e HF_ENDPOINT={q(endpoint)} " if endpoint else ""
    lines = [
        "set -eu",
        _prune(cache_dir, record_dir, verify_manifest_json(repo, commit, files)),
        f"docker run -i --rm --network host {label_flags(labels)} "
        f"-v {hub_mount(cache_dir)} -e HF_HOME={HF_MOUNT} -e HF_HUB_DISABLE_TELEMETRY=1 "
        f"-e HF_HUB_DISABLE_PROGRESS_BARS=1 {env}"
        f"--entrypoint python3 {q(image)} -c {q(_SNAPSHOT_PY)} {q(repo)} {q(commit)} "
        f"{FETCH_PROGRESS_SECONDS} {q(json.dumps([[f.etag, f.size] for f in files]))}",
    ]
    if revision != commit:
        lines.append(f"python3 -c {q(_REF_PY)} {q(cache_dir)} {q(repo_dir(repo))} "
                     f"{q(revision)} {q(commit)}")
    return "\n".join(lines)


def model_seeder_start(
    names: StackNames,
    image: str,
    cache_dir: str,
    repo: str,
    bind_ips: Sequence[str],
    labels: Mapping[str, str],
    targets: Sequence[str],
    commit: str,
) -> str:
    """On the head: serve the files of `commit` from the repo's cache folder, read-only, over
    HTTP on each fabric address in `bind_ips` (the head's carrier-up twins, primary first), one
    listener each, same port, to the holders of this run's token only (issue 31): the script
    makes the token (hostscripts.common.MAKE_TOKEN), gives the seeder its sha256 and prints the
    token on stdout, the only thing it prints there (the program hands it to the syncs).

    `targets` and `commit` are in the text so the seeder runs again whenever a pull will. The
    container is the stack's (StackNames.model_seeder) and declares its port
    (`spark-vllm.port`), so preflight refuses another stack that would seed on the same node
    while it runs.
    """
    if not bind_ips:
        raise ValueError("model_seeder_start: no fabric address to listen on")
    image = image_id(image)  # the daemon's answer: its exact form before any shell
    root = f"{HF_MOUNT}/hub/{repo_dir(repo)}"
    binds = ",".join(bind_ips)
    seeder = q(names.model_seeder)
    labels = {**labels, "spark-vllm.port": str(MODEL_SEED_PORT)}
    return "\n".join(
        [
            "set -eu",
            f"# commit {plain(commit)} for: {' '.join(map(plain, targets))}",
            f"docker rm -f {seeder} >/dev/null 2>&1 || true",
            *MAKE_TOKEN,
            f"docker run -d --rm --name {seeder} --network host {label_flags(labels)} "
            f"-v {hub_mount(cache_dir, read_only=True)} --entrypoint timeout {q(image)} "
            f"{SEED_TIMEOUT_SECONDS} python3 -c {q(_MODEL_SEEDER_PY)} "
            f"{q(binds)} {MODEL_SEED_PORT} {q(root)} {q(plain(commit))} \"$sum\" >/dev/null",
            f"echo model seeder on "
            f"{' '.join(f'{plain(ip)}:{MODEL_SEED_PORT}' for ip in bind_ips)} >&2",
            "printf '%s\\n' \"$tok\"",
        ]
    )


def model_seeder_stop(
    names: StackNames, targets: Sequence[str], commit: str, image: str, bind_ips: Sequence[str],
    start: str = "",
) -> str:
    """Stops what model_seeder_start started. Carries the same inputs (targets, commit, the
    image the seeder runs and the addresses it listens on): an image change re-runs the start,
    and without the image here the stop would not run again and the seeder would stay up after
    the update. `start`: the start's whole text, whose digest it carries too, so a change of the
    seeder's program (a new release) re-runs the stop as well (issue 31)."""
    image = image_id(image)  # read back from the head's daemon, and it lands in a comment line
    return "\n".join(
        [
            "set -eu",
            f"# commit {plain(commit)} for: {' '.join(map(plain, targets))} image: {image} "
            f"on: {','.join(map(plain, bind_ips))}",
            *([f"# start {hashlib.sha256(start.encode()).hexdigest()[:16]}"] if start else []),
            f"docker rm -f {q(names.model_seeder)} >/dev/null 2>&1 || true",
            "echo model seeder stopped",
        ]
    )


def model_manifest_json(
    repo: str, commit: str, revision: str, files: Iterable[ModelFile], seeds: Sequence[Seed],
    token: str = "",
) -> str:
    """The stdin of a sync command: what to fetch, from where (every seeder address the node
    pairs with one of its twins, in the node's twin order), at which commit, in which pieces,
    and the run's token the seeder asks for (model_seeder_start's stdout; a secret: the program
    keeps this stdin as one)."""
    if not seeds:
        raise ValueError("model_manifest_json: no seeder address")
    if token and not re.fullmatch(r"[0-9a-f]{64}", token):
        raise ValueError("model_manifest_json: the seeder's token is not 64 hex digits")
    return json.dumps(
        {
            "repoDir": repo_dir(repo),
            "commit": commit,
            "revision": revision,
            "seeds": [{"ip": s.ip, "via": s.via} for s in seeds],
            "seedPort": MODEL_SEED_PORT,
            "token": token,
            "chunkBytes": SYNC_CHUNK_BYTES,
            "streamsPerSeed": SYNC_STREAMS_PER_SEED,
            "waitSeconds": SYNC_WAIT_SECONDS,
            "files": _files_json(files),
        },
        sort_keys=True,
    )


def model_sync(image: str, cache_dir: str, labels: Mapping[str, str], record_dir: str) -> str:
    """On another node: pull missing/changed files from the head's seeder (manifest on stdin),
    over every twin the manifest lists at once (payloads/model_sync.py says how).

    Files land in the Hugging Face cache layout (blobs named by etag, snapshot symlinks, refs), so
    a later revision moves only the files whose content changed. Blobs whose content is not
    what the hub lists are deleted first (payloads/model_verify.py --prune, its record in
    `record_dir`), so they move too. The container mounts the cache's hub/ only (hub_mount).
    Its progress goes to stderr every SYNC_PROGRESS_SECONDS, named by the node's `uname -n`
    (`model fan-out <host>: <done> of <total> (<percent>), <rate>, ETA <left>`; sizes and rates
    only), which the command's logging (both streams) shows in the `up`.
    """
    image = image_id(image)  # the daemon's answer: its exact form before any shell
    return "\n".join(
        [
            "set -eu",
            'm=$(mktemp)',
            'trap \'rm -f "$m"\' EXIT',
            'cat > "$m"',
            f'python3 -c {q(_VERIFY_PY)} {q(cache_dir)} {q(record_dir)} --prune < "$m" >/dev/null',
            f"docker run -i --rm --network host {label_flags(labels)} "
            f"-v {hub_mount(cache_dir)} --entrypoint python3 {q(image)} -c {q(_SYNC_PY)} "
            f'{SYNC_PROGRESS_SECONDS} "$(uname -n)" < "$m"',
        ]
    )


def model_verify(cache_dir: str, repo: str, commit: str, files: Iterable[ModelFile],
                 record_dir: str) -> str:
    """On every node: every file of the commit present with the size and the content (sha256
    of LFS files, git blob id of the others) the hub lists; a wrong blob is removed and the
    command fails naming it (payloads/model_verify.py). What it hashed is recorded in
    `record_dir` (StackNames.model_record_dir: the stack's root-only folder, not the cache)."""
    manifest = verify_manifest_json(repo, commit, files)
    return "\n".join(
        [
            "set -eu",
            f"printf '%s' {q(manifest)} | python3 -c {q(_VERIFY_PY)} {q(cache_dir)} "
            f"{q(record_dir)}",
        ]
    )


def drop_page_cache(repo: str, commit: str, files: Iterable[ModelFile]) -> str:
    """On a node whose copy of the model just moved (fetched, synced or repaired, then hashed by
    the verify step): write back and drop the page cache before vLLM loads the weights.

    On GB10's unified memory the page cache counts against what CUDA can allocate: after a 119 GB
    copy (and the verify's read of every byte) the cache is full, and loads are reported to die at
    73-97% (NVIDIA's vLLM playbook troubleshooting, https://github.com/NVIDIA/dgx-spark-playbooks;
    sparkrun and eugr/spark-vllm-docker drop caches before launch). `echo 3` frees the clean page
    cache and reclaimable dentries/inodes; dirty pages are written back first by `sync`.
    The commit and the file list are in the text: it runs again exactly when the model moves.
    """
    listed = sorted(f"{f.path}:{f.etag}" for f in files)
    digest = hashlib.sha256("\n".join(listed).encode()).hexdigest()[:16]
    return "\n".join(
        [
            "set -eu",
            f"# model {plain(repo)} @ {plain(commit)} ({len(listed)} files, {digest}) moved",
            "free_kb() { awk '$1 == \"MemFree:\" {print $2}' /proc/meminfo; }",
            "before=$(free_kb)",
            "sync",
            "if ! echo 3 > /proc/sys/vm/drop_caches; then",
            "  echo 'cannot drop the page cache (/proc/sys/vm/drop_caches is not writable): "
            "vLLM would load next to a full cache on unified memory' >&2; exit 1",
            "fi",
            "after=$(free_kb)",
            "echo \"page cache dropped: MemFree $((before / 1024)) MiB -> $((after / 1024)) MiB\"",
        ]
    )
