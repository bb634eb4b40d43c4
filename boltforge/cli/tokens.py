"""``bolt token create | list | revoke``: API tokens for people and agents (admins only)."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from boltforge.cli.common import EXIT_BAD_INPUT, console, print_json
from boltforge.cli.remote import (
    CaOpt,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    api_errors,
    cell,
    connect,
    fail,
    span,
)
from boltforge.spec import units
from boltforge.wire.jobs import TokenOut, TokenReply, TokenRequest

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
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            "--nodes",
            help="Agents: the node(s) it may act for, by name or glob (host-3, 'host-*'; "
            "repeat or comma-separate; '*': every node, for a Slurm or Kubernetes bridge). "
            "Without it, an agent token claims each node it is the first to act for.",
            show_default=False,
        ),
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            help="It stops working after this long: 90m, 12h, 30d (default: when revoked).",
            show_default=False,
        ),
    ] = None,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Create a token. It is shown once: hand it over now (as BOLT_TOKEN)."""
    if role == TokenRole.member and not team:
        fail("a member token needs a team. To fix: add --team T", EXIT_BAD_INPUT)
    nodes = _nodes(node)
    if nodes is not None and role != TokenRole.agent:
        fail(
            f"--node binds agent tokens only, not {role.value} tokens. To fix: drop --node, "
            "or add --role agent",
            EXIT_BAD_INPUT,
        )
    req = _request(name, role, team, nodes, _expiry(expires))
    with connect(server, token) as client, api_errors("token"):
        reply = client.create_token(req)
    if json:
        print_json(reply.model_dump(mode="json"))
        return
    console.print(_made(reply), highlight=False)
    console.print(reply.token, markup=False, highlight=False)


def _nodes(given: list[str] | None) -> list[str] | None:
    """The node names and patterns of repeated or comma-separated ``--node`` values."""
    if not given:
        return None
    return [n.strip() for value in given for n in value.split(",") if n.strip()] or None


def _expiry(text: str | None) -> float | None:
    """``--expires`` in seconds, or exit 2 saying what is accepted."""
    if text is None:
        return None
    try:
        seconds = units.seconds(text)
    except ValueError as e:
        fail(f"--expires {text!r}: {e}. To fix: e.g. --expires 30d", EXIT_BAD_INPUT)
    if seconds <= 0:
        fail(f"--expires {text!r}: must be more than 0. To fix: e.g. --expires 30d", 2)
    return seconds


def _request(
    name: str,
    role: TokenRole,
    team: str | None,
    nodes: list[str] | None,
    expires_in_s: float | None,
) -> TokenRequest:
    """The request, or exit 2 naming the field that is wrong and how to put it right."""
    try:
        return TokenRequest(
            name=name, role=role.value, team=team, nodes=nodes, expires_in_s=expires_in_s
        )
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = str(first["loc"][0]) if first["loc"] else "token"
        fixes = {
            "team": "lower-case letters, digits and _.- (e.g. `nlp`)",
            "nodes": "node names or globs of letters, digits, _.- and *?[]! (e.g. `host-*`)",
            "expires_in_s": "at most 3650d (e.g. --expires 30d)",
        }
        fix = fixes.get(where, "letters, digits and _.@- (e.g. `alice`)")
        option = {"nodes": "node", "expires_in_s": "expires"}.get(where, where)
        fail(f"{option}: {first['msg']} (got {first['input']!r}). To fix: {fix}", 2)


def _made(reply: TokenReply) -> str:
    """What the new token is, before its secret: role, owner, team, nodes, expiry."""
    parts = [f"{reply.role} token for {reply.name}"]
    if reply.team:
        parts.append(f"for team {reply.team}")
    if reply.role == "agent":
        parts.append(_binding(reply.nodes))
    if reply.expires_at is not None:
        parts.append(f"expires in {span(reply.expires_at - time.time())}")
    return " ".join(parts) + " (shown once):"


def _binding(nodes: list[str] | None) -> str:
    if nodes is None:
        return "that claims each node it is the first to act for"
    return "for every node" if "*" in nodes else "for node " + ", ".join(nodes)


@token_app.command("list")
def list_command(
    json: JsonOpt = False, server: ServerOpt = None, token: TokenOpt = None, ca: CaOpt = None
) -> None:
    """List the tokens: id, who, role, team, nodes, age, time left, how long since last
    used (to the minute) and state. Never a token itself (it was shown once, when made)."""
    with connect(server, token) as client, api_errors("tokens"):
        listing = client.tokens()
    if json:
        print_json(listing.model_dump(mode="json"))
        return
    if not listing.tokens:
        console.print("no tokens. To fix: `bolt token create NAME`", style="dim")
        return
    console.print(tokens_table(listing.tokens, time.time()))


COLUMNS = ("ID", "NAME", "ROLE", "TEAM", "NODES", "AGE", "EXPIRES", "USED", "STATE")


def tokens_table(tokens: list[TokenOut], now: float) -> Table:
    """One row per token. NAME and NODES give way on a narrow terminal (cut with an
    ellipsis); the short columns keep their width. AGE, EXPIRES (time left) and USED (time
    since) are spans: ``45 s``, ``12 min``, ``3.5 h``, ``30 d``."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in COLUMNS:
        gives = name in ("NAME", "NODES")
        table.add_column(name, no_wrap=not gives, justify="right" if name == "ID" else "left")
    for t in tokens:
        table.add_row(
            str(t.id),
            cell(t.name),
            t.role,
            t.team or "-",
            cell(_nodes_cell(t)),
            span(now - t.created_at),
            _expires_cell(t.expires_at, now),
            "-" if t.last_used_at is None else f"{span(now - t.last_used_at)}",
            Text(t.state, style={"active": "green", "revoked": "red"}.get(t.state, "yellow")),
        )
    return table


def _nodes_cell(t: TokenOut) -> str:
    if t.role != "agent":
        return "-"
    if t.nodes is not None:
        return "every node" if "*" in t.nodes else ",".join(t.nodes)
    return "claims: " + (",".join(t.claimed) if t.claimed else "none yet")


def _expires_cell(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    return span(at - now) if at > now else "past"


@token_app.command("revoke")
def revoke_command(
    ref: Annotated[
        str,
        typer.Argument(
            metavar="NAME-OR-ID",
            help="The token's id (see `bolt token list`), or a name only one working token has.",
            show_default=False,
        ),
    ],
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Revoke a token: it stops working within seconds on every server replica; an agent
    token's claimed nodes are freed for another token."""
    with connect(server, token) as client, api_errors("token"):
        out = client.revoke_token(ref)
    if json:
        print_json(out.model_dump(mode="json"))
        return
    console.print(
        f"token {out.id} ({out.role} {out.name}) revoked; it stops working within seconds",
        highlight=False,
    )
