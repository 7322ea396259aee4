# What both seeders share (a prelude: hostscripts/common.py `payload()` joins this text in front
# of image_seeder.py's and model_seeder.py's). `SeedServer` binds without http.server's reverse
# DNS lookup of the bind address (getfqdn), which timed out for fabric addresses no resolver
# knows (10 s per converge on the lab). `Guarded` is a request handler that answers only the
# run's nodes (issue 31): `authorized()` holds when the request carries
# `Authorization: Bearer <token>` whose sha256 is the handler's `token_sha256` (the seeder sets
# it from its argv: no secret is in its command line), compared in constant time; `refuse(status)`
# answers an empty body, with `WWW-Authenticate: Bearer` for 401.
# The lines above are not sent to the node.

import hashlib, hmac, http.server, socketserver


class SeedServer(http.server.ThreadingHTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Guarded(http.server.BaseHTTPRequestHandler):
    token_sha256 = None  # set by the seeder; None answers nobody

    def authorized(self):
        given = self.headers.get("Authorization", "")
        token = given[len("Bearer "):] if given.startswith("Bearer ") else ""
        return self.token_sha256 is not None and hmac.compare_digest(
            hashlib.sha256(token.encode()).hexdigest(), self.token_sha256)

    def refuse(self, status):
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Length", "0")
        self.end_headers()
