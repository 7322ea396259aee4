# Model seeder (the serving image's python, on the head): serves the repo's HF cache folder
# read-only over HTTP on the fabric address, the body sent by the kernel (sendfile) instead of
# 64 KiB Python copies. argv = bind-ip port root. Binds without the reverse DNS lookup (see
# image_seeder.py). Built by hostscripts/models.py; the lines above are not sent to the node.

import functools, http.server, socketserver, sys

class Server(http.server.ThreadingHTTPServer):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

class H(http.server.SimpleHTTPRequestHandler):
    def copyfile(self, source, outputfile):
        outputfile.flush()
        self.connection.sendfile(source)
bind, port, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
handler = functools.partial(H, directory=root)
Server((bind, port), handler).serve_forever()
