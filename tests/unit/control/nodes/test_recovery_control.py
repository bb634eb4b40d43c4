"""Recovery holds and degraded hosts through the real API in-process (the test plays the
agents, the clock is fake): a gang that loses a host keeps its healthy hosts' GPUs for a
while and restarts on them with only the lost host replaced; a degraded host takes
single-host jobs but no multi-host gang."""

from __future__ import annotations

from pathlib import Path

from control_kit import ADMIN, AGENT, Fleet, make_spec
from sqlalchemy import select

from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.models import JobRow


def home_of(fleet: Fleet, job: str) -> list[str]:
    """The nodes the job's current replicas are placed on."""
    detail = fleet.job(job)
    return sorted(p.node for p in detail.placement if p.state not in ("exited", "lost"))


def rack(name: str) -> int:
    return int(name.split("-")[1]) // 2  # control_kit: two hosts per rack


def die(fleet: Fleet, name: str) -> None:
    """``name`` goes silent past its 15 s lease while every other node keeps heartbeating."""
    for _ in range(2):
        fleet.clock.advance(10.0)
        beat(fleet, skip=name)
    fleet.settle()


def beat(fleet: Fleet, skip: str = "") -> None:
    for other, node in fleet.nodes.items():
        if other != skip and node.session:
            node.heartbeat()


def hold_of(fleet: Fleet, job: str) -> object:
    with fleet.rt.db.session() as s:
        row = s.scalar(select(JobRow).where(JobRow.id == job))
        assert row is not None
        return row.recovery_hold


def test_a_gang_that_loses_a_host_restarts_on_the_rest_plus_the_closest_healthy_host(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=6) as fleet:
        gang = fleet.submit(make_spec("train", 24))
        fleet.start_everything()
        home = home_of(fleet, gang)
        # the gang host whose rack partner is free: losing it, the partner is the closest
        victim = next(h for h in home if sum(rack(o) == rack(h) for o in home) == 1)
        partner = next(
            f"host-{i}"
            for i in range(6)
            if rack(f"host-{i}") == rack(victim) and f"host-{i}" != victim
        )
        kept = sorted(set(home) - {victim})

        die(fleet, victim)
        assert home_of(fleet, gang) == sorted([*kept, partner])
        notes = [e.message for e in fleet.job(gang).events if e.kind == "note"]
        assert notes[-1] == f"replaced {victim} by {partner} (same rack), kept {', '.join(kept)}"
        assert hold_of(fleet, gang) is None  # placed: the hold is cleared

        fleet.stop_everything()  # the old replicas on the kept hosts stop; the new ones start
        fleet.start_everything()
        detail = fleet.job(gang)
        assert (detail.state, detail.restarts, detail.epoch) == ("running", 1, 2)
        with fleet.rt.db.session() as s:
            assert double_allocations(s) == []


def _busy_gang(fleet: Fleet) -> tuple[str, str, str, list[str]]:
    """A 3-host gang and an 8-GPU filler on the fourth host of a 4-host fleet; the gang
    then loses a host. Returns (gang, filler, victim, kept)."""
    gang = fleet.submit(make_spec("train", 24, team="nlp"))
    fleet.start_everything()
    filler = fleet.submit(make_spec("filler", 8, team="vision"))
    fleet.start_everything()
    home = home_of(fleet, gang)
    victim = home[-1]
    die(fleet, victim)
    fleet.stop_everything()  # the gang's replicas on its healthy hosts stop
    return gang, filler, victim, sorted(set(home) - {victim})


def test_held_gpus_go_to_no_other_job_and_the_gang_restarts_on_them(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=4) as fleet:
        gang, filler, victim, kept = _busy_gang(fleet)
        waiting = fleet.job(gang)
        assert waiting.state == "requeued"
        assert any("held for its restart" in line for line in waiting.waiting)
        hold = hold_of(fleet, gang)
        assert isinstance(hold, dict) and hold["lost"] == [victim]
        assert sorted(g["node"] for g in hold["grants"]) == kept

        rival = fleet.submit(make_spec("rival", 16, team="vision"))  # would fit on kept
        assert home_of(fleet, rival) == []
        assert fleet.job(rival).state == "pending"

        fleet.finish(filler)  # a healthy host frees up: the gang restarts next to its own
        [freed] = [h for h in fleet.nodes if h not in (*kept, victim)]
        assert home_of(fleet, gang) == sorted([*kept, freed])
        assert home_of(fleet, rival) == []
        fleet.start_everything()
        assert fleet.job(gang).state == "running"
        with fleet.rt.db.session() as s:
            assert double_allocations(s) == []


def test_when_the_hold_runs_out_the_gpus_are_free_again(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=4, recovery_hold_s=60.0) as fleet:
        gang, _, _, kept = _busy_gang(fleet)
        rival = fleet.submit(make_spec("rival", 16, team="vision"))
        assert home_of(fleet, rival) == []
        for _ in range(5):  # 50 s more: the hold, taken 20 s ago... still 10 s to go
            fleet.clock.advance(10.0)
            beat(fleet)
        fleet.settle()
        assert home_of(fleet, rival) == []
        fleet.clock.advance(15.0)
        beat(fleet)
        fleet.settle()
        assert home_of(fleet, rival) == kept
        assert hold_of(fleet, gang) is None
        messages = [e.message for e in fleet.job(gang).events]
        assert any("recovery hold on" in m and "ended" in m for m in messages)
        with fleet.rt.db.session() as s:
            assert double_allocations(s) == []


def test_no_hold_when_it_is_turned_off(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=4, recovery_hold_s=0.0) as fleet:
        _, _, _, kept = _busy_gang(fleet)
        rival = fleet.submit(make_spec("rival", 16, team="vision"))
        assert home_of(fleet, rival) == kept


def test_a_degraded_host_gets_a_one_host_job_but_not_a_two_host_gang(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        node = fleet.nodes["host-0"]
        body = {"session": node.session, "health": {"degraded": "NVLink CRC errors"}}
        r = fleet.http.post("/v1/agents/host-0/heartbeat", json=body, headers=AGENT)
        assert r.status_code == 200
        fleet.settle()

        gang = fleet.submit(make_spec("pair", 16))
        assert home_of(fleet, gang) == []
        assert any("degraded" in line and "host-0" in line for line in fleet.job(gang).waiting)

        listing = fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
        assert {n["name"]: n["degraded"] for n in listing} == {"host-0": True, "host-1": False}

        one = fleet.submit(make_spec("one", 8))
        two = fleet.submit(make_spec("two", 8))
        assert sorted(home_of(fleet, one) + home_of(fleet, two)) == ["host-0", "host-1"]


def test_a_straggler_finding_marks_its_host_degraded_for_a_while(tmp_path: Path) -> None:
    from boltforge.control.nodes.health import DEGRADED_S
    from boltforge.control.scheduling.world import degraded
    from boltforge.control.store.models import NodeRow

    with Fleet(tmp_path, hosts=2) as fleet:
        now = fleet.clock()
        with fleet.rt.db.session() as s:
            node = s.get(NodeRow, "host-0")
            assert node is not None and not degraded(node, now)
            node.degraded_until = now + DEGRADED_S
            assert degraded(node, now) and not degraded(node, now + DEGRADED_S + 1)
