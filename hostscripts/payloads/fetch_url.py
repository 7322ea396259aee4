# Fetch one URL to stdout, retrying for up to 120 s while the seeder comes up.
# argv = url. Runs on a node with the host's python3 (hostscripts/images.py pipes it into
# `docker load`); the lines above are not sent to the node.

import shutil, sys, time, urllib.request
url, deadline = sys.argv[1], time.time() + 120
while True:
    try:
        r = urllib.request.urlopen(url, timeout=60)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(1)
shutil.copyfileobj(r, sys.stdout.buffer, 1 << 20)
