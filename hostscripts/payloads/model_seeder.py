# Model seeder (the serving image's python, on the head): serves the repo's HF cache folder
# read-only over HTTP on each of the head's carrier-up fabric addresses (one listener per
# address, same port), so the nodes' syncs can pull over every twin at once. GET and HEAD
# only; the body is sent by the kernel (sendfile) instead of 64 KiB Python copies. A single
# byte range (`Range: bytes=a-b`, `bytes=a-`, `bytes=-n`) is answered 206 with exactly those
# bytes; a malformed, multi-part or unsatisfiable range is answered 416. One stderr line per
# body sent: listener address, status, bytes, path (the container's log). argv = bind-ips
# (comma-separated) port root; an address that cannot be bound is reported and skipped, none
# bound is fatal. Binds without the reverse DNS lookup (see image_seeder.py). Built by
# hostscripts/models.py; the lines above are not sent to the node.

import functools, http.server, os, re, socketserver, sys, threading

class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # every worker's streams connect at once

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

class H(http.server.SimpleHTTPRequestHandler):
    span = None  # (offset, length) of the body to send

    def send_head(self):
        self.span = None
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if rng is None or os.path.isdir(path):
            return super().send_head()
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(404, "File not found")
            return None
        try:
            size = os.fstat(f.fileno()).st_size
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
            self.send_header("Content-Type", self.guess_type(path))
            self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            self.span = (first, last - first + 1)
            return f
        except Exception:
            f.close()
            raise

    def copyfile(self, source, outputfile):
        outputfile.flush()
        if self.span is None:
            sent = self.connection.sendfile(source)
        else:
            sent = self.connection.sendfile(source, self.span[0], self.span[1])
        sys.stderr.write("sent %s %s %d %s\n" % (self.server.server_address[0],
                         206 if self.span else 200, sent, self.path))

    def log_request(self, code="-", size="-"):
        pass  # bodies are logged by copyfile, errors by log_error

binds, port, root = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
handler = functools.partial(H, directory=root)
servers = []
for ip in binds:
    try:
        servers.append(Server((ip, port), handler))
        sys.stderr.write("listening on %s:%d\n" % (ip, port))
    except OSError as e:
        sys.stderr.write("cannot listen on %s:%d: %s\n" % (ip, port, e))
if not servers:
    sys.exit("model seeder: no address to listen on (%s)" % sys.argv[1])
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
