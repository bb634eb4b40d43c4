"""Security headers on every reply of the API and the console.

* ``Content-Security-Policy``: the console's code, styles and data come from the server
  itself only (``default-src 'self'``); images may also be ``data:`` and ``blob:`` URLs (the
  console shows report plots it downloaded with the user's token as blobs); no plugins, no
  ``<base>``, forms post only here, and no page may frame it (``frame-ancestors 'none'``,
  with ``X-Frame-Options: DENY`` for browsers that predate it).
* ``X-Content-Type-Options: nosniff``: a reply is read as the type it says (a job's log or
  artifact is never run as a script).
* ``Referrer-Policy: no-referrer``: a link out of the console does not carry its address.

A header the application set itself is kept as it is.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeaders:
    """ASGI middleware adding ``HEADERS`` to every HTTP reply of ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {bytes(k).lower() for k, _ in headers}
                headers += [(k, v) for k, v in HEADERS if k not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
