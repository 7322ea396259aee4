# Download one model snapshot into the HF cache with huggingface_hub (the serving image's
# python, on the head), its progress on stderr every `every` seconds: the bytes of the commit's
# files that were missing and are now in the cache (blobs and incomplete downloads, by their
# hub etag), the rate and the time left; then one line with what was fetched. No token, URL or
# header is printed. huggingface_hub's own progress bars are off (HF_HUB_DISABLE_PROGRESS_BARS).
# argv = repo commit every files_json ([[etag, size], ...], the hub's listing as the program
# validated it); the HF token, if any, arrives on stdin. stdout: the snapshot's folder.
# Built into a command by hostscripts/models.py; the lines above are not sent to the node.

import json, os, sys, threading, time
from huggingface_hub import snapshot_download
repo, commit, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
files = {etag: int(size) for etag, size in json.loads(sys.argv[4])}
token = sys.stdin.read().strip() or None
hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
    os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
blobs = os.path.join(hub, "models--" + repo.replace("/", "--"), "blobs")
def have(etag, size):
    got = 0
    for name in (etag, etag + ".incomplete"):
        try:
            got = max(got, os.path.getsize(os.path.join(blobs, name)))
        except OSError:
            pass
    return min(got, size)
def gb(n):
    return "%.2f GB" % (n / 1e9) if n >= 1e8 else "%.1f MB" % (n / 1e6)
def say(text):
    print("model-fetch %s@%s: %s" % (repo, commit[:12], text), file=sys.stderr, flush=True)
present = {e: have(e, s) for e, s in files.items()}
need = sum(s - present[e] for e, s in files.items())
done = threading.Event()
t0 = time.monotonic()
def fetched():
    return sum(have(e, s) for e, s in files.items()) - sum(present.values())
def report():
    while not done.wait(every):
        n, secs = fetched(), time.monotonic() - t0
        rate = n / secs if secs > 0 else 0
        left = "about %d min left" % max(1, round((need - n) / rate / 60)) if rate > 0 else "starting"
        say("%s of %s (%d%%), %.1f MB/s, %s" % (gb(n), gb(need), 100 * n // max(need, 1),
                                                rate / 1e6, left))
if need:
    say("%s to fetch (%d of %d files), %s already in the cache"
        % (gb(need), sum(present[e] < s for e, s in files.items()), len(files),
           gb(sum(present.values()))))
    threading.Thread(target=report, daemon=True).start()
path = snapshot_download(repo_id=repo, revision=commit, token=token)
done.set()
secs = time.monotonic() - t0
if need:
    say("%s fetched in %.0f s (%.1f MB/s)" % (gb(need), secs, need / max(secs, 1e-9) / 1e6))
else:
    say("nothing to fetch: every file is in the cache")
print(path)
