# Model seeder (the serving image's python, on the head): serves the files of ONE commit of a
# repo's HF cache folder, read-only, over HTTP on each of the head's carrier-up fabric addresses
# (one listener per address, same port), so the nodes' syncs can pull over every twin at once.
# Only the run's nodes are answered (issue 31): each request must carry
# `Authorization: Bearer <token>`, the token the start command made for this run; the seeder
# knows only its sha256 (argv), so no secret is in its command line or environment. Without it:
# 401. Only `GET`/`HEAD /snapshots/<commit>/<path>` of the commit being copied is served, when the
# snapshot's link resolves to a file in the repo's blobs/ folder: no listing, no other commit, no
# blob by name, no refs (404). The body is sent by the kernel (sendfile) instead of 64 KiB
# Python copies. A single byte range (`Range: bytes=a-b`, `bytes=a-`, `bytes=-n`) is answered
# 206 with exactly those bytes; a malformed, multi-part or unsatisfiable range is answered 416.
# One stderr line per body sent: listener address, status, bytes, path (the container's log).
# argv = bind-ips (comma-separated) port root commit token-sha256; an address that cannot be
# bound is reported and skipped, none bound is fatal. Binds without the reverse DNS lookup and
# checks the token with seeder.py's SeedServer and Guarded. Built by hostscripts/models.py.
# Prelude: seeder.
# The lines above are not sent to the node.

import os, re, sys, threading, urllib.parse

if len(sys.argv) != 6 or not re.fullmatch(r"[0-9a-f]{40}", sys.argv[4]) \
        or not re.fullmatch(r"[0-9a-f]{64}", sys.argv[5]):
    sys.exit("model seeder: argv is bind-ips port root commit token-sha256")
binds, port, root, commit, digest = (sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3],
                                     sys.argv[4], sys.argv[5])
blobs = os.path.realpath(os.path.join(root, "blobs"))
prefix = "/snapshots/%s/" % commit


class Server(SeedServer):
    request_queue_size = 128  # every worker's streams connect at once


class H(Guarded):
    span = None  # (offset, length) of the body to send
    token_sha256 = digest

    def target(self):
        """The blob the request's snapshot path names, or None."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if not path.startswith(prefix) or "\0" in path:
            return None
        rel = path[len(prefix):]
        if not rel or any(p in ("", ".", "..") for p in rel.split("/")):
            return None
        real = os.path.realpath(os.path.join(root, "snapshots", commit, rel))
        if os.path.dirname(real) != blobs or not os.path.isfile(real):
            return None
        return real

    def send_head(self):
        self.span = None
        if not self.authorized():
            return self.refuse(401)
        path = self.target()
        if path is None:
            return self.refuse(404)
        try:
            f = open(path, "rb")
        except OSError:
            return self.refuse(404)
        try:
            size = os.fstat(f.fileno()).st_size
            rng = self.headers.get("Range")
            if rng is None:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                return f
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            first = last = -1
            if m and m.group(1):
                first = int(m.group(1))
                last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            elif m and m.group(2) and int(m.group(2)) > 0:  # suffix: the last n bytes
                first, last = max(size - int(m.group(2)), 0), size - 1
            if first < 0 or first > last:
                f.close()
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            self.send_response(206)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            self.span = (first, last - first + 1)
            return f
        except Exception:
            f.close()
            raise

    def do_GET(self):
        f = self.send_head()
        if f is None:
            return
        try:
            self.wfile.flush()
            if self.span is None:
                sent = self.connection.sendfile(f)
            else:
                sent = self.connection.sendfile(f, self.span[0], self.span[1])
            sys.stderr.write("sent %s %s %d %s\n" % (self.server.server_address[0],
                             206 if self.span else 200, sent, self.path))
        finally:
            f.close()

    def do_HEAD(self):
        f = self.send_head()
        if f is not None:
            f.close()

    def log_request(self, code="-", size="-"):
        pass  # bodies are logged by do_GET, errors by log_error


servers = []
for ip in binds:
    try:
        servers.append(Server((ip, port), H))
        sys.stderr.write("listening on %s:%d\n" % (ip, port))
    except OSError as e:
        sys.stderr.write("cannot listen on %s:%d: %s\n" % (ip, port, e))
if not servers:
    sys.exit("model seeder: no address to listen on (%s)" % sys.argv[1])
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
