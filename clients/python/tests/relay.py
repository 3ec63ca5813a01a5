"""A TCP relay in front of mwmq that can lose a reply: armed, it drops the
next bytes the server sends and closes both sides, as a network that fails
after a request went out (the request ran; the client never hears)."""

from __future__ import annotations

import contextlib
import socket
import threading

from mwlab.procs import free_port


class CuttingRelay:
    """Listens on `port` (127.0.0.1) and forwards to `target`."""

    def __init__(self, target: int):
        self.target = target
        self.port = free_port()
        self.cuts = 0
        self._armed = threading.Event()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._stop = False
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    def arm(self) -> None:
        """The next reply (the server's next bytes on any connection) is lost."""
        self._armed.set()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_server and self._armed.is_set():
                    self._armed.clear()
                    self.cuts += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stop = True
        self._server.close()
