# Model sync (the serving image's python, on every other node): reads a manifest on stdin
# (hostscripts/models.py: model_manifest_json) and pulls from the head's seeder exactly the files
# whose blob is missing or of the wrong size, into the HF cache layout (blobs by etag, snapshot
# symlinks, the ref when the revision is not the commit).
#
# Every fabric twin at once: `seeds` lists the head's seeder addresses, each with this node's
# own twin in the same subnet (`via`, the source address the streams bind to). Files larger than
# `chunkBytes` are cut into byte ranges (HTTP Range, answered 206 by model_seeder.py), smaller
# ones are whole-file GETs; the pieces are dealt to the seeds in manifest order, each to the
# seed with the fewest bytes so far (one big safetensors file goes over both twins, small files
# alternate), and `streamsPerSeed` threads per seed fetch their seed's share.
# Every request carries the run's token (`token`, Authorization: Bearer; the seeder answers
# 401 without it). Before any transfer every seed is probed (TCP connect) until one answers (up to `waitSeconds`,
# 120: the seeder may still be starting), then 3 s more for the rest. A seed that does not answer, or
# whose stream breaks later, is dropped with a stderr line naming it and its pieces go to the
# others; no seed left is fatal, with the errors. An HTTP answer other than the expected one
# (404, a size other than the manifest's) or a local write error (a full disk) is fatal at once:
# another twin would meet the same.
#
# Nothing half-written is ever visible under a blob name: a file's pieces are written (pwrite)
# into `<blob>.incomplete`, sized up front; it is renamed onto the blob only when every piece
# arrived with exactly its length and the file has the manifest's size. After a failure the
# `.incomplete` files of unfinished blobs are removed. Prints a line per file finished (bytes
# and rate per seed), then {"files", "bytesMoved", "bytesBySeed"} as the last line.
# Its progress goes to stderr: what it has to copy (the sizes of the missing files: known up
# front), then every `every` seconds `model fan-out <node>: <done> of <total> (<percent>), <rate>,
# ETA <time left>`, bytes counted as they are written (a piece fetched again after a broken
# stream counts once), and one line at 100% when every file is in place. No URL or token is
# printed. argv = [every [node]] (10 s and the host name when not given).
# The manifest's values came from the hub: every one is checked before a file is touched (etag
# 40 or 64 lowercase hex, path relative and normalised, size a byte count, the revision a ref
# name), and every path again where it is joined; a manifest that fails exits 1 with
# "model manifest refused: ..." and changes nothing (issue 31).
# It runs in a container that mounts only the cache's hub/ (a link there resolves inside the
# container), and still writes, renames and links only through cache_fs.py's Tree (joined in
# front of this text, rooted at the hub): a symbolic link or a foreign file on the way is
# refused naming it ("refused: <path> ...", exit 1), never followed (issue 46). The manifest
# rules are contract/manifest.py's (read by manifest_read.py), the sizes and times progress.py's.
# Prelude: cache_fs, manifest, manifest_read, progress.
# The lines above are not sent to the node.

import collections, http.client, json, os, re, socket, sys, threading, time, urllib.parse
every = float(sys.argv[1]) if len(sys.argv) > 1 else 10
node = "".join(c for c in (sys.argv[2] if len(sys.argv) > 2 else socket.gethostname())
               if c.isprintable())
m = read_manifest()
if check_repo_path(m.get("revision")) is not None:
    refuse_manifest("revision %r is not a ref name" % (m.get("revision"),))
if not isinstance(m.get("token"), str) or not re.fullmatch(r"[0-9a-f]{64}", m["token"]):
    refuse_manifest("no token for the seeder")
AUTH = {"Authorization": "Bearer " + m["token"]}
hub = "/root/.cache/huggingface/hub/".rstrip("/")
root = inside(hub, m["repoDir"])
snap = inside(root, "snapshots", m["commit"])
base = "/snapshots/%s/" % m["commit"]
port, chunk, streams = m["seedPort"], m["chunkBytes"], m["streamsPerSeed"]


class Fatal(Exception):
    pass


class Seed:
    def __init__(self, s):
        self.ip, self.via = s["ip"], s.get("via")
        self.name = "%s:%d" % (self.ip, port) + (" (from %s)" % self.via if self.via else "")
        self.alive, self.queue, self.bytes, self.load = True, collections.deque(), 0, 0

    def connect(self, timeout):
        src = (self.via, 0) if self.via else None
        return http.client.HTTPConnection(self.ip, port, timeout=timeout, source_address=src)


class File:
    def __init__(self, f):
        self.path, self.size = f["path"], f["size"]
        # checked again where joined; relative to the hub, for the Tree
        self.blob = inside(root, "blobs", f["etag"])[len(hub) + 1:]
        self.link = inside(snap, f["path"])[len(hub) + 1:]
        self.tmp = self.blob + ".incomplete"
        self.url = base + urllib.parse.quote(self.path)
        self.left, self.got = 0, 0


def fetch(seed, piece, buf):
    """One piece over one seed: exactly its bytes at its offset in the .incomplete file."""
    f, start, length, ranged = piece
    conn = seed.connect(60)
    try:
        conn.request("GET", f.url, headers=dict(AUTH, Range="bytes=%d-%d" % (
            start, start + length - 1)) if ranged else AUTH)
        r = conn.getresponse()
        want = "bytes %d-%d/%d" % (start, start + length - 1, f.size) if ranged else None
        if r.status != (206 if ranged else 200) or r.getheader("Content-Range") != want:
            raise Fatal("seeder %s answered %d %s (Content-Range %s) for %s, expected %s"
                        % (seed.name, r.status, r.reason, r.getheader("Content-Range"), f.path,
                           want or "200"))
        if r.getheader("Content-Length") != str(length):
            raise Fatal("size mismatch for %s: the seeder %s sends %s bytes, the manifest "
                        "says %d" % (f.path, seed.name, r.getheader("Content-Length"), length))
        view, got = memoryview(buf), 0
        try:
            fd = tree.open(f.tmp, os.O_WRONLY)
        except (OSError, Refused) as e:
            raise Fatal("cannot write %s: %s" % (tree.path(f.tmp), e))
        try:
            while got < length:
                n = r.readinto(view[:min(len(buf), length - got)])
                if not n:
                    break
                try:
                    os.pwrite(fd, view[:n], start + got)
                except OSError as e:  # a full disk is not the twin's fault
                    raise Fatal("cannot write %s: %s" % (tree.path(f.tmp), e))
                got += n
                count(n)
        except BaseException:
            count(-got)  # the piece goes to another seed, or nowhere
            raise
        finally:
            os.close(fd)
        if got != length:
            count(-got)
            raise OSError("short read of %s: %d of %d bytes" % (f.path, got, length))
        return got
    finally:
        conn.close()


progress, counted = [0], threading.Lock()


def count(n):
    with counted:
        progress[0] += n


def say(text):
    print("model fan-out %s: %s" % (node, text), file=sys.stderr, flush=True)


def line(done, total, secs, final=False):
    rate = done / secs if secs > 0 else 0
    text = "%s of %s (%d%%), %s/s" % (size(done), size(total),
                                      100 * done // total if total else 100, size(rate))
    if final:
        text += ", done in %s" % clock(secs)
    elif rate > 0:
        text += ", ETA %s" % clock((total - done) / rate)
    say(text)


def present(f):
    try:
        st = tree.file(f.blob)
    except FileNotFoundError:
        return False
    return st is not None and st.st_size == f.size


try:
    tree = Tree(hub, create=True)  # the mount: there in the container
    files = [File(f) for f in m["files"]]
    missing = [f for f in files if not present(f)]
    if missing:  # each missing blob's download file, made afresh (a leftover never written)
        os.close(tree.dir(m["repoDir"] + "/blobs", create=True))
        for f in missing:
            tree.remove(f.tmp)
            os.close(tree.open(f.tmp, os.O_WRONLY | os.O_EXCL, create=True))
            fd = tree.open(f.tmp, os.O_WRONLY)
            try:
                os.ftruncate(fd, f.size)
            finally:
                os.close(fd)
except Refused as e:
    sys.exit("refused: %s" % e)
seeds = [Seed(s) for s in m["seeds"]]
moved = 0
if missing:
    # probe: every seed until one answers (the seeder may be starting), then a grace for the rest
    deadline, grace, errors = time.time() + m["waitSeconds"], None, {}
    waiting = list(seeds)
    while waiting:
        for s in list(waiting):
            try:
                socket.create_connection((s.ip, port), 3,
                                         (s.via, 0) if s.via else None).close()
                waiting.remove(s)
                grace = grace or time.time() + 3
            except OSError as e:
                errors[s] = e
        now = time.time()
        if not waiting or now > (grace or deadline):
            break
        time.sleep(0.2 if grace else 1)
    for s in waiting:
        s.alive = False
        if len(waiting) < len(seeds):
            print("model sync: seeder %s does not answer (%s); fetching over the other twins"
                  % (s.name, errors[s]), file=sys.stderr, flush=True)
    if len(waiting) == len(seeds):
        for f in missing:
            tree.remove(f.tmp)
        sys.exit("model sync: no seeder address answers after %d s: %s (is the seeder on the "
                 "head running?)" % (m["waitSeconds"], "; ".join(
                     "%s: %s" % (s.name, errors[s]) for s in seeds)))

    live = [s for s in seeds if s.alive]
    need = sum(f.size for f in missing)
    say("%s to copy (%d of %d files), over %d seeder address%s" % (
        size(need), len(missing), len(files), len(live), "" if len(live) == 1 else "es"))
    m0, ticking = time.monotonic(), threading.Event()

    def ticks():
        while not ticking.wait(every):
            line(progress[0], need, time.monotonic() - m0)

    ticker = threading.Thread(target=ticks, daemon=True)

    def deal(pieces):  # each piece to the live seed with the fewest bytes so far
        for p in pieces:
            s = min((s for s in seeds if s.alive), key=lambda s: s.load)
            s.load += p[2]
            s.queue.append(p)

    pieces = []
    for f in missing:
        ranged = f.size > chunk
        step = chunk if ranged else max(f.size, 1)
        for start in range(0, max(f.size, 1), step):
            pieces.append((f, start, min(step, f.size - start), ranged))
            f.left += 1
    deal(pieces)
    cond = threading.Condition()
    state = {"pending": len(pieces), "fatal": None, "done": 0}
    t0 = time.time()

    def per_seed(el):
        return ", ".join("%s %d B %.1f MB/s%s" % (s.ip, s.bytes, s.bytes / el / 1e6,
                                                  "" if s.alive else " (dropped)") for s in seeds)

    def report(f):
        el = max(time.time() - t0, 1e-6)
        print("%s done (%d B, %d/%d files); %s" % (f.path, f.size, state["done"], len(missing),
                                                   per_seed(el)), flush=True)

    def stream(seed):
        buf = bytearray(1 << 22)
        while True:
            with cond:
                while True:
                    if state["fatal"] or not seed.alive:
                        return
                    if seed.queue:
                        piece = seed.queue.popleft()
                        break
                    if not state["pending"]:
                        return
                    cond.wait()
            f = piece[0]
            try:
                got = fetch(seed, piece, buf)
            except Fatal as e:
                with cond:
                    state["fatal"] = state["fatal"] or str(e)
                    cond.notify_all()
                return
            except (OSError, http.client.HTTPException) as e:
                with cond:
                    seed.load -= piece[2]
                    back = [piece]
                    if seed.alive:
                        seed.alive = False
                        back += list(seed.queue)
                        seed.queue.clear()
                        print("model sync: seeder %s failed (%s: %s); fetching over the other "
                              "twins" % (seed.name, type(e).__name__, e), file=sys.stderr,
                              flush=True)
                    if any(s.alive for s in seeds):
                        deal(back)
                    else:
                        state["fatal"] = state["fatal"] or (
                            "model sync: no seeder address left (the last, %s, failed: %s)"
                            % (seed.name, e))
                    cond.notify_all()
                return
            with cond:
                seed.bytes += got
                f.got += got
                f.left -= 1
                last = f.left == 0
            if last:
                try:
                    size = tree.file(f.tmp).st_size
                    if f.got == f.size and size == f.size:
                        tree.rename(f.tmp, f.blob)
                except (OSError, Refused, AttributeError) as e:
                    with cond:
                        state["fatal"] = "cannot put %s in place: %s" % (tree.path(f.blob), e)
                        cond.notify_all()
                    return
                if f.got != f.size or size != f.size:
                    with cond:
                        state["fatal"] = "size mismatch for %s: %d != %d" % (
                            f.path, f.got if f.got != f.size else size, f.size)
                        cond.notify_all()
                    return
                with cond:
                    state["done"] += 1
                    report(f)
            with cond:
                state["pending"] -= 1
                cond.notify_all()

    threads = [threading.Thread(target=stream, args=(s,)) for s in live for _ in range(streams)]
    ticker.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ticking.set()
    ticker.join()
    if state["fatal"] or state["pending"]:
        for f in missing:
            try:
                tree.remove(f.tmp)
            except (OSError, Refused):
                pass
        sys.exit(state["fatal"] or "model sync: %d pieces not fetched" % state["pending"])
    moved = sum(f.size for f in missing)
    line(progress[0], need, time.monotonic() - m0, True)  # == need: each byte counted once
    el = max(time.time() - t0, 1e-6)
    print("moved %d B in %.1f s: %s" % (moved, el, per_seed(el)), flush=True)
else:
    say("nothing to copy: every file is in the cache")
try:
    for f in files:
        tree.symlink(f.link, os.path.relpath("/" + f.blob, os.path.dirname("/" + f.link)))
    if m["revision"] != m["commit"]:
        tree.write(inside(root, "refs", m["revision"])[len(hub) + 1:], m["commit"].encode())
except Refused as e:
    sys.exit("refused: %s" % e)
print(json.dumps({"files": len(files), "bytesMoved": moved,
                  "bytesBySeed": {s.ip: s.bytes for s in seeds}}))
