"""API tokens as a boundary: an agent token speaks only for its own nodes, a revoked token
stops working within seconds on every server replica sharing the store, an expired token is
refused, the token listing never shows a secret, and only admins revoke. Each test is one
finding of the security review (issue 46, finding 5) and failed before tokens were bound,
expiring and revocable."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from api_builders import bearer, make_token
from control_kit import ADMIN, Fleet, make_spec
from fastapi.testclient import TestClient

from boltforge.control.app import create_app
from boltforge.control.store.models import TokenRow

REVOKED_WITHIN_S = 30.0  # a bound for the poll, far above the 5 s the cache trusts a token


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Two nodes registered with the server's own (claiming) agent token, and one job on
    host-1 whose environment holds another team's secret."""
    with Fleet(tmp_path, hosts=2) as f:
        spec = make_spec("secret-job", 8, team="vision", env={"API_KEY": "vision-secret"})
        f.submit(spec)
        f.start_everything()
        yield f


def agent_token(fleet: Fleet, name: str, *nodes: str) -> dict[str, str]:
    """An agent token bound to ``nodes`` (none: one that claims nodes on first use)."""
    body: dict[str, object] = {"name": name, "role": "agent"}
    if nodes:
        body["nodes"] = list(nodes)
    r = fleet.post("/v1/tokens", body)
    assert r.status_code == 201, r.text
    return bearer(r.json()["token"])


def test_an_agent_token_reads_and_reports_only_for_its_own_node(fleet: Fleet) -> None:
    [busy] = {r.node for r in fleet.replicas()}  # the node running the other team's job
    [mine] = set(fleet.nodes) - {busy}
    own = agent_token(fleet, "own-agent", mine)
    http = fleet.http
    assert http.get(f"/v1/agents/{mine}/desired", headers=own).status_code == 200
    r = http.get(f"/v1/agents/{busy}/desired", headers=own)
    assert r.status_code == 403 and "vision-secret" not in r.text
    assert busy in r.json()["error"] and "To fix" in r.json()["error"]
    batched = http.get("/v1/agents/desired", headers=own).json()
    assert [n["node"] for n in batched["nodes"]] == [mine]
    assert "vision-secret" not in str(batched)
    session = fleet.nodes[busy].session
    beat = http.post(f"/v1/agents/{busy}/heartbeat", json={"session": session}, headers=own)
    assert beat.status_code == 403
    report = http.post(f"/v1/agents/{busy}/report", json={"session": session}, headers=own)
    assert report.status_code == 403
    beats = {"beats": {mine: {"session": "x"}, busy: {"session": session}}}
    assert http.post("/v1/agents/heartbeats", json=beats, headers=own).status_code == 403
    reports = {"reports": {busy: {"session": session}}}
    assert http.post("/v1/agents/reports", json=reports, headers=own).status_code == 403


def test_a_second_unbound_agent_token_sees_none_of_the_nodes_another_token_holds(
    fleet: Fleet,
) -> None:
    other = agent_token(fleet, "other-agent")
    batched = fleet.http.get("/v1/agents/desired", headers=other).json()
    assert batched["nodes"] == [] and "vision-secret" not in str(batched)
    [busy] = {r.node for r in fleet.replicas()}
    r = fleet.http.get(f"/v1/agents/{busy}/desired", headers=other)
    assert r.status_code == 403 and "belongs to token agents" in r.json()["error"]
    assert "vision-secret" not in r.text
    inventory = fleet.nodes[busy].inventory()
    took = fleet.post("/v1/agents/register", {"inventory": inventory, "running": []}, other)
    assert took.status_code == 403


def test_a_revoked_token_is_refused_within_seconds_on_every_replica(
    fleet: Fleet, tmp_path: Path
) -> None:
    viewer = make_token(fleet, "leaving", "viewer")
    second = replace(fleet.config, admin_token=None, agent_token=None)
    with TestClient(create_app(second, fleet.clock)) as replica:
        assert replica.get("/v1/whoami", headers=viewer).status_code == 200  # remembered now
        revoked = fleet.post("/v1/tokens/leaving/revoke", {})
        assert revoked.status_code == 200, revoked.text
        assert fleet.http.get("/v1/whoami", headers=viewer).status_code == 401  # here: at once
        deadline = time.monotonic() + REVOKED_WITHIN_S
        while replica.get("/v1/whoami", headers=viewer).status_code != 401:
            assert time.monotonic() < deadline, "the other replica still takes a revoked token"
            time.sleep(0.1)
    r = fleet.http.get("/v1/whoami", headers=viewer)
    assert "revoked API token" in r.json()["error"]


def test_an_expired_token_is_refused(fleet: Fleet) -> None:
    body = {"name": "temp", "role": "viewer", "expires_in_s": 3600}
    r = fleet.post("/v1/tokens", body)
    assert r.status_code == 201, r.text
    temp = bearer(r.json()["token"])
    assert fleet.http.get("/v1/whoami", headers=temp).status_code == 200
    fleet.clock.advance(3601)
    refused = fleet.http.get("/v1/whoami", headers=temp)
    assert refused.status_code == 401 and "expired API token" in refused.json()["error"]


def test_the_token_listing_never_shows_a_secret(fleet: Fleet) -> None:
    secret = make_token(fleet, "carol", "member", "nlp")["Authorization"].split()[1]
    r = fleet.http.get("/v1/tokens", headers=ADMIN)
    assert r.status_code == 200, r.text
    with fleet.rt.db.session() as s:
        digests = [row.digest for row in s.query(TokenRow)]
    for value in (secret, *digests):
        assert value not in r.text
    listed = r.json()["tokens"]
    shown = {str(v) for t in listed for v in t.values()}
    assert not shown & {"adm", "agt"}  # nor the server's own tokens
    assert "carol" in {t["name"] for t in listed}
    assert all("token" not in t and "digest" not in t for t in listed)


def test_a_member_may_neither_list_nor_revoke_tokens(fleet: Fleet) -> None:
    member = make_token(fleet, "mallory", "member", "nlp")
    assert fleet.http.get("/v1/tokens", headers=member).status_code == 403
    r = fleet.http.post("/v1/tokens/admin/revoke", headers=member)
    assert r.status_code == 403
    assert fleet.http.get("/v1/whoami", headers=ADMIN).status_code == 200
