# Image seeder (runs on the head with the host's python3; image.source = head).
# Serves `docker save <ref>` over HTTP on the head's fabric address: argv = bind-ip port ref.
# The Server class binds without http.server's reverse DNS lookup of the bind address (getfqdn),
# which timed out for fabric addresses no resolver knows (10 s per converge on the lab).
# Built into a command by hostscripts/images.py; the lines above are not sent to the node.

import http.server, socketserver, subprocess, sys

class Server(http.server.ThreadingHTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

ref = sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        p = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-tar")
        self.end_headers()
        while True:
            b = p.stdout.read(1 << 20)
            if not b:
                break
            self.wfile.write(b)
        p.wait()
Server((sys.argv[1], int(sys.argv[2])), H).serve_forever()
