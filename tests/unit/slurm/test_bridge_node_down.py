"""The Slurm bridge's nodes: each registers as one whose replicas outlive its lease (Slurm
runs them), and a node Slurm says is down is let go only after the gangs with a replica
there were reported ended by their node (its lease then runs out with nothing left on it)."""

from __future__ import annotations

from slurm_builders import sinfo_node
from slurm_fakes import NODES, FakeServer, FakeSlurm, bridge, run, wants

from boltforge.slurm.model import parse_nodes


def test_every_slurm_node_registers_as_one_whose_replicas_outlive_its_lease() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    run(bridge(slurm, server))
    assert [r.inventory.replicas_outlive_lease for r in server.registered] == [True] * len(NODES)


def test_a_node_down_in_slurm_reports_its_gang_ended_by_the_node_then_loses_its_lease() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, node_count=1)
    b = bridge(slurm, server)
    b.nodes_every_s = 0.0  # sinfo on every pass
    run(b)
    wants(b, "run", "1", 1, ["n1"])
    run(b)
    slurm.set(sid, state="RUNNING")
    run(b)
    assert server.kinds("1.1.0") == ["started"]
    slurm.nodes_ = parse_nodes(
        {"nodes": [sinfo_node(name="n1", state="down"), sinfo_node(name="n2")]}
    )
    run(b)
    [ended] = [e for e in server.events if e.replica == "1.1.0" and e.kind == "exited"]
    assert ended.by_node
    assert sorted(b.state.leases) == ["n2"]
    assert sid not in b.state.gangs
