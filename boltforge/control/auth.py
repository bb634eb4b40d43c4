"""API tokens and roles: who is calling, and what they may do.

Roles: ``admin`` (everything), ``member`` of one team (submits and cancels that team's jobs,
sees other teams' work only in aggregate), ``viewer`` (reads everything, changes nothing) and
``agent`` (the node protocol only). Tokens are stored as SHA-256 digests; a token may expire
(``expires_at``) and an admin may revoke it, after which it is refused.

An agent token acts only for its own nodes (as the Kubernetes NodeRestriction admission
plugin lets a kubelet change only its own Node):

- bound by the admin (``bolt token create NAME --role agent --node host-3``, or patterns
  such as ``--node 'host-*'``): it may register, heartbeat, read the desired state of and
  report for the nodes whose names match, and no other. ``--node '*'`` is a fleet-wide
  token for a bridge (Slurm, Kubernetes) that speaks for every node;
- unbound (``bolt server --agent-token``, or ``bolt token create NAME --role agent`` without
  ``--node``): it claims each node it is the first to act for, and then acts for the nodes it
  claimed only. A node another live token claimed is refused to it. Revoking a token frees
  its claims.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from boltforge.control.store import ahead
from boltforge.control.store.models import CounterRow, NodeClaimRow, TokenRow

ROLES = ("admin", "member", "viewer", "agent")
EVERY_NODE = "*"
GENERATION = "tokens"  # the counter that grows at every revocation, and when a node changes token


@dataclass(frozen=True, slots=True)
class NodeScope:
    """The nodes an agent token may act for: those matching ``patterns`` (names or
    ``fnmatch`` globs the admin bound it to; ``*``: every node) and those it ``claimed``.
    ``claims``: whether it claims a node on first use (a token bound to no pattern)."""

    patterns: tuple[str, ...] = ()
    claimed: AbstractSet[str] = frozenset()
    claims: bool = False

    @property
    def everywhere(self) -> bool:
        return EVERY_NODE in self.patterns

    def allows(self, node: str) -> bool:
        """Whether the token may act for ``node`` as far as this scope knows."""
        if node in self.claimed or self.everywhere:
            return True
        return any(fnmatchcase(node, p) for p in self.patterns)

    def bound_to(self, node: str) -> bool:
        """Whether the admin bound the token to ``node`` (by name or pattern)."""
        return any(fnmatchcase(node, p) for p in self.patterns)

    def select(self, nodes: Iterable[str]) -> list[str]:
        """The names in ``nodes`` the token may act for, in order."""
        return list(nodes) if self.everywhere else [n for n in nodes if self.allows(n)]

    def growing(self, more: Iterable[str] = ()) -> NodeScope:
        """This scope with ``more`` claimed, in a claimed set of its own, which its holder
        may add claims to in place (``control/tokencache.py``): a fleet's claims are then
        recorded one node at a time, never by copying every claim before it."""
        return NodeScope(self.patterns, {*self.claimed, *more}, self.claims)


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller of one request, and where it came from. ``token_id``,
    ``expires_at`` and ``nodes`` (an agent token's scope; None: not limited to nodes) come
    from the token and take no part in comparisons."""

    name: str
    role: str
    team: str | None = None
    source: str = ""
    token_id: int | None = field(default=None, compare=False)
    expires_at: float | None = field(default=None, compare=False)
    nodes: NodeScope | None = field(default=None, compare=False)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def sees_team(self, team: str) -> bool:
        """Whether this caller may see a job of ``team`` in detail."""
        return self.role in ("admin", "viewer") or (self.role == "member" and self.team == team)

    def acts_for_team(self, team: str) -> bool:
        """Whether this caller may submit or cancel a job of ``team``."""
        return self.role == "admin" or (self.role == "member" and self.team == team)

    def acts_for_node(self, node: str) -> bool:
        """Whether this caller may speak for ``node`` in the agent protocol, as far as its
        remembered scope knows (admins: every node; agents: their scope; others: none)."""
        if self.role == "admin":
            return True
        return self.role == "agent" and self.nodes is not None and self.nodes.allows(node)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class TokenProblem(Exception):
    """A token reference that cannot be acted on; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (``bf_`` and 32 URL-safe characters)."""
    return "bf_" + secrets.token_urlsafe(24)


def create_token(
    s: Session, name: str, role: str, team: str | None, at: float, token: str | None = None
) -> str:
    """Store a token for ``name`` with ``role`` (and ``team`` for members) that works until
    revoked (an agent's claims nodes on first use); return it."""
    return add_token(s, name, role, team, at, token)[0]


def add_token(
    s: Session,
    name: str,
    role: str,
    team: str | None,
    at: float,
    token: str | None = None,
    nodes: Sequence[str] | None = None,
    expires_at: float | None = None,
) -> tuple[str, TokenRow]:
    """Store a token for ``name`` with ``role`` (and ``team`` for members), bound to ``nodes``
    (agents only; None: it claims nodes on first use) and working until ``expires_at``
    (None: until revoked); return it and its row (flushed: its ``id`` is set)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    if nodes is not None and role != "agent":
        raise ValueError(f"only agent tokens are bound to nodes, not {role} tokens")
    value = token or new_token()
    row = TokenRow(
        name=name,
        role=role,
        team=team,
        digest=digest(value),
        created_at=at,
        nodes=list(nodes) if nodes is not None else None,
        expires_at=expires_at,
    )
    s.add(row)
    s.flush()
    return value, row


def state_of(row: TokenRow, now: float) -> str:
    """``active``, ``expired`` or ``revoked``."""
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and now >= row.expires_at:
        return "expired"
    return "active"


def load(s: Session, token_digest: str, now: float) -> Caller | str:
    """The caller whose token has ``token_digest``, or why there is none: ``unknown``,
    ``revoked`` or ``expired``."""
    row = s.scalar(select(TokenRow).where(TokenRow.digest == token_digest))
    if row is None:
        return "unknown"
    state = state_of(row, now)
    return caller_of(s, row) if state == "active" else state


def caller_of(s: Session, row: TokenRow) -> Caller:
    """The caller ``row`` names, with its scope of nodes (claims read from the store)."""
    scope = None
    if row.role == "agent":
        claims = row.nodes is None
        claimed = frozenset(
            s.scalars(select(NodeClaimRow.node).where(NodeClaimRow.token_id == row.id))
        )
        scope = NodeScope(tuple(row.nodes or ()), claimed, claims)
    return Caller(row.name, row.role, row.team, "", row.id, row.expires_at, scope)


def lookup(s: Session, token: str, now: float = 0.0) -> Caller | None:
    """The caller a token belongs to, or None for an unknown, revoked or expired token."""
    found = load(s, digest(token), now)
    return found if isinstance(found, Caller) else None


def generation(s: Session) -> int:
    """The tokens' change counter: it grows at every revocation and whenever a node is taken
    from one token by another, so a server that sees it move forgets the callers it
    remembers."""
    value = s.scalar(select(CounterRow.value).where(CounterRow.name == GENERATION))
    return int(value or 0)


def bump(s: Session) -> None:
    """Grow the change counter (in ``s``'s transaction), making it at its first change (a
    store is not seeded with it, so that a new store stays empty of data)."""
    if _grow(s):
        return
    try:
        with s.begin_nested():  # another server may make it at the same moment
            s.add(CounterRow(name=GENERATION, value=1))
    except IntegrityError:
        _grow(s)


def _grow(s: Session) -> bool:
    grown = s.execute(
        update(CounterRow)
        .where(CounterRow.name == GENERATION)
        .values(value=CounterRow.value + 1)
        .returning(CounterRow.value)
    ).first()
    return grown is not None


def claim(s: Session, who: Caller, node: str, at: float, registering: bool) -> Claimed:
    """Let agent token ``who`` act for ``node``, recording its claim where that is how it is
    bound: whether it may (else the reason, a sentence with its fix), and whether the node
    was taken from another token.

    A token bound by name or pattern may act for matching nodes; registering one records the
    claim, so that no claiming token takes the node. A claiming token may act for a node no
    live token claimed, or that it claimed itself."""
    scope = who.nodes
    if who.role == "admin" or scope is None:
        return Claimed(None if who.role == "admin" else f"a {who.role} token acts for no node")
    if scope.bound_to(node):
        return Claimed(None, registering and _record(s, node, who, at))
    if not scope.claims:
        return Claimed(
            f"token {who.name} is bound to {', '.join(scope.patterns)}, not node {node}. "
            f"To fix: use the node's own token, or bind one with "
            f"`bolt token create NAME --role agent --node {node}`"
        )
    held = ahead.get(s, NodeClaimRow, node)
    if held is not None and held.token_id != who.token_id:
        holder = s.get(TokenRow, held.token_id)
        if holder is not None and state_of(holder, at) == "active":
            return Claimed(
                f"node {node} belongs to token {holder.name} (id {holder.id}). To fix: use "
                f"that token, or revoke it (`bolt token revoke {holder.id}`) first"
            )
    return Claimed(None, _record(s, node, who, at))


CLAIMING = "claim\x00"  # a batch read key: a node a token may claim


def claiming(node: str) -> str:
    """The batch read key of a claim of ``node`` (``read_claims``)."""
    return CLAIMING + node


def read_claims(s: Session, keys: Iterable[str]) -> None:
    """Read the claims of the nodes named by ``keys`` (``claiming``) in one statement, so
    that ``claim`` asks the store nothing more for them in this transaction."""
    ahead.read(s, NodeClaimRow, NodeClaimRow.node, (k[len(CLAIMING) :] for k in keys))


@dataclass(frozen=True, slots=True)
class Claimed:
    """What ``claim`` found: why the token may not act for the node (None: it may), and
    whether the node was taken from another token (whose remembered scope is then stale)."""

    refused: str | None
    moved: bool = False


def _record(s: Session, node: str, who: Caller, at: float) -> bool:
    """Record that ``node`` belongs to ``who``; whether it belonged to another token (then
    the change counter moves, so that every server forgets that token's scope)."""
    assert who.token_id is not None
    held = ahead.get(s, NodeClaimRow, node)
    if held is None:
        row = NodeClaimRow(node=node, token_id=who.token_id, at=at)
        s.add(row)
        ahead.added(s, NodeClaimRow, node, row)
        return False
    if held.token_id == who.token_id:
        return False
    held.token_id, held.at = who.token_id, at
    bump(s)
    return True


def find(s: Session, ref: str) -> TokenRow:
    """The token ``ref`` names: its id (all digits), else its name, which must then name one
    token that is not revoked. Raises ``TokenProblem`` (404, or 409 for an ambiguous name)."""
    if ref.isdigit():
        row = s.get(TokenRow, int(ref))
        if row is None:
            raise TokenProblem(404, f"no token with id {ref}. To fix: see `bolt token list`")
        return row
    rows = list(s.scalars(select(TokenRow).where(TokenRow.name == ref).order_by(TokenRow.id)))
    live = [r for r in rows if r.revoked_at is None] or rows[-1:]
    if not live:
        raise TokenProblem(404, f"no token named {ref}. To fix: see `bolt token list`")
    if len(live) > 1:
        ids = ", ".join(str(r.id) for r in live)
        raise TokenProblem(
            409,
            f"{len(live)} tokens are named {ref} (ids {ids}). To fix: revoke one by its id",
        )
    return live[0]


def revoke(s: Session, row: TokenRow, at: float) -> bool:
    """Revoke ``row`` (its claims are freed); False when it already was. Refuses (409) to
    revoke the last admin token that still works, which would lock every admin out."""
    if row.revoked_at is not None:
        return False
    if row.role == "admin" and state_of(row, at) == "active":
        admins = s.scalars(select(TokenRow).where(TokenRow.role == "admin", TokenRow.id != row.id))
        if not any(state_of(a, at) == "active" for a in admins):
            raise TokenProblem(
                409,
                f"token {row.name} (id {row.id}) is the last working admin token. To fix: "
                "create another admin token first",
            )
    row.revoked_at = at
    for held in s.scalars(select(NodeClaimRow).where(NodeClaimRow.token_id == row.id)):
        s.delete(held)
    bump(s)
    return True


def claimed_by(s: Session) -> dict[int, list[str]]:
    """Every token's claimed nodes, by token id."""
    out: dict[int, list[str]] = {}
    for node, token_id in s.execute(
        select(NodeClaimRow.node, NodeClaimRow.token_id).order_by(NodeClaimRow.node)
    ):
        out.setdefault(token_id, []).append(node)
    return out
