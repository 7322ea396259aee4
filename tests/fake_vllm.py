"""A FAKE vLLM for tests: a tiny stdlib HTTP server that only looks like vLLM's API from the
outside. It runs no model. It answers every request with JSON saying it is fake and which
server it is, records what it received, and has two paths for the gateway's tests:

* `POST /v1/completions` with `"stream": true`: server-sent events, `chunks` events `gap`
  seconds apart (`data: {...}` then `data: [DONE]`), each send time recorded; a client that went
  away is recorded as `disconnected` (the write fails);
* `POST /fake/slow`: answers after `slow` seconds unless the client went away first (its socket
  reads end-of-file): recorded as `disconnected`.

Used by tests/unit/hostscripts/test_gateway_haproxy.py, where the real HAProxy runs the config
the stack renders in front of two of these.
"""

from __future__ import annotations

import http.server
import json
import select
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Seen:
    method: str
    path: str
    authorization: str | None
    body: bytes


@dataclass
class FakeVllm:
    """One fake server: `name` is what it says it is; `url` once started."""

    name: str
    chunks: int = 5
    gap: float = 0.4
    slow: float = 10.0
    seen: list[Seen] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)  # time.monotonic() of each SSE event
    disconnected: threading.Event = field(default_factory=threading.Event)
    _server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> FakeVllm:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _answer(self, status: int, doc: dict) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Fake-Vllm", fake.name)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                body = self._body()
                if self.path == "/health":  # not recorded: the gateway's checks ask it often
                    self._answer(200, {})
                    return
                fake.seen.append(Seen(self.command, self.path,
                                      self.headers.get("Authorization"), body))
                doc = json.loads(body) if body.startswith(b"{") else {}
                if self.path == "/v1/completions" and doc.get("stream"):
                    self._stream()
                elif self.path == "/fake/slow":
                    self._slow()
                else:
                    self._answer(200, {"fake_vllm": fake.name, "note": "a fake vLLM for tests",
                                       "method": self.command, "path": self.path,
                                       "model": doc.get("model")})

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("X-Fake-Vllm", fake.name)
                self.end_headers()
                try:
                    for i in range(fake.chunks):
                        event = f"data: {json.dumps({'fake_vllm': fake.name, 'i': i})}\n\n"
                        self._chunk(event.encode())
                        fake.sent_at.append(time.monotonic())
                        time.sleep(fake.gap)
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                except OSError:  # the client (the gateway) closed the connection
                    fake.disconnected.set()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _slow(self) -> None:
                end = time.monotonic() + fake.slow
                while time.monotonic() < end:
                    ready, _, _ = select.select([self.connection], [], [], 0.1)
                    try:  # end of file, or a reset: the client (the gateway) went away
                        gone = bool(ready) and not self.connection.recv(1, socket.MSG_PEEK)
                    except OSError:
                        gone = True
                    if gone:
                        fake.disconnected.set()
                        self.close_connection = True
                        return
                self._answer(200, {"fake_vllm": fake.name, "slow": True})

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _handle

            def do_HEAD(self) -> None:
                self._handle()

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a health check or a client that closed early: nothing to report

        self._server = Quiet(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
