"""A TCP relay in front of the API server that misbehaves towards the client, for real: the
transfers under test go through the real API server and kwok's exec, and only the network
between them and the controller breaks."""

from __future__ import annotations

import socket
import threading
import time


class Relay:
    """``cut_after``: the first connection to carry more than that many bytes towards the client
    is closed (a transfer dropped mid-stream). ``stall_after``: past that many bytes nothing more
    is passed towards the client, while both connections stay open (a server that stops
    mid-frame)."""

    def __init__(self, target: tuple[str, int], cut_after: int | None = None, stall_after: int | None = None):
        self.target, self.cut_after, self.stall_after = target, cut_after, stall_after
        self.cuts = 0
        self.stalled = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, to_client: bool) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if to_client and self.stall_after is not None and sent + len(data) > self.stall_after:
                    dst.sendall(data[:self.stall_after - sent])
                    self.stalled.set()
                    time.sleep(3600)  # hold both connections open, pass nothing more
                dst.sendall(data)
                sent += len(data)
                if to_client and self.cut_after is not None and sent > self.cut_after and self.cuts == 0:
                    self.cuts += 1
                    break
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
