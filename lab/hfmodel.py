"""The lab's model repository `spark-lab/tiny-moe`: a plain git repo that olah serves as an HF
model with revisions.

The files come from lab/tinymodel.py (a real tiny Qwen3-MoE, see there), which needs torch,
safetensors and tokenizers: it runs inside the lab's base image on the build dockerd
(`docker run --rm --network none`, one thread), and its output is cached in
/root/.cache/spark-vllm/lab/model-<key>/ keyed by the generator's source and the pinned versions
of the libraries that write the bytes. Two commits with fixed author, committer and dates, so the
SHAs are the same on every machine; the second (`main`) changes the router weights shard only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from lab.layout import CACHE, HERE
from lab.util import log, progress, short_hash, write

GENERATOR = os.path.join(HERE, "tinymodel.py")
LOCK = os.path.join(HERE, "image-requirements.txt")
BYTE_WRITERS = ("torch", "safetensors", "tokenizers")  # their versions change the files' bytes
COMMITS = [("2026-01-01T00:00:00+00:00", "tiny-moe: first revision"),
           ("2026-01-02T00:00:00+00:00", "tiny-moe: other router weights (second shard only)")]


def model_key() -> str:
    with open(GENERATOR, "rb") as f:
        src = f.read()
    with open(LOCK) as f:
        pins = sorted(m.group(0) for line in f
                      if (m := re.match(rf"({'|'.join(BYTE_WRITERS)})==\S+", line)))
    return short_hash(src.decode(), *pins)


def ensure_files(builder) -> str:
    """The generated revisions (folders 1/ and 2/), from the cache or made in the base image."""
    key = model_key()
    d = os.path.join(CACHE, f"model-{key}")
    if os.path.exists(os.path.join(d, ".complete")):
        return d
    tmp = d + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    log(f"model: generating spark-lab/tiny-moe with lab/tinymodel.py in the base image -> {d}")
    with progress("model generator"):
        builder.run_in_base(["python3", "/lab/tinymodel.py", "/out"],
                            {GENERATOR: "/lab/tinymodel.py:ro", tmp: "/out"},
                            env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    for rev in ("1", "2"):
        if not os.path.isdir(os.path.join(tmp, rev)):
            raise RuntimeError(f"the model generator wrote no revision {rev} into {tmp}")
    write(os.path.join(tmp, ".complete"), key + "\n")
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    for old in os.listdir(CACHE):  # keep only the current model
        if old.startswith("model-") and old != os.path.basename(d):
            shutil.rmtree(os.path.join(CACHE, old), ignore_errors=True)
    return d


def _git(repo, *args, env=None):
    e = dict(os.environ, GIT_AUTHOR_NAME="spark-vllm lab",
             GIT_AUTHOR_EMAIL="lab@spark-vllm.invalid", GIT_COMMITTER_NAME="spark-vllm lab",
             GIT_COMMITTER_EMAIL="lab@spark-vllm.invalid", GIT_CONFIG_GLOBAL="/dev/null",
             GIT_CONFIG_NOSYSTEM="1", **(env or {}))
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True,
                          env=e).stdout.strip()


def _commits(repo: str) -> dict:
    shas = _git(repo, "log", "--format=%H", "main").split()
    if len(shas) != len(COMMITS):
        raise ValueError(f"{len(shas)} commits")
    return {"first": shas[1], "second": shas[0], "main": shas[0]}


def ensure_repo(repo: str, builder) -> tuple[dict, bool]:
    """The git repo at `repo` for the current model; ({first, second, main}, whether it was
    (re)made). A repo made from other files (an older generator) is made again."""
    key = model_key()
    stamp = os.path.join(repo, ".git", "spark-vllm-lab-model")
    try:
        with open(stamp) as f:
            if f.read().strip() == key:
                return _commits(repo), False
    except (OSError, ValueError, subprocess.CalledProcessError):
        pass
    files = ensure_files(builder)
    subprocess.run(["rm", "-rf", repo], check=True)
    os.makedirs(repo)
    _git(repo, "init", "-q", "-b", "main")
    for rev, (date, msg) in enumerate(COMMITS, 1):
        for f in os.listdir(repo):
            if f != ".git":
                os.unlink(os.path.join(repo, f))
        write(os.path.join(repo, ".gitattributes"), "")
        src = os.path.join(files, str(rev))
        for f in sorted(os.listdir(src)):
            shutil.copyfile(os.path.join(src, f), os.path.join(repo, f))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", msg,
             env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    write(stamp, key + "\n")
    commits = _commits(repo)
    log(f"model: spark-lab/tiny-moe first {commits['first']}, main {commits['main']}")
    return commits, True
