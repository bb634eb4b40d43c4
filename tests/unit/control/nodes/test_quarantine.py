"""Operators taking nodes out of service and back, through the real API in-process: cordon
(no new work), drain (the work moves off at its next checkpoint), uncordon."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, make_spec

from boltforge.control.store.invariants import double_allocations


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2) as f:
        yield f


def node_state(fleet: Fleet, name: str) -> str:
    nodes = fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
    state: str = next(n["state"] for n in nodes if n["name"] == name)
    return state


def act(fleet: Fleet, what: str, node: str, headers: dict[str, str] = ADMIN) -> Any:
    r = fleet.post(f"/v1/nodes/{node}/{what}", {}, headers)
    fleet.settle()
    return r


def test_a_cordoned_node_gets_no_new_work_and_keeps_what_it_runs(fleet: Fleet) -> None:
    first = fleet.submit(make_spec("first", 8))
    fleet.start_everything()
    [where] = [r.node for r in fleet.job(first).placement]
    r = act(fleet, "cordon", where)
    assert r.status_code == 200 and r.json()["state"] == "draining"  # busy and cordoned
    second = fleet.submit(make_spec("second", 8))
    third = fleet.submit(make_spec("third", 8))
    assert [p.node for p in fleet.job(second).placement] != [where]
    assert fleet.job(third).state == "pending"  # the only free host is cordoned
    assert fleet.job(first).state == "running"
    act(fleet, "uncordon", where)
    fleet.finish(first)
    assert fleet.job(third).state == "scheduled"
    assert [p.node for p in fleet.job(third).placement] == [where]


def test_draining_moves_a_job_off_at_its_checkpoint_and_it_resumes_elsewhere(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    [where] = [r.node for r in fleet.job(job).placement]
    assert act(fleet, "drain", where).status_code == 200
    leaving = fleet.job(job)
    assert leaving.state == "preempting"
    assert leaving.events[-1].kind == "drained"
    assert fleet.stop_everything() == [f"{job}.1.0"]
    fleet.start_everything()
    moved = fleet.job(job)
    assert moved.state == "running" and moved.epoch == 2
    assert [r.node for r in moved.placement] != [where]
    assert node_state(fleet, where) == "cordoned"
    with fleet.rt.db.session() as s:
        assert double_allocations(s) == []


def test_quarantine_is_for_admins_audited_and_names_unknown_nodes(fleet: Fleet) -> None:
    made = fleet.post("/v1/tokens", {"name": "ann", "role": "member", "team": "research"})
    member = {"Authorization": f"Bearer {made.json()['token']}"}
    assert act(fleet, "cordon", "host-0", member).status_code == 403
    missing = act(fleet, "drain", "host-9")
    assert missing.status_code == 404
    assert "no node host-9. To fix: check the name with `bolt nodes`" in missing.json()["error"]
    act(fleet, "cordon", "host-1")
    act(fleet, "uncordon", "host-1")
    log = fleet.http.get("/v1/audit", headers=ADMIN).json()
    actions = [(e["action"], e["target"]) for e in log]
    assert ("cordon", "host-1") in actions and ("uncordon", "host-1") in actions
    assert node_state(fleet, "host-1") == "ready"
