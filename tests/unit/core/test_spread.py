"""Jobs of one spread group (an inference service's replicas): no host holds more than half
of them while other hosts have room, so two go to two hosts, more still pack, and they share
one host only when nothing else is free."""

from __future__ import annotations

from collections import Counter

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import SERVING, Job, Running
from boltforge.core.policy import POLICIES
from boltforge.testing.builders import make_fleet, make_gang

FLEET = make_fleet(racks=1, hosts=4)  # four 8-GPU hosts in one rack


def replica(n: int, group: str = "service chat", gpus: int = 2) -> Job:
    base = make_gang(f"chat-{n}", gpus=gpus, per_node=gpus)
    gang = Gang(f"chat-{n}", base.roles, team="nlp", priority=SERVING)
    return Job(f"chat-{n}", gang, "nlp", float(n), preemptible=False, spread=group)


def hosts_of(
    state: FleetState, pending: list[Job], running: tuple[Running, ...] = ()
) -> dict[str, int]:
    snap = Snapshot(state, tuple(pending), tuple(running), 10.0)
    result = run_cycle(snap, POLICIES["default"])
    assert not result.waiting
    return {b.job: b.placement.grants[0].host for b in result.binds}


def test_two_replicas_land_on_two_hosts_and_more_never_put_half_on_one() -> None:
    placed = hosts_of(FleetState(FLEET), [replica(n) for n in range(2)])
    assert len(set(placed.values())) == 2
    for count in (3, 4, 7):
        placed = hosts_of(FleetState(FLEET), [replica(n) for n in range(count)])
        per_host = Counter(placed.values())
        assert max(per_host.values()) <= (count + 1) // 2
        assert len(per_host) <= 2  # and they still pack: 2 GPUs each, 8 per host


def test_a_replica_goes_apart_from_the_ones_already_running() -> None:
    state = FleetState(FLEET)
    grant = Grant("worker", 0, 0, (0, 1))
    state.allocate(Allocation("chat-0", (grant,), None, SERVING))
    running = (Running(replica(0), state.allocations["chat-0"], 0.0),)
    placed = hosts_of(state, [replica(1)], running)
    assert placed["chat-1"] != 0


def test_replicas_share_a_host_when_no_other_host_has_room() -> None:
    state = FleetState(FLEET)
    for h in (1, 2, 3):
        state.allocate(Allocation(f"train-{h}", (Grant("w", 0, h, tuple(range(8))),), None))
    placed = hosts_of(state, [replica(n) for n in range(3)])
    assert set(placed.values()) == {0}


def test_other_groups_and_plain_jobs_are_not_kept_apart() -> None:
    placed = hosts_of(FleetState(FLEET), [replica(0, "service a"), replica(1, "service b")])
    assert len(set(placed.values())) == 1  # best fit packs two services on one host
