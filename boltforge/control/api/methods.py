"""``405 Method Not Allowed`` replies that list every method the path allows (the router
answers for the first route whose path matches, which may hold only some of them)."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import Scope

METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The ``Allow`` header for a request (``scope``) whose path matches some of ``routes``
    but not with its method: each method with which some route matches the path fully
    (routers included into the app are asked like any route)."""
    return ", ".join(
        method
        for method in METHODS
        if any(r.matches({**scope, "method": method})[0] == Match.FULL for r in routes)
    )
