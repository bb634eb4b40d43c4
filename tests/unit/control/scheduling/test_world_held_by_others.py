"""What work the server does not run holds on a node (``held_by_others`` in its health, as
the Slurm bridge reports another partition's jobs on a shared node) is not free in a pass's
view, is preempted by none, and counts after the server's own jobs."""

from __future__ import annotations

from typing import Any

from sched_builders import live_job, live_node, live_replica, mirror_of

from boltforge.control.scheduling.world import Caches, held_by_others, load_world
from boltforge.control.store.mirror import _differs

NOW = 1_800_000_000.0
OTHERS = "held_by_others"


def free_on(world: Any, name: str) -> tuple[int, float]:
    h = world.fleet.index[name]
    return int(world.state.host_free[h]), float(world.state.free_cpus[h])


def test_gpus_and_cpus_held_by_others_are_not_free_and_no_job_holds_them() -> None:
    nodes = [live_node("host-0", health={OTHERS: "gpus=2,cpus=4"}), live_node("host-1")]
    world = load_world(mirror_of(nodes), NOW, Caches())
    cpus = float(world.state.free_cpus[world.fleet.index["host-1"]])
    assert free_on(world, "host-0") == (6, cpus - 4)
    assert free_on(world, "host-1") == (8, cpus)
    assert "others:host-0" in world.state.allocations
    assert world.running == []  # nothing a pass could preempt


def test_the_servers_own_jobs_count_first_and_others_take_only_what_is_left() -> None:
    nodes = [live_node("host-0", health={OTHERS: "gpus=3"})]
    job = live_job("1", state="running", bound_at=NOW - 50, gpus=6)
    reps = [live_replica("1", "host-0", list(range(6)))]
    world = load_world(mirror_of(nodes, [job], reps), NOW, Caches())
    assert [r.job.id for r in world.running] == ["1"]
    assert free_on(world, "host-0")[0] == 0


def test_a_fact_badly_written_or_absent_holds_nothing() -> None:
    assert held_by_others("gpus=2,cpus=x,memory_gb=1.5,other=3") == (2, 0.0, 1.5)
    assert held_by_others(None) == (0, 0.0, 0.0)
    world = load_world(mirror_of([live_node("host-0", health={OTHERS: "?"})]), NOW, Caches())
    assert free_on(world, "host-0")[0] == 8


def test_a_change_of_what_others_hold_is_a_change_passes_see() -> None:
    before, after = live_node("host-0"), live_node("host-0", health={OTHERS: "gpus=1"})
    assert _differs(before, after, ("health",))
    same = live_node("host-0", health={"preflight": "ok"})
    assert not _differs(before, same, ("health",))
