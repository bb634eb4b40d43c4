"""Checks over the store's history that must always hold, for tests and soak runs."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.store.models import ReplicaRow

FOREVER = float("inf")


def double_allocations(s: Session) -> list[str]:
    """Every time two replicas of different allocations held one GPU at once, in words.

    A replica holds its GPUs on its node from the moment it was sent there (``dispatched_at``)
    until it exited or was lost (``exited_at``; still held when unset). Intervals are
    half-open, so one replica may start the instant another ends.
    """
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)
    for r in s.scalars(select(ReplicaRow).where(ReplicaRow.dispatched_at.is_not(None))):
        assert r.dispatched_at is not None
        end = r.exited_at if r.exited_at is not None else FOREVER
        for gpu in r.gpus:
            held[(r.node, gpu)].append((r.dispatched_at, end, f"{r.job_id}.{r.epoch}"))
    out = []
    for (node, gpu), spans in sorted(held.items()):
        spans.sort()
        last_end, holder = float("-inf"), ""
        for start, end, who in spans:
            if start < last_end and who != holder:
                out.append(f"GPU {gpu} of {node}: {holder} and {who} overlap")
            if end > last_end:
                last_end, holder = end, who
    return out
