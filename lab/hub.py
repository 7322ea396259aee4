"""The lab's Hugging Face endpoint on http://10.77.0.1:8090 (HF_ENDPOINT).

olah (https://github.com/vtuber-plan/olah, from PyPI into a venv in the cache) serves the
lab-generated git repos spark-lab/tiny-moe and spark-lab/tiny-embed (lab/hfmodel.py) offline on
127.0.0.1:8091, behind lab/hfproxy.py, a stdlib proxy that logs every request with the bytes it
sent (`hf-bytes`).
"""

from __future__ import annotations

import json
import os
import shutil

from lab import hfmodel
from lab.cgroups import cg_kill_remove, spawn
from lab.layout import CACHE, HERE, HF_ENDPOINT, HF_PORT, HF_REPO, LAB, MGMT_IP, OLAH_PORT
from lab.util import VERBOSE, http_get, log, run, wait_for, write

OLAH_REQ = "olah==0.5.4"
HF_DIR = os.path.join(LAB, "hf")  # olah config and logs, access.jsonl, commits.json
# commits.json: {repo: {first, second, main}} for every repo of hfmodel.MODELS
COMMITS_JSON = os.path.join(HF_DIR, "commits.json")
ACCESS_LOG = os.path.join(HF_DIR, "access.jsonl")


def ensure_olah_venv() -> str:
    venv = os.path.join(CACHE, "olah-venv-" + OLAH_REQ.split("==")[1])
    if os.path.exists(os.path.join(venv, ".complete")):
        return venv
    log(f"installing {OLAH_REQ} into {venv}")
    shutil.rmtree(venv, ignore_errors=True)
    run(["/usr/bin/python3", "-m", "venv", venv])
    run([f"{venv}/bin/pip", "install", "--disable-pip-version-check", "-q", OLAH_REQ],
        quiet=not VERBOSE)
    write(os.path.join(venv, ".complete"), OLAH_REQ)
    return venv


def hf_missing() -> list:
    """The repos of hfmodel.MODELS the endpoint does not serve (all of them when it is down)."""
    def serves(repo: str) -> bool:
        try:
            return http_get(f"{HF_ENDPOINT}/api/models/{repo}/revision/main",
                            timeout=3).status == 200
        except Exception:  # a probe: any failure means "not served"
            return False

    return [m.repo for m in hfmodel.MODELS if not serves(m.repo)]


def hf_running() -> bool:
    return not hf_missing()


def ensure_hf(builder) -> None:
    """The model repos (re)generated, then olah + the proxy started unless they already answer.
    `builder` (image.Builder) runs the model generator when its output is not cached."""
    mirror = os.path.join(LAB, "hub")
    commits, remade = {}, False
    for m in hfmodel.MODELS:
        commits[m.repo], new = hfmodel.ensure_repo(os.path.join(mirror, "models", m.repo),
                                                   builder, m)
        remade |= new
    write(COMMITS_JSON, json.dumps(commits, indent=1))
    if remade:  # olah caches what it served: start it afresh on the new repository
        cg_kill_remove("hf")
        shutil.rmtree(os.path.join(HF_DIR, "repos"), ignore_errors=True)
    elif hf_running():
        return
    cg_kill_remove("hf")
    venv = ensure_olah_venv()
    hd = HF_DIR
    cfg = os.path.join(hd, "olah.toml")
    write(cfg, f"""[basic]
host = "127.0.0.1"
port = {OLAH_PORT}
repos-path = "{hd}/repos"
mirror-scheme = "http"
mirror-netloc = "{MGMT_IP}:{HF_PORT}"
mirror-lfs-netloc = "{MGMT_IP}:{HF_PORT}"
mirrors-path = ["{mirror}"]

[accessibility]
offline = true
""")
    spawn([f"{venv}/bin/olah-cli", "-c", cfg], os.path.join(hd, "olah.log"), "hf",
          env=dict(os.environ, OLAH_LOG_PATH=os.path.join(hd, "logs")))
    spawn(["/usr/bin/python3", os.path.join(HERE, "hfproxy.py"), "--listen", f"{MGMT_IP}:{HF_PORT}",
           "--upstream", f"127.0.0.1:{OLAH_PORT}", "--log", ACCESS_LOG],
          os.path.join(hd, "proxy.log"), "hf")
    wait_for(hf_running, 60, f"HF endpoint {HF_ENDPOINT} (see {hd}/olah.log, proxy.log)")


def commits(repo: str = HF_REPO) -> dict:
    """A model repo's commits as ensure_hf recorded them ({} before the first `up`)."""
    try:
        with open(COMMITS_JSON) as f:
            got = json.load(f)
    except (FileNotFoundError, ValueError):
        return {}
    if "main" in got:  # written by an older lab: tiny-moe's commits only
        got = {HF_REPO: got}
    return got.get(repo, {})


def served_bytes() -> tuple[int, dict]:
    """(total, {path: {requests, bytes}}) of the GET requests the endpoint answered."""
    agg = {}
    total = 0
    if os.path.exists(ACCESS_LOG):
        with open(ACCESS_LOG) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e.get("method") != "GET":
                    continue
                k = e["path"]
                a = agg.setdefault(k, {"requests": 0, "bytes": 0})
                a["requests"] += 1
                a["bytes"] += e.get("bytes", 0)
                total += e.get("bytes", 0)
    return total, agg
