"""A free TCP port, for every tier's servers (moto, test proxies, the real node's components)
and for a port nothing listens on: bound and released at once, so a server may take it, or a
connection to it is refused."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
