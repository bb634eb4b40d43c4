"""API tokens and roles: who is calling, and what they may do.

Roles: ``admin`` (everything), ``member`` of one team (submits and cancels that team's jobs,
sees other teams' work only in aggregate), ``viewer`` (reads everything, changes nothing) and
``agent`` (the node protocol only). Tokens are stored as SHA-256 digests.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.store.models import TokenRow

ROLES = ("admin", "member", "viewer", "agent")


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller of one request, and where it came from."""

    name: str
    role: str
    team: str | None = None
    source: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def sees_team(self, team: str) -> bool:
        """Whether this caller may see a job of ``team`` in detail."""
        return self.role in ("admin", "viewer") or (self.role == "member" and self.team == team)

    def acts_for_team(self, team: str) -> bool:
        """Whether this caller may submit or cancel a job of ``team``."""
        return self.role == "admin" or (self.role == "member" and self.team == team)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (``bf_`` and 32 URL-safe characters)."""
    return "bf_" + secrets.token_urlsafe(24)


def create_token(
    s: Session, name: str, role: str, team: str | None, at: float, token: str | None = None
) -> str:
    """Store a token for ``name`` with ``role`` (and ``team`` for members); return it."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; known: {', '.join(ROLES)}")
    value = token or new_token()
    s.add(TokenRow(name=name, role=role, team=team, digest=digest(value), created_at=at))
    return value


def lookup(s: Session, token: str) -> Caller | None:
    """The caller a token belongs to, or None for an unknown token."""
    row = s.scalar(select(TokenRow).where(TokenRow.digest == digest(token)))
    return None if row is None else Caller(row.name, row.role, row.team)
