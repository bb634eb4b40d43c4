"""Boltforge on a real Slurm cluster against Slurm alone, on the same cluster: a slurmctld
with 8 slurmd nodes of 8 emulated GPUs in two racks (``topology/tree``), a ``bolt server``
and ``bolt slurm-bridge``.

- **preempt_signal_ms**: a low-priority job holds all 64 GPUs and checkpoints; a
  high-priority 2-node job is submitted with plain ``sbatch`` to the managed partition
  (``bolt``); the time until the victim's batch script gets SIGTERM (it writes the time;
  it waits on its sleeps with ``wait``, so its trap runs as the signal arrives rather than
  when a foreground ``sleep`` ends).
  Repeated ``--rounds`` times, each with a fresh victim, the high job sent at a moment drawn
  at random (seeded, the same for both sides) within ``PHASE_S``: Slurm acts on its own
  scheduling passes, so its latency depends on when in its pass cycle a job arrives, and a
  fixed rhythm would sample one point of that cycle.
- **slurm_preempt_signal_ms**: the same, through Slurm's own ``partition_prio`` preemption
  with requeue: the victim in partition ``low``, the high job in ``high`` (neither managed).
- **split_jobs**: the same ``--jobs``-job sequence (1 to 4 nodes of 8 GPUs, 1 to 4 s each,
  seeded) sent at once to Slurm alone (``low``, placed by ``topology/tree``) and to Boltforge
  (``bolt``); how many multi-node jobs each ran across both racks, and how long each took
  from the first submission until nothing ran or waited (``sequence_s``).

- **slurmctld_rpcs_per_s**: the bridge's ``REQUEST_JOB_INFO`` calls a second (each one
  ``squeue``), read from ``sdiag`` (reset first) over ``LOAD_S`` while two managed jobs run
  and nothing else asks slurmctld for jobs.
- **restarted_after_bridge_outage**: those two jobs, the bridge killed and away for twice the
  server's lease (``LEASE_S``), then started again: how many were restarted (a Boltforge
  restart or epoch, or Slurm's ``restart_cnt``). Slurm ran them all along: 0 is right.

Slurm's scheduling passes run every 2 s here (``SchedulerParameters=sched_interval=2,
bf_interval=2``); ``--slurm-defaults`` keeps Slurm's own 60 s and 30 s. Both sides run on
the same cluster either way.

``--json`` prints ``{"preempt_signal_ms": {"p50", "p99"}, "slurm_preempt_signal_ms":
{"p50", "p99"}, "split_jobs": {"slurm", "boltforge"}, "sequence_s": {"slurm", "boltforge"},
"multi_node_jobs": N, "slurmctld_rpcs_per_s": R, "restarted_after_bridge_outage": N, ...}``.
``--bridge-poll`` sets the bridge's ``--poll`` (its default otherwise).
Needs root and Debian's slurm-wlm and munge. Figures depend on the machine; nothing here
asserts them.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from boltforge.slurm.model import hostnames
from boltforge.testing.processes import wait_until
from boltforge.testing.slurm import FAST_SCHEDULER
from boltforge.testing.slurm_fleet import SlurmFleet, slurm_fleet

VICTIM = """
trap 'date +%s.%N > "{out}.term"; exit 0' TERM
touch "{out}.ready"
while true; do sleep 0.05 & wait $!; done
"""
QUICK = "sleep {seconds}\n"
PHASE_S = 2.0  # the high job is sent within this long of the victim settling (the tests' pass)
LEASE_S = 3.0  # the server's lease: the bridge's outage lasts twice this
LOAD_S = 20.0  # how long slurmctld's RPCs are counted
STEADY = "sleep 600\n"


def pct(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(values, 50)), 1),
        "p99": round(float(np.percentile(values, 99)), 1),
    }


def signal_ms(fleet: SlurmFleet, victim_part: str, high_part: str, tag: str, delay: float) -> float:
    """Run a victim on every node, submit a high job ``delay`` seconds after it has settled,
    time the victim's SIGTERM."""
    out = fleet.data / f"{tag}-{time.monotonic_ns()}"
    script = VICTIM.format(out=out)
    victim = fleet.slurm.sbatch(
        "-p", victim_part, "-N8", "--gres=gpu:8", "--qos=low", script=script
    )
    wait_until(lambda: Path(f"{out}.ready").exists(), 60, "the victim to run")
    time.sleep(0.5 + delay)  # its trap is set
    sent = time.time()
    high = fleet.slurm.sbatch(
        "-p", high_part, "-N2", "--gres=gpu:8", "--qos=high", script=QUICK.format(seconds=1)
    )
    term = Path(f"{out}.term")
    wait_until(lambda: term.exists() and term.read_text().endswith("\n"), 60, "the SIGTERM")
    took = (float(term.read_text()) - sent) * 1000
    if victim_part == "bolt":  # the victim is requeued by Boltforge: cancel it there
        api = fleet.api
        for sid in (victim, high):
            bf = wait_until(partial(fleet.boltforge_id, sid), 30, "the Boltforge job")
            api.cancel(bf)
    else:
        fleet.slurm.run("scancel", victim, high)
    wait_until(lambda: quiet(fleet), 60, "the cluster to empty")
    return took


def idle(fleet: SlurmFleet) -> bool:
    running = ("RUNNING", "COMPLETING", "CONFIGURING")
    return not any(j["job_state"] in running for j in fleet.queue().values())


def quiet(fleet: SlurmFleet) -> bool:
    """Nothing runs or waits in Slurm."""
    live = ("RUNNING", "COMPLETING", "CONFIGURING", "PENDING")
    return not any(j["job_state"] in live for j in fleet.queue().values())


def sequence(jobs: int, seed: int) -> list[tuple[int, int]]:
    """(nodes, seconds) per job: mostly multi-node, as fragmenting as a busy queue."""
    rng = random.Random(seed)
    return [(rng.choice([1, 1, 2, 2, 3, 4]), rng.randint(1, 4)) for _ in range(jobs)]


def splits(fleet: SlurmFleet, partition: str, seq: list[tuple[int, int]]) -> tuple[int, int, float]:
    """Send ``seq`` at once to ``partition``; (multi-node jobs, those spread over racks,
    seconds from the first submission until nothing runs or waits)."""
    sent = time.monotonic()
    ids = [
        fleet.slurm.sbatch(
            "-p", partition, f"-N{n}", "--gres=gpu:8", script=QUICK.format(seconds=s)
        )
        for n, s in seq
    ]
    seen: dict[str, tuple[str, ...]] = {}
    deadline = time.monotonic() + 600
    while len(seen) < len(ids) and time.monotonic() < deadline:
        for sid, j in fleet.queue().items():
            if sid in ids and sid not in seen and j["job_state"] in ("RUNNING", "COMPLETING"):
                seen[sid] = hostnames(str(j["nodes"]))
        time.sleep(0.1)
    rack = {n: i for i, r in enumerate(fleet.slurm.racks) for n in r}
    multi = [nodes for nodes in seen.values() if len(nodes) > 1]
    wait_until(lambda: quiet(fleet), 120, "the sequence to finish")
    split = sum(1 for nodes in multi if len({rack[n] for n in nodes}) > 1)
    return len(multi), split, time.monotonic() - sent


def job_info_calls(fleet: SlurmFleet) -> int:
    """slurmctld's ``REQUEST_JOB_INFO`` count since ``sdiag`` was last reset."""
    m = re.search(r"REQUEST_JOB_INFO\s+\(\s*\d+\)\s+count:(\d+)", fleet.slurm.run("sdiag"))
    return int(m.group(1)) if m else 0


def steady_jobs(fleet: SlurmFleet) -> dict[str, str]:
    """Two managed jobs (2 nodes and 1 node) running; Slurm id -> Boltforge id."""
    ids = [
        fleet.slurm.sbatch("-p", "bolt", f"-N{n}", "--gres=gpu:8", script=STEADY) for n in (2, 1)
    ]
    running = ("RUNNING",)
    wait_until(
        lambda: all(fleet.queue()[i]["job_state"] in running for i in ids), 60, "both to run"
    )
    return {
        sid: wait_until(partial(fleet.boltforge_id, sid), 30, "the Boltforge job") for sid in ids
    }


def rpcs_per_s(fleet: SlurmFleet) -> float:
    """The bridge's ``REQUEST_JOB_INFO`` calls a second while nothing changes."""
    fleet.slurm.run("sdiag", "--reset")
    time.sleep(LOAD_S)
    return job_info_calls(fleet) / LOAD_S


def restarted_after_outage(fleet: SlurmFleet, jobs: dict[str, str]) -> int:
    """Kill the bridge, keep it away for twice the lease, start it again: how many of
    ``jobs`` were restarted by either side."""
    fleet.kill_bridge()
    time.sleep(LEASE_S * 2)
    fleet.start_bridge()
    api = fleet.api
    wait_until(lambda: {n.state for n in api.nodes().nodes} == {"ready"}, 60, "nodes to return")
    time.sleep(2 * LEASE_S)  # what a restart would do is done by now
    queue = fleet.queue()
    restarted = 0
    for sid, bf in jobs.items():
        detail = api.job(bf)
        slurm_restarts = int(queue[sid].get("restart_cnt") or 0)
        restarted += bool(detail.restarts or detail.epoch != 1 or slurm_restarts)
    for bf in jobs.values():
        api.cancel(bf)
    wait_until(lambda: quiet(fleet), 60, "the cluster to empty")
    return restarted


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--slurm-defaults",
        action="store_true",
        help="Slurm's own scheduler intervals (60 s main, 30 s backfill) instead of 2 s",
    )
    parser.add_argument("--bridge-poll", type=float, help="the bridge's --poll, in seconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # Every round bumps the same GPUs, far beyond a real churn budget.
    server = ["--churn", "1000", "--heartbeat", "0.5", "--lease", str(LEASE_S)]
    poll = ("--poll", str(args.bridge_poll)) if args.bridge_poll is not None else ()
    scheduler = None if args.slurm_defaults else FAST_SCHEDULER
    with (
        tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp,
        slurm_fleet(Path(tmp), server, scheduler, bridge_args=poll) as fleet,
    ):
        jobs = steady_jobs(fleet)
        load = rpcs_per_s(fleet)
        restarted = restarted_after_outage(fleet, jobs)
        rng = random.Random(args.seed)
        delays = [rng.uniform(0.0, PHASE_S) for _ in range(args.rounds)]
        ours = [signal_ms(fleet, "bolt", "bolt", "bolt", d) for d in delays]
        theirs = [signal_ms(fleet, "low", "high", "slurm", d) for d in delays]
        seq = sequence(args.jobs, args.seed)
        multi, slurm_split, slurm_s = splits(fleet, "low", seq)
        _, bolt_split, bolt_s = splits(fleet, "bolt", seq)
    result = {
        "preempt_signal_ms": pct(ours),
        "slurm_preempt_signal_ms": pct(theirs),
        "speedup_p50": round(statistics.median(theirs) / statistics.median(ours), 1),
        "split_jobs": {"slurm": slurm_split, "boltforge": bolt_split},
        "sequence_s": {"slurm": round(slurm_s, 1), "boltforge": round(bolt_s, 1)},
        "multi_node_jobs": multi,
        "slurmctld_rpcs_per_s": round(load, 2),
        "restarted_after_bridge_outage": restarted,
        "rounds": args.rounds,
        "jobs": args.jobs,
        "slurm_scheduler": "defaults" if args.slurm_defaults else FAST_SCHEDULER,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"high-priority sbatch to SIGTERM at the victim ({args.rounds} rounds):")
    print(
        f"  Boltforge on Slurm   p50 {result['preempt_signal_ms']['p50']:8.1f} ms"
        f"   p99 {result['preempt_signal_ms']['p99']:8.1f} ms"
    )
    print(
        f"  Slurm partition_prio p50 {result['slurm_preempt_signal_ms']['p50']:8.1f} ms"
        f"   p99 {result['slurm_preempt_signal_ms']['p99']:8.1f} ms"
    )
    print(f"  Boltforge is {result['speedup_p50']}x faster at the median")
    print(f"{args.jobs}-job sequence, {multi} multi-node jobs split across racks:")
    print(f"  Slurm topology/tree {slurm_split}   Boltforge {bolt_split}")
    print(f"sent to all done: Slurm {slurm_s:.1f} s   Boltforge {bolt_s:.1f} s")
    print(f"the bridge's REQUEST_JOB_INFO to slurmctld, steady: {load:.2f}/s (sdiag)")
    print(f"jobs restarted after the bridge was away {2 * LEASE_S:g} s: {restarted}")


if __name__ == "__main__":
    main()
