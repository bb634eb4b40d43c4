"""``405 Method Not Allowed`` replies that list every method the path allows (the router
answers for the first route whose path matches, which may hold only some of them)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class AllowHeader:
    """ASGI middleware that rewrites the ``Allow`` header of 405 replies for ``app``'s routes."""

    def __init__(self, inner: ASGIApp, app: FastAPI) -> None:
        self.inner = inner
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return

        async def send_fixed(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                allowed = ", ".join(sorted(self._allowed(scope)))
                headers = [(k, v) for k, v in message["headers"] if k.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", allowed.encode())]}
            await send(message)

        await self.inner(scope, receive, send_fixed)

    def _allowed(self, scope: Scope) -> set[str]:
        methods: set[str] = set()
        for route in self.app.router.routes:
            if isinstance(route, Route) and route.methods:
                match, _ = route.matches({**scope, "method": next(iter(route.methods))})
                if match == Match.FULL:
                    methods |= route.methods
        return methods
