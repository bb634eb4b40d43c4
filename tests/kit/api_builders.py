"""Small helpers for tests of the HTTP API on the real app (``control_kit.Fleet``): tokens
of each role, the checks every refusal must pass, and readers of what the store holds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from control_kit import ADMIN, Fleet
from sqlalchemy import select

from boltforge.control.store.models import AuditRow, JobRow

ALL_STATES = "pending,scheduled,running,preempting,requeued,succeeded,failed,cancelled"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def make_token(fleet: Fleet, name: str, role: str, team: str | None = None) -> dict[str, str]:
    """A fresh token for ``name`` (made by the admin), as request headers."""
    body: dict[str, Any] = {"name": name, "role": role}
    if team is not None:
        body["team"] = team
    r = fleet.post("/v1/tokens", body)
    assert r.status_code == 201, r.text
    return bearer(r.json()["token"])


def refusal(r: Any, status: int, *words: str) -> dict[str, Any]:
    """``r`` is an error reply with ``status`` whose sentence names each of ``words`` and
    ends with its fix; its body."""
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert set(body) == {"error", "problems"}, body
    for word in words:
        assert word in body["error"], (word, body["error"])
    return body


def problem_of(r: Any, status: int = 422) -> dict[str, Any]:
    """The one problem of an invalid-input reply, checked to name a field and a fix."""
    body = refusal(r, status)
    [problem] = body["problems"]
    assert problem["field"] and "To fix" in problem["message"], problem
    return dict(problem)


def job_ids(fleet: Fleet) -> set[str]:
    """Every job the store holds, in any state."""
    with fleet.rt.db.session() as s:
        return set(s.scalars(select(JobRow.id)))


def audit_rows(fleet: Fleet, action: str | None = None) -> list[AuditRow]:
    """The audit log, oldest first (only ``action``'s entries when given)."""
    with fleet.rt.db.session() as s:
        q = select(AuditRow).order_by(AuditRow.id)
        if action is not None:
            q = q.where(AuditRow.action == action)
        rows = list(s.scalars(q))
        s.expunge_all()
        return rows


class Background:
    """A call made on a thread of its own (a long-poll), its result collected by ``result``."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._out: list[Any] = []
        self._thread = threading.Thread(target=lambda: self._out.append(call()), daemon=True)
        self._thread.start()

    def result(self, timeout: float = 30.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call did not return in time"
        return self._out[0]


def get_json(fleet: Fleet, path: str, headers: dict[str, str] = ADMIN) -> Any:
    r = fleet.http.get(path, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()
