"""Garbage-collector settings for the processes that hold a large, long-lived world and run
scheduling passes over it: ``bolt server`` and ``bolt simulate``.

CPython starts a young-generation collection every 700 net allocations, and every tenth of
those looks at the older generations too. A full pass over 5,000 waiting jobs allocates
hundreds of thousands of short-lived objects (placements, grants, reasons), so with the
default thresholds the collector keeps walking the whole world (fleet state, jobs, mirror
rows), none of which is garbage: about a sixth of such a pass went to it
(``bench/cycle.py``). The scheduler's objects rarely form reference cycles; what becomes
garbage is freed by reference counting as it goes, so collecting less often costs little
memory: at most ``YOUNG`` objects in cycles wait for the next young collection.
"""

from __future__ import annotations

import gc

YOUNG = 50_000  # allocations between young-generation collections (CPython: 700)
OLDER = 20  # young collections per middle one, and middle ones per full one (CPython: 10)


def tune() -> None:
    """Collect less often (see the module docstring). Idempotent."""
    gc.set_threshold(YOUNG, OLDER, OLDER)


def settle() -> None:
    """After loading a large world that lives as long as the process: collect once, then move
    everything alive into the permanent generation, which later collections skip."""
    gc.collect()
    gc.freeze()
