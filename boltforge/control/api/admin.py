"""Tokens, identity and the audit log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from boltforge.control.api.deps import Admins, People, Rt
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.audit import audit
from boltforge.control.auth import create_token
from boltforge.control.store.models import AuditRow
from boltforge.wire.jobs import TokenReply, TokenRequest, WhoAmI

router = APIRouter(prefix="/v1", tags=["admin"], responses=ERRORS)


@router.post("/tokens", status_code=201)
def new_token(req: TokenRequest, who: Admins, rt: Rt) -> TokenReply:
    """Create a token (shown once). Members need a team."""
    if req.role == "member" and not req.team:
        raise ApiError(422, "a member token needs a team. To fix: add `team`")
    now = rt.clock()
    with rt.db.session() as s:
        token = create_token(s, req.name, req.role, req.team, now)
        audit(s, who, "create-token", req.name, now, role=req.role, team=req.team)
    return TokenReply(name=req.name, role=req.role, team=req.team, token=token)


@router.get("/whoami")
def whoami(who: People) -> WhoAmI:
    return WhoAmI(name=who.name, role=who.role, team=who.team)


@router.get("/audit")
def audit_log(
    who: Admins, rt: Rt, limit: Annotated[int, Query(ge=1, le=10_000)] = 100
) -> list[dict[str, Any]]:
    """The newest audit entries first."""
    with rt.db.session() as s:
        rows = s.scalars(select(AuditRow).order_by(AuditRow.id.desc()).limit(limit))
        return [
            {
                "at": r.at,
                "who": r.who,
                "role": r.role,
                "action": r.action,
                "target": r.target,
                "source": r.source,
                "detail": r.detail,
            }
            for r in rows
        ]
