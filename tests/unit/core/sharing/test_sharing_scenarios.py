"""Shares of GPUs through the scheduling cycle: MIG instances pack into valid geometries on
GPUs already cut the right way, re-carves happen only on idle GPUs, fractions stay within
their GPU, and shared GPUs never hold an exclusive job."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.decisions import Reserve, WaitReason
from boltforge.core.model.gang import Capability, Gang, Role
from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import Job, Running
from boltforge.core.placement.place import place_gang
from boltforge.core.policy import POLICIES
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.sharing import mig
from boltforge.core.sharing.place import carve_now
from boltforge.core.sharing.share import ShareAsk
from boltforge.testing.builders import make_fleet, make_gang, make_pool

POLICY = POLICIES["default"]
CUT_SMALL = replace(make_pool("a100", "A100-80GB"), mig=True, mig_layout=("1g.10gb",) * 7)
PLAIN = make_pool("h100", "H100-80GB")


def fleet(*pools: object) -> TopologyTree:
    return make_fleet(racks=1, hosts=2, pools=list(pools) or [CUT_SMALL])  # type: ignore[arg-type]


def shared(name: str, ask: ShareAsk, replicas: int = 1, pools: tuple[str, ...] = ()) -> Job:
    role = Role("worker", replicas, 0, capability=Capability(pools=frozenset(pools)), share=ask)
    return Job(name, Gang(name, (role,), team="lab", priority=2), "lab", 0.0)


def whole(name: str, gpus: int) -> Job:
    base = make_gang(name, gpus=gpus, per_node=min(gpus, 8))
    return Job(name, Gang(name, base.roles, team="lab", priority=3), "lab", 0.0)


class Fleet:
    """A fleet whose cycles start the jobs they bind (nothing ends unless told)."""

    def __init__(self, tree: TopologyTree) -> None:
        self.state = FleetState(tree)
        self.running: dict[str, Running] = {}
        self.notes: dict[str, tuple[str, ...]] = {}

    def submit(self, *jobs: Job) -> dict[str, str]:
        """Run one cycle with ``jobs`` pending; the reason each waiting job waits."""
        snap = Snapshot(self.state.copy(), jobs, tuple(self.running.values()), 0.0)
        result = run_cycle(snap, POLICY)
        by_id = {j.id: j for j in jobs}
        for bind in result.binds:
            allocation = bind.placement.allocation(None, by_id[bind.job].priority)
            self.state.allocate(allocation)
            self.running[bind.job] = Running(by_id[bind.job], allocation, 0.0)
            self.notes[bind.job] = bind.placement.notes
        return {w.job: w.reason for w in result.waiting}

    def end(self, job: str) -> None:
        self.state.release(job)
        del self.running[job]

    def share_of(self, job: str) -> tuple[int, int, mig.Instance | float]:
        (grant,) = self.running[job].allocation.grants
        assert grant.share is not None
        s = grant.share
        return grant.host, s.gpu, s.instance if s.profile else s.fraction


def test_small_instances_fill_a_gpu_already_cut_that_way_before_another() -> None:
    lab = Fleet(fleet())
    waits = lab.submit(*(shared(f"nb{i}", ShareAsk("1g.10gb")) for i in range(8)))
    assert waits == {}
    gpus = [lab.share_of(f"nb{i}")[:2] for i in range(8)]
    assert len(set(gpus[:7])) == 1 and gpus[7] != gpus[0]
    assert "already cut that way" in lab.notes["nb0"][0]
    assert lab.state.free_gpus == 16 - 2


def test_a_bigger_profile_re_carves_an_idle_gpu_and_leaves_busy_ones_alone() -> None:
    lab = Fleet(fleet())
    lab.submit(shared("nb", ShareAsk("1g.10gb")))
    lab.submit(shared("infer", ShareAsk("3g.40gb")))
    host, gpu, inst = lab.share_of("infer")
    assert (host, gpu) != lab.share_of("nb")[:2]
    assert inst == mig.Instance(4, "3g.40gb") or inst == mig.Instance(0, "3g.40gb")
    assert "re-carves the idle GPU (was 1g.10gb@0" in lab.notes["infer"][0]
    busy = lab.state.shared[lab.share_of("nb")[:2]]
    assert busy.instances == (mig.Instance(0, "1g.10gb"),)


def test_a_new_instance_goes_into_unused_slices_beside_running_ones() -> None:
    lab = Fleet(fleet(replace(CUT_SMALL, mig_layout=())))
    lab.submit(shared("a", ShareAsk("3g.40gb")))
    lab.submit(shared("b", ShareAsk("3g.40gb")))
    assert lab.share_of("a")[:2] == lab.share_of("b")[:2]
    assert "unused slices" in lab.notes["b"][0] and "untouched" in lab.notes["b"][0]
    carve = lab.state.shared[lab.share_of("a")[:2]].instances
    assert mig.valid("A100-80GB", carve) and len(carve) == 2


def test_fractions_share_a_gpu_up_to_its_whole_and_its_memory() -> None:
    lab = Fleet(fleet(PLAIN))
    jobs = [shared(f"q{i}", ShareAsk(fraction=0.25)) for i in range(4)]
    lab.submit(*jobs)
    lab.submit(shared("big", ShareAsk(fraction=0.5, memory_gb=60)))
    quarter = {lab.share_of(f"q{i}")[:2] for i in range(4)}
    assert len(quarter) == 1 and lab.share_of("big")[:2] not in quarter
    use = lab.state.shared[quarter.pop()]
    assert use.fraction == 1.0 and use.memory_gb == 80.0


def test_shared_gpus_never_hold_an_exclusive_job_and_come_back_when_emptied() -> None:
    lab = Fleet(make_fleet(racks=1, hosts=1, pools=[PLAIN]))
    lab.submit(shared("nb", ShareAsk(fraction=0.1)))
    assert lab.submit(whole("train", 8)) == {"train": WaitReason.CAPACITY}
    lab.submit(whole("seven", 7))
    (grant,) = lab.running["seven"].allocation.grants
    assert lab.share_of("nb")[1] not in grant.gpus
    lab.end("nb")
    assert lab.state.shared == {} and lab.state.free_gpus == 1


def test_a_profile_no_pool_offers_never_fits_and_says_why() -> None:
    lab = Fleet(fleet(PLAIN))
    assert lab.submit(shared("x", ShareAsk("3g.40gb"))) == {"x": WaitReason.NEVER}
    lab2 = Fleet(fleet(CUT_SMALL))
    assert lab2.submit(shared("y", ShareAsk("1g.5gb"))) == {"y": WaitReason.NEVER}
    assert lab2.submit(shared("z", ShareAsk(fraction=0.5, memory_gb=96))) == {"z": WaitReason.NEVER}


def test_a_gang_of_shares_starts_whole_or_not_at_all() -> None:
    lab = Fleet(make_fleet(racks=1, hosts=1, pools=[replace(CUT_SMALL, mig_layout=())]))
    assert lab.submit(shared("fleet-of-9", ShareAsk("4g.40gb"), replicas=9)) == {
        "fleet-of-9": WaitReason.CAPACITY
    }
    assert lab.state.shared == {} and lab.state.free_gpus == 8
    assert lab.submit(shared("eight", ShareAsk("4g.40gb"), replicas=8)) == {}


ASKS = st.sampled_from(
    [
        ShareAsk("1g.10gb"),
        ShareAsk("1g.20gb"),
        ShareAsk("2g.20gb"),
        ShareAsk("3g.40gb"),
        ShareAsk("4g.40gb"),
        ShareAsk("7g.80gb"),
        ShareAsk(fraction=0.3),
        ShareAsk(fraction=0.5, memory_gb=20),
    ]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(ASKS, st.booleans(), st.integers(0, 3)), min_size=1, max_size=25))
def test_any_sequence_of_shares_and_ends_keeps_every_gpu_valid(
    steps: list[tuple[ShareAsk, bool, int]],
) -> None:
    tree = fleet(CUT_SMALL, replace(CUT_SMALL, name="bare", mig_layout=()))
    lab = Fleet(tree)
    for n, (ask, end_one, exclusive) in enumerate(steps):
        if end_one and lab.running:
            lab.end(sorted(lab.running)[n % len(lab.running)])
        before = dict(lab.state.shared)
        jobs = [shared(f"s{n}", ask)] + ([whole(f"w{n}", exclusive * 2)] if exclusive else [])
        lab.submit(*jobs)
        if f"s{n}" in lab.running and ask.profile:
            host, gpu, inst = lab.share_of(f"s{n}")
            if (host, gpu) in before:  # a GPU with work: an idle instance, or unused slices
                cut = carve_now(tree.pool_of(host), before[(host, gpu)])
                assert isinstance(inst, mig.Instance)
                new = set(inst.slices("A100-80GB"))
                assert inst in cut or not mig.used_slices("A100-80GB", cut) & new
        _check(lab)


def _check(lab: Fleet) -> None:
    exclusive = {
        (g.host, gpu) for r in lab.running.values() for g in r.allocation.grants for gpu in g.gpus
    }
    for (host, gpu), use in lab.state.shared.items():
        assert (host, gpu) not in exclusive and not lab.state.free[host, gpu]
        assert len({s.mode for _, s in use.shares}) == 1
        if use.mode == "mig":
            assert mig.valid("A100-80GB", use.instances)
        else:
            assert use.fraction <= 1 + 1e-9 and use.memory_gb <= 80 + 1e-9
    held = len(exclusive) + len(lab.state.shared)
    assert lab.state.free_gpus == 32 - held


def running_low(lab: Fleet, name: str, gpus: int = 8) -> None:
    """A batch-class training job started on the fleet: preemptible, checkpointing."""
    job = whole(name, gpus)
    lab.submit(job)
    assert name in lab.running


# One 8-GPU host: let a preemption take all of it (the default churn budget, 5% of the
# fleet's GPUs per 10 minutes, rounds down to none here).
WHOLE_HOST = POLICY.with_preempt_rules(PreemptRules(min_runtime_s=0.0, churn_fraction=1.0))


def test_a_serving_share_preempts_batch_training_for_one_gpu() -> None:
    lab = Fleet(make_fleet(racks=1, hosts=1, pools=[CUT_SMALL]))
    running_low(lab, "train")
    role = Role("server", 1, 0, share=ShareAsk("3g.40gb"))
    serving = Job("infer", Gang("infer", (role,), team="lab", priority=0), "lab", 0.0)
    snap = Snapshot(lab.state.copy(), (serving,), tuple(lab.running.values()), 3600.0)
    result = run_cycle(snap, WHOLE_HOST)
    assert [e.job for e in result.evictions] == ["train"]
    [bind] = result.binds
    [grant] = bind.placement.grants
    assert grant.share is not None and grant.share.profile == "3g.40gb"
    assert any("re-carves" in n or "already cut" in n for n in bind.placement.notes)


def test_a_share_of_the_same_class_waits_rather_than_bump_anyone() -> None:
    lab = Fleet(make_fleet(racks=1, hosts=1, pools=[CUT_SMALL]))
    running_low(lab, "train")
    role = Role("worker", 1, 0, share=ShareAsk("1g.10gb"))
    notebook = Job("nb", Gang("nb", (role,), team="lab", priority=3), "lab", 0.0)
    snap = Snapshot(lab.state.copy(), (notebook,), tuple(lab.running.values()), 3600.0)
    result = run_cycle(snap, WHOLE_HOST)
    assert result.evictions == () and result.binds == ()
    assert [w.reason for w in result.waiting] == [WaitReason.CAPACITY]


def test_a_share_stays_off_a_host_reserved_for_a_start_it_would_delay() -> None:
    tree = make_fleet(racks=1, hosts=2, pools=[PLAIN])
    lab = Fleet(tree)
    running_low(lab, "busy")  # one host full; the other free but promised
    free_host = 1 - lab.running["busy"].allocation.grants[0].host
    big = whole("big", 16)
    promised = place_gang(FleetState(tree), big.gang)[0]
    assert promised is not None
    reserve = Reserve("big", 600.0, promised, frozenset({free_host}))
    snap = Snapshot(
        lab.state.copy(), (shared("nb", ShareAsk(fraction=0.25)),), tuple(lab.running.values()), 0.0
    )
    result = run_cycle(snap, POLICY, reservations=(reserve,))
    assert result.binds == () and [w.job for w in result.waiting] == ["nb"]
