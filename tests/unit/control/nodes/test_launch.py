"""torchrun's static rendezvous as the native backend hands it to a gang
(``nodes/launch.py``): ranks, world size, local ranks per node, the master and one free
port per gang."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boltforge.control.nodes.launch import (
    FIRST_PORT,
    PORT_RANGE,
    Launcher,
    Ports,
    PortsExhausted,
    Slot,
    TorchrunLauncher,
    free_port,
)

KEYS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def gang(*nodes: str, role: str = "worker") -> list[Slot]:
    """One slot per entry of ``nodes`` (in rank order), each node at ``10.0.0.<n>``."""
    return [
        Slot(rank=r, role=role, node=n, address=f"10.0.{r}.{n.removeprefix('n')}", gpus=(r,))
        for r, n in enumerate(nodes)
    ]


def test_the_torchrun_launcher_is_a_launcher_that_uses_the_scheduler_s_gpus() -> None:
    launcher: Launcher = TorchrunLauncher()
    assert launcher.picks_devices is False


def test_each_rank_gets_torchrun_s_variables_in_slot_order() -> None:
    env = TorchrunLauncher().rendezvous(gang("n1", "n1", "n2", "n2"), {})
    assert [set(e) for e in env] == [KEYS] * 4
    assert [e["RANK"] for e in env] == ["0", "1", "2", "3"]
    assert {e["WORLD_SIZE"] for e in env} == {"4"}
    assert [e["GROUP_RANK"] for e in env] == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("nodes", "local", "local_world"),
    [
        (("n1",), [0], [1]),
        (("n1", "n1", "n1"), [0, 1, 2], [3, 3, 3]),
        (("n1", "n2", "n3"), [0, 0, 0], [1, 1, 1]),
        (("n1", "n1", "n2", "n2"), [0, 1, 0, 1], [2, 2, 2, 2]),
        (("n1", "n2", "n1", "n2", "n1"), [0, 0, 1, 1, 2], [3, 2, 3, 2, 3]),
        (("n2", "n1", "n1"), [0, 0, 1], [1, 2, 2]),
    ],
    ids=["alone", "one-node", "one-per-node", "two-by-two", "interleaved", "uneven"],
)
def test_local_ranks_count_within_each_node(
    nodes: tuple[str, ...], local: list[int], local_world: list[int]
) -> None:
    env = TorchrunLauncher().rendezvous(gang(*nodes), {})
    assert [int(e["LOCAL_RANK"]) for e in env] == local
    assert [int(e["LOCAL_WORLD_SIZE"]) for e in env] == local_world


def test_every_rank_meets_at_rank_zero_s_address() -> None:
    slots = gang("n3", "n1", "n2")
    env = TorchrunLauncher().rendezvous(slots, {})
    assert {e["MASTER_ADDR"] for e in env} == {slots[0].address} == {"10.0.0.3"}


def test_a_gang_takes_the_first_port_of_its_master_and_records_it() -> None:
    ports: Ports = {}
    env = TorchrunLauncher().rendezvous(gang("n1", "n2"), ports)
    assert {e["MASTER_PORT"] for e in env} == {str(FIRST_PORT)}
    assert ports == {"10.0.0.1": {FIRST_PORT}}


def test_gangs_with_one_master_started_one_after_another_get_distinct_ports() -> None:
    launcher, ports = TorchrunLauncher(), Ports()
    seen = [launcher.rendezvous(gang("n1"), ports)[0]["MASTER_PORT"] for _ in range(5)]
    assert seen == [str(FIRST_PORT + i) for i in range(5)]
    assert ports == {"10.0.0.1": set(range(FIRST_PORT, FIRST_PORT + 5))}


def test_gangs_with_other_masters_reuse_a_port() -> None:
    launcher, ports = TorchrunLauncher(), Ports()
    first = launcher.rendezvous(gang("n1", "n2"), ports)
    second = launcher.rendezvous(gang("n2", "n1"), ports)
    assert first[0]["MASTER_PORT"] == second[0]["MASTER_PORT"] == str(FIRST_PORT)
    assert (first[0]["MASTER_ADDR"], second[0]["MASTER_ADDR"]) == ("10.0.0.1", "10.0.0.2")


def test_the_range_bounds_one_master_never_the_fleet() -> None:
    """More gangs than the range holds ports run at once, each with rank 0 on its own node;
    only a node that is rank 0 of a whole range of gangs runs out."""
    launcher, ports = TorchrunLauncher(), Ports()
    for n in range(PORT_RANGE + 1):
        env = launcher.rendezvous(gang(f"n{n}"), ports)
        assert env[0]["MASTER_PORT"] == str(FIRST_PORT)
    ports["10.0.0.0"] = set(range(FIRST_PORT, FIRST_PORT + PORT_RANGE))
    with pytest.raises(PortsExhausted, match="on one node"):
        launcher.rendezvous(gang("n0"), ports)


def test_ports_in_use_are_skipped_and_a_freed_one_is_reused() -> None:
    ports = {"10.0.0.1": {FIRST_PORT, FIRST_PORT + 1, FIRST_PORT + 3}}
    env = TorchrunLauncher().rendezvous(gang("n1", "n1"), ports)
    assert env[0]["MASTER_PORT"] == str(FIRST_PORT + 2)
    ports["10.0.0.1"].discard(FIRST_PORT)
    assert free_port(ports["10.0.0.1"]) == FIRST_PORT


def test_an_empty_gang_gets_no_environment_but_still_takes_a_port() -> None:
    ports: Ports = {}
    assert TorchrunLauncher().rendezvous([], ports) == []
    assert ports == {"127.0.0.1": {FIRST_PORT}}


def test_free_port_takes_the_lowest_port_not_in_use() -> None:
    ports = {FIRST_PORT + 1, 80, FIRST_PORT + PORT_RANGE + 5}
    assert free_port(ports) == FIRST_PORT
    assert free_port(ports) == FIRST_PORT + 2
    assert {FIRST_PORT, FIRST_PORT + 2} <= ports


def test_free_port_uses_the_last_port_of_the_range_then_runs_out() -> None:
    ports = set(range(FIRST_PORT, FIRST_PORT + PORT_RANGE - 1))
    assert free_port(ports) == FIRST_PORT + PORT_RANGE - 1
    with pytest.raises(PortsExhausted, match="rendezvous ports"):
        free_port(ports)


@given(
    st.lists(st.sampled_from(["n1", "n2", "n3", "n4"]), min_size=1, max_size=24),
    st.sets(st.integers(FIRST_PORT, FIRST_PORT + 40), max_size=20),
)
def test_any_gang_s_local_ranks_on_each_node_are_zero_to_k_minus_one(
    nodes: list[str], used: set[int]
) -> None:
    slots = gang(*nodes)
    ports = {slots[0].address: set(used)}
    env = TorchrunLauncher().rendezvous(slots, ports)
    per_node: dict[str, list[int]] = {}
    for node, e in zip(nodes, env, strict=True):
        per_node.setdefault(node, []).append(int(e["LOCAL_RANK"]))
        assert int(e["LOCAL_WORLD_SIZE"]) == nodes.count(node)
        assert int(e["WORLD_SIZE"]) == len(nodes)
    for ranks in per_node.values():
        assert ranks == list(range(len(ranks)))
    [port] = {int(e["MASTER_PORT"]) for e in env}
    assert port not in used
    assert all(p in used for p in range(FIRST_PORT, port))
    assert ports == {slots[0].address: used | {port}}
