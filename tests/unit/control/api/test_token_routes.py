"""Tokens bound, expiring and revocable, over the API: making a token bound to nodes or
with an expiry (and every way to get that wrong), the listing, revoking by id or name, how
agent tokens claim nodes and are held to them (one node, a pattern, every node, or the nodes
they claimed first), and the token cache that forgets a revoked token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_builders import audit_rows, bearer, make_token, refusal
from control_kit import ADMIN, AGENT, Fleet, postgres_server, store_url
from sqlalchemy import delete, select

from boltforge.control import auth
from boltforge.control.store.models import NodeClaimRow, TokenRow
from boltforge.control.tokencache import TokenCache

__all__ = ["postgres_server", "store_url"]  # fixtures used by name


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2) as f:
        yield f


def made(fleet: Fleet, **body: Any) -> dict[str, Any]:
    r = fleet.post("/v1/tokens", body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def listed(fleet: Fleet) -> dict[str, dict[str, Any]]:
    r = fleet.http.get("/v1/tokens", headers=ADMIN)
    assert r.status_code == 200, r.text
    return {t["name"]: t for t in r.json()["tokens"]}


def register(fleet: Fleet, node: str, headers: dict[str, str]) -> Any:
    inventory = {**fleet.nodes["host-0"].inventory(), "name": node}
    return fleet.post("/v1/agents/register", {"inventory": inventory, "running": []}, headers)


# -- making tokens ----------------------------------------------------------------------------


def test_a_token_made_with_nodes_and_an_expiry_says_so(fleet: Fleet) -> None:
    reply = made(fleet, name="n3", role="agent", nodes=["host-3", "gpu-*"], expires_in_s=60)
    assert reply["nodes"] == ["host-3", "gpu-*"]
    assert reply["expires_at"] == fleet.clock() + 60 and isinstance(reply["id"], int)
    [entry] = [a for a in audit_rows(fleet, "create-token") if a.target == "n3"]
    assert entry.detail["nodes"] == ["host-3", "gpu-*"]
    assert entry.detail["expires_at"] == fleet.clock() + 60


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "v", "role": "viewer", "nodes": ["host-1"]}, "nodes"),
        ({"name": "a", "role": "agent", "nodes": ["host 1"]}, "nodes"),
        ({"name": "a", "role": "agent", "nodes": []}, "nodes"),
        ({"name": "a", "role": "agent", "expires_in_s": 0}, "expires_in_s"),
        ({"name": "a", "role": "agent", "expires_in_s": 1e12}, "expires_in_s"),
    ],
    ids=["nodes-for-a-viewer", "space-in-pattern", "no-nodes", "zero-expiry", "too-long"],
)
def test_bad_bindings_and_expiries_are_refused_naming_the_field(
    fleet: Fleet, body: dict[str, Any], field: str
) -> None:
    r = fleet.post("/v1/tokens", body)
    assert r.status_code == 422, r.text
    assert field in r.text and "To fix" in r.text


# -- listing ----------------------------------------------------------------------------------


def test_the_listing_shows_binding_claims_expiry_and_state(fleet: Fleet) -> None:
    made(fleet, name="bridge", role="agent", nodes=["*"])
    made(fleet, name="brief", role="viewer", expires_in_s=10)
    fleet.clock.advance(11)
    tokens = listed(fleet)
    assert tokens["agents"]["nodes"] is None
    assert tokens["agents"]["claimed"] == ["host-0", "host-1"]  # registered with it first
    assert tokens["bridge"]["nodes"] == ["*"] and tokens["bridge"]["claimed"] == []
    assert tokens["brief"]["state"] == "expired"
    assert tokens["admin"]["state"] == "active" and tokens["admin"]["revoked_at"] is None


def test_when_a_token_was_last_used_is_written_back(fleet: Fleet) -> None:
    cache = TokenCache(fleet.rt.db, fleet.clock, ttl_s=0.0, used_every_s=0.0)
    value = make_token(fleet, "user", "viewer")["Authorization"].split()[1]
    assert isinstance(cache.lookup(value), auth.Caller)
    fleet.clock.advance(30)
    cache.lookup(value)  # revalidates: writes back the use before
    assert listed(fleet)["user"]["last_used_at"] == fleet.clock() - 30


# -- revoking ---------------------------------------------------------------------------------


def test_revoking_by_id_stops_the_token_and_is_audited(fleet: Fleet) -> None:
    headers = make_token(fleet, "gone", "viewer")
    token_id = listed(fleet)["gone"]["id"]
    r = fleet.post(f"/v1/tokens/{token_id}/revoke", {})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "revoked" and r.json()["revoked_at"] == fleet.clock()
    refusal(fleet.http.get("/v1/whoami", headers=headers), 401, "revoked API token")
    [entry] = audit_rows(fleet, "revoke-token")
    assert (entry.target, entry.detail["id"]) == ("gone", token_id)
    again = fleet.post(f"/v1/tokens/{token_id}/revoke", {})  # changes nothing
    assert again.status_code == 200 and again.json()["revoked_at"] == r.json()["revoked_at"]
    assert len(audit_rows(fleet, "revoke-token")) == 1


def test_a_name_two_working_tokens_share_is_ambiguous(fleet: Fleet) -> None:
    make_token(fleet, "twin", "viewer")
    make_token(fleet, "twin", "viewer")
    refusal(fleet.post("/v1/tokens/twin/revoke", {}), 409, "2 tokens are named twin", "by its id")
    refusal(fleet.post("/v1/tokens/nobody/revoke", {}), 404, "no token named nobody")
    refusal(fleet.post("/v1/tokens/9999/revoke", {}), 404, "no token with id 9999")


def test_the_last_working_admin_token_cannot_be_revoked(fleet: Fleet) -> None:
    refusal(fleet.post("/v1/tokens/admin/revoke", {}), 409, "last working admin token")
    made(fleet, name="ops", role="admin")
    assert fleet.post("/v1/tokens/admin/revoke", {}).status_code == 200


def test_revoking_an_agent_token_frees_its_nodes_for_another(fleet: Fleet) -> None:
    other = bearer(made(fleet, name="next", role="agent")["token"])
    assert register(fleet, "host-0", other).status_code == 403
    assert fleet.post("/v1/tokens/agents/revoke", {}).status_code == 200
    assert fleet.http.get("/v1/agents/host-0/desired", headers=AGENT).status_code == 401
    assert register(fleet, "host-0", other).status_code == 200
    assert listed(fleet)["next"]["claimed"] == ["host-0"]


# -- agent tokens held to their nodes ----------------------------------------------------------


def test_a_pattern_bound_token_registers_matching_nodes_only(fleet: Fleet) -> None:
    gpu = bearer(made(fleet, name="gpus", role="agent", nodes=["gpu-*"])["token"])
    assert register(fleet, "gpu-7", gpu).status_code == 200
    r = register(fleet, "cpu-1", gpu)
    refusal(r, 403, "bound to gpu-*, not node cpu-1", "--node cpu-1")
    desired = fleet.http.get("/v1/agents/desired", headers=gpu).json()
    assert [n["node"] for n in desired["nodes"]] == ["gpu-7"]


def test_a_bound_token_takes_a_node_from_a_claiming_one(fleet: Fleet) -> None:
    bound = bearer(made(fleet, name="host-0-agent", role="agent", nodes=["host-0"])["token"])
    assert register(fleet, "host-0", bound).status_code == 200
    refusal(fleet.http.get("/v1/agents/host-0/desired", headers=AGENT), 403, "host-0")
    assert fleet.http.get("/v1/agents/host-1/desired", headers=AGENT).status_code == 200


def test_a_bridge_token_for_every_node_reads_every_node(fleet: Fleet) -> None:
    bridge = bearer(made(fleet, name="slurm", role="agent", nodes=["*"])["token"])
    desired = fleet.http.get("/v1/agents/desired", headers=bridge).json()
    assert [n["node"] for n in desired["nodes"]] == ["host-0", "host-1"]
    beats = {n.name: {"session": n.session} for n in fleet.nodes.values()}
    r = fleet.post("/v1/agents/heartbeats", {"beats": beats}, bridge)
    assert r.status_code == 200 and r.json()["lost"] == []


def test_a_node_nobody_claimed_is_claimed_by_the_first_token_to_act_for_it(
    fleet: Fleet,
) -> None:
    """Nodes registered before tokens claimed nodes (a store upgraded from an older server)
    belong to the first claiming token that heartbeats for them."""
    with fleet.rt.db.session() as s:
        s.execute(delete(NodeClaimRow))
        auth.bump(s)
    fleet.rt.tokens.forget()
    node = fleet.nodes["host-1"]
    assert node.heartbeat() == 200
    with fleet.rt.db.session() as s:
        holder = s.scalar(select(NodeClaimRow.token_id).where(NodeClaimRow.node == "host-1"))
        assert s.get(TokenRow, holder).name == "agents"  # type: ignore[union-attr]
    desired = fleet.http.get("/v1/agents/desired", headers=AGENT).json()
    assert [n["node"] for n in desired["nodes"]] == ["host-1"]  # host-0 not claimed yet


def test_an_artifact_upload_for_another_node_is_refused(fleet: Fleet) -> None:
    own = bearer(made(fleet, name="host-0-agent", role="agent", nodes=["host-0"])["token"])
    r = fleet.http.put(
        "/v1/agents/host-1/artifacts/some-replica/out.txt",
        content=b"x",
        headers={**own, "X-Sha256": "0" * 64},
    )
    refusal(r, 403, "host-1")


# -- the token cache ---------------------------------------------------------------------------


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_trusts_a_token_for_its_ttl_then_forgets_a_revoked_one(fleet: Fleet) -> None:
    ticks = Ticks()
    cache = TokenCache(fleet.rt.db, fleet.clock, ttl_s=5.0, monotonic=ticks)
    value = make_token(fleet, "cached", "viewer")["Authorization"].split()[1]
    assert cache.current(value) is None  # never looked up
    assert isinstance(cache.lookup(value), auth.Caller)
    assert cache.current(value) is not None
    assert fleet.post("/v1/tokens/cached/revoke", {}).status_code == 200  # by another server
    ticks.now = 4.0
    assert cache.current(value) is not None  # still trusted within the ttl
    ticks.now = 5.5
    assert cache.current(value) is None  # the ttl passed: look again
    assert cache.lookup(value) == "revoked"


def test_the_cache_refuses_a_remembered_token_once_it_expires(fleet: Fleet) -> None:
    value = made(fleet, name="short", role="viewer", expires_in_s=5)["token"]
    assert fleet.rt.caller(value) is not None
    assert fleet.rt.tokens.current(value) is not None
    fleet.clock.advance(5)
    assert fleet.rt.tokens.current(value) is None
    assert fleet.rt.tokens.lookup(value) == "expired"


# -- on either store ---------------------------------------------------------------------------


def test_claims_revocation_and_the_listing_hold_on_either_store(
    tmp_path: Path, store_url: str
) -> None:
    with Fleet(tmp_path, hosts=2, db_url=store_url) as f:
        other = bearer(made(f, name="other", role="agent", expires_in_s=600)["token"])
        refusal(f.http.get("/v1/agents/host-0/desired", headers=other), 403, "belongs to")
        assert f.post("/v1/tokens/agents/revoke", {}).status_code == 200
        assert register(f, "host-0", other).status_code == 200
        tokens = listed(f)
        assert tokens["other"]["claimed"] == ["host-0"] and tokens["agents"]["claimed"] == []
        assert tokens["agents"]["state"] == "revoked"


def test_claims_made_in_one_group_commit_are_all_remembered_whatever_order_they_settle(
    fleet: Fleet,
) -> None:
    """Registrations arriving together claim their nodes in one transaction; each claim is
    remembered when the transaction commits, in whatever order, and none hides another."""
    cache = TokenCache(fleet.rt.db, fleet.clock)
    value = AGENT["Authorization"].split()[1]
    who = cache.lookup(value)
    assert isinstance(who, auth.Caller)
    with fleet.rt.db.session() as s:
        first = cache.claim_in(s, who, ["host-5"], registering=True)
        second = cache.claim_in(s, who, ["host-6"], registering=True)
    assert cache.settle(second) == [] and cache.settle(first) == []
    remembered = cache.current(value)
    assert remembered is not None and remembered.nodes is not None
    assert {"host-5", "host-6"} <= remembered.nodes.claimed
    with fleet.rt.db.session() as s:
        stored = s.scalars(select(NodeClaimRow.node).where(NodeClaimRow.token_id == who.token_id))
        assert {"host-5", "host-6"} <= set(stored)
