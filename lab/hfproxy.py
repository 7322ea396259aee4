#!/usr/bin/env python3
"""Access-logging reverse proxy in front of olah (the lab's HF endpoint). Stdlib only.
Every request becomes one JSON line: {ts, method, path, status, bytes} where bytes is the body size
sent to the client, so tests can count what was downloaded (`lab.py hf-bytes`)."""
import argparse
import http.client
import http.server
import json
import socketserver
import threading
import time

HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
       "transfer-encoding", "upgrade"}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None
    logf = None
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def _proxy(self):
        body = None
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            body = self.rfile.read(n)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in HOP and k.lower() != "host"}
        headers["Host"] = self.headers.get("Host", self.upstream)
        sent = 0
        status = 502
        try:
            conn = http.client.HTTPConnection(self.upstream, timeout=300)
            conn.request(self.command, self.path, body=body, headers=headers)
            r = conn.getresponse()
            status = r.status
            self.send_response_only(r.status, r.reason)
            length = r.getheader("Content-Length")
            for k, v in r.getheaders():
                if k.lower() not in HOP:
                    self.send_header(k, v)
            chunked = length is None and self.command != "HEAD" and r.status not in (204, 304)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if self.command != "HEAD":
                while True:
                    chunk = r.read(1 << 16)
                    if not chunk:
                        break
                    sent += len(chunk)
                    if chunked:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    else:
                        self.wfile.write(chunk)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
            conn.close()
        except (ConnectionError, OSError) as e:
            if status == 502:
                try:
                    msg = f"lab hf proxy: upstream error {e}".encode()
                    self.send_response(502)
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                except OSError:
                    pass
        finally:
            rec = {"ts": round(time.time(), 3), "method": self.command, "path": self.path,
                   "status": status, "bytes": sent, "client": self.client_address[0]}
            with self.lock:
                self.logf.write(json.dumps(rec) + "\n")
                self.logf.flush()

    do_GET = do_HEAD = do_POST = _proxy


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    host, port = a.listen.rsplit(":", 1)
    Handler.upstream = a.upstream
    Handler.logf = open(a.log, "a")  # noqa: SIM115  (open while the proxy runs)
    Server((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
