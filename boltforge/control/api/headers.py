"""Reading request headers straight from the ASGI scope, and compressing only for clients
that ask for it.

Starlette's ``Headers`` is built per use and its ``get`` raises and catches a ``KeyError``
for each absent header; on the hottest routes that costs more than the work itself.
"""

from __future__ import annotations

from starlette.middleware.gzip import GZipMiddleware
from starlette.types import Receive, Scope, Send


def raw_header(scope: Scope, name: bytes) -> bytes | None:
    """The value of header ``name`` (lower case, as ASGI servers hand them over), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def header(scope: Scope, name: bytes) -> str | None:
    """``raw_header`` as text (HTTP headers are Latin-1)."""
    value = raw_header(scope, name)
    return value.decode("latin-1") if value is not None else None


class AskedGZip(GZipMiddleware):
    """``GZipMiddleware`` for the requests whose ``Accept-Encoding`` names gzip; every other
    request goes straight to the app (nothing of its reply would change)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and b"gzip" in (raw_header(scope, b"accept-encoding") or b""):
            await super().__call__(scope, receive, send)
        else:
            await self.app(scope, receive, send)
