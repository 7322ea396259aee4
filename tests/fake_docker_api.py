"""FAKE: Docker's Engine API on a unix socket, only the calls hostscripts/payloads/deployment.py
makes (container inspect, create, start, stop, delete, a file read and written through the
archive API, image inspect), with containers held in memory. It checks what a real daemon
refuses that the payload must not do (a name taken, a container started twice) and keeps every
request, so a test can say what the payload asked. It does not run anything: the engine tier
(tests/engine/test_deployment_restore.py) proves the same payload against a real dockerd.
"""

from __future__ import annotations

import io
import json
import os
import socketserver
import tarfile
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any


class FakeDocker:
    def __init__(self, path: str) -> None:
        self.path = path
        self.containers: dict[str, dict[str, Any]] = {}  # id -> {inspect..., "files": {}}
        self.images: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def address_string(self) -> str:  # a unix socket has no client address
                return "unix"

            def _send(self, status: int, body: Any = None, raw: bytes | None = None) -> None:
                data = raw if raw is not None else (json.dumps(body).encode()
                                                    if body is not None else b"")
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _route(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
                body = self._body()
                with fake.lock:
                    fake.calls.append(f"{method} {url.path}")
                    status, out, raw = fake.handle(method, parts, query, body)
                self._send(status, out, raw)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        class Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True

        if os.path.exists(path):
            os.remove(path)
        self.server = Server(path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ state
    def find(self, ref: str) -> dict[str, Any] | None:
        for c in self.containers.values():
            if c["Id"] == ref or c["Name"] == "/" + ref:
                return c
        return None

    def add(self, name: str, config: dict[str, Any], host: dict[str, Any],
            files: dict[str, bytes] | None = None, running: bool = True) -> str:
        """A container as the stack's provider would have made it."""
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        self.containers[cid] = {
            "Id": cid, "Name": "/" + name, "Image": config.get("Image", ""),
            "Config": json.loads(json.dumps(config)), "HostConfig": json.loads(json.dumps(host)),
            "State": {"Running": running, "Status": "running" if running else "created"},
            "files": dict(files or {}),
        }
        return cid

    def handle(self, method: str, parts: list[str], query: dict[str, str],
               body: bytes) -> tuple[int, Any, bytes | None]:
        if parts[:1] == ["images"] and method == "GET":
            img = self.images.get(parts[1])
            return (404, {"message": "no such image"}, None) if img is None else (200, img, None)
        if parts[:1] != ["containers"]:
            return 404, {"message": "page not found"}, None
        if parts[1:] == ["create"] and method == "POST":
            name = query["name"]
            if self.find(name) is not None:
                return 409, {"message": f"Conflict. The container name \"/{name}\" is already "
                                        "in use"}, None
            spec = json.loads(body)
            host = spec.pop("HostConfig", {})
            if (host.get("NetworkMode") == "host") and spec.get("Hostname"):
                return 400, {"message": "conflicting options: hostname and the network mode"}, \
                    None
            return 201, {"Id": self.add(name, spec, host, running=False)}, None
        c = self.find(parts[1])
        if c is None:
            return 404, {"message": f"No such container: {parts[1]}"}, None
        action = parts[2] if len(parts) > 2 else ""
        if method == "GET" and action == "json":
            return 200, {k: v for k, v in c.items() if k != "files"}, None
        if method == "POST" and action == "start":
            if c["State"]["Running"]:
                return 304, None, None
            c["State"] = {"Running": True, "Status": "running"}
            return 204, None, None
        if method == "POST" and action == "stop":
            c["State"] = {"Running": False, "Status": "exited"}
            return 204, None, None
        if method == "DELETE" and not action:
            if c["State"]["Running"] and query.get("force") != "true":
                return 409, {"message": "container is running"}, None
            del self.containers[c["Id"]]
            return 204, None, None
        if action == "archive" and method == "GET":
            path = query["path"]
            if path not in c["files"]:
                return 404, {"message": f"Could not find the file {path}"}, None
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                info = tarfile.TarInfo(os.path.basename(path))
                info.size, info.mode = len(c["files"][path]), 0o644
                tar.addfile(info, io.BytesIO(c["files"][path]))
            return 200, None, buf.getvalue()
        if action == "archive" and method == "PUT":
            root = query["path"]
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                for m in tar.getmembers():
                    f = tar.extractfile(m)
                    if f is not None:
                        c["files"][os.path.join(root, m.name)] = f.read()
            return 200, None, None
        return 404, {"message": "page not found"}, None
