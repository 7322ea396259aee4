# Fetch one URL to stdout, retrying for up to 120 s while the seeder comes up, presenting the
# run's token (the first line of stdin: the image seeder answers 401 without it).
# argv = url. Runs on a node with the host's python3 (hostscripts/images.py pipes it into
# `docker load`); the lines above are not sent to the node.

import shutil, sys, time, urllib.error, urllib.request
url, deadline = sys.argv[1], time.time() + 120
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
shutil.copyfileobj(r, sys.stdout.buffer, 1 << 20)
