"""Stand-in agents for the benchmarks that need a fleet larger than the machine: this process
speaks the agent protocol (``/v1/agents``) for every host of a fleet file, so a real
``bolt server`` sees thousands of registered hosts without one ``bolt agent`` process each.

What is here: the hosts of a fleet file as their agents would declare them, registering them,
reading their desired state and reporting the replicas there started, all from ``THREADS``
concurrent connections with a progress bar on stderr; reading ``GET /v1/fleet`` and waiting
on it; and a SIGTERM that unwinds like Ctrl-C, so servers started in ``with`` blocks stop.
Used by ``bench/console.py`` and ``bench/fleet_scale.py``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from boltforge.spec.fleet import FleetSpec
from boltforge.wire.agent import AgentReport, Inventory, Registration, ReplicaEvent

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "examples" / "fleets" / "h100-16k.yaml"
# Concurrent stand-in agents and submitters: registrations and reports wait for the
# scheduler's lock, so one pass serves as many of them as are in flight.
THREADS = 32
console = Console(stderr=True)


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---- the fleet: hosts registered as stand-in agents ------------------------------------------


def address(index: int) -> str:
    """A private address of its own for the fleet's ``index``-th host (``10.x.y.z``), as each
    real host has: a gang's rendezvous port is unique per master address. Stand-ins run no
    processes, so nothing connects to it."""
    return f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"


def inventories(spec: FleetSpec) -> list[Inventory]:
    """Every host of the fleet as its agent would declare it (names as ``FleetSpec.to_tree``,
    each with its own ``address``)."""
    out: list[Inventory] = []
    for pool in spec.pools:
        for p, r, h in pool.layout.places():
            rack = f"{pool.name}-p{p}-r{r:02d}"
            out.append(
                Inventory(
                    name=f"{rack}-h{h:02d}",
                    pool=pool.name,
                    gpu=pool.gpu,
                    gpu_memory_gb=pool.gpu_memory_gb,
                    gpus=pool.gpus_per_host,
                    nvlink_island=pool.nvlink_island,
                    cpus=pool.cpus,
                    memory_gb=pool.memory_gb,
                    rails=pool.rails,
                    pod=f"{pool.name}-p{p}",
                    rack=rack,
                    tier=pool.tier.value,
                    price_per_gpu_hour=pool.price_per_gpu_hour,
                    address=address(len(out)),
                )
            )
    return out


def post(http: httpx.Client, path: str, body: Any) -> Any:
    reply = http.post(path, json=body)
    if reply.status_code >= 400:
        raise RuntimeError(f"POST {path}: {reply.status_code} {reply.text[:300]}")
    return reply.json()


def parallel(
    label: str,
    like: httpx.Client,
    items: list[Any],
    work: Callable[[httpx.Client, Any], Any],
    timeout: float = 60.0,
) -> list[Any]:
    """``work(client, item)`` on every item in ``THREADS`` threads, each with its own client
    made ``like`` the given one (``timeout`` seconds per request), with a progress bar; the
    results in order."""
    local, made = threading.local(), []

    def run(item: Any) -> Any:
        if not hasattr(local, "http"):
            local.http = httpx.Client(base_url=like.base_url, headers=like.headers, timeout=timeout)
            made.append(local.http)
        return work(local.http, item)

    out = []
    pool = ThreadPoolExecutor(THREADS)
    try:
        with progress() as bar:
            task = bar.add_task(label, total=len(items))
            for result in pool.map(run, items):
                out.append(result)
                bar.advance(task)
    finally:  # on an error or Ctrl-C, drop what has not started
        pool.shutdown(wait=True, cancel_futures=True)
        for http in made:
            http.close()
    return out


def register_hosts(
    agent: httpx.Client, hosts: list[Inventory], timeout: float = 60.0
) -> dict[str, str]:
    """Register every host; returns each node's session."""

    def one(http: httpx.Client, inv: Inventory) -> tuple[str, str]:
        body = Registration(inventory=inv).model_dump(mode="json", exclude_defaults=True)
        return inv.name, post(http, "/v1/agents/register", body)["session"]

    return dict(parallel("registering hosts", agent, hosts, one, timeout))


def report_started(agent: httpx.Client, sessions: dict[str, str]) -> int:
    """Report every replica the server wants run as started; returns how many."""

    def one(http: httpx.Client, node: str) -> int:
        desired = http.get(f"/v1/agents/{node}/desired").json()
        now = time.time()
        events = [
            ReplicaEvent(
                replica=r["replica"], job=r["job"], epoch=r["epoch"], kind="started", at=now
            )
            for r in desired["replicas"]
            if r["action"] == "run"
        ]
        if events:
            body = AgentReport(session=sessions[node], events=events)
            post(http, f"/v1/agents/{node}/report", body.model_dump(mode="json"))
        return len(events)

    return sum(parallel("reporting replicas started", agent, sorted(sessions), one))


# ---- the server's view ------------------------------------------------------------------------


def fleet(http: httpx.Client) -> dict[str, Any]:
    reply = http.get("/v1/fleet")
    reply.raise_for_status()
    data: dict[str, Any] = reply.json()
    return data


def wait_used(http: httpx.Client, gpus: int, timeout: float) -> dict[str, Any]:
    """Until the scheduler has placed ``gpus`` GPUs; returns ``/v1/fleet``."""
    deadline = time.monotonic() + timeout
    with progress() as bar:
        task = bar.add_task("scheduler placing the fill", total=gpus)
        while True:
            now = fleet(http)
            bar.update(task, completed=min(now["gpus_used"], gpus))
            if now["gpus_used"] >= gpus:
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(f"{now['gpus_used']} of {gpus} GPUs placed in {timeout} s")
            time.sleep(0.5)


def wait_running(http: httpx.Client, jobs: int, timeout: float) -> dict[str, Any]:
    """Until ``jobs`` jobs are in state ``running`` (``jobs_running`` counts scheduled ones)."""
    deadline = time.monotonic() + timeout
    while (running := (now := fleet(http))["by_state"].get("running", 0)) < jobs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{running} of {jobs} jobs running in {timeout} s")
        time.sleep(0.5)
    return now


# ---- running it --------------------------------------------------------------------------------


@contextlib.contextmanager
def interrupts_as_keyboard() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every ``finally`` and ``with`` runs."""

    def stop(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
