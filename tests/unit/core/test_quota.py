"""Quota scenarios as data (admission, borrowing, reclaim, validation) and their invariants."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boltforge.core.queueing.quota import (
    ANY,
    QueueSpec,
    QuotaError,
    QuotaTree,
    admit,
    borrowing,
    held_by,
    reclaimable_for,
)

Quota = dict[str, int]
Row = tuple[str, Quota] | tuple[str, Quota, Quota] | tuple[str, Quota, Quota, float]
Holdings = dict[str, dict[str, int]]


def spec(row: Row) -> QueueSpec:
    """``(path, guaranteed[, burst[, weight]])`` as a queue spec."""
    path, guaranteed, *rest = row
    burst = rest[0] if rest else {}
    weight = rest[1] if len(rest) > 1 else 1.0
    assert isinstance(burst, dict) and isinstance(weight, float)
    return QueueSpec(path, guaranteed, burst, weight)


def tree(*rows: Row) -> QuotaTree:
    """``tree(("org", {"*": 64}), ("org/nlp", {"*": 32}, {"h100": 64}))``."""
    return QuotaTree.build([spec(r) for r in rows])


ORG = tree(("org", {ANY: 64}), ("org/nlp", {ANY: 32}, {"h100": 64}), ("org/cv", {}))


# ---------------------------------------------------------------------------------- admission


@dataclass(frozen=True)
class Admit:
    """A job of ``queue`` asks for ``demand`` on top of ``held``; the verdict it must get."""

    id: str
    tree: QuotaTree
    queue: str
    demand: Quota
    held: Holdings = field(default_factory=dict)
    ok: bool = True
    borrowed: int = 0
    reason: tuple[str, ...] = ()


ADMISSIONS = [
    Admit(
        "a team within its guarantee starts without borrowing",
        ORG,
        "org/nlp",
        {"h100": 16},
        held={"org/nlp": {"h100": 16}},
        reason=("fits within the guarantee of queue org/nlp",),
    ),
    Admit(
        "a team past its guarantee borrows only the GPUs beyond it",
        ORG,
        "org/nlp",
        {"h100": 16},
        held={"org/nlp": {"h100": 24}},
        borrowed=8,
        reason=("8 of its 16 GPU(s) are borrowed beyond the guarantee of queue org/nlp",),
    ),
    Admit(
        "a team over its burst is refused and told which limit",
        ORG,
        "org/nlp",
        {"h100": 48},
        held={"org/nlp": {"h100": 48}},
        ok=False,
        borrowed=48,
        reason=(
            "queue org/nlp would hold 96 GPUs of pool h100, above its burst limit of 64.",
            "To fix: wait for its running jobs, or raise burst for org/nlp",
        ),
    ),
    Admit(
        "a job that reaches its team's burst limit exactly starts",
        ORG,
        "org/nlp",
        {"h100": 16},
        held={"org/nlp": {"h100": 48}},
        borrowed=16,
    ),
    Admit(
        "an org's burst refuses a job its team would allow and names the org",
        tree(("org", {ANY: 64}, {ANY: 80}), ("org/nlp", {ANY: 32}), ("org/cv", {ANY: 32})),
        "org/nlp",
        {"h100": 32},
        held={"org/cv": {"a100": 64}},
        ok=False,
        reason=(
            "queue org (which org/nlp belongs to) would hold 96 GPUs across all pools,"
            " above its burst limit of 80 for all pools together",
            "raise burst for org",
        ),
    ),
    Admit(
        "the root's burst caps the whole cluster",
        tree(("", {}, {"h100": 100}), ("org", {}), ("lab", {})),
        "org",
        {"h100": 8},
        held={"lab": {"h100": 96}},
        ok=False,
        borrowed=8,
        reason=("the root queue (which org belongs to) would hold 104 GPUs of pool h100",),
    ),
    Admit(
        "a burst limit on another pool does not limit this pool",
        tree(("org/nlp", {}, {"a100": 8})),
        "org/nlp",
        {"h100": 16},
        borrowed=16,
    ),
    Admit(
        "holdings already over a lowered burst do not block a job in another pool",
        tree(("org/nlp", {}, {"h100": 16})),
        "org/nlp",
        {"a100": 8},
        held={"org/nlp": {"h100": 32}},
        borrowed=8,
    ),
    Admit(
        "a queue with no guarantee on its path borrows every GPU",
        tree(("org/nlp", {})),
        "org/nlp",
        {"h100": 8},
        borrowed=8,
        reason=("beyond the guarantee of the root queue",),
    ),
    Admit(
        "a project without its own guarantee shares its team's",
        tree(("org/nlp", {ANY: 32}), ("org/nlp/llm", {}), ("org/nlp/asr", {})),
        "org/nlp/llm",
        {"h100": 16},
        held={"org/nlp/asr": {"h100": 24}},
        borrowed=8,
        reason=("beyond the guarantee of queue org/nlp",),
    ),
    Admit(
        "a team using GPUs its sibling is guaranteed borrows them",
        ORG,
        "org/cv",
        {"h100": 8},
        held={"org/cv": {"h100": 32}},
        borrowed=8,
        reason=("beyond the guarantee of queue org",),
    ),
    Admit(
        "a sibling's borrowing does not eat into a team's own guarantee",
        ORG,
        "org/nlp",
        {"h100": 32},
        held={"org/cv": {"h100": 64}},
    ),
    Admit(
        "a pool-specific guarantee does not cover another pool",
        tree(("org/nlp", {"h100": 32})),
        "org/nlp",
        {"a100": 8},
        borrowed=8,
    ),
    Admit(
        "an any-pool guarantee is counted over all pools together",
        tree(("org/nlp", {ANY: 32})),
        "org/nlp",
        {"a100": 16},
        held={"org/nlp": {"h100": 24}},
        borrowed=8,
    ),
    Admit(
        "a pool's own guarantee is used before the any-pool guarantee",
        tree(("org/nlp", {"h100": 16, ANY: 8})),
        "org/nlp",
        {"h100": 8, "a100": 8},
        held={"org/nlp": {"h100": 16}},
        borrowed=8,
    ),
    Admit(
        "an unknown project is charged to its team and told the team's limit",
        ORG,
        "org/nlp/new",
        {"h100": 40},
        held={"org/nlp": {"h100": 32}},
        ok=False,
        borrowed=40,
        reason=("queue org/nlp (which org/nlp/new belongs to) would hold 72 GPUs of pool h100",),
    ),
]


@pytest.mark.parametrize("case", ADMISSIONS, ids=[c.id for c in ADMISSIONS])
def test_admission(case: Admit) -> None:
    verdict = admit(case.tree, case.held, case.queue, case.demand)
    assert (verdict.ok, verdict.borrowed) == (case.ok, case.borrowed), verdict.reason
    for text in case.reason:
        assert text in verdict.reason


def test_a_refusal_ends_with_what_to_do() -> None:
    verdict = admit(ORG, {"org/nlp": {"h100": 60}}, "org/nlp", {"h100": 8})
    assert verdict.reason.rpartition(". ")[2].startswith("To fix: ")


@pytest.mark.parametrize("demand", [{"h100": -1}, {ANY: 8}], ids=["negative GPUs", "no pool named"])
def test_a_demand_must_name_pools_with_whole_gpus(demand: Quota) -> None:
    with pytest.raises(ValueError, match="must name pools"):
        admit(ORG, {}, "org/nlp", demand)


# --------------------------------------------------------------------------------- validation


@dataclass(frozen=True)
class Invalid:
    """Specs the tree must refuse, and what its message must say."""

    id: str
    rows: tuple[Row, ...]
    says: tuple[str, ...]


INVALID = [
    Invalid(
        "sub-team guarantees summing above their org's are refused with the shortfall",
        (("org", {"h100": 64}), ("org/a", {"h100": 40}), ("org/b", {"h100": 30})),
        (
            "queue org guarantees h100 64",
            "guaranteed 6 GPU(s) more than that: org/a (h100 40), org/b (h100 30)",
            "To fix: lower their guarantees by 6 or raise the guarantee of queue org",
        ),
    ),
    Invalid(
        "an any-pool guarantee below a pool-only guarantee is refused",
        (("org", {"h100": 64}), ("org/a", {ANY: 8})),
        ("queue org guarantees h100 64", "8 GPU(s) more", "org/a (any pool 8)"),
    ),
    Invalid(
        "pool guarantees that jointly overrun an any-pool guarantee are refused",
        (("org", {ANY: 64}), ("org/a", {"h100": 40}), ("org/b", {"a100": 40})),
        ("queue org guarantees any pool 64", "16 GPU(s) more"),
    ),
    Invalid(
        "guarantees are checked against the nearest guaranteed ancestor, past quota-less queues",
        (("org", {ANY: 16}), ("org/nlp", {}), ("org/nlp/llm", {ANY: 32})),
        ("queue org guarantees any pool 16", "org/nlp/llm (any pool 32)"),
    ),
    Invalid(
        "a declared root guarantee bounds the top-level guarantees",
        (("", {ANY: 100}), ("org", {ANY: 64}), ("lab", {ANY: 64})),
        ("the root queue guarantees any pool 100", "28 GPU(s) more"),
    ),
    Invalid(
        "a burst below the guarantee is refused",
        (("org/nlp", {"h100": 32}, {"h100": 16}),),
        (
            "queue org/nlp has a burst limit of 16 GPUs for pool h100, below its guarantee of 32",
            "To fix: raise the burst to at least 32 or lower the guarantee",
        ),
    ),
    Invalid(
        "an any-pool burst below the whole guarantee is refused",
        (("org/nlp", {"h100": 16, "a100": 16}, {ANY: 24}),),
        ("burst limit of 24 GPUs for all pools together, below its guarantee of 32",),
    ),
    Invalid(
        "a negative guarantee is refused",
        (("org", {"h100": -1}),),
        ("queue org has a negative guarantee of -1 for h100",),
    ),
    Invalid(
        "a negative burst is refused",
        (("org", {}, {ANY: -4}),),
        ("queue org has a negative burst of -4 for any pool",),
    ),
    Invalid(
        "a queue defined twice is refused",
        (("org", {}), ("org", {ANY: 8})),
        ("queue org is defined twice. To fix: merge the two definitions",),
    ),
    Invalid(
        "a path with an empty name is refused",
        (("org//nlp", {}),),
        ("'org//nlp' is not a queue path",),
    ),
    Invalid(
        "a path starting with a slash is refused",
        (("/org", {}),),
        ("'/org' is not a queue path",),
    ),
    Invalid("a zero weight is refused", (("org", {}, {}, 0.0),), ("queue org has weight 0.0",)),
]


@pytest.mark.parametrize("case", INVALID, ids=[c.id for c in INVALID])
def test_invalid_quotas_are_refused_with_the_fix(case: Invalid) -> None:
    with pytest.raises(QuotaError) as caught:
        tree(*case.rows)
    for text in case.says:
        assert text in str(caught.value)
    for problem in caught.value.problems:
        assert problem.rpartition(". ")[2].startswith("To fix: "), problem


VALID = [
    pytest.param(
        (("org", {ANY: 64}), ("org/a", {ANY: 32}), ("org/b", {ANY: 32})),
        id="guarantees that exactly fill their org are accepted",
    ),
    pytest.param(
        (("org", {"h100": 32, ANY: 32}), ("org/a", {"h100": 48})),
        id="a pool guarantee may draw on its org's any-pool guarantee",
    ),
    pytest.param(
        (("org", {ANY: 1000}), ("lab", {ANY: 1000})),
        id="top-level guarantees are unchecked when the root declares none",
    ),
    pytest.param(
        (("org/nlp", {"h100": 8}, {"h100": 8, ANY: 8}),),
        id="a burst equal to the guarantee is accepted",
    ),
]


@pytest.mark.parametrize("rows", VALID)
def test_valid_quotas_build(rows: tuple[Row, ...]) -> None:
    assert tree(*rows).resolve(rows[-1][0]) == rows[-1][0]


# ------------------------------------------------------------------------------ the tree itself


def test_missing_intermediate_queues_are_created_without_quota() -> None:
    t = tree(("org/nlp/llm", {ANY: 8}))
    assert t.children("") == ("org",)
    assert t.children("org") == ("org/nlp",)
    assert (t.guaranteed("org/nlp", "h100"), t.burst("org/nlp", "h100")) == (0, None)
    assert t.weight("org") == 1.0


@pytest.mark.parametrize(
    ("queue", "resolved"),
    [
        ("org/nlp", "org/nlp"),
        ("org/nlp/new", "org/nlp"),
        ("org/nlp/new/deeper", "org/nlp"),
        ("lab", ""),
        ("", ""),
    ],
    ids=[
        "a known queue resolves to itself",
        "an unknown project resolves to its team",
        "an unknown path resolves to its nearest known ancestor",
        "an unknown org resolves to the root",
        "the root resolves to itself",
    ],
)
def test_resolve(queue: str, resolved: str) -> None:
    assert ORG.resolve(queue) == resolved


def test_ancestors_run_from_the_queue_up_to_and_including_the_root() -> None:
    assert ORG.ancestors("org/nlp") == ["org/nlp", "org", ""]
    assert ORG.ancestors("org/nlp/new") == ["org/nlp", "org", ""]
    assert ORG.ancestors("") == [""]


def test_guarantee_and_burst_lookups_fall_back_to_any_pool() -> None:
    t = tree(("org", {"h100": 16, ANY: 8}, {"h100": 32, ANY: 48}), ("lab", {}))
    assert (t.guaranteed("org", "h100"), t.guaranteed("org", "a100")) == (16, 8)
    assert (t.burst("org", "h100"), t.burst("org", "a100")) == (32, 48)
    assert (t.guaranteed("lab", "h100"), t.burst("lab", "h100")) == (0, None)


def test_the_tree_cannot_be_changed_after_build() -> None:
    with pytest.raises(TypeError):
        ORG.specs["lab"] = QueueSpec("lab")  # type: ignore[index]


def test_holdings_aggregate_up_to_every_ancestor() -> None:
    held = {"org/nlp": {"h100": 8}, "org/nlp/llm": {"h100": 4, "a100": 2}, "org/cv": {"h100": 1}}
    assert held_by(held, "org/nlp") == {"h100": 12, "a100": 2}
    assert held_by(held, "org") == {"h100": 13, "a100": 2}
    assert held_by(held, "") == {"h100": 13, "a100": 2}
    assert held_by({"org/nlpx": {"h100": 3}}, "org/nlp") == {}


# ------------------------------------------------------------------------- borrowing and reclaim


@dataclass(frozen=True)
class Borrowing:
    """Who holds GPUs beyond the guarantees, per leaf queue and pool."""

    id: str
    tree: QuotaTree
    held: Holdings
    expect: Holdings


BORROWING = [
    Borrowing(
        "nobody borrows while every team is within its guarantee",
        ORG,
        {"org/nlp": {"h100": 32}, "org/cv": {"a100": 32}},
        {},
    ),
    Borrowing(
        "a team past its guarantee is reported with its excess",
        ORG,
        {"org/nlp": {"h100": 40}},
        {"org/nlp": {"h100": 8}},
    ),
    Borrowing(
        "a team using its sibling's guarantee is the one reported",
        ORG,
        {"org/cv": {"h100": 48}},
        {"org/cv": {"h100": 16}},
    ),
    Borrowing(
        "a team's excess is split over its projects by what each holds",
        tree(("org/nlp", {ANY: 32}), ("org/nlp/a", {}), ("org/nlp/b", {})),
        {"org/nlp/a": {"h100": 30}, "org/nlp/b": {"h100": 10}},
        {"org/nlp/a": {"h100": 6}, "org/nlp/b": {"h100": 2}},
    ),
    Borrowing(
        "an any-pool excess is split over pools by their excess",
        tree(("org/nlp", {ANY: 8})),
        {"org/nlp": {"h100": 12, "a100": 4}},
        {"org/nlp": {"h100": 6, "a100": 2}},
    ),
    Borrowing(
        "queues with no guarantee on their path borrow all they hold",
        tree(("org/nlp", {ANY: 8}), ("lab", {})),
        {"lab": {"h100": 5}, "org/nlp": {"h100": 8}},
        {"lab": {"h100": 5}},
    ),
]


@pytest.mark.parametrize("case", BORROWING, ids=[c.id for c in BORROWING])
def test_borrowing(case: Borrowing) -> None:
    assert borrowing(case.tree, case.held) == case.expect


@dataclass(frozen=True)
class Reclaim:
    """How many GPUs of ``pool`` ``queue`` may take back from borrowers."""

    id: str
    tree: QuotaTree
    held: Holdings
    queue: str
    pool: str
    expect: int


RECLAIMS = [
    Reclaim(
        "a team holding nothing may reclaim its whole guarantee", ORG, {}, "org/nlp", "h100", 32
    ),
    Reclaim(
        "a team at its guarantee has nothing to reclaim",
        ORG,
        {"org/nlp": {"h100": 32}},
        "org/nlp",
        "h100",
        0,
    ),
    Reclaim(
        "GPUs held in one pool lower what an any-pool guarantee can reclaim in another",
        ORG,
        {"org/nlp": {"a100": 20}},
        "org/nlp",
        "h100",
        12,
    ),
    Reclaim(
        "a pool guarantee and an any-pool guarantee add up in that pool",
        tree(("org/nlp", {"h100": 16, ANY: 16})),
        {},
        "org/nlp",
        "h100",
        32,
    ),
    Reclaim(
        "a pool guarantee does not help in another pool",
        tree(("org/nlp", {"h100": 16, ANY: 16})),
        {},
        "org/nlp",
        "a100",
        16,
    ),
    Reclaim(
        "projects' holdings count toward their team's guarantee",
        tree(("org/nlp", {ANY: 32}), ("org/nlp/llm", {})),
        {"org/nlp/llm": {"h100": 24}},
        "org/nlp",
        "h100",
        8,
    ),
    Reclaim("a queue with no guarantee reclaims nothing", ORG, {}, "org/cv", "h100", 0),
]


@pytest.mark.parametrize("case", RECLAIMS, ids=[c.id for c in RECLAIMS])
def test_reclaimable(case: Reclaim) -> None:
    assert reclaimable_for(case.tree, case.held, case.queue, case.pool) == case.expect


# ------------------------------------------------------------------------------------ properties

POOLS = ("h100", "a100")
SHAPE = ("a", "a/x", "a/y", "b", "b/z")
LEAVES = ("a/x", "a/y", "a/x/new", "b/z", "b", "c")
EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def quotas(draw: st.DrawFn, most: int) -> Quota:
    keys = draw(st.lists(st.sampled_from((*POOLS, ANY)), unique=True, max_size=3))
    return {k: draw(st.integers(0, most)) for k in keys}


@st.composite
def specs(draw: st.DrawFn) -> list[QueueSpec]:
    """Queues of a small fixed shape with random guarantees and bursts (maybe inconsistent)."""
    out = []
    for path in draw(st.lists(st.sampled_from(("", *SHAPE)), unique=True, min_size=1)):
        guaranteed = draw(quotas(48 if "/" not in path else 16))
        extra = draw(quotas(24))
        burst = {k: guaranteed.get(k, 0) + n for k, n in extra.items() if k != ANY}
        if ANY in extra:
            burst[ANY] = sum(guaranteed.values()) + extra[ANY]
        out.append(QueueSpec(path, guaranteed, burst, draw(st.sampled_from((0.5, 1.0, 3.0)))))
    return out


@st.composite
def trees(draw: st.DrawFn) -> QuotaTree:
    """A valid tree: the drawn one, else the same with only top-level guarantees kept."""
    drawn = draw(specs())
    try:
        return QuotaTree.build(drawn)
    except QuotaError:
        kept = [s if s.path.count("/") == 0 and s.path else QueueSpec(s.path) for s in drawn]
        return QuotaTree.build(kept)


Asks = list[tuple[str, Quota]]
demands = st.lists(
    st.tuples(st.sampled_from(LEAVES), st.dictionaries(st.sampled_from(POOLS), st.integers(0, 24))),
    max_size=12,
)


def charge(held: Holdings, queue: str, demand: Quota) -> None:
    """Add ``demand`` to what ``queue`` holds."""
    pools = held.setdefault(queue, {})
    for pool, n in demand.items():
        pools[pool] = pools.get(pool, 0) + n


def _within_every_burst(t: QuotaTree, held: Holdings) -> bool:
    for q in t.specs:
        have, limits = held_by(held, q), t.specs[q].burst
        if any(have.get(p, 0) > n for p, n in limits.items() if p != ANY):
            return False
        if ANY in limits and sum(have.values()) > limits[ANY]:
            return False
    return True


@EXAMPLES
@given(specs())
def test_build_either_succeeds_or_says_how_to_fix_each_problem(drawn: list[QueueSpec]) -> None:
    try:
        t = QuotaTree.build(drawn)
    except QuotaError as e:
        assert e.problems and all("To fix: " in p for p in e.problems)
    else:
        assert all(n >= 0 for pot in t.pots.values() for n in pot.values())


@EXAMPLES
@given(trees(), demands)
def test_admit_never_lets_any_queue_exceed_a_burst(t: QuotaTree, asks: Asks) -> None:
    held: Holdings = {}
    borrowed = 0
    for queue, demand in asks:
        verdict = admit(t, held, queue, demand)
        assert 0 <= verdict.borrowed <= sum(demand.values())
        if verdict.ok:
            charge(held, queue, demand)
            borrowed += verdict.borrowed
        assert _within_every_burst(t, held)
    assert sum(n for pools in borrowing(t, held).values() for n in pools.values()) == borrowed


@EXAMPLES
@given(trees(), demands)
def test_borrowing_never_exceeds_what_a_queue_holds(t: QuotaTree, asks: Asks) -> None:
    held: Holdings = {}
    for queue, demand in asks:
        charge(held, queue, demand)
    for queue, pools in borrowing(t, held).items():
        assert all(0 < n <= held[queue][p] for p, n in pools.items())


@EXAMPLES
@given(trees(), demands, st.sampled_from(POOLS))
def test_a_leaf_reclaims_exactly_what_it_can_take_without_borrowing(
    t: QuotaTree, asks: Asks, pool: str
) -> None:
    held: Holdings = {}
    for queue, demand in asks:
        charge(held, queue, demand)
    for leaf in (q for q in t.specs if not t.children(q) and t.holder(q) == q):
        room = reclaimable_for(t, held, leaf, pool)
        assert admit(t, held, leaf, {pool: room}).borrowed == 0
        assert admit(t, held, leaf, {pool: room + 1}).borrowed == 1
