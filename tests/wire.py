"""The head of an HTTP message (request or response) read off a socket, and a recording
upstream's base, for the tests' own small servers and clients."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler


def read_head(sock: socket.socket) -> bytes:
    """Everything up to and including the blank line after the headers, or what arrived
    before the peer closed."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


class RecordingUpstream(BaseHTTPRequestHandler):
    """A provider stand-in's base: HTTP/1.1, quiet, each request's path, headers and body kept in
    the subclass's ``seen``; ``chunk`` writes one piece of a chunked answer and flushes it."""

    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def log_message(self, *args: object) -> None:
        pass

    def recorded_body(self) -> bytes:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        return body

    def answer_json(self, status: int, payload: bytes, **headers: str) -> None:
        self.send_response(status)
        for k, v in {"content-type": "application/json", **headers, "content-length": str(len(payload))}.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(payload)

    def start_events(self, **headers: str) -> None:
        """A 200 event stream, chunked: its pieces follow by ``chunk``."""
        self.send_response(200)
        for k, v in {"content-type": "text/event-stream", **headers, "transfer-encoding": "chunked"}.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
