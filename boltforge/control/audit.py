"""The audit log: one row per mutating call, saying who, what, when and from where."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from boltforge.control.auth import Caller
from boltforge.control.store.models import AuditRow


def audit(s: Session, caller: Caller, action: str, target: str, at: float, **detail: Any) -> None:
    """Record ``action`` on ``target`` by ``caller`` in the caller's transaction."""
    s.add(
        AuditRow(
            at=at,
            who=caller.name,
            role=caller.role,
            action=action,
            target=target,
            source=caller.source[:100],
            detail=detail,
        )
    )
