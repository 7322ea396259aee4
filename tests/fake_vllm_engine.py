"""A FAKE vLLM process for the liveness watchdog's tests (tests/unit/hostscripts/
test_vllm_liveness.py): a stdlib HTTP server that answers like vLLM's API server on the paths the
watchdog probes, run as the watchdog's child process exactly as `vllm serve` would be. It runs
no model. Its behaviour is read, at every request, from a state file the test writes:

* `ok`: /health 200, metrics with no request queued, a completion or embedding answers at once;
* `frozen`: what a vLLM whose engine process stopped looks like from outside (measured on the
  lab with SIGSTOP of vLLM's EngineCore): /health still 200, metrics still answer and do not
  move, a completion never answers;
* `busy`: a request running and the token counter moving at every metrics read; a completion
  waits (a full engine);
* `stuck`: a request running and no counter moving (a rank hung in a collective).

Every request is appended to the log file as `<method> <path> <authorization> <state>`,
the state it was answered in.
`--engine` starts a child process (the fake's "engine") that stops itself with SIGSTOP, as the
lab's measurement did to vLLM's EngineCore; its PID goes to the log as `engine <pid>`.
`--no-health` never answers /health (a vLLM still loading).

Usage: python tests/fake_vllm_engine.py PORT STATE_FILE LOG_FILE [--engine] [--no-health]
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    port, state_file, log_file = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    flags = set(sys.argv[4:])
    if "--engine" in flags:
        engine = subprocess.Popen([sys.executable, "-c",
                                   "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"])
        with log_file.open("a") as f:
            f.write(f"engine {engine.pid}\n")
    counter = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)
            state = state_file.read_text().strip()  # before the log line: it names the state
            with log_file.open("a") as f:
                f.write(f"{self.command} {self.path} {self.headers.get('Authorization')} "
                        f"{state}\n")
            if self.path == "/health":
                if "--no-health" in flags:
                    time.sleep(3600)
                self._send(200, b"")
            elif self.path == "/metrics":
                running = 1 if state in ("busy", "stuck") else 0
                if state == "busy":
                    counter[0] += 1
                text = (f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}.0\n'
                        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
                        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} '
                        f"{counter[0]}.0\n"
                        'vllm:generation_tokens_created{engine="0",model_name="m"} '
                        f"{time.time()}\n"
                        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n')
                self._send(200, text.encode(), "text/plain")
            elif state == "ok":
                self._send(200, json.dumps({"fake": True}).encode())
            else:
                time.sleep(3600)  # frozen, busy, stuck: the request never answers

        do_GET = do_POST = _handle

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143 - 128))  # like vLLM: exits on SIGTERM
    server.serve_forever()


if __name__ == "__main__":
    main()
