"""The index of the server's desired states: by action and run, kept node by node."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st
from kube_unit_kit import rspec

from boltforge.kube.desired import DesiredStates, Wanted
from boltforge.wire.agent import ReplicaSpec


def from_scratch(nodes: dict[str, list[ReplicaSpec]], action: str) -> Wanted:
    """The index worked out from every node's state, as a pass once did each time."""
    out: Wanted = defaultdict(dict)
    for node, specs in nodes.items():
        for spec in specs:
            if spec.action == action:
                out[(spec.job, spec.epoch)][spec.replica] = (node, spec)
    return dict(out)


def test_a_nodes_new_state_replaces_its_old_one() -> None:
    d = DesiredStates()
    a0, a1 = rspec("a", 1, 0), rspec("a", 1, 1)
    d.put("n1", [a0, a1])
    assert d.wanted("run") == {("a", 1): {a0.replica: ("n1", a0), a1.replica: ("n1", a1)}}
    stop = rspec("a", 1, 0, action="stop")
    d.put("n1", [stop])
    assert d.wanted("run") == {}
    assert d.wanted("stop") == {("a", 1): {stop.replica: ("n1", stop)}}
    assert d.lists(stop.replica) and not d.lists(a1.replica)


def test_the_runs_touched_are_those_whose_replicas_changed() -> None:
    d = DesiredStates()
    assert d.take_touched() is None  # nothing seen yet: every run
    d.put("n1", [rspec("a", 1, 0)])
    d.put("n2", [rspec("b", 2, 0)])
    assert d.take_touched() == {("a", 1), ("b", 2)}
    d.put("n1", [])
    assert d.take_touched() == {("a", 1)}
    assert d.take_touched() == set()
    d.clear()
    assert d.take_touched() is None


def test_a_replica_listed_by_two_nodes_stays_while_either_lists_it() -> None:
    d = DesiredStates()
    spec = rspec("a", 1, 0)
    d.put("n1", [spec])
    d.put("n2", [spec])  # the server moved it; n1's change comes after
    assert d.wanted("run") == {("a", 1): {spec.replica: ("n2", spec)}}
    d.put("n2", [])
    assert d.wanted("run") == {("a", 1): {spec.replica: ("n1", spec)}}
    d.put("n1", [])
    assert d.wanted("run") == {} and not d.lists(spec.replica)


specs = st.builds(
    rspec,
    st.sampled_from(["a", "b", "c"]),
    st.integers(1, 2),
    st.integers(0, 3),
    action=st.sampled_from(["run", "stop"]),
)
changes = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.lists(specs, max_size=4)),
        st.just(None),  # a full answer: forget everything
    ),
    max_size=25,
)


def unique(specs: list[ReplicaSpec]) -> list[ReplicaSpec]:
    """A node's state lists each replica once per action."""
    return list({(s.action, s.replica): s for s in specs}.values())


@settings(max_examples=200, deadline=None)
@given(changes)
def test_the_index_always_matches_the_states_of_every_node(
    steps: list[tuple[str, list[ReplicaSpec]] | None],
) -> None:
    d = DesiredStates()
    for step in steps:
        if step is None:
            d.clear()
        else:
            d.put(step[0], unique(step[1]))
    owners: dict[tuple[str, str], list[str]] = defaultdict(list)
    for node, listed in d.nodes.items():
        for s in listed:
            owners[(s.action, s.replica)].append(node)
    for action in ("run", "stop"):
        got, want = d.wanted(action), from_scratch(d.nodes, action)
        assert got.keys() == want.keys()
        for run, replicas in got.items():
            assert replicas.keys() == want[run].keys()
            for replica, (node, spec) in replicas.items():
                assert node in owners[(action, replica)]  # some node lists it, there
                assert spec in d.nodes[node]
