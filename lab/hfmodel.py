"""The lab's model repositories `spark-lab/tiny-moe`, `spark-lab/tiny-embed` and
`spark-lab/tiny-drafter` (a draft model of tiny-moe from another repo, for model.drafter): plain
git repos that olah serves as HF models with revisions.

The files come from lab/tinymodel.py (real tiny Qwen3 models, see there), which needs torch,
safetensors and tokenizers: it runs inside the lab's base image on the build dockerd
(`docker run --rm --network none`, one thread), once per model (`--arch`), and its output is
cached in /root/.cache/spark-vllm/lab/model-<name>-<key>/ keyed by the generator's source, the
model's arguments and the pinned versions of the libraries that write the bytes. Two commits per
repo with fixed author, committer and dates, so the SHAs are the same on every machine; the second
(`main`) changes one small file: tiny-moe's router shard, tiny-embed's and tiny-drafter's q_norm
shard.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from lab.layout import CACHE, HERE, HF_DRAFTER_REPO, HF_EMBED_REPO, HF_REPO
from lab.util import log, progress, short_hash, write

GENERATOR = os.path.join(HERE, "tinymodel.py")
LOCK = os.path.join(HERE, "image-requirements.txt")
BYTE_WRITERS = ("torch", "safetensors", "tokenizers")  # their versions change the files' bytes


@dataclass(frozen=True)
class Model:
    repo: str  # owner/name on the HF endpoint
    arch: str  # tinymodel.py --arch
    commits: tuple  # ((date, message) of revision 1, of revision 2 = main)

    @property
    def name(self) -> str:
        return self.repo.split("/")[1]


MOE = Model(HF_REPO, "qwen3moe",
            (("2026-01-01T00:00:00+00:00", "tiny-moe: first revision"),
             ("2026-01-02T00:00:00+00:00", "tiny-moe: other router weights (second shard only)")))
EMBED = Model(HF_EMBED_REPO, "qwen3embed",
              (("2026-01-01T00:00:00+00:00", "tiny-embed: first revision"),
               ("2026-01-02T00:00:00+00:00",
                "tiny-embed: other q_norm weights (second shard only)")))
DRAFTER = Model(HF_DRAFTER_REPO, "qwen3",
                (("2026-01-01T00:00:00+00:00", "tiny-drafter: first revision"),
                 ("2026-01-02T00:00:00+00:00",
                  "tiny-drafter: other q_norm weights (second shard only)")))
MODELS = (MOE, EMBED, DRAFTER)


def model_key(m: Model = MOE) -> str:
    with open(GENERATOR, "rb") as f:
        src = f.read()
    with open(LOCK) as f:
        pins = sorted(mt.group(0) for line in f
                      if (mt := re.match(rf"({'|'.join(BYTE_WRITERS)})==\S+", line)))
    return short_hash(src.decode(), m.arch, *pins)


def _stale_cache(entry: str, m: Model, current: str) -> bool:
    """This model's older outputs, and the single-model cache of older labs (model-<key>)."""
    return entry != current and (entry.startswith(f"model-{m.name}-")
                                 or re.fullmatch(r"model-[0-9a-f]{16}(\.tmp)?", entry) is not None)


def ensure_files(builder, m: Model = MOE) -> str:
    """The generated revisions of `m` (folders 1/ and 2/), from the cache or made in the base
    image."""
    key = model_key(m)
    d = os.path.join(CACHE, f"model-{m.name}-{key}")
    if os.path.exists(os.path.join(d, ".complete")):
        return d
    tmp = d + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    log(f"model: generating {m.repo} with lab/tinymodel.py --arch {m.arch} in the base image"
        f" -> {d}")
    # The build dockerd runs in a lab host whose /tmp (and any folder but the lab's cache) is
    # its own: the checkout may live anywhere (/tmp/x, a path with a space), so the generator is
    # bound from a copy in the cache, never from the checkout's path.
    gen = os.path.join(CACHE, "tmp", f"generator-{key}")
    shutil.rmtree(gen, ignore_errors=True)
    os.makedirs(gen)
    shutil.copyfile(GENERATOR, os.path.join(gen, "tinymodel.py"))
    try:
        with progress(f"model generator ({m.name})"):
            builder.run_in_base(["python3", "/lab/tinymodel.py", "/out", "--arch", m.arch],
                                {gen: "/lab:ro", tmp: "/out"},
                                env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    finally:
        shutil.rmtree(gen, ignore_errors=True)
    for rev in ("1", "2"):
        if not os.path.isdir(os.path.join(tmp, rev)):
            raise RuntimeError(f"the model generator wrote no revision {rev} into {tmp}")
    write(os.path.join(tmp, ".complete"), key + "\n")
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    for old in os.listdir(CACHE):  # keep only the current output of this model
        if _stale_cache(old, m, os.path.basename(d)):
            shutil.rmtree(os.path.join(CACHE, old), ignore_errors=True)
    return d


def _git(repo, *args, env=None):
    e = dict(os.environ, GIT_AUTHOR_NAME="spark-vllm lab",
             GIT_AUTHOR_EMAIL="lab@spark-vllm.invalid", GIT_COMMITTER_NAME="spark-vllm lab",
             GIT_COMMITTER_EMAIL="lab@spark-vllm.invalid", GIT_CONFIG_GLOBAL="/dev/null",
             GIT_CONFIG_NOSYSTEM="1", **(env or {}))
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True,
                          env=e).stdout.strip()


def _commits(repo: str, m: Model) -> dict:
    shas = _git(repo, "log", "--format=%H", "main").split()
    if len(shas) != len(m.commits):
        raise ValueError(f"{len(shas)} commits")
    return {"first": shas[1], "second": shas[0], "main": shas[0]}


def _replace_tree(repo: str, src: str) -> None:
    """The work tree of `repo` becomes a copy of `src` (sub-folders too, e.g. 1_Pooling/)."""
    for f in os.listdir(repo):
        if f != ".git":
            p = os.path.join(repo, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    write(os.path.join(repo, ".gitattributes"), "")
    for top, dirs, files in os.walk(src):
        dirs.sort()
        dst = os.path.join(repo, os.path.relpath(top, src))
        os.makedirs(dst, exist_ok=True)
        for f in sorted(files):
            shutil.copyfile(os.path.join(top, f), os.path.join(dst, f))


# The drafter is the generator's dense Qwen3 (`--arch qwen3`), whose README names tiny-moe: its
# repo gets a README of its own (the generator is left as it is: its source keys every model's
# cache, and the lab is shared by several checkouts)
DRAFTER_README = """---
license: apache-2.0
---
# spark-lab/tiny-drafter

A tiny dense Qwen3ForCausalLM (bfloat16) generated by the spark-vllm lab (lab/tinymodel.py --arch
qwen3) with the same byte-level BPE tokenizer and vocabulary as spark-lab/tiny-moe, so it can
draft for it (speculative decoding, `method: draft_model`). The weights are deterministic noise,
not trained. Revision 2 (`main`) differs from revision 1 in the q_norm weights only (the second
shard).
"""


def ensure_repo(repo: str, builder, m: Model = MOE) -> tuple[dict, bool]:
    """The git repo at `repo` for the current model `m`; ({first, second, main}, whether it was
    (re)made). A repo made from other files (an older generator) is made again."""
    key = model_key(m)
    stamp = os.path.join(repo, ".git", "spark-vllm-lab-model")
    try:
        with open(stamp) as f:
            if f.read().strip() == key:
                return _commits(repo, m), False
    except (OSError, ValueError, subprocess.CalledProcessError):
        pass
    files = ensure_files(builder, m)
    subprocess.run(["rm", "-rf", repo], check=True)
    os.makedirs(repo)
    _git(repo, "init", "-q", "-b", "main")
    for rev, (date, msg) in enumerate(m.commits, 1):
        _replace_tree(repo, os.path.join(files, str(rev)))
        if m is DRAFTER:
            write(os.path.join(repo, "README.md"), DRAFTER_README)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", msg,
             env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
    write(stamp, key + "\n")
    commits = _commits(repo, m)
    log(f"model: {m.repo} first {commits['first']}, main {commits['main']}")
    return commits, True
