"""A TCP relay that can be cut: one process reaches a server (PostgreSQL) through it, and
the test partitions that process from the server while everyone else still reaches it."""

from __future__ import annotations

import contextlib
import socket
import threading

from boltforge.testing.postgres import free_port


class TcpRelay:
    """Relays ``127.0.0.1:port`` to ``target_port`` until ``cut``: then every relayed
    connection is closed and new ones are refused (a partition, as the client sees it)."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.port = target_port, free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Partition: close every relayed connection and stop accepting."""
        self._cut.set()
        with contextlib.suppress(OSError):  # wakes the accept under way (close alone may not)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
