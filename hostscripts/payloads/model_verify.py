# Model verify (the node's own python3, on every node, before vLLM starts): every file of the
# commit is in the node's HF cache with the size AND the content the hub lists: the LFS sha256
# for large files, the git blob id (sha1 of "blob <size>\0" + content) for the others. The
# files crossed the fabric over plain HTTP from the head's seeder, so size is not enough.
# Blobs already verified (same size and mtime as recorded in <record dir>/verified-<repo dir>, the
# stack's own root-only folder /var/lib/spark-vllm/stacks/<stack>/models, never the cache, which
# containers and other stacks write (issue 46); one "<etag> <size> <mtime as seconds.nanoseconds>"
# line per blob, which recon's hf_cache snippet also reads to spot a blob changed since; it holds
# this commit's blobs only) are not hashed again. argv = hf-cache-dir record-dir [--prune]; the
# manifest (hostscripts/models.py: verify_manifest_json) on stdin. --prune deletes blobs whose
# content is wrong and succeeds (the fetch that follows downloads them again); it also makes the
# cache folder and its hub/ when they are missing (what the fetch and sync containers mount).
# Without it a wrong blob is deleted and the command fails naming the file, so vLLM never starts
# on it and the next `up` copies it again.
# Every file it reads, removes or writes, in the cache and in the record folder, goes through
# cache_fs.py's Tree (joined in front of this text): a symbolic link, a component that is not a
# folder or a file owned by another user anywhere on the way is refused naming the path
# ("refused: <path> ..."), and the command fails with nothing changed there. Snapshot links are
# read (readlink), never followed.
# Prints {"files", "bytes", "hashed", "bad"}. The manifest's values came from the hub: every one
# is checked before a file is touched (etag 40 or 64 lowercase hex, path relative and
# normalised, size a byte count), and every path again where it is joined; a manifest that fails
# exits 1 with "model manifest refused: ..." and changes nothing (issue 31). The rules are
# contract/manifest.py's (read by manifest_read.py), the ones the program checked it with.
# Prelude: cache_fs, manifest, manifest_read.
# The lines above are not sent to the node.

import hashlib, json, os, sys
cache, record_dir, prune = sys.argv[1], sys.argv[2], "--prune" in sys.argv[3:]
m = read_manifest()
cache = os.path.abspath(cache)
root = inside(cache, "hub", m["repoDir"])
blobs = inside(root, "blobs")
snap = inside(root, "snapshots", m["commit"])
repo = "hub/" + m["repoDir"]
record_name = "verified-%s" % m["repoDir"]


def main():
    tree = Tree(cache, create=prune)
    if prune:
        os.close(tree.dir("hub", create=True))  # what the fetch and sync containers mount
    records = Tree(os.path.abspath(record_dir), create=True, mode=0o700)
    record = {}
    try:
        fd = records.open(record_name, os.O_RDONLY)
    except FileNotFoundError:
        fd = None
    if fd is not None:
        with os.fdopen(fd) as fh:
            for line in fh:
                parts = line.split()
                sec, _, ns = parts[2].partition(".") if len(parts) == 3 else ("", "", "")
                if parts[1:2] and parts[1].isdigit() and sec.isdigit() and ns.isdigit():
                    record[parts[0]] = [int(parts[1]), int(sec) * 10**9 + int(ns)]

    def digest(fd, size, etag):
        h = hashlib.sha256() if len(etag) == 64 else hashlib.sha1()
        if len(etag) != 64:
            h.update(b"blob %d\0" % size)
        with os.fdopen(fd, "rb") as fh:
            while True:
                chunk = fh.read(1 << 24)
                if not chunk:
                    break
                h.update(chunk)
        return h.hexdigest()

    bad, hashed, total = [], 0, 0
    for f in m["files"]:
        # checked again where joined: a name in blobs/, a path in the snapshot, nothing else
        blob = inside(blobs, f["etag"])[len(cache) + 1:]
        link = inside(snap, f["path"])[len(cache) + 1:]
        try:
            st = tree.file(blob)
        except FileNotFoundError:
            st = None
        if st is None:
            if not prune:
                bad.append("%s: missing" % f["path"])
            continue
        mark = [st.st_size, st.st_mtime_ns]
        if record.get(f["etag"]) == mark:
            total += st.st_size
            continue
        problem = None
        fd = tree.open(blob, os.O_RDONLY)
        now = os.fstat(fd)
        mark = [now.st_size, now.st_mtime_ns]
        if now.st_size != f["size"]:
            os.close(fd)
            problem = "%d bytes, want %d" % (now.st_size, f["size"])
        elif digest(fd, now.st_size, f["etag"]) != f["etag"]:
            problem = "content does not match %s" % f["etag"]
        hashed += 1
        if problem:
            tree.remove(blob)
            record.pop(f["etag"], None)
            bad.append("%s: %s (blob removed)" % (f["path"], problem))
            continue
        want = os.path.relpath("/" + blob, os.path.dirname("/" + link))
        if not prune:
            try:
                got = tree.readlink(link)
            except FileNotFoundError:
                got = None
            if got != want:
                bad.append("%s: the snapshot does not link to its blob" % f["path"])
                continue
        record[f["etag"]] = mark
        total += now.st_size
    # only this commit's blobs: a blob of another commit gone since (a wiped repo, a pruned
    # cache) must not count as changed for ever
    wanted = set(f["etag"] for f in m["files"])
    record = dict((e, v) for e, v in record.items() if e in wanted)
    records.write(record_name, "".join("%s %d %d.%09d\n" % (e, v[0], v[1] // 10**9, v[1] % 10**9)
                                       for e, v in sorted(record.items())).encode(), mode=0o600)
    print(json.dumps({"files": len(m["files"]), "bytes": total, "hashed": hashed, "bad": bad}))
    if bad and not prune:
        sys.exit("model snapshot %s is not what the hub lists:\n  %s"
                 % (m["commit"], "\n  ".join(bad)))


try:
    main()
except Refused as e:
    sys.exit("refused: %s" % e)
except FileNotFoundError as e:
    sys.exit("model verify: %s: %s" % (e.filename or cache, e.strerror))
