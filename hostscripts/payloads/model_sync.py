# Model sync (the serving image's python, on every other node): reads a manifest on stdin
# (hostscripts/models.py: model_manifest_json) and pulls from the head's seeder exactly the files
# whose blob is missing or of the wrong size, into the HF cache layout (blobs by etag, snapshot
# symlinks, the ref when the revision is not the commit). Prints {"files", "bytesMoved"}.
# The lines above are not sent to the node.

import json, os, sys, time, urllib.parse, urllib.request
m = json.load(sys.stdin)
root = "/root/.cache/huggingface/hub/" + m["repoDir"]
snap = root + "/snapshots/" + m["commit"]
base = "http://%s:%d/snapshots/%s/" % (m["seedIp"], m["seedPort"], m["commit"])
deadline = time.time() + 120
moved = 0
for f in m["files"]:
    blob = root + "/blobs/" + f["etag"]
    if not (os.path.isfile(blob) and os.path.getsize(blob) == f["size"]):
        os.makedirs(root + "/blobs", exist_ok=True)
        tmp = blob + ".incomplete"
        while True:
            try:
                r = urllib.request.urlopen(base + urllib.parse.quote(f["path"]), timeout=60)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(1)
        buf = bytearray(1 << 22)
        view = memoryview(buf)
        with open(tmp, "wb") as out:
            while True:
                n = r.readinto(buf)
                if not n:
                    break
                out.write(view[:n])
        if os.path.getsize(tmp) != f["size"]:
            sys.exit("size mismatch for %s: %d != %d"
                     % (f["path"], os.path.getsize(tmp), f["size"]))
        os.replace(tmp, blob)
        moved += f["size"]
    link = snap + "/" + f["path"]
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
if m["revision"] != m["commit"]:
    ref = root + "/refs/" + m["revision"]
    os.makedirs(os.path.dirname(ref), exist_ok=True)
    with open(ref, "w") as out:
        out.write(m["commit"])
print(json.dumps({"files": len(m["files"]), "bytesMoved": moved}))
