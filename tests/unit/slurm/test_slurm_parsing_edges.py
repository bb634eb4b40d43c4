"""Edges of what Slurm says, parsed: compressed host lists of any shape, ``topology.conf``
files written by hand, nodes that report odd sizes, and held jobs as the bridge submits them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slurm_builders import sinfo_node, squeue_job

from boltforge.slurm.model import hostnames, parse_jobs, parse_nodes, parse_topology
from boltforge.slurm.translate import job_spec

# A host-list group: a prefix and the runs of numbers after it, zero-padded to ``width``.
groups = st.tuples(
    st.sampled_from(["n", "gpu", "rack1-n", "dgx-a"]),
    st.lists(st.tuples(st.integers(0, 300), st.integers(0, 4)), min_size=1, max_size=3),
    st.sampled_from([0, 2, 3]),
)


def compress(prefix: str, runs: list[tuple[int, int]], width: int) -> tuple[str, list[str]]:
    """Slurm's compressed form of ``prefix`` with each run ``(first, extra)`` and the names it
    stands for, as Slurm writes them (a padded run keeps its width)."""
    parts, names = [], []
    for first, extra in runs:
        last = first + extra
        lo, hi = f"{first:0{width}d}", f"{last:0{width}d}"
        if width and not lo.startswith("0"):
            lo, hi = str(first), str(last)  # nothing to pad: plain numbers
            width_here = 0
        else:
            width_here = width
        parts.append(lo if extra == 0 else f"{lo}-{hi}")
        names += [f"{prefix}{i:0{width_here}d}" for i in range(first, last + 1)]
    return f"{prefix}[{','.join(parts)}]", names


@settings(max_examples=100, deadline=None)
@given(st.lists(groups, min_size=1, max_size=3))
def test_a_compressed_host_list_expands_to_every_host_in_order(
    drawn: list[tuple[str, list[tuple[int, int]], int]],
) -> None:
    texts, expect = [], []
    for prefix, runs, width in drawn:
        text, names = compress(prefix, runs, width)
        texts.append(text)
        expect += names
    assert hostnames(",".join(texts)) == tuple(expect)


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n[098-101]", ("n098", "n099", "n100", "n101")),
        ("n[7]", ("n7",)),
        ("n[007]", ("n007",)),
        ("n[1-2],n5,m[0-1]", ("n1", "n2", "n5", "m0", "m1")),
        ("n1, n2", ("n1", "n2")),
    ],
    ids=["padding kept past the width", "one number", "one padded number", "mixed", "spaces"],
)
def test_host_list_shapes(text: str, hosts: tuple[str, ...]) -> None:
    assert hostnames(text) == hosts


def test_a_hand_written_topology_keeps_leaf_switches_only() -> None:
    text = "\n".join(
        [
            "SwitchName=leaf-a Nodes=gpu[001-002]",
            "SwitchName=leaf-b   Nodes=gpu003,gpu[004-005]   LinkSpeed=400",
            "SwitchName=orphan",  # no nodes: places nothing
            "SwitchName=top Switches=leaf-[a-b]",
            "Nodes=gpu099",  # no switch: places nothing
            "#SwitchName=old Nodes=gpu[001-005]",
        ]
    )
    assert parse_topology(text) == {
        "gpu001": "leaf-a",
        "gpu002": "leaf-a",
        "gpu003": "leaf-b",
        "gpu004": "leaf-b",
        "gpu005": "leaf-b",
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_each_rack_of_a_generated_topology_holds_exactly_its_nodes(sizes: list[int]) -> None:
    lines, expect, first = [], {}, 1
    for r, size in enumerate(sizes):
        last = first + size - 1
        lines.append(f"SwitchName=r{r} Nodes=n[{first}-{last}]  # rack {r}")
        expect.update({f"n{i}": f"r{r}" for i in range(first, last + 1)})
        first = last + 1
    lines.append(f"SwitchName=spine Switches=r[0-{len(sizes) - 1}]")
    assert parse_topology("\n".join(lines)) == expect


@pytest.mark.parametrize(
    ("fields", "cpus", "memory_gb"),
    [
        ({"cpus": 0, "real_memory": 0}, 1, 1.0),
        ({"cpus": None, "real_memory": None}, 1, 1.0),
        ({"cpus": 4, "real_memory": 512}, 4, 1.0),
        ({"cpus": 256, "real_memory": 2 * 1024 * 1024}, 256, 2048.0),
    ],
    ids=["zeros", "nulls", "under a GiB", "two TiB"],
)
def test_a_node_reports_at_least_one_cpu_and_one_gib(
    fields: dict[str, int | None], cpus: int, memory_gb: float
) -> None:
    (node,) = parse_nodes({"nodes": [sinfo_node(**fields)]})
    assert (node.cpus, node.memory_gb) == (cpus, memory_gb)


def test_a_node_with_no_partitions_or_state_is_unknown_and_serves_nothing() -> None:
    (node,) = parse_nodes({"nodes": [sinfo_node(partitions=None, state=None, state_flags=None)]})
    assert node.partitions == () and node.state == "unknown" and node.flags == ()


def held(**fields: object) -> dict[str, object]:
    (job,) = parse_jobs({"jobs": [squeue_job(job_state="PENDING", priority=0, **fields)]})
    assert job.held
    return job_spec(job, "default", 45.0)


def test_a_held_job_asking_gpus_in_all_of_a_type_becomes_whole_nodes_of_that_type() -> None:
    spec = held(node_count=4, tres_per_node="", tres_per_job="gres:gpu:a100:32", time_limit=90)
    assert (spec["gpus"], spec["per_node"]) == (32, 8)
    assert spec["gpu"] == {"types": ["a100"]}
    assert spec["time_limit"] == "5400s" and spec["checkpoint"] == {"grace": "45s"}


def test_a_held_job_with_an_unknown_qos_runs_at_normal_priority() -> None:
    assert held(qos="gold")["priority"] == "normal"
    assert held(qos="", comment="boltforge: held for placement [qos=low]")["priority"] == "low"
