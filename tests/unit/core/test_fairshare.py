"""Fair-share scenarios as data (factor, DRF, job order) and their invariants."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest
from fairshare_reference import dominant_share, job_resources, order_key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.workload import (
    BATCH,
    INTERACTIVE,
    PRODUCTION,
    SERVING,
    Job,
    Usage,
)
from boltforge.core.queueing.fairshare import (
    DEFAULT_HALF_LIFE_S,
    URGENT_SLACK_S,
    Resources,
    fair_share_factor,
    normalized_share,
    order,
)
from boltforge.core.queueing.quota import ANY, QueueSpec, QuotaTree, held_by, lineage
from boltforge.core.queueing.shortest import SizeRule, rank

H = DEFAULT_HALF_LIFE_S
HOUR = 3600.0
CLUSTER: Resources = (1024.0, 32768.0, 262144.0)


def tree(*queues: str | tuple[str, float]) -> QuotaTree:
    """Queues by path, each with weight 1 unless given as ``(path, weight)``."""
    specs = [QueueSpec(q) if isinstance(q, str) else QueueSpec(q[0], weight=q[1]) for q in queues]
    return QuotaTree.build(specs)


def job(
    id: str,
    queue: str = "org/nlp",
    priority: int = BATCH,
    gpus: int = 8,
    submit: float = 0.0,
    deadline: float | None = None,
    runtime: float | None = None,
    cpus: float = 0.0,
    memory_gb: float = 0.0,
) -> Job:
    """A one-role job of ``gpus`` GPUs (and ``cpus`` and ``memory_gb`` in total)."""
    role = Role("worker", 1, gpus, cpus, memory_gb)
    gang = Gang(id, (role,), priority=priority)
    return Job(id, gang, queue, submit, estimate=runtime, deadline=deadline)


def used(by_queue: dict[str, float] | None = None) -> Usage:
    """Usage per queue as of time 0 (``""`` is the root: the cluster's total)."""
    return Usage(dict(by_queue or {}), 0.0)


def rolled_up(by_leaf: dict[str, float]) -> Usage:
    """Usage charged as the meter charges it: to each queue and every queue above it."""
    out: dict[str, float] = {}
    for leaf, amount in by_leaf.items():
        for q in lineage(leaf):
            out[q] = out.get(q, 0.0) + amount
    return Usage(out, 0.0)


# ------------------------------------------------------------------------------ fair-share factor

TEAMS = tree("a", "b", "c")
ORG = tree("org/nlp", "org/cv", "lab")


@dataclass(frozen=True)
class Factor:
    """The fair-share factor ``queue`` must get."""

    id: str
    tree: QuotaTree
    usage: Usage
    queue: str
    expect: float
    capacity_gpus: float = 1024.0


FACTORS = [
    Factor("an unused queue has factor 1", TEAMS, used({"a": 50, "": 50}), "b", 1.0),
    Factor(
        "a queue at its share has factor one half",
        TEAMS,
        used({"a": 1, "b": 1, "c": 1, "": 3}),
        "a",
        0.5,
    ),
    Factor(
        "a queue at twice its share has factor one quarter",
        TEAMS,
        used({"a": 2, "b": 1, "": 3}),
        "a",
        0.25,
    ),
    Factor(
        "weights set the share: weight 3 of 4 at 75% usage is at its share",
        tree(("a", 3.0), "b"),
        used({"a": 75, "b": 25, "": 100}),
        "a",
        0.5,
    ),
    Factor(
        "shares multiply down the path: half of an org that has half the cluster",
        ORG,
        used({"org/nlp": 25, "org": 25, "": 100}),
        "org/nlp",
        0.5,
    ),
    Factor(
        "an unknown project is judged as its team",
        ORG,
        used({"org/nlp": 25, "org": 25, "": 100}),
        "org/nlp/new",
        0.5,
    ),
    Factor("with no usage anywhere every queue has factor 1", ORG, used(), "lab", 1.0),
    Factor(
        "with no total recorded, usage counts against a full cluster for one half-life",
        tree("a", "b"),
        used({"a": 10.0 * H / 2}),
        "a",
        0.5,
        capacity_gpus=10.0,
    ),
]


@pytest.mark.parametrize("case", FACTORS, ids=[c.id for c in FACTORS])
def test_fair_share_factor(case: Factor) -> None:
    got = fair_share_factor(case.tree, case.usage, case.queue, case.capacity_gpus)
    assert got == pytest.approx(case.expect)


def test_a_queue_that_used_twice_its_share_gets_about_half_the_factor() -> None:
    usage = used({"a": 2.0, "b": 1.0, "": 3.0})
    twice, at_share = (fair_share_factor(TEAMS, usage, q, 1024.0) for q in ("a", "b"))
    assert twice / at_share == pytest.approx(0.5)


def test_normalized_shares_of_siblings_sum_to_their_parents() -> None:
    t = tree(("org/nlp", 2.0), "org/cv", ("lab", 3.0))
    assert normalized_share(t, "org") == pytest.approx(0.25)
    assert normalized_share(t, "org/nlp") + normalized_share(t, "org/cv") == pytest.approx(0.25)
    assert normalized_share(t, "") == 1.0


# --------------------------------------------------------------------------------------- DRF


DOMINANT = [
    pytest.param((8, 16, 128), (64, 1024, 8192), 0.125, id="a GPU-heavy job is dominated by GPUs"),
    pytest.param((1, 512, 128), (64, 1024, 8192), 0.5, id="a CPU-heavy job is dominated by CPUs"),
    pytest.param((1, 8, 6144), (64, 1024, 8192), 0.75, id="a memory-heavy job by memory"),
    pytest.param((0, 8, 0), (0, 1024, 8192), 1 / 128, id="a resource the cluster lacks is ignored"),
    pytest.param((1, 0, 0), (0, 1024, 8192), math.inf, id="asking for a missing resource is inf"),
    pytest.param((0, 0, 0), (64, 1024, 8192), 0.0, id="asking for nothing is a zero share"),
]


@pytest.mark.parametrize(("demand", "capacity", "expect"), DOMINANT)
def test_dominant_share(demand: Resources, capacity: Resources, expect: float) -> None:
    assert dominant_share(demand, capacity) == pytest.approx(expect)


def test_dominant_share_refuses_negative_amounts() -> None:
    with pytest.raises(ValueError, match="negative"):
        dominant_share((-1.0, 0.0, 0.0), CLUSTER)


# ------------------------------------------------------------------------------------- order

NOW = 100 * HOUR


@dataclass(frozen=True)
class Ordering:
    """Pending ``jobs`` and the order (by id) they must be considered in."""

    id: str
    jobs: tuple[Job, ...]
    expect: tuple[str, ...]
    tree: QuotaTree = ORG
    usage: Usage = field(default_factory=Usage)
    held: dict[str, dict[str, int]] = field(default_factory=dict)


ORDERINGS = [
    Ordering(
        "serving class always orders before batch",
        (
            job("batch", submit=0.0, deadline=NOW, runtime=HOUR),
            job("serve", "lab", SERVING, submit=NOW),
        ),
        ("serve", "batch"),
        usage=used({"lab": 1000, "": 1000}),
    ),
    Ordering(
        "classes order production, interactive, batch",
        (job("b", priority=BATCH), job("i", priority=INTERACTIVE), job("p", priority=PRODUCTION)),
        ("p", "i", "b"),
    ),
    Ordering(
        "a job near its deadline goes first within its class",
        (
            job("relaxed", submit=0.0),
            job("due", submit=50.0, deadline=NOW + 2 * HOUR, runtime=1.5 * HOUR),
        ),
        ("due", "relaxed"),
    ),
    Ordering(
        "among urgent jobs the one with least slack goes first",
        (
            job("half-hour", submit=0.0, deadline=NOW + 0.5 * HOUR),
            job("ten-minutes", submit=1.0, deadline=NOW + 600.0),
        ),
        ("ten-minutes", "half-hour"),
    ),
    Ordering(
        "an overdue job still counts as urgent",
        (job("fresh", submit=0.0), job("late", submit=9.0, deadline=NOW - HOUR)),
        ("late", "fresh"),
    ),
    Ordering(
        "a distant deadline gives no urgency",
        (job("first", submit=0.0), job("later", submit=1.0, deadline=NOW + 30 * HOUR)),
        ("first", "later"),
    ),
    Ordering(
        "a queue under its share orders before one over it",
        (job("heavy", "org/nlp", submit=0.0), job("light", "lab", submit=5.0)),
        ("light", "heavy"),
        usage=used({"org/nlp": 90, "org": 90, "lab": 10, "": 100}),
    ),
    Ordering(
        "within one queue a big job keeps its place ahead of later small ones",
        (job("big", "lab", gpus=64, submit=0.0), job("small", "lab", gpus=8, submit=1.0)),
        ("big", "small"),
    ),
    Ordering(
        "with equal fair share a queue holding many GPUs orders after an idle one",
        (job("busy", "org/nlp", submit=0.0), job("idle", "org/cv", submit=1.0)),
        ("idle", "busy"),
        held={"org/nlp": {"h100": 256}},
    ),
    Ordering(
        "CPUs count in the dominant share",
        (job("cpu-heavy", cpus=16384.0, submit=0.0), job("gpu-only", submit=1.0)),
        ("gpu-only", "cpu-heavy"),
    ),
    Ordering(
        "earlier submission wins when all else ties",
        (job("second", submit=2.0), job("first", submit=1.0)),
        ("first", "second"),
    ),
    Ordering(
        "the job id breaks the final tie",
        (job("b", submit=1.0), job("a", submit=1.0)),
        ("a", "b"),
    ),
]


@pytest.mark.parametrize("case", ORDERINGS, ids=[c.id for c in ORDERINGS])
def test_order(case: Ordering) -> None:
    got = order(case.jobs, case.tree, case.usage, CLUSTER, NOW, case.held)
    assert tuple(j.id for j in got) == case.expect


def test_an_unknown_runtime_counts_as_zero_in_the_slack() -> None:
    near = job("near", deadline=NOW + URGENT_SLACK_S - 1.0)
    far = job("far", deadline=NOW + URGENT_SLACK_S)
    assert order_key(near, 1.0, 0.0, NOW)[1] == 0
    assert order_key(far, 1.0, 0.0, NOW)[1] == 1


def test_order_refuses_duplicate_ids() -> None:
    with pytest.raises(ValueError, match="unique"):
        order([job("x"), job("x")], ORG, Usage(), CLUSTER, NOW, {})


# ------------------------------------------------------------------------------------ properties

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUEUES = ("org/nlp", "org/cv", "org/nlp/llm", "lab", "unknown")
amounts = st.floats(0.0, 1e9, allow_nan=False)
usages = st.dictionaries(st.sampled_from(("org", *QUEUES)), amounts).map(rolled_up)
times = st.floats(0.0, 10 * H, allow_nan=False)


@EXAMPLES
@given(usages, st.sampled_from(QUEUES), st.floats(0.0, 1e9))
def test_the_factor_lies_in_0_1_and_falls_as_a_queue_uses_more(
    usage: Usage, queue: str, extra: float
) -> None:
    t = ORG
    base = fair_share_factor(t, usage, queue, 1024.0)
    more = dict(usage.by_queue)
    for q in t.ancestors(queue):
        more[q] = more.get(q, 0.0) + extra
    after = fair_share_factor(t, Usage(more, 0.0), queue, 1024.0)
    assert 0.0 <= after <= base <= 1.0


@st.composite
def pending(draw: st.DrawFn) -> list[Job]:
    """Jobs with unique ids and random class, queue, size, submit time and deadline."""
    out = []
    for i in range(draw(st.integers(0, 12))):
        deadline = draw(st.none() | st.floats(NOW - HOUR, NOW + 4 * HOUR))
        out.append(
            job(
                f"j{i}",
                draw(st.sampled_from(QUEUES)),
                draw(st.integers(SERVING, BATCH)),
                draw(st.sampled_from((1, 8, 64))),
                float(draw(st.integers(0, 5))),
                deadline,
                draw(st.none() | st.sampled_from((600.0, HOUR))),
                draw(st.sampled_from((0.0, 512.0))),
            )
        )
    return out


@EXAMPLES
@given(pending(), usages, st.randoms(use_true_random=False))
def test_order_is_a_deterministic_total_order(
    jobs: list[Job], usage: Usage, rnd: random.Random
) -> None:
    held = {"org/nlp": {"h100": 64}, "lab": {"a100": 8}}
    first = order(jobs, ORG, usage, CLUSTER, NOW, held)
    shuffled = list(jobs)
    rnd.shuffle(shuffled)
    assert order(shuffled, ORG, usage, CLUSTER, NOW, held) == first
    assert sorted(j.id for j in first) == sorted(j.id for j in jobs)
    classes = [j.priority for j in first]
    assert classes == sorted(classes)


@EXAMPLES
@given(pending(), usages, st.sampled_from((None, SizeRule(32 * HOUR, 0.5))))
def test_order_sorts_by_the_order_key(jobs: list[Job], usage: Usage, size: SizeRule | None) -> None:
    """``order`` computes its keys for all jobs at once; they sort as ``order_key`` does."""
    held = {"org/nlp": {"h100": 64}, "lab": {"a100": 8}}

    def key(j: Job) -> tuple[object, ...]:
        factor = fair_share_factor(ORG, usage, j.queue, CLUSTER[0])
        queue_gpus = float(sum(held_by(held, j.queue).values()))
        _, cpus, memory = job_resources(j)
        dominant = dominant_share((queue_gpus, cpus, memory), CLUSTER)
        size_rank = None if size is None else rank(j, factor, NOW, size)
        return order_key(j, factor, dominant, NOW, size_rank)

    expected = sorted(jobs, key=key)
    assert order(jobs, ORG, usage, CLUSTER, NOW, held, size=size) == expected


def test_guarantees_do_not_change_shares() -> None:
    t = QuotaTree.build([QueueSpec("a", {ANY: 96}), QueueSpec("b", {ANY: 32})])
    assert normalized_share(t, "a") == normalized_share(t, "b") == 0.5


@EXAMPLES
@given(pending(), usages, st.sampled_from((None, SizeRule(32 * HOUR, 0.5))))
def test_order_given_arrival_order_is_the_order_of_any_permutation(
    jobs: list[Job], usage: Usage, size: SizeRule | None
) -> None:
    """``arrived=True`` skips the sort by id; ties still end by submit time, then id."""
    held = {"org/nlp": {"h100": 64}, "lab": {"a100": 8}}
    by_arrival = sorted(jobs, key=lambda j: (j.submit_time, j.id))
    expected = order(jobs, ORG, usage, CLUSTER, NOW, held, size=size)
    assert order(by_arrival, ORG, usage, CLUSTER, NOW, held, size=size, arrived=True) == expected
