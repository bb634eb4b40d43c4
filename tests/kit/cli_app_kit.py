"""The ``bolt`` command against the real server app in-process, with no socket: while
``serve_cli`` is in force, every ``Client`` the command builds (``remote.connect``) sends its
requests to a ``control_kit.Fleet``'s app, carrying the token the command resolved. What
runs is the real command, the real client and the real server; only the wire is short."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import pytest
from control_kit import Fleet
from starlette.testclient import TestClient
from typer.testing import Result

import boltforge.cli.remote as remote
from boltforge.client import Client

BASE = "http://testserver"
HOP_BY_HOP = ("content-encoding", "content-length", "transfer-encoding")


class AppTransport(httpx.BaseTransport):
    """Hands each request to the app through ``http`` (the fleet's test client, whose event
    loop the app's lifespan runs on) and gives back its answer, already decoded."""

    def __init__(self, http: TestClient) -> None:
        self.http = http

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = self.http.request(
            request.method,
            request.url.raw_path.decode(),
            headers=dict(request.headers),
            content=request.read(),
        )
        headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP}
        return httpx.Response(r.status_code, headers=headers, content=r.content)


@dataclass
class Connections:
    """Every (server, token) a command connected with, in order."""

    made: list[tuple[str, str | None]] = field(default_factory=list)


def app_client(fleet: Fleet, token: str | None, server: str = BASE) -> Client:
    """A real ``Client`` for ``server`` with ``token`` whose requests go to ``fleet``'s app."""
    made = Client(server, token)
    made.http.close()
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    made.http = httpx.Client(transport=AppTransport(fleet.http), base_url=BASE, headers=auth)
    return made


def serve_cli(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Connections:
    """Make the CLI's clients talk to ``fleet``'s app (undone with ``monkeypatch``)."""
    seen = Connections()

    def client(server: str, token: str | None, timeout: float = 30.0, ca: object = None) -> Client:
        seen.made.append((server, token))
        return app_client(fleet, token, server)

    monkeypatch.setattr(remote, "Client", client)
    return seen


def clean_exit(result: Result, code: int) -> None:
    """The command exited with ``code`` on its own (a ``typer.Exit``, never an exception) and
    printed no traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def fits(text: str, width: int) -> bool:
    """Whether every line of ``text`` fits ``width`` columns."""
    return all(len(line) <= width for line in text.splitlines())
