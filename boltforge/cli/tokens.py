"""``bolt token create``: API tokens for people and agents (admins only)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from pydantic import ValidationError

from boltforge.cli.common import EXIT_BAD_INPUT, console, print_json
from boltforge.cli.remote import CaOpt, JsonOpt, ServerOpt, TokenOpt, api_errors, connect, fail
from boltforge.wire.jobs import TokenRequest

token_app = typer.Typer(help="API tokens (admins).", no_args_is_help=True)


class TokenRole(StrEnum):
    admin = "admin"
    member = "member"
    viewer = "viewer"
    agent = "agent"


@token_app.command("create")
def create_command(
    name: Annotated[str, typer.Argument(help="Who it is for, e.g. alice.", show_default=False)],
    role: Annotated[
        TokenRole,
        typer.Option(help="member: submits for one team; viewer: reads; agent: a node."),
    ] = TokenRole.member,
    team: Annotated[str | None, typer.Option(help="The member's team (members need one).")] = None,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Create a token. It is shown once: hand it over now (as BOLT_TOKEN)."""
    if role == TokenRole.member and not team:
        fail("a member token needs a team. To fix: add --team T", EXIT_BAD_INPUT)
    try:
        req = TokenRequest(name=name, role=role.value, team=team)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        example = "nlp" if where == "team" else "alice"
        fail(
            f"{where}: {first['msg']} (got {first['input']!r}). To fix: lower-case letters, "
            f"digits and _.- (e.g. `{example}`)",
            2,
        )
    with connect(server, token) as client, api_errors("token"):
        reply = client.create_token(req)
    if json:
        print_json(reply.model_dump(mode="json"))
        return
    scope = f" for team {reply.team}" if reply.team else ""
    console.print(f"{reply.role} token for {reply.name}{scope} (shown once):", highlight=False)
    console.print(reply.token, markup=False, highlight=False)
