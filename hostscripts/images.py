"""Copying the serving image from the head to the other nodes (image.source = head).

Nodes do not trust each other over SSH: the head runs a short-lived HTTP seeder on its fabric
address that streams `docker save` (payloads/image_seeder.py), each other node fetches it into a
root-only scratch file (payloads/fetch_url.py), checks that the archive is exactly the head's
image named only as the ref (payloads/image_verify.py) and only then `docker load`s it, and a
last command on the head stops the seeder. The seeder also stops on its own after
SEED_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hostscripts.common import (
    MAKE_TOKEN,
    image_id,
    label_flags,
    payload,
    plain,
    q,
    verdict_script,
)
from hostscripts.paths import HF_MOUNT, IMAGE_SEED_PORT, SEED_TIMEOUT_SECONDS, StackNames

_IMAGE_SEEDER_PY = payload("image_seeder.py")
_FETCH_PY = payload("fetch_url.py")
_VERIFY_PY = payload("image_verify.py")
_PROBE_PY = payload("image_probe.py")
NCCL_PY = payload("nccl_library.py")  # which libnccl runs: the probe's child, recon's section
# The copy prints its progress (bytes, the image's size, rate, time left) into the `up` this
# often, and once at the end.
COPY_PROGRESS_SECONDS = 10


def image_seeder_start(names: StackNames, ref: str, bind_ip: str,
                       targets: Sequence[str]) -> str:
    """On the head: serve `docker save <ref>` over HTTP on the fabric address, in the background
    (its pid and log files are the stack's), to the holders of this run's token only; the
    token is the script's stdout (the only thing it prints there), at most one `docker save`
    per target at once.

    `targets` is part of the text on purpose: adding a node changes it, so the seeder runs again
    for the new node's pull.
    """
    pidfile, log = q(names.image_seeder_pid), q(names.image_seeder_log)
    return "\n".join(
        [
            "set -eu",
            f"# targets: {' '.join(map(plain, targets))}",
            f"docker image inspect {q(ref)} >/dev/null",
            f"if [ -f {pidfile} ]; then kill \"$(cat {pidfile})\" 2>/dev/null || true; fi",
            *MAKE_TOKEN,
            f"setsid nohup timeout {SEED_TIMEOUT_SECONDS} python3 -c {q(_IMAGE_SEEDER_PY)} "
            f"{q(bind_ip)} {IMAGE_SEED_PORT} {q(ref)} \"$sum\" {max(len(targets), 1)} </dev/null "
            f">{log} 2>&1 &",
            f"echo $! > {pidfile}",
            f"echo image seeder on {plain(bind_ip)}:{IMAGE_SEED_PORT} >&2",
            "printf '%s\\n' \"$tok\"",
        ]
    )


def image_seeder_stop(names: StackNames, targets: Sequence[str], ref: str,
                      start: str = "") -> str:
    """Stops what image_seeder_start started. Carries `ref` as well as the targets: whatever
    makes the seeder run again must make the stop run again, or the seeder stays up. `start`:
    the start's whole text, whose digest it carries too (a change of the seeder's program)."""
    pidfile = q(names.image_seeder_pid)
    return "\n".join(
        [
            "set -eu",
            f"# targets: {' '.join(map(plain, targets))} ref: {plain(ref)}",
            *([f"# start {hashlib.sha256(start.encode()).hexdigest()[:16]}"] if start else []),
            f"if [ -f {pidfile} ]; then kill \"$(cat {pidfile})\" 2>/dev/null || true; "
            f"rm -f {pidfile}; fi",
            "echo image seeder stopped",
        ]
    )


def image_pull_from_head(names: StackNames, ref: str, seed_ip: str, expect_id: str) -> str:
    """On another node: load the head's image from its seeder unless the same ID is present.
    The run's token (image_seeder_start's stdout) arrives on stdin and goes to the fetch's
    stdin: it is in no command line. The fetch prints its progress to stderr every
    COPY_PROGRESS_SECONDS, named by the node's `uname -n` (`image copy <host>: <done> of
    ~<image size> (<percent>), <rate>, ETA <left>`; the total is the size the head's docker gives
    the image, announced by the seeder; payloads/fetch_url.py), which the command's logging
    (both streams) shows in the `up`.

    Its stdout goes into a scratch file in the stack's root-only folder (StackNames.
    image_copy_dir: the archive needs the image's size on disk once more, until the load), which
    payloads/image_verify.py checks before `docker load` reads it: one image, whose config is
    the head's image ID, named only `ref` (issue 46: piped straight into `docker load`, a forged
    stream retagged other images before the ID was compared). The file goes whatever happens.
    The ID is compared after the load too."""
    expect_id = image_id(expect_id)  # read back from the head's daemon: its exact form only
    url = f"http://{seed_ip}:{IMAGE_SEED_PORT}/image.tar"
    scratch = q(names.image_copy_dir)
    return "\n".join(
        [
            "set -eu",
            f"have=$(docker image inspect --format '{{{{.Id}}}}' {q(ref)} 2>/dev/null || true)",
            f"if [ \"$have\" = {q(expect_id)} ]; then echo image present; exit 0; fi",
            "umask 077",
            f"mkdir -p {scratch}",
            f"f=$(mktemp {scratch}/image.XXXXXX)",
            "trap 'rm -f \"$f\"' EXIT",
            f"python3 -c {q(_FETCH_PY)} {q(url)} {COPY_PROGRESS_SECONDS} 'image copy' "
            "\"$(uname -n)\" > \"$f\"",
            f"python3 -c {q(_VERIFY_PY)} \"$f\" {q(ref)} {q(expect_id)}",
            "docker load -i \"$f\"",
            f"have=$(docker image inspect --format '{{{{.Id}}}}' {q(ref)})",
            f"if [ \"$have\" != {q(expect_id)} ]; then",
            f"  printf 'image %s has ID %s after load, head has %s\\n' {q(ref)} \"$have\" "
            f"{q(expect_id)} >&2; exit 1",
            "fi",
            "echo image loaded",
        ]
    )


def image_probe(image: str, labels: Mapping[str, str],
                request: Mapping[str, Any] | None = None, hf_cache: str | None = None,
                record: StackNames | None = None) -> str:
    """On every node, once per image ID: the image's own python reports what it carries
    (payloads/image_probe.py), in a throw-away container without network or GPU. With a
    `request` (the serve check: argv, VLLM_* env, chat template, strict) it also checks the
    serve command with the image's vLLM and exits 1 on what must stop the `up`; the request is
    in the text, so the check runs again whenever what it checks changes. `hf_cache` (the
    node's model cache, read-only, offline as vLLM serves it): vLLM's engine arguments resolve
    the served snapshot, which must be there. Only the cache's hub/ is mounted, never the
    folder with a node's `token` (issue 46). `record` (the stack's names): the probe also
    reports the NCCL vLLM loads (payloads/nccl_library.py), and its answer is left in the
    stack's folder (StackNames.image_probe_record, root only) for recon; image_probe_remove
    removes it."""
    image = image_id(image)  # the daemon's answer: its exact form before any shell
    if record is not None:
        request = {**(request or {}), "nccl": NCCL_PY}
    tail = f" {q(json.dumps(request, sort_keys=True))}" if request is not None else ""
    cache = (f"-v {q(hf_cache + '/hub:' + HF_MOUNT + '/hub:ro')} -e HF_HOME={HF_MOUNT} "
             "-e HF_HUB_OFFLINE=1 " if hf_cache is not None else "")
    run = (f"docker run --rm --network none {label_flags(labels)} {cache}--entrypoint python3 "
           f"{q(image)} -c {q(_PROBE_PY)}{tail}")
    if record is None:
        return "\n".join(["set -eu", run])
    path = record.image_probe_record(image)
    return "\n".join([
        "set -eu",
        f"out=$({run})",
        "umask 077",
        f"mkdir -p {q(record.image_probe_dir)}",
        f"printf '%s\\n' \"$out\" | tail -n 1 > {q(path + '.new')}",
        f"mv {q(path + '.new')} {q(path)}",
        "printf '%s\\n' \"$out\"",
    ])


def image_probe_remove(record: StackNames, image: str) -> str:
    """The probe's record of `image` goes (destroy, or the probe of another image ID)."""
    return f"rm -f {q(record.image_probe_record(image_id(image)))}"


def image_check(lines: Sequence[str], problems: Sequence[str],
                warnings: Sequence[str] = ()) -> str:
    """On the head, before Ray starts: print what every node's image carries, warn, and fail
    with the problems (inspection/image_probe.judge) when there are any."""
    return verdict_script("image check", lines, problems, warnings)
