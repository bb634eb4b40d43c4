"""Placement scenarios written as data: a fleet, what is busy, a job, and what must happen."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from boltforge.core.model.gang import Capability, Gang, Role, SpotPolicy
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import HostLayout, Tier, TopologyTree
from boltforge.core.placement.modes import could_ever_fit, place_now, when_and_where
from boltforge.core.placement.place import Decision, Outcome
from boltforge.testing.builders import make_fleet, make_gang, make_pool, make_role

NOW = 10.0
ALL = tuple(range(8))


@dataclass(frozen=True)
class Held:
    """GPUs (and CPUs) a running job holds on one host, and when it is expected to end."""

    host: str
    gpus: tuple[int, ...]
    until: float | None = None
    job: str = ""
    cpus: float = 0.0


def hold(host: str, *gpus: int, until: float | None = None, job: str = "") -> Held:
    return Held(host, gpus, until, job)


def full(host: str, until: float | None = None, job: str = "") -> Held:
    return Held(host, ALL, until, job)


@dataclass(frozen=True)
class Scenario:
    """A question to the engine and the answer it must give (unset fields are not checked).

    ``ask`` is ``now`` (place_now), ``ever`` (could_ever_fit) or ``when`` (when_and_where at
    ``NOW``). ``nodes`` is the exact host-to-GPUs map; ``within`` a domain holding every grant;
    ``roles_within`` the same per role; ``hops`` a subset of the cost's hop counts; ``reasons``,
    ``fixes`` and ``notes`` substrings of those texts.
    """

    id: str
    fleet: TopologyTree
    gang: Gang
    held: tuple[Held, ...] = ()
    cordoned: tuple[str, ...] = ()
    ask: str = "now"
    outcome: Outcome = Outcome.NOW
    nodes: dict[str, list[int]] | None = None
    hosts: set[str] | None = None
    pool: str | None = None
    within: tuple[Level, str] | None = None
    roles_within: dict[str, tuple[Level, str]] = field(default_factory=dict)
    role_hosts: dict[str, set[str]] = field(default_factory=dict)
    level: Level | None = None
    hops: dict[str, int] = field(default_factory=dict)
    cost: float | None = None
    reasons: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    start_time: float | None = None
    waits_for: tuple[str, ...] | None = None


def racks_with_cpu_nodes(racks: int = 2, gpu_hosts: int = 2) -> TopologyTree:
    """Racks r0, r1, ... each holding ``gpu_hosts`` 8-GPU hosts and one CPU node ``rN-cpu``."""
    pools = (make_pool("h100"), make_pool("cpu", gpu_type="none", memory_gb=0, gpus=0))
    layout = []
    for r in range(racks):
        layout += [HostLayout(f"r{r}-h{h}", 0, "p0", f"r{r}") for h in range(gpu_hosts)]
        layout.append(HostLayout(f"r{r}-cpu", 1, "p0", f"r{r}"))
    return TopologyTree.build("mixed", pools, layout)


def one_role(role: Role) -> Gang:
    return make_gang(roles=(role,))


def trainers_and(other: Role, trainers: int = 2, required: Level | None = None) -> Gang:
    """``trainers`` 8-GPU trainer replicas and ``other``, the gang's second role."""
    roles = (make_role("trainer", replicas=trainers, gpus=8), other)
    return make_gang(roles=roles, required=required)


SCENARIOS = [
    Scenario(
        "8-GPU job takes the one fully free host, not a fragmented one",
        fleet=make_fleet(racks=1, hosts=4),
        gang=make_gang(gpus=8, per_node=4),
        held=(
            hold("h100-p0-r0-h0", 4, 5, 6, 7),
            hold("h100-p0-r0-h1", 0, 1, 2, 3),
            hold("h100-p0-r0-h3", 2, 3, 4, 5),
        ),
        nodes={"h100-p0-r0-h2": list(ALL)},
        level=Level.HOST,
        hops={"rack": 0, "host": 0},
    ),
    Scenario(
        "TP-8 job skips hosts with two islands of 4",
        fleet=make_fleet(racks=1, hosts=2, pools=[make_pool("quad", island=4), make_pool("hgx")]),
        gang=make_gang(gpus=8, tp=8),
        pool="hgx",
        hops={"nvlink": 7, "host": 0},
    ),
    Scenario(
        "8-GPU TP-4 job on hosts with islands of 4 puts one group in each island of one host",
        fleet=make_fleet(racks=1, hosts=2, island=4),
        gang=make_gang(gpus=8, tp=4),
        held=(hold("h100-p0-r0-h0", 0),),
        nodes={"h100-p0-r0-h1": list(ALL)},
        hops={"nvlink": 6, "host": 1},
    ),
    Scenario(
        "TP-2 replica that no island can hold whole splits on a group boundary",
        fleet=make_fleet(racks=1, hosts=1, island=4),
        gang=one_role(make_role(gpus=4, tp=2)),
        held=(hold("h100-p0-r0-h0", 1, 6),),
        nodes={"h100-p0-r0-h0": [0, 2, 4, 5]},
        hops={"nvlink": 2, "host": 1},
    ),
    Scenario(
        "job needing 40 GB skips V100-32GB",
        fleet=make_fleet(
            racks=1,
            hosts=2,
            pools=[
                make_pool("v100", "V100-32GB", 32, price=1.0),
                make_pool("a100", "A100-40GB", 40),
            ],
        ),
        gang=one_role(make_role(gpus=8, min_memory=40)),
        pool="a100",
    ),
    Scenario(
        "job asking for any GPU takes the smaller, cheaper one when both cost the same",
        fleet=make_fleet(
            racks=1,
            hosts=1,
            pools=[make_pool("a100", "A100-40GB", 40), make_pool("v100", "V100-32GB", 32, price=1)],
        ),
        gang=make_gang(gpus=8),
        pool="v100",
    ),
    Scenario(
        "spot-never job stays off spot capacity",
        fleet=make_fleet(
            racks=1, hosts=1, pools=[make_pool("spot", tier=Tier.SPOT, price=1), make_pool("res")]
        ),
        gang=one_role(Role("worker", 1, 8, capability=Capability(spot=SpotPolicy.NEVER))),
        pool="res",
    ),
    Scenario(
        "256 GPUs fit in one rack and do not spread",
        fleet=make_fleet(pods=2, racks=2, hosts=32),
        gang=make_gang(gpus=256),
        held=(
            hold("h100-p0-r0-h0", 0),
            hold("h100-p0-r1-h5", 3),
            hold("h100-p1-r1-h9", 7),
        ),
        within=(Level.RACK, "h100-p1-r0"),
        level=Level.RACK,
        hops={"rack": 31, "pod": 0, "spine": 0, "rail": 0},
    ),
    Scenario(
        "a job that fits one host never spreads to two",
        fleet=make_fleet(racks=2, hosts=2),
        gang=make_gang(gpus=8, per_node=2),
        level=Level.HOST,
        hops={"rack": 0, "pod": 0},
    ),
    Scenario(
        "best-fit: a 4-GPU job takes the host with exactly 4 free",
        fleet=make_fleet(racks=1, hosts=4),
        gang=make_gang(gpus=4, per_node=4),
        held=(
            hold("h100-p0-r0-h1", 0, 1),
            hold("h100-p0-r0-h2", 4, 5, 6, 7),
            hold("h100-p0-r0-h3", 0, 1, 2),
        ),
        nodes={"h100-p0-r0-h2": [0, 1, 2, 3]},
    ),
    Scenario(
        "cordoned host is skipped even when it is the best fit",
        fleet=make_fleet(racks=1, hosts=2),
        gang=make_gang(gpus=4, per_node=4),
        held=(hold("h100-p0-r0-h0", 4, 5, 6, 7),),
        cordoned=("h100-p0-r0-h0",),
        hosts={"h100-p0-r0-h1"},
    ),
    Scenario(
        "multi-host data-parallel replicas are rail-aligned",
        fleet=make_fleet(racks=1, hosts=3),
        gang=make_gang(gpus=8, per_node=4),
        held=(
            hold("h100-p0-r0-h0", 0, 1),
            hold("h100-p0-r0-h1", 6, 7),
            full("h100-p0-r0-h2"),
        ),
        nodes={"h100-p0-r0-h0": [2, 3, 4, 5], "h100-p0-r0-h1": [2, 3, 4, 5]},
        hops={"rack": 1, "rail": 0},
    ),
    Scenario(
        "preferred rack that no rack can hold spreads across the pod and says so",
        fleet=make_fleet(racks=2, hosts=2),
        gang=make_gang(gpus=16, preferred=Level.RACK),
        held=(full("h100-p0-r0-h0"), full("h100-p0-r1-h0")),
        hosts={"h100-p0-r0-h1", "h100-p0-r1-h1"},
        level=Level.POD,
        hops={"pod": 1},
        notes=("no single rack could hold it",),
    ),
    Scenario(
        "required rack with no rack free is NOT_NOW and the fix suggests preferred",
        fleet=make_fleet(racks=2, hosts=2),
        gang=make_gang(gpus=16, required=Level.RACK),
        held=(full("h100-p0-r0-h0"), full("h100-p0-r1-h0")),
        outcome=Outcome.NOT_NOW,
        reasons=("requires a single rack", "the best rack can take 1 of 2"),
        fixes=("topology: {preferred: rack}",),
    ),
    Scenario(
        "impossible capability is NEVER and names min_gpu_memory_gb",
        fleet=make_fleet(racks=1, hosts=2),
        gang=one_role(make_role(gpus=8, min_memory=141)),
        outcome=Outcome.NEVER,
        reasons=("at least 141 GB of GPU memory", "no pool offers it"),
        fixes=("lower min_gpu_memory_gb to 80 or less",),
    ),
    Scenario(
        "unknown GPU type is NEVER and lists the fleet's GPU types",
        fleet=make_fleet(racks=1, hosts=1),
        gang=one_role(make_role(gpus=8, gpu_types=("MI300X",))),
        ask="ever",
        outcome=Outcome.NEVER,
        fixes=("ask for one of the fleet's GPU types: H100-80GB",),
    ),
    Scenario(
        "TP-4 job on PCIe-only hosts is NEVER and suggests lowering tensor parallelism",
        fleet=make_fleet(racks=1, hosts=2, island=1),
        gang=make_gang(gpus=8, tp=4),
        outcome=Outcome.NEVER,
        fixes=("lower tensor parallelism to 1",),
    ),
    Scenario(
        "job bigger than the whole fleet can never start and says to add capacity",
        fleet=make_fleet(racks=1, hosts=2),
        gang=make_gang(gpus=32),
        ask="ever",
        outcome=Outcome.NEVER,
        reasons=("fleet: 2 of 4 replica(s) fit",),
        fixes=("add capacity",),
    ),
    Scenario(
        "gang with CPU data workers lands them in the trainers' rack",
        fleet=racks_with_cpu_nodes(),
        gang=trainers_and(Role("loader", 2, 0, cpus=32)),
        held=(hold("r0-h0", 0, 1, 2, 3), hold("r0-h1", 4, 5, 6, 7)),
        roles_within={"trainer": (Level.RACK, "r1"), "loader": (Level.RACK, "r1")},
        role_hosts={"trainer": {"r1-h0", "r1-h1"}, "loader": {"r1-cpu"}},
    ),
    Scenario(
        "a small second role joins the trainers' rack rather than a better fit elsewhere",
        fleet=make_fleet(racks=2, hosts=2),
        gang=trainers_and(make_role("eval", gpus=2), trainers=1),
        held=(
            hold("h100-p0-r0-h1", 0, 1, 2, 3),
            hold("h100-p0-r1-h0", 0, 1, 2, 3, 4, 5),
            hold("h100-p0-r1-h1", 0, 1, 2, 3),
        ),
        role_hosts={"trainer": {"h100-p0-r0-h0"}, "eval": {"h100-p0-r0-h1"}},
    ),
    Scenario(
        "job that must wait is LATER, starts when its GPUs free up and names whom it waits for",
        fleet=make_fleet(racks=1, hosts=1),
        gang=make_gang(gpus=8),
        held=(
            hold("h100-p0-r0-h0", 0, 1, 2, 3, until=100.0, job="etl"),
            hold("h100-p0-r0-h0", 4, 5, until=50.0, job="eval"),
        ),
        ask="when",
        outcome=Outcome.LATER,
        nodes={"h100-p0-r0-h0": list(ALL)},
        start_time=100.0,
        waits_for=("eval", "etl"),
    ),
    Scenario(
        "job that fits now starts now, whatever else is running",
        fleet=make_fleet(racks=1, hosts=2),
        gang=make_gang(gpus=8),
        held=(full("h100-p0-r0-h0", until=100.0, job="etl"),),
        ask="when",
        nodes={"h100-p0-r0-h1": list(ALL)},
        start_time=NOW,
        waits_for=(),
    ),
    Scenario(
        "job blocked only by jobs with no expected end is NOT_NOW, not LATER",
        fleet=make_fleet(racks=1, hosts=1),
        gang=make_gang(gpus=8),
        held=(hold("h100-p0-r0-h0", 0, 1, job="notebook"),),
        ask="when",
        outcome=Outcome.NOT_NOW,
        reasons=("does not fit even after every job with a known end ends",),
    ),
]

# Regression scenarios for bugs the engine once had (multi-role `required`, island packing,
# rails across hosts), kept apart so their history stays readable.
FIXED_BUGS = [
    pytest.param(
        Scenario(
            "required rack keeps every role of the gang inside one rack",
            fleet=make_fleet(racks=2, hosts=2),
            gang=trainers_and(make_role("eval", gpus=2), trainers=1, required=Level.RACK),
            held=(full("h100-p0-r0-h1"), hold("h100-p0-r1-h1", 0, 1, 2, 3, 4, 5)),
            within=(Level.RACK, "h100-p0-r1"),
        ),
        id="required rack keeps every role of the gang inside one rack",
    ),
    pytest.param(
        Scenario(
            "required host with two roles that need two hosts is not placed",
            fleet=make_fleet(racks=1, hosts=2),
            gang=trainers_and(make_role("eval", gpus=2), trainers=1, required=Level.HOST),
            outcome=Outcome.NOT_NOW,
        ),
        id="required host with two roles that need two hosts is not placed",
    ),
    pytest.param(
        Scenario(
            "required NVLink island is never satisfied by a job spanning two islands",
            fleet=make_fleet(racks=1, hosts=1, island=4),
            gang=make_gang(gpus=8, per_node=4, required=Level.ISLAND),
            ask="ever",
            outcome=Outcome.NEVER,
        ),
        id="required NVLink island is never satisfied by a job spanning two islands",
    ),
    pytest.param(
        Scenario(
            "four 1-GPU replicas on one host share its fully free island of 4",
            fleet=make_fleet(racks=1, hosts=1, island=4),
            gang=one_role(make_role(replicas=4, gpus=1)),
            held=(hold("h100-p0-r0-h0", 1),),
            nodes={"h100-p0-r0-h0": [4, 5, 6, 7]},
            hops={"host": 0},
            cost=3.0,
        ),
        id="four 1-GPU replicas on one host share its fully free island of 4",
    ),
    pytest.param(
        Scenario(
            "best-fit swap of the last replica keeps it on its rail",
            fleet=make_fleet(racks=1, hosts=3),
            gang=one_role(make_role(replicas=3, gpus=2)),
            held=(
                hold("h100-p0-r0-h0", 4, 5, 6, 7),
                hold("h100-p0-r0-h1", 4, 5, 6, 7),
                hold("h100-p0-r0-h2", 0, 1, 2, 3, 6, 7),
            ),
            hosts={"h100-p0-r0-h0", "h100-p0-r0-h1"},
            hops={"rail": 0},
            cost=13.0,
        ),
        id="best-fit swap of the last replica keeps it on its rail",
    ),
    pytest.param(
        Scenario(
            "of two equally full hosts the spill-over takes the one whose GPUs sit on its rails",
            fleet=make_fleet(racks=1, hosts=3),
            gang=one_role(make_role(replicas=6, gpus=2)),
            held=(hold("h100-p0-r0-h1", 1, 5), hold("h100-p0-r0-h2", 5, 6)),
            hops={"rail": 0},
            cost=19.0,
        ),
        id="of two equally full hosts the spill-over takes the one whose GPUs sit on its rails",
    ),
    pytest.param(
        Scenario(
            "rail template is the host with the most replicas, not the lowest-numbered one",
            fleet=make_fleet(racks=1, hosts=2),
            gang=one_role(make_role(replicas=4, gpus=2)),
            held=(hold("h100-p0-r0-h0", 4), hold("h100-p0-r0-h1", 5, 6)),
            hops={"rail": 0},
            cost=15.0,
        ),
        id="rail template is the host with the most replicas, not the lowest-numbered one",
    ),
]


def fleet_state(s: Scenario) -> FleetState:
    state = FleetState(s.fleet)
    for i, h in enumerate(s.held):
        grant = Grant("w", 0, s.fleet.host_index[h.host], h.gpus, h.cpus)
        state.allocate(Allocation(h.job or f"busy-{i}", (grant,), h.until))
    for name in s.cordoned:
        state.cordoned[s.fleet.host_index[name]] = True
    return state


def ask(s: Scenario) -> Decision:
    state = fleet_state(s)
    if s.ask == "now":
        return place_now(state, s.gang)
    if s.ask == "ever":
        return could_ever_fit(s.fleet, s.gang)
    assert s.ask == "when", s.ask
    return when_and_where(state, s.gang, NOW)


def domain(tree: TopologyTree, level: Level, host: int) -> str:
    return tree.domain_name(level, tree.domain_of(host, level))


def check(s: Scenario, d: Decision) -> None:
    tree = s.fleet
    assert d.outcome == s.outcome, (d.outcome, d.reasons, d.fixes)
    for wanted, texts in ((s.reasons, d.reasons), (s.fixes, d.fixes)):
        for text in wanted:
            assert any(text in t for t in texts), f"{text!r} not in {texts}"
    if s.start_time is not None:
        assert d.start_time == s.start_time
    if s.waits_for is not None:
        assert d.waits_for == s.waits_for
    if s.outcome not in (Outcome.NOW, Outcome.LATER):
        assert d.placement is None
        return
    p = d.placement
    assert p is not None
    hosts = {g.host for g in p.grants}
    if s.nodes is not None:
        assert p.nodes(tree) == s.nodes
    if s.hosts is not None:
        assert {tree.hosts[h].name for h in hosts} == s.hosts
    if s.pool is not None:
        assert {tree.pool_of(h).name for h in hosts} == {s.pool}
    if s.within is not None:
        level, name = s.within
        assert {domain(tree, level, h) for h in hosts} == {name}
    for role, (level, name) in s.roles_within.items():
        plan = next(r for r in p.roles if r.role == role)
        assert {domain(tree, level, g.host) for g in plan.grants} == {name}, role
    for role, names in s.role_hosts.items():
        plan = next(r for r in p.roles if r.role == role)
        assert {tree.hosts[g.host].name for g in plan.grants} == names, role
    if s.level is not None:
        assert p.main.level == s.level
    for key, count in s.hops.items():
        assert p.cost.hops[key] == count, (key, p.cost.hops)
    if s.cost is not None:
        assert p.cost.total == pytest.approx(s.cost)
    for text in s.notes:
        assert any(text in n for n in p.notes), f"{text!r} not in {p.notes}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_scenario(scenario: Scenario) -> None:
    check(scenario, ask(scenario))


@pytest.mark.parametrize("scenario", FIXED_BUGS)
def test_fixed_bug(scenario: Scenario) -> None:
    check(scenario, ask(scenario))


def test_scenario_ids_are_unique() -> None:
    ids = [s.id for s in SCENARIOS] + [p.id for p in FIXED_BUGS]
    assert len(ids) == len(set(ids))
