# Gateway counters (the head's own python3, for `spark-vllm status`): asks HAProxy's stats
# socket (root only, in the gateway's run folder; hostscripts/gateway.render puts it there)
# for its frontend's counters (`show stat`, CSV: connections now, its limit, since its start,
# refused by the per-source rules: dcon) and its per-source stick table (`show table api`:
# each address seen in the last 10 minutes with its connections now and its 401s, count and
# rate per minute), and prints both as HAProxy answered, each after a line `== <command>`.
# The parser is inspection/status.py's parse_gateway. argv = socket-path. An error is one line
# on stderr, exit 1. Read-only (the socket's `show` commands change nothing).
# The lines above are not sent to the node.

import socket, sys

path = sys.argv[1]


def ask(command):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(path)
        s.sendall(command.encode() + b"\n")
        out = b""
        while len(out) < 1 << 22:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            out += chunk
        return out.decode("utf-8", "replace")
    finally:
        s.close()


try:
    for command in ("show stat", "show table api"):
        text = ask(command)
        print("== %s" % command)
        print(text.rstrip("\n"))
except OSError as e:
    sys.exit("the gateway's stats socket %s: %s" % (path, e))
