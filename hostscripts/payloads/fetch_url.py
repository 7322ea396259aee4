# Fetch one URL to stdout, retrying for up to 120 s while the seeder comes up, presenting the
# run's token (the first line of stdin: the image seeder answers 401 without it).
# argv = url [every what node]. With `every` (seconds) it prints its progress on stderr that
# often, `<what> <node>: <done> of <total> (<percent>), <rate>, ETA <time left>`, and one line at
# the end with what came (100%). The total is the response's Content-Length, else the size the
# seeder announces in X-Image-Size (the image's size in the head's docker: the stream's own size
# is not known before it ends, so it shows as `~`); without either, or once the bytes reach the
# announced size, a line shows the bytes and the rate only. No URL, header or token is printed.
# The bytes written to stdout are exactly the body's. Runs on a node with the host's python3
# (hostscripts/images.py pipes it into `docker load`). Sizes and times are progress.py's.
# Prelude: progress.
# The lines above are not sent to the node.

import sys, threading, time, urllib.error, urllib.request
url, deadline = sys.argv[1], time.time() + 120
every = float(sys.argv[2]) if len(sys.argv) > 2 else 0
label = "%s %s" % (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else "fetch"
label = "".join(c for c in label if c.isprintable())
token = sys.stdin.readline().strip()
if not token:
    sys.exit("fetch: no token on stdin")
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
while True:
    try:
        r = urllib.request.urlopen(req, timeout=60)
        break
    except urllib.error.HTTPError as e:
        if e.code == 401 or time.time() > deadline:  # a wrong token does not get better
            raise
        time.sleep(1)
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(1)


def line(done, total, secs, approx, final=False):
    rate = done / secs if secs > 0 else 0
    text = "%s: %s" % (label, size(done))
    shown = total and (done < total if approx else done <= total)  # an estimate reached: gone
    if shown:
        text += " of %s%s (%d%%)" % ("~" if approx else "", size(total), 100 * done // total)
    text += ", %s/s" % size(rate)
    if final:
        text += ", done in %s" % clock(secs)
    elif shown and rate > 0:
        text += ", ETA %s" % clock((total - done) / rate)
    print(text, file=sys.stderr, flush=True)


total, approx = r.getheader("Content-Length") or "", False
if not total.isdigit():
    total, approx = r.getheader("X-Image-Size") or "", True
total = int(total) if total.isdigit() and int(total) > 0 else 0
got, stop, t0 = [0], threading.Event(), time.monotonic()


def report():
    while not stop.wait(every):
        line(got[0], total, time.monotonic() - t0, approx)


if every > 0:
    ticker = threading.Thread(target=report, daemon=True)
    ticker.start()
out = sys.stdout.buffer
while True:
    b = r.read(1 << 20)
    if not b:
        break
    out.write(b)
    got[0] += len(b)
out.flush()
if every > 0:
    stop.set()
    ticker.join()
    line(got[0], got[0], time.monotonic() - t0, False, True)
