"""A full pass planned on a world read earlier keeps only the decisions that still hold on
the world now (``planning.still_valid``), as scenarios: a bind stays while its job still
waits, its GPUs are free (or held by the victims it evicts, in the same allocation) and its
hosts still take work; an eviction stays only with its bind, or while its victim still
holds the same allocation; reasons pass through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from sched_builders import T0, live_job, live_node, live_replica, mirror_of

from boltforge.control.scheduling.planning import still_valid
from boltforge.control.scheduling.world import Caches, World, load_world
from boltforge.control.store.mirror import LiveJob, LiveReplica, Mirror
from boltforge.core.decisions import Bind, CycleResult, Evict, Waiting, WaitReason
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Grant
from boltforge.core.placement.answers import Placement, RolePlan
from boltforge.core.placement.crossing import CostBreakdown

NODES = ("host-0", "host-1")
FREE = CostBreakdown({}, 0.0)


def bind(world: World, job: str, node: str, gpus: tuple[int, ...] = tuple(range(8))) -> Bind:
    return bind_on(world, job, [(node, gpus)])


def bind_on(world: World, job: str, where: list[tuple[str, tuple[int, ...]]]) -> Bind:
    grants = tuple(
        Grant("worker", i, world.fleet.index[node], gpus) for i, (node, gpus) in enumerate(where)
    )
    plan = RolePlan("worker", Level.POD, "p0", grants, FREE, (), "H100-80GB")
    return Bind(job, Placement(job, (plan,), FREE))


def world_of(m: Mirror) -> World:
    return load_world(m, T0, Caches())


def base() -> Mirror:
    """``V`` (low) runs on host-0; ``W`` waits."""
    jobs = [live_job("1", state="running", bound_at=T0 - 600, priority=3), live_job("2")]
    reps = [live_replica("1", "host-0", list(range(8)))]
    return mirror_of([live_node(n) for n in NODES], jobs, reps)


def set_job(m: Mirror, job: str, **values: object) -> None:
    m.jobs[job] = replace(m.jobs[job], **values)  # type: ignore[arg-type]


def add_holder(m: Mirror, job: LiveJob, rep: LiveReplica) -> None:
    m.jobs[job.id] = job
    m.replicas[rep.id] = rep
    m.on_node.setdefault(rep.node, set()).add(rep.id)


def drop_job(m: Mirror, job: str) -> None:
    del m.jobs[job]
    for rid in [r for r, rep in m.replicas.items() if rep.job_id == job]:
        rep = m.replicas.pop(rid)
        m.on_node[rep.node].discard(rid)


Change = Callable[[Mirror], None]


@dataclass(frozen=True)
class Case:
    """A plan binding ``W`` (job 2) on ``node`` (evicting ``V``, job 1, when ``evicts``),
    applied after ``change`` happened to the world."""

    name: str
    node: str
    evicts: bool
    change: Change
    kept: bool


def nothing(m: Mirror) -> None:
    pass


def cordon_host_1(m: Mirror) -> None:
    m.nodes["host-1"] = replace(m.nodes["host-1"], cordoned=True)


def host_1_suspect(m: Mirror) -> None:
    m.nodes["host-1"] = replace(m.nodes["host-1"], state="suspect")


def w_cancelled(m: Mirror) -> None:
    drop_job(m, "2")


def w_placed_meanwhile(m: Mirror) -> None:
    set_job(m, "2", state="scheduled", epoch=1)


def w_requeued_instead(m: Mirror) -> None:
    set_job(m, "2", state="requeued")


def arrival_took_host_1(m: Mirror) -> None:
    add_holder(m, live_job("3", state="scheduled", bound_at=T0), live_replica("3", "host-1", [2]))


def v_finished(m: Mirror) -> None:
    drop_job(m, "1")


def v_restarted_in_a_new_epoch(m: Mirror) -> None:
    drop_job(m, "1")
    add_holder(
        m,
        live_job("1", state="running", epoch=2, bound_at=T0, priority=3),
        live_replica("1", "host-0", list(range(8)), epoch=2),
    )


def v_already_leaving(m: Mirror) -> None:
    set_job(m, "1", state="preempting")


CASES = [
    Case("free-host-unchanged", "host-1", False, nothing, True),
    Case("free-host-cordoned", "host-1", False, cordon_host_1, False),
    Case("free-host-suspect", "host-1", False, host_1_suspect, False),
    Case("job-cancelled", "host-1", False, w_cancelled, False),
    Case("job-placed-by-an-arrival", "host-1", False, w_placed_meanwhile, False),
    Case("job-requeued-still-waits", "host-1", False, w_requeued_instead, True),
    Case("a-gpu-taken-meanwhile", "host-1", False, arrival_took_host_1, False),
    Case("victim-unchanged", "host-0", True, nothing, True),
    Case("victim-restarted-in-a-new-epoch", "host-0", True, v_restarted_in_a_new_epoch, False),
    Case("victim-already-leaving", "host-0", True, v_already_leaving, False),
    Case("victim-finished", "host-0", True, v_finished, False),
    Case("other-host-taken-victim-unchanged", "host-0", True, arrival_took_host_1, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_planned_bind_holds_only_while_its_job_waits_and_its_gpus_can_be_had(
    case: Case,
) -> None:
    m = base()
    planned = world_of(m)
    b = bind(planned, "2", case.node)
    evictions = (Evict("1", "2", 100.0),) if case.evicts else ()
    why = Waiting("4", 3, WaitReason.CAPACITY, ("no room",))
    result = CycleResult(binds=(b,), evictions=evictions, waiting=(why,))
    case.change(m)
    current = load_world(m, T0, Caches(), waiting=["2"])
    kept = still_valid(result, planned, current)
    assert kept.binds == ((b,) if case.kept else ())
    assert kept.evictions == (evictions if case.kept else ())
    assert kept.waiting == (why,)  # reasons are advice: they pass through


def test_an_eviction_of_a_plan_without_its_bind_stays_while_the_victim_holds_the_same_gpus() -> (
    None
):
    m = base()
    planned = world_of(m)
    lone = Evict("1", "9", 50.0)  # for a job the plan did not bind (a reservation's room)
    result = CycleResult(evictions=(lone,))
    assert still_valid(result, planned, world_of(m)).evictions == (lone,)
    v_restarted_in_a_new_epoch(m)
    assert still_valid(result, planned, world_of(m)).evictions == ()


def test_of_two_binds_evicting_the_same_victim_only_the_first_gets_its_gpus() -> None:
    m = base()
    m.jobs["6"] = live_job("6")
    planned = world_of(m)
    first, second = bind(planned, "2", "host-0"), bind(planned, "6", "host-0")
    evictions = (Evict("1", "2", 1.0), Evict("1", "6", 1.0))
    result = CycleResult(binds=(first, second), evictions=evictions)
    kept = still_valid(result, planned, load_world(m, T0, Caches(), waiting=["2", "6"]))
    assert kept.binds == (first,)
    assert kept.evictions == (evictions[0],)


def test_a_dropped_bind_gives_its_victims_gpus_back_before_the_next_bind_is_judged() -> None:
    m = base()
    m.jobs["6"] = live_job("6")
    planned = world_of(m)
    wide = bind_on(planned, "2", [("host-0", tuple(range(8))), ("host-1", (2,))])
    after = bind(planned, "6", "host-0")  # no victim: fits only if V were gone
    result = CycleResult(binds=(wide, after), evictions=(Evict("1", "2", 1.0),))
    arrival_took_host_1(m)  # GPU 2 of host-1 is taken: the wide bind fails
    current = load_world(m, T0, Caches(), waiting=["2", "6"])
    kept = still_valid(result, planned, current)
    assert kept.binds == () and kept.evictions == ()
    assert "1" in current.state.allocations  # V still holds host-0 in the world now


def test_two_binds_that_both_still_fit_are_both_kept() -> None:
    m = base()
    m.jobs["6"] = live_job("6", gpus=4)
    planned = world_of(m)
    a = bind(planned, "2", "host-1", (0, 1, 2, 3))
    b = bind(planned, "6", "host-1", (4, 5, 6, 7))
    kept = still_valid(CycleResult(binds=(a, b)), planned, load_world(m, T0, Caches(), ["2", "6"]))
    assert kept.binds == (a, b)
