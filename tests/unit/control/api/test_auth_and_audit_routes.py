"""Tokens, roles and the audit log over the API: how the ``Authorization`` header is read,
what each role may call, making tokens (and every way to get that wrong), who-am-I, and
what the audit log records of each change (who, role, action, target, source, detail)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_builders import audit_rows, bearer, get_json, make_token, problem_of, refusal
from control_kit import ADMIN, AGENT, Fleet
from sqlalchemy import func, select

from boltforge.control.audit import audit
from boltforge.control.auth import Caller, digest
from boltforge.control.store.db import Database
from boltforge.control.store.models import AuditRow, TokenRow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("auth"), hosts=1) as f:
        yield f


def token_rows(fleet: Fleet, name: str) -> int:
    with fleet.rt.db.session() as s:
        return int(s.scalar(select(func.count()).where(TokenRow.name == name)) or 0)


# -- reading the Authorization header --------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["Bearer adm", "bearer adm", "BEARER adm", "Bearer   adm  "],
    ids=["canonical", "lower-scheme", "upper-scheme", "padded"],
)
def test_a_bearer_token_is_read_whatever_the_schemes_case_and_padding(
    fleet: Fleet, value: str
) -> None:
    r = fleet.http.get("/v1/whoami", headers={"Authorization": value})
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "admin", "role": "admin", "team": None}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer   "},
        {"Authorization": "Basic adm"},
    ],
    ids=["none", "scheme-only", "blank-token", "basic-scheme"],
)
def test_a_missing_token_is_a_401_telling_how_to_send_one(
    fleet: Fleet, headers: dict[str, str]
) -> None:
    r = fleet.http.get("/v1/whoami", headers=headers)
    refusal(r, 401, "no API token", "To fix: send `Authorization: Bearer <token>`", "BOLT_TOKEN")


def test_an_unknown_token_is_a_401_telling_whom_to_ask(fleet: Fleet) -> None:
    r = fleet.http.get("/v1/whoami", headers=bearer("bf_never_issued"))
    refusal(r, 401, "unknown API token", "To fix: ask an admin for a token")


def test_a_token_is_remembered_after_its_first_use(fleet: Fleet) -> None:
    headers = make_token(fleet, "memo", "viewer")
    value = headers["Authorization"].split()[1]
    assert fleet.rt.known_caller(value) is None  # not looked up yet
    assert get_json(fleet, "/v1/whoami", headers)["name"] == "memo"
    assert fleet.rt.known_caller(value) == Caller("memo", "viewer", None)


# -- roles -----------------------------------------------------------------------------------

# (method, path, body): calls only an admin may make
ADMIN_ONLY = [
    ("POST", "/v1/tokens", {"name": "x", "role": "viewer"}),
    ("GET", "/v1/audit", None),
    ("POST", "/v1/nodes/host-0/cordon", None),
    ("POST", "/v1/nodes/host-0/drain", None),
    ("POST", "/v1/nodes/host-0/uncordon", None),
    ("POST", "/v1/nodes/host-0/reclaim", {"in_s": 60}),
]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_ONLY, ids=lambda v: str(v))
@pytest.mark.parametrize("role", ["member", "viewer", "agent"])
def test_admin_calls_are_refused_to_every_other_role_naming_the_role_needed(
    fleet: Fleet, role: str, method: str, path: str, body: Any
) -> None:
    team = "nlp" if role == "member" else None
    headers = AGENT if role == "agent" else make_token(fleet, f"r-{role}", role, team)
    before = len(audit_rows(fleet))
    r = fleet.http.request(method, path, json=body, headers=headers)
    refusal(r, 403, f"role {role} may not do this (needs admin)", "To fix: use a token")
    assert len(audit_rows(fleet)) == before  # a refused change leaves no record
    [node] = get_json(fleet, "/v1/nodes")["nodes"]
    assert (node["state"], node["reclaim_at"]) == ("ready", None)  # nothing was changed


@pytest.mark.parametrize("path", ["/v1/whoami", "/v1/jobs", "/v1/nodes", "/v1/fleet", "/v1/cost"])
def test_an_agent_token_reads_nothing_meant_for_people(fleet: Fleet, path: str) -> None:
    refusal(
        fleet.http.get(path, headers=AGENT), 403, "role agent", "needs admin or member or viewer"
    )


@pytest.mark.parametrize(("role", "team"), [("member", "nlp"), ("viewer", None), ("admin", None)])
def test_whoami_names_the_tokens_holder_role_and_team(
    fleet: Fleet, role: str, team: str | None
) -> None:
    headers = make_token(fleet, f"who-{role}", role, team)
    assert get_json(fleet, "/v1/whoami", headers) == {
        "name": f"who-{role}",
        "role": role,
        "team": team,
    }


# -- making tokens ---------------------------------------------------------------------------


def test_a_new_token_is_shown_once_stored_as_a_digest_and_audited(fleet: Fleet) -> None:
    r = fleet.post("/v1/tokens", {"name": "ci-bot", "role": "member", "team": "nlp"})
    assert r.status_code == 201, r.text
    reply = r.json()
    assert (reply["name"], reply["role"], reply["team"]) == ("ci-bot", "member", "nlp")
    value = reply["token"]
    assert value.startswith("bf_")
    with fleet.rt.db.session() as s:
        row = s.scalar(select(TokenRow).where(TokenRow.name == "ci-bot"))
        assert row is not None and row.digest == digest(value) and row.created_at == fleet.clock()
    [entry] = [a for a in audit_rows(fleet, "create-token") if a.target == "ci-bot"]
    assert (entry.who, entry.role, entry.source) == ("admin", "admin", "testclient")
    assert entry.detail == {"role": "member", "team": "nlp"}
    assert value not in str([a.detail for a in audit_rows(fleet)])  # never in the log
    assert get_json(fleet, "/v1/whoami", bearer(value))["team"] == "nlp"


def test_two_tokens_for_one_name_both_work(fleet: Fleet) -> None:
    first = make_token(fleet, "rotating", "viewer")
    second = make_token(fleet, "rotating", "viewer")
    assert first != second
    assert token_rows(fleet, "rotating") == 2
    for headers in (first, second):
        assert get_json(fleet, "/v1/whoami", headers)["name"] == "rotating"


def test_a_member_token_without_a_team_is_refused_and_nothing_is_stored(fleet: Fleet) -> None:
    r = fleet.post("/v1/tokens", {"name": "teamless", "role": "member"})
    body = refusal(r, 422, "a member token needs a team", "To fix: add `team`")
    assert body["problems"] == []
    assert token_rows(fleet, "teamless") == 0
    assert all(a.target != "teamless" for a in audit_rows(fleet))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "a b", "role": "viewer"}, "name"),
        ({"name": "-leading", "role": "viewer"}, "name"),
        ({"name": "n" * 64, "role": "viewer"}, "name"),
        ({"name": "x", "role": "root"}, "role"),
        ({"name": "x", "role": "member", "team": "NLP"}, "team"),
        ({"name": "x", "role": "viewer", "scope": "all"}, "scope"),
        ({"role": "viewer"}, "name"),
        ({"name": 7, "role": "viewer"}, "name"),
    ],
    ids=[
        "space",
        "leading-dash",
        "too-long",
        "unknown-role",
        "team-case",
        "extra",
        "no-name",
        "number",
    ],
)
def test_a_bad_token_request_names_its_field_and_stores_nothing(
    fleet: Fleet, body: dict[str, Any], field: str
) -> None:
    with fleet.rt.db.session() as s:
        before = s.scalar(select(func.count()).select_from(TokenRow))
    problem = problem_of(fleet.post("/v1/tokens", body))
    assert problem["field"] == field
    with fleet.rt.db.session() as s:
        assert s.scalar(select(func.count()).select_from(TokenRow)) == before


# -- the audit log ---------------------------------------------------------------------------


def test_the_audit_log_is_newest_first_and_limited(fleet: Fleet) -> None:
    for i in range(3):
        make_token(fleet, f"order-{i}", "viewer")
    log = get_json(fleet, "/v1/audit?limit=3")
    assert [e["target"] for e in log] == ["order-2", "order-1", "order-0"]
    assert set(log[0]) == {"at", "who", "role", "action", "target", "source", "detail"}
    assert len(get_json(fleet, "/v1/audit")) <= 100
    assert problem_of(fleet.http.get("/v1/audit?limit=0", headers=ADMIN))["field"] == "query.limit"


def test_node_registrations_are_audited_as_the_agents(fleet: Fleet) -> None:
    [entry] = [a for a in audit_rows(fleet, "register") if a.target == "host-0"][:1]
    assert (entry.who, entry.role) == ("agents", "agent")
    assert entry.detail == {"gpus": 8, "pool": "h100"}


def test_an_audit_record_keeps_at_most_100_characters_of_source(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'audit.db'}")
    db.migrate()
    caller = Caller("ops", "admin", None, "10.0.0.1," + "x" * 200)
    with db.session() as s:
        audit(s, caller, "drain", "host-9", 12.5, reason="maintenance", hosts=["a"])
    with db.session() as s:
        [row] = s.scalars(select(AuditRow))
        assert (row.who, row.role, row.action, row.target, row.at) == (
            "ops",
            "admin",
            "drain",
            "host-9",
            12.5,
        )
        assert row.source == caller.source[:100] and len(row.source) == 100
        assert row.detail == {"reason": "maintenance", "hosts": ["a"]}
    db.close()
