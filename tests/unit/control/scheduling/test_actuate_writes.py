"""A pass's decisions written to the store (``scheduling/actuate.py``): what a bound job's
replicas are told to run (command, environment, grace, checkpoint directory, image), the
words of its placement, the run it opens and its price, in-place resizes, and decisions
about jobs that have moved on since the world was read, which change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench
from sqlalchemy import select

from boltforge.control.scheduling import actuate
from boltforge.control.scheduling.actuate import Settings, Touched, apply
from boltforge.control.scheduling.world import Caches, World, load_world
from boltforge.control.store.models import JobRow, ReplicaRow, RunRow
from boltforge.core.decisions import CycleResult, Evict, Resize, Waiting, WaitReason
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Grant
from boltforge.core.placement.answers import Placement, RolePlan
from boltforge.core.placement.crossing import CostBreakdown


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=2) as b:
        b.settle()
        yield b


def spec_of(bench: Bench, job: str) -> list[dict[str, Any]]:
    return [r.spec for r in bench.replicas(job)]


# -- what the replicas are told ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        (["python", "train.py", "--lr", "3e-4"], ["python", "train.py", "--lr", "3e-4"]),
        ("python train.py --name 'a b'", ["python", "train.py", "--name", "a b"]),
        ("python train.py | tee log", ["/bin/sh", "-c", "python train.py | tee log"]),
        ("echo $HOME", ["/bin/sh", "-c", "echo $HOME"]),
        ("a && b", ["/bin/sh", "-c", "a && b"]),
        ("run > out.txt", ["/bin/sh", "-c", "run > out.txt"]),
    ],
    ids=["list", "words", "pipe", "variable", "and", "redirect"],
)
def test_a_command_runs_as_words_or_through_the_shell_when_it_needs_one(
    bench: Bench, command: Any, argv: list[str]
) -> None:
    job = bench.place("train", 8, command=command)
    [spec] = spec_of(bench, job)
    assert spec["command"] == argv


def test_each_replica_gets_its_rank_role_node_and_the_jobs_own_environment(
    bench: Bench,
) -> None:
    job = bench.place("wide", 16, env={"SEED": "7", "RANK": "mine"}, workdir="/work/x")
    reps = bench.replicas(job)
    for rank, rep in enumerate(reps):
        env = rep.spec["env"]
        assert env["BOLT_ROLE"] == "worker" and env["BOLT_NODE"] == rep.node
        assert env["BOLT_RESTARTS"] == "0"
        assert (env["WORLD_SIZE"], env["MASTER_PORT"]) == ("2", "29500")
        assert env["SEED"] == "7"
        assert env["RANK"] == "mine"  # the job's own variables come last and win
        assert rep.spec["cwd"] == "/work/x"
        assert rep.rank == rank and rep.id == f"{job}.1.{rank}"
    assert [r.spec["env"]["GROUP_RANK"] for r in reps] == ["0", "1"]


def test_a_second_gang_gets_the_next_rendezvous_port(bench: Bench) -> None:
    first = bench.place("a", 8)
    second = bench.place("b", 8)
    ports = [spec_of(bench, j)[0]["env"]["MASTER_PORT"] for j in (first, second)]
    assert ports == ["29500", "29501"]


def test_grace_checkpoint_directory_and_outputs_come_from_the_spec(
    bench: Bench, tmp_path: Path
) -> None:
    job = bench.place("ckpt", 8, checkpoint={"grace": "45s"}, outputs=["out/model.pt"])
    [spec] = spec_of(bench, job)
    assert spec["grace_s"] == 45.0
    assert spec["checkpoint_dir"] == f"{tmp_path / 'checkpoints'}/{job}"
    assert spec["outputs"] == ["out/model.pt"]
    assert spec["image"] is None


def test_a_default_job_gets_two_minutes_to_checkpoint(bench: Bench) -> None:
    job = bench.place("plain", 8)
    assert spec_of(bench, job)[0]["grace_s"] == 120.0


def test_a_role_runs_its_own_command_and_image_else_the_jobs(bench: Bench) -> None:
    roles = [
        {"name": "trainer", "gpus": 8, "command": "python trainer.py", "image": "trainer:1"},
        {"name": "helper", "gpus": 4},
    ]
    job = bench.place("roles", None, roles=roles, image="base:2", command=["python", "main.py"])
    by_role = {r.role: r.spec for r in bench.replicas(job)}
    assert by_role["trainer"]["command"] == ["python", "trainer.py"]
    assert by_role["trainer"]["image"] == "trainer:1"
    assert by_role["helper"]["command"] == ["python", "main.py"]
    assert by_role["helper"]["image"] == "base:2"


# -- the words and the run of a placement -----------------------------------------------------


def test_a_placement_is_told_in_words_on_the_job_and_its_timeline(bench: Bench) -> None:
    job = bench.place("wide", 16)
    row = bench.job(job)
    summary = "16 x H100-80GB on 2 host(s) inside rack r0 (host-[0-1])"
    assert row.explanation[0] == summary
    assert (row.reason, row.position, row.estimated_start, row.waiting) == ("", None, None, [])
    [placed] = bench.events(job, "placed")
    assert placed.message == f"placed: {summary}"
    assert placed.data == {"nodes": "host-[0-1]", "epoch": 1, "gpus": 16, "preempted": []}


def test_a_job_placed_again_says_it_resumes(bench: Bench) -> None:
    job = bench.place("train", 8)
    bench.start_all()
    [rep] = bench.replicas(job)
    bench.clock.advance(16.0)
    bench.beat_all(but=[rep.node])
    bench.settle()
    placed = bench.events(job, "placed")
    assert len(placed) == 2
    assert placed[-1].message.endswith("(resumes from its last checkpoint)")
    assert placed[-1].data["epoch"] == 2
    assert bench.replicas(job)[-1].spec["env"]["BOLT_RESTARTS"] == "1"


def test_a_bind_opens_a_run_priced_at_its_pool(tmp_path: Path) -> None:
    with Bench(tmp_path, hosts=0) as b:
        for i in range(2):
            b.register(f"p{i}", pool="paid", price_per_gpu_hour=2.5, price_per_vcpu_hour=0.5)
        job = b.place("paid", 16, cpus=4)
        with b.db.session() as s:
            [run] = s.scalars(select(RunRow).where(RunRow.job_id == job))
            assert (run.epoch, run.gpus, run.cpus, run.started_at) == (1, 16, 8.0, b.clock())
            assert run.dollars_per_hour == pytest.approx(16 * 2.5 + 8 * 0.5)
            assert (run.queue, run.team, run.ended_at) == ("research", "research", None)


# -- decisions about jobs that moved on -------------------------------------------------------


def world_now(bench: Bench) -> World:
    return load_world(bench.mirror, bench.clock(), Caches())


def apply_now(bench: Bench, result: CycleResult) -> Touched:
    world = world_now(bench)
    settings = Settings(str(bench.sched.settings.checkpoint_root))
    return bench.write(lambda s: apply(s, world, result, settings))


def test_evicting_a_job_that_no_longer_holds_gpus_changes_nothing(bench: Bench) -> None:
    job = bench.submit("waiting", 8)  # never placed
    touched = apply_now(bench, CycleResult(evictions=(Evict(job, "9", 0.0),)))
    assert touched == Touched(jobs={job})
    row = bench.job(job)
    assert (row.state, row.preemptions) == ("pending", 0)


def test_growing_a_job_with_no_allocation_changes_nothing(bench: Bench) -> None:
    job = bench.submit("waiting", 8)
    empty = Placement(job, (), CostBreakdown({}, 0.0))
    touched = apply_now(bench, CycleResult(resizes=(Resize(job, 2, empty),)))
    assert touched == Touched(jobs={job})
    assert bench.job(job).epoch == 0


def test_binding_a_job_that_no_longer_waits_changes_nothing(bench: Bench) -> None:
    job = bench.place("placed", 8)
    world = world_now(bench)
    grant = Grant("worker", 0, world.fleet.index["host-1"], tuple(range(8)))
    plan = RolePlan("worker", Level.HOST, "host-1", (grant,), CostBreakdown({}, 0.0), (), "H100")
    from boltforge.core.decisions import Bind

    again = Bind(job, Placement(job, (plan,), CostBreakdown({}, 0.0)))
    settings = bench.sched.settings
    touched = bench.write(lambda s: apply(s, world, CycleResult(binds=(again,)), settings))
    assert touched == Touched()
    assert bench.job(job).epoch == 1 and len(bench.replicas(job)) == 1


def test_reasons_are_written_only_for_jobs_that_still_wait(bench: Bench) -> None:
    placed = bench.place("placed", 8)
    waiting = bench.submit("waiting", 8)
    world = world_now(bench)
    waits = (
        Waiting(placed, 2, WaitReason.CAPACITY, ("stale",)),
        Waiting(waiting, 4, WaitReason.CAPACITY, ("no room",), 1234.0),
    )
    settings = bench.sched.settings
    bench.write(lambda s: apply(s, world, CycleResult(waiting=waits), settings))
    row = bench.job(waiting)
    assert (row.reason, row.position, row.estimated_start, row.waiting) == (
        "capacity",
        4,
        1234.0,
        ["no room"],
    )
    assert bench.mirror.jobs[waiting].reason == "capacity"  # the mirror heard of it
    assert bench.job(placed).reason == ""


def test_an_incremental_reason_leaves_the_place_in_line_to_full_passes(bench: Bench) -> None:
    waiting = bench.submit("waiting", 8)
    world = world_now(bench)
    settings = bench.sched.settings
    first = (Waiting(waiting, 3, WaitReason.CAPACITY, ("a",)),)
    bench.write(lambda s: apply(s, world, CycleResult(waiting=first), settings))
    world = world_now(bench)
    later = (Waiting(waiting, -1, WaitReason.TOPOLOGY, ("b",)),)
    bench.write(lambda s: apply(s, world, CycleResult(waiting=later), settings))
    row = bench.job(waiting)
    assert (row.reason, row.position, row.waiting) == ("topology", 3, ["b"])


# -- in-place resizes and closing runs --------------------------------------------------------


def test_a_resize_of_a_scheduled_job_starts_a_new_epoch_without_leaving_scheduled(
    bench: Bench,
) -> None:
    job = bench.place("elastic", 8)
    world = world_now(bench)
    grants = [Grant("worker", 0, world.fleet.index["host-1"], tuple(range(8)))]
    settings = bench.sched.settings

    def resize(s: Any) -> Touched:
        row = s.get(JobRow, job)
        reps = list(s.scalars(select(ReplicaRow).where(ReplicaRow.job_id == job)))
        return actuate.resize(s, world, row, reps, grants, settings, "grown", "grown", {"x": 1})

    touched = bench.write(resize)
    assert touched.jobs == {job}
    row = bench.job(job)
    assert (row.state, row.epoch, row.resized_at) == ("scheduled", 2, bench.clock())
    states = {r.id: r.state for r in bench.replicas(job)}
    assert states == {f"{job}.1.0": "stopping", f"{job}.2.0": "waiting"}
    [entry] = bench.events(job, "grown")
    assert entry.message == "grown: 8 GPU(s) on 1 host(s); restarts from its checkpoint"
    assert entry.data == {"x": 1, "nodes": "host-1", "epoch": 2, "gpus_now": 8}


def test_closing_a_run_counts_its_gpu_seconds_and_keeps_a_checkpoint_within_it(
    bench: Bench,
) -> None:
    job = bench.place("train", 8)
    start = bench.clock()

    def close(s: Any) -> None:
        row = s.get(JobRow, job)
        row.last_checkpoint_at = start + 30.0
        actuate.close_run(s, row, start + 100.0)
        actuate.close_run(s, row, start + 500.0)  # no open run left: nothing more

    bench.write(close)
    row = bench.job(job)
    assert row.attained_gpu_s == 8 * 100.0
    with bench.db.session() as s:
        [run] = s.scalars(select(RunRow).where(RunRow.job_id == job))
        assert (run.ended_at, run.checkpoint_at) == (start + 100.0, start + 30.0)


def test_a_checkpoint_from_before_the_run_is_not_the_runs(bench: Bench) -> None:
    job = bench.place("train", 8)
    start = bench.clock()

    def close(s: Any) -> None:
        row = s.get(JobRow, job)
        row.last_checkpoint_at = start - 1.0
        actuate.close_run(s, row, start + 10.0)

    bench.write(close)
    with bench.db.session() as s:
        [run] = s.scalars(select(RunRow).where(RunRow.job_id == job))
        assert run.checkpoint_at is None


def test_finishing_a_stop_in_the_state_the_job_is_in_adds_no_entry(bench: Bench) -> None:
    job = bench.submit("waiting", 8)
    before = len(bench.events(job))

    def finish(s: Any) -> None:
        actuate.finish_stop(s, s.get(JobRow, job), bench.clock(), "pending", "nothing")

    bench.write(finish)
    assert len(bench.events(job)) == before


def test_reading_no_jobs_reads_nothing(bench: Bench) -> None:
    assert bench.write(lambda s: actuate.read_jobs(s, [])) == []
