"""What the services' HTTP servers share: a JSON handler (one log line per request, bodies bounded) and serving
until SIGTERM."""

from __future__ import annotations

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_REQUEST_BYTES = 1 << 20


class TooLarge(ValueError):
    """A request body over MAX_REQUEST_BYTES."""


class JsonHandler(BaseHTTPRequestHandler):
    name = "service"  # the log lines' prefix

    def log_message(self, format, *args) -> None:  # one line per request on stderr, never a body
        sys.stderr.write(f"{self.name}: {self.command} {self.path} {args[1] if len(args) > 1 else ''}\n")

    def send(self, code: int, body: dict | str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> dict:
        """The request's JSON object; TooLarge over the bound, ValueError for anything but a JSON object."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            raise TooLarge(f"request of {length} bytes is over the limit of {MAX_REQUEST_BYTES}")
        request = json.loads(self.rfile.read(length) or b"{}")
        if not isinstance(request, dict):
            raise ValueError("not a JSON object")
        return request


def threaded_server(host: str, port: int, handler: type) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_until_stopped(server: ThreadingHTTPServer) -> int:
    """Serve until SIGTERM or Ctrl-C, then close; exit code 0."""
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
