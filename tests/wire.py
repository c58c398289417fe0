"""The head of an HTTP message (request or response) read off a socket, for the tests' own
small servers and clients."""

from __future__ import annotations

import socket


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
