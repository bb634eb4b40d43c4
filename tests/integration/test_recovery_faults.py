"""A real control plane (``bolt server``, ``bolt agent``s for 8-GPU hosts, the example
trainer) loses one host of a three-host gang: the gang restarts from its checkpoint on the
two hosts it kept plus the closest healthy one, and nothing is lost or double-held."""

from __future__ import annotations

from pathlib import Path

from test_faults import (
    SHORT_LEASE,
    checkpointed,
    fleet,
    node_state,
    nothing_lost,
    resumed_from,
    running_at_epoch,
    submit,
    trainer,
)

from boltforge.testing.processes import wait_until


def rack(name: str) -> int:
    return int(name.rsplit("-", 1)[1]) // 2  # LocalCluster: two hosts per rack


def test_a_gang_that_loses_a_host_restarts_on_the_rest_plus_the_closest_host(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 4, SHORT_LEASE) as (cluster, api):
        job = submit(api, {**trainer("gang", 300), "gpus": 24})
        wait_until(lambda: checkpointed(api, job, 20), 60, "a checkpoint")
        home = sorted(r.node for r in api.job(job).placement)
        victim = next(h for h in home if sum(rack(o) == rack(h) for o in home) == 1)
        [partner] = [
            f"host-{i}"
            for i in range(4)
            if rack(f"host-{i}") == rack(victim) and f"host-{i}" != victim
        ]
        kept = sorted(set(home) - {victim})

        cluster.kill_host(victim)

        wait_until(lambda: node_state(api, victim) == "dead", 30, f"{victim} to be dead")
        moved = wait_until(lambda: running_at_epoch(api, job, 2), 60, "the gang to resume")
        assert sorted(r.node for r in moved.placement) == sorted([*kept, partner])
        notes = [e.message for e in moved.events if e.kind == "note"]
        assert f"replaced {victim} by {partner} (same rack), kept {', '.join(kept)}" in notes
        assert moved.restarts == 1
        nothing_lost(cluster, api, [job])
        assert resumed_from(api, job)[-1] >= 20
