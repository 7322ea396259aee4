"""Verification of a model snapshot in the local Hugging Face cache (runs on every worker's node)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import struct

HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hf_cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def _digest(path: str, kind: str) -> str:
    size = os.path.getsize(path)
    h = hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_safetensors(path: str) -> str | None:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            return "too short for a safetensors header"
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8 or n > 100 * 1024 * 1024:
            return f"header length {n} exceeds file size {size}"
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            return f"header is not JSON ({e})"
    data_len = size - 8 - n
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            a, b = t["data_offsets"]
            t["dtype"], t["shape"]
        except (KeyError, TypeError, ValueError):
            return f"tensor {name}: malformed entry"
        if not 0 <= a <= b <= data_len:
            return f"tensor {name}: offsets {a}..{b} outside data ({data_len} bytes)"
        end = max(end, b)
    if end != data_len:
        return f"data section is {data_len} bytes but tensors cover {end}"
    return None


def verify(model: str, revision: str | None) -> dict:
    """Return {"node", "ok", "problems", "commit", "snapshot", "files": {rel: [size, blob]}}."""
    res = {"node": socket.gethostname(), "ok": False, "problems": [], "warnings": [], "commit": None,
           "files": {}, "snapshot": None}
    probs = res["problems"]
    if os.path.isdir(model):
        snap = model
        res["commit"] = "local:" + os.path.abspath(model)
    else:
        repo_dir = os.path.join(hf_cache_dir(), "models--" + model.replace("/", "--"))
        rev = revision or "main"
        if not os.path.isdir(repo_dir):
            probs.append(f"{model} is not in this node's HF cache ({repo_dir} missing)")
            return res
        if HEX40.match(rev):
            commit = rev
        else:
            try:
                commit = open(os.path.join(repo_dir, "refs", rev)).read().strip()
            except FileNotFoundError:
                probs.append(f"revision {rev!r} of {model} is not in this node's HF cache (no refs/{rev})")
                return res
        res["commit"] = commit
        snap = os.path.join(repo_dir, "snapshots", commit)
        blobs = os.path.join(repo_dir, "blobs")
        if os.path.isdir(blobs):
            inc = [b for b in os.listdir(blobs) if b.endswith(".incomplete")]
            if inc:   # harmless unless the snapshot points at them (then the link dangles: a problem)
                res["warnings"].append(f"unfinished downloads in the cache: {', '.join(sorted(inc))}")
    res["snapshot"] = snap
    if not os.path.isdir(snap):
        probs.append(f"snapshot directory {snap} missing")
        return res
    files = {}
    for root, dirs, names in os.walk(snap):
        dirs.sort()
        for fn in sorted(names):
            p = os.path.join(root, fn)
            rel = os.path.relpath(p, snap)
            if not os.path.exists(p):
                probs.append(f"{rel}: dangling link to missing blob {os.readlink(p)}")
                continue
            real = os.path.realpath(p)
            blob = os.path.basename(real)
            size = os.path.getsize(real)
            if os.path.islink(p):
                if HEX64.match(blob) and _digest(real, "sha256") != blob:
                    probs.append(f"{rel}: blob {blob[:12]}… content/size does not match its sha256")
                elif HEX40.match(blob) and _digest(real, "gitsha1") != blob:
                    probs.append(f"{rel}: blob {blob[:12]}… content/size does not match its git sha1")
            files[rel] = [size, blob]
    res["files"] = files
    if "config.json" not in files:
        probs.append("config.json missing")
    else:
        try:
            json.load(open(os.path.join(snap, "config.json")))
        except ValueError as e:
            probs.append(f"config.json is not JSON ({e})")
    weights = []
    idx = os.path.join(snap, "model.safetensors.index.json")
    if os.path.exists(idx):
        try:
            weights = sorted(set(json.load(open(idx))["weight_map"].values()))
        except (ValueError, KeyError) as e:
            probs.append(f"model.safetensors.index.json unreadable ({e})")
    else:
        weights = sorted(f for f in files if f.endswith(".safetensors"))
    if not weights:
        probs.append("no *.safetensors weights in the snapshot")
    for w in weights:
        if w not in files:
            probs.append(f"{w} missing")
            continue
        err = check_safetensors(os.path.join(snap, w))
        if err:
            probs.append(f"{w}: {err}")
    res["weights"] = weights
    res["bytes"] = sum(v[0] for v in files.values())
    res["ok"] = not probs
    return res
