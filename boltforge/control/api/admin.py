"""Tokens, identity and the audit log."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select

from boltforge.control.api.deps import Admins, People, Rt
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.audit import audit
from boltforge.control.auth import TokenProblem, add_token, claimed_by, find, revoke, state_of
from boltforge.control.store.models import AuditRow, TokenRow
from boltforge.wire.jobs import TokenList, TokenOut, TokenReply, TokenRequest, WhoAmI

router = APIRouter(prefix="/v1", tags=["admin"], responses=ERRORS)


@router.post("/tokens", status_code=201)
def new_token(req: TokenRequest, who: Admins, rt: Rt) -> TokenReply:
    """Create a token (shown once). Members need a team; only agent tokens take ``nodes``."""
    if req.role == "member" and not req.team:
        raise ApiError(422, "a member token needs a team. To fix: add `team`")
    if req.nodes is not None and req.role != "agent":
        raise ApiError(
            422, f"nodes: only agent tokens are bound to nodes. To fix: drop `nodes` ({req.role})"
        )
    now = rt.clock()
    expires_at = now + req.expires_in_s if req.expires_in_s is not None else None
    with rt.db.session() as s:
        token, row = add_token(s, req.name, req.role, req.team, now, None, req.nodes, expires_at)
        bounds = {"nodes": req.nodes, "expires_at": expires_at}
        given = {k: v for k, v in bounds.items() if v is not None}
        audit(s, who, "create-token", req.name, now, role=req.role, team=req.team, **given)
        token_id = row.id
    return TokenReply(
        name=req.name,
        role=req.role,
        team=req.team,
        token=token,
        id=token_id,
        nodes=req.nodes,
        expires_at=expires_at,
    )


@router.get("/tokens")
def tokens(who: Admins, rt: Rt) -> TokenList:
    """Every token, oldest first: who it is for, its role, team, nodes, when it was made,
    expires, was last used (to the minute) and revoked. Never a token's secret."""
    now = rt.clock()
    with rt.db.session() as s:
        claims = claimed_by(s)
        rows = s.scalars(_ALL_TOKENS)
        return TokenList(tokens=[_token_out(r, claims.get(r.id, []), now) for r in rows])


@router.post("/tokens/{ref}/revoke")
def revoke_token(ref: str, who: Admins, rt: Rt) -> TokenOut:
    """Revoke the token ``ref`` names (its id, or a name only one working token has): it
    stops working on this server at once and on every replica within the token cache's
    seconds (``ServerConfig.token_cache_s``, 5 s); an agent token's claimed nodes are freed.
    Revoking a revoked token changes nothing. 409 for the last working admin token."""
    now = rt.clock()
    try:
        with rt.db.session() as s:
            row = find(s, ref)
            if revoke(s, row, now):
                audit(s, who, "revoke-token", row.name, now, id=row.id, role=row.role)
            out = _token_out(row, [], now)
    except TokenProblem as e:
        raise ApiError(e.status, str(e)) from None
    rt.tokens.forget()
    return out


_ALL_TOKENS = select(TokenRow).order_by(TokenRow.id)


def _token_out(row: TokenRow, claimed: list[str], now: float) -> TokenOut:
    return TokenOut(
        id=row.id,
        name=row.name,
        role=row.role,
        team=row.team,
        nodes=row.nodes,
        claimed=claimed,
        created_at=row.created_at,
        expires_at=row.expires_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
        state=state_of(row, now),
    )


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
