"""The store going away under a working fleet: a ``bolt server`` on a real PostgreSQL (a
primary and a synchronous streaming standby, given to ``--db`` in libpq's multi-host form
with ``target_session_attrs=read-write``), two ``bolt agent`` processes standing in for 8-GPU
hosts, and jobs submitted the whole time (each with an idempotency key, through the client's
own retries). In turn: PostgreSQL restarts; it stops for ``--stop-for`` seconds; the primary
is killed and the standby promoted. Then a second server on SQLite, whose store lives on a
small tmpfs, has its disk filled for ``--stop-for`` seconds (skipped where no tmpfs can be
mounted). On the way, ``bolt server`` is given a ``--db`` that names no server, a wrong
password and a database that does not exist.

- **accepted**, **lost**: jobs accepted, and those never finished (gone, failed or still
  unfinished after the drain).
- **double_allocations**, **duplicate_starts**: counted from what ran, as
  ``bench/failover.py`` counts them.
- **http_500**: submissions answered 500 (must be 0).
- **log_lines_per_outage**: lines the server logged from each fault until after recovery.
- **outage_s**: from the fault until its repair was done: PostgreSQL started again (``pg_ctl
  -w``: it accepts connections) or the standby promoted (it takes writes), or the disk
  freed. **recovery_s**: from then to the first placement, as the job itself records it (the
  first job process started after it), p50 and max. It counts everything between: the
  synchronous standby connecting to the restarted primary again (commits wait for it), the
  server finding the store back, reading its world afresh and running a full pass, the
  agent hearing of the placement and starting the process.
- **bad_input**: for each bad ``--db``, its exit code and whether it said one line naming
  ``--db`` and the fix.

``--json`` prints the figures as one object. Figures depend on the machine; nothing here
asserts them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from failover import EVERY_STATE, WORKLOAD, Flow, overlaps

from boltforge.client import Client
from boltforge.testing.pgcluster import Cluster
from boltforge.testing.postgres import free_port
from boltforge.testing.processes import LocalCluster, bolt
from boltforge.wire.jobs import TERMINAL

HOSTS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stop-for", type=float, default=30.0, help="seconds of outage")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds between faults")
    parser.add_argument("--every", type=float, default=0.3, help="seconds between submissions")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="bench-store-faults-"))
    result: dict[str, Any] = {"bad_input": bad_input(data)}
    outages: list[dict[str, float]] = []
    flows: list[tuple[Flow, LocalCluster]] = []
    pg = Cluster()
    try:
        flows.append(run_postgres(pg, data, args, outages))
    finally:
        pg.close()
    with contextlib.suppress(PermissionError):
        flows.append(run_full_disk(data, args, outages))
    result.update(figures(flows, outages))
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>22}: {v}")


def run_postgres(
    pg: Cluster, data: Path, args: argparse.Namespace, outages: list[dict[str, float]]
) -> tuple[Flow, LocalCluster]:
    """The fleet on PostgreSQL through a restart, a stop and a failover."""
    standby = pg.standby()
    pg.synchronous()
    primary = pg.servers[0]
    fleet = LocalCluster(data / "pg", hosts=HOSTS, db=pg.multi_host())
    faults: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("restart", lambda: pg.stop(primary), lambda: pg.start(primary)),
        ("stop", lambda: pg.stop(primary), lambda: _after(args.stop_for, pg.start, primary)),
        ("failover", lambda: pg.stop(primary, "immediate"), lambda: pg.promote(standby)),
    ]
    return run_faults(fleet, faults, args, outages)


def run_full_disk(
    data: Path, args: argparse.Namespace, outages: list[dict[str, float]]
) -> tuple[Flow, LocalCluster]:
    """The fleet on SQLite on a small tmpfs whose disk fills up for a while."""
    disk = data / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        raise PermissionError("cannot mount a tmpfs")
    filler = disk / "filler"
    fleet = LocalCluster(data / "sqlite", hosts=HOSTS, db=f"sqlite:///{disk / 'store.db'}")
    faults = [("disk full", lambda: fill(filler), lambda: _after(args.stop_for, filler.unlink))]
    try:
        return run_faults(fleet, faults, args, outages)
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def run_faults(
    fleet: LocalCluster,
    faults: list[tuple[str, Callable[[], None], Callable[[], None]]],
    args: argparse.Namespace,
    outages: list[dict[str, float]],
) -> tuple[Flow, LocalCluster]:
    """Start ``fleet``, keep jobs flowing, apply each fault and its repair in turn, drain."""
    workload, record = fleet.data / "work.py", fleet.data / "record.log"
    fleet.start()
    workload.write_text(WORKLOAD)
    flow = Flow(
        fleet.url,
        workload,
        record,
        args.every,
        token=fleet.admin_token,
        gpus=lambda n: 8,
        seconds=2,
        prefix=fleet.data.name,
    )
    flow.thread.start()
    try:
        for name, fault, repair in faults:
            time.sleep(args.settle)
            progress(f"{name} at {time.time():.3f}")
            outages.append(one_outage(fleet, record, fault, repair))
        time.sleep(args.settle)
        flow.stopped.set()
        flow.thread.join(90)
        drain(fleet, flow)
    except BaseException:
        fleet.stop()
        raise
    fleet.stop()
    return flow, fleet


def one_outage(
    fleet: LocalCluster, record: Path, fault: Callable[[], None], repair: Callable[[], None]
) -> dict[str, float]:
    """Apply ``fault`` then ``repair``; how long the store was away, how long until the next
    placement, and how many lines the server logged meanwhile."""
    log = fleet.data / "server.log"
    before = _lines(log)
    at = time.time()
    fault()
    repair()
    back = time.time()
    placed = _first_start_after(record, back, 60.0)
    time.sleep(2.0)
    return {
        "outage_s": back - at,
        "recovery_s": (placed - back) if placed is not None else float("inf"),
        "log_lines": _lines(log) - before,
    }


def drain(fleet: LocalCluster, flow: Flow, drain_s: float = 120.0) -> None:
    """Wait until every accepted job ended (or ``drain_s`` passed)."""
    ids = set(flow.accepted.values())
    deadline = time.monotonic() + drain_s
    with Client(fleet.url, fleet.admin_token) as client:
        while time.monotonic() < deadline:
            listed: dict[str, str] = {j.id: j.state for j in client.jobs(state=EVERY_STATE).jobs}
            flow.states = listed
            if all(listed.get(j) in TERMINAL for j in ids):
                return
            time.sleep(1.0)


def figures(
    flows: list[tuple[Flow, LocalCluster]], outages: list[dict[str, float]]
) -> dict[str, Any]:
    accepted = lost = http_500 = double = duplicates = 0
    for flow, fleet in flows:
        ids = set(flow.accepted.values())
        accepted += len(ids)
        lost += sum(1 for j in ids if flow.states.get(j) != "succeeded")
        http_500 += flow.http_500
        d, dup, _ = overlaps(fleet.data / "record.log")
        double, duplicates = double + d, duplicates + dup
    return {
        "accepted": accepted,
        "lost": lost,
        "double_allocations": double,
        "duplicate_starts": duplicates,
        "http_500": http_500,
        "log_lines_per_outage": [o["log_lines"] for o in outages],
        "outage_s": _spread([o["outage_s"] for o in outages]),
        "recovery_s": _spread([o["recovery_s"] for o in outages]),
    }


def bad_input(data: Path) -> dict[str, dict[str, Any]]:
    """``bolt server`` with a ``--db`` that cannot work: its exit code and first line."""
    pg = Cluster(password="right")
    try:
        tries = {
            "no server": f"postgresql+psycopg://bolt@127.0.0.1:{free_port()}/bolt",
            "wrong password": pg.url().replace(":right@", ":wrong@"),
            "missing database": pg.url(database="nope"),
        }
        out = {}
        for name, db in tries.items():
            cmd = [*bolt(), "server", "--db", db, "--port", str(free_port())]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=data)
            said = " ".join((done.stdout + done.stderr).split())
            one_line = len((done.stdout + done.stderr).strip().splitlines()) <= 3
            out[name] = {
                "exit": done.returncode,
                "one_line": one_line and "--db" in said and "To fix" in said,
            }
        return out
    finally:
        pg.close()


def fill(path: Path) -> None:
    """Fill the disk ``path`` is on to the last byte."""
    with path.open("wb", buffering=0) as f:
        for size in (1 << 16, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)


def _after(seconds: float, do: Callable[..., Any], *args: Any) -> None:
    time.sleep(seconds)
    do(*args)


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def _first_start_after(record: Path, at: float, wait_s: float) -> float | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for line in record.read_text().splitlines() if record.exists() else []:
            parts = line.split(" ")
            if parts[0] == "start" and float(parts[-1]) > at:
                return float(parts[-1])
        time.sleep(0.1)
    return None


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    return {"p50": round(ordered[len(ordered) // 2], 2), "max": round(ordered[-1], 2)}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
