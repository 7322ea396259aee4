# Image seeder (runs on the head with the host's python3; image.source = head).
# Serves `docker save <ref>` over HTTP on the head's fabric address, to the run's nodes only
# (issue 31): GET /image.tar with `Authorization: Bearer <token>`, the token the start command
# made for this run (the seeder knows only its sha256, so none is on its command line). Without
# it 401 and no `docker save` runs; another path 404; at most max-saves saves at once (one per
# node that copies), another then 503. The answer carries no Content-Length (the size of the
# `docker save` stream is known only at its end); X-Image-Size is the image's size as
# `docker image inspect` gives it, when it gives one, for the nodes' progress lines
# (payloads/fetch_url.py shows it as approximate). argv = bind-ip port ref token-sha256 max-saves.
# It binds without http.server's reverse DNS lookup of the bind address, and checks the token,
# with seeder.py's SeedServer and Guarded.
# Prelude: seeder.
# Built into a command by hostscripts/images.py; the lines above are not sent to the node.

import re, subprocess, sys, threading

if len(sys.argv) != 6 or not re.fullmatch(r"[0-9a-f]{64}", sys.argv[4]) \
        or not sys.argv[5].isdigit() or int(sys.argv[5]) < 1:
    sys.exit("image seeder: argv is bind-ip port ref token-sha256 max-saves")
ref, digest, saves = sys.argv[3], sys.argv[4], threading.BoundedSemaphore(int(sys.argv[5]))


class H(Guarded):
    token_sha256 = digest

    def do_GET(self):
        if not self.authorized():
            return self.refuse(401)
        if self.path != "/image.tar":
            return self.refuse(404)
        if not saves.acquire(blocking=False):
            return self.refuse(503)
        try:
            try:
                size = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", ref],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      timeout=60).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                size = b""
            p = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            if size.isdigit():
                self.send_header("X-Image-Size", size.decode())
            self.end_headers()
            while True:
                b = p.stdout.read(1 << 20)
                if not b:
                    break
                self.wfile.write(b)
            p.wait()
        finally:
            saves.release()


SeedServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
