"""Several addresses for one control plane (its server replicas, ``docs/operations.md``):
``http://a:8080,http://b:8080``. Clients call the first that answers and stay with it; a
call that could not be delivered (refused, timed out connecting) goes to the next at once,
and a replica with no leader behind it (503) sends the next call to the next address."""

from __future__ import annotations

import httpx

CONNECT_S = 3.0  # how long a client waits to connect to one address before the next


class Addresses:
    """A list of server addresses and the one in use. Raises ``ValueError`` for a list
    with none in it."""

    def __init__(self, text: str) -> None:
        self.all = [a.strip().rstrip("/") for a in text.split(",") if a.strip()]
        if not self.all:
            raise ValueError(f"no server address in {text!r}")
        self._at = 0

    @property
    def current(self) -> str:
        return self.all[self._at]

    def advance(self) -> str:
        """Move to the next address (round the list); the new current one."""
        self._at = (self._at + 1) % len(self.all)
        return self.current

    def move_on(self, http: httpx.Client | httpx.AsyncClient) -> None:
        """Point ``http`` at the next address (nothing to do when there is only one)."""
        if len(self.all) > 1:
            http.base_url = httpx.URL(self.advance())

    def __len__(self) -> int:
        return len(self.all)
