"""The Fleet Console: a web view of the fleet served by ``bolt server`` at ``/console/``.

The browser code is plain ES modules and CSS in ``static/`` with no build step and nothing
fetched from elsewhere (no CDN, no web fonts), so it works on an air-gapped cluster. The files
hold no data: every figure comes from the API with the user's token.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"


def install(app: FastAPI) -> None:
    """Serve the console at ``/console/`` and send ``/`` there."""
    app.mount("/console", StaticFiles(directory=STATIC, html=True), name="console")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/console/")
