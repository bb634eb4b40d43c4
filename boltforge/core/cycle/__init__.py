"""The scheduling cycle: one pure function from a fleet snapshot to decisions.

A full pass (``run.py``) orders the pending jobs, then takes them one at a time through the
phases, each a module of this package::

    order.py     1. order pending jobs by the policy's ordering (fair share, FIFO, priority, LAS)
    state.py     2. a scratch copy of the fleet state that the pass fills in (``PassState``)
    place.py     3. place each job now, outside hosts reserved for jobs ahead of it (backfill);
                    near the head of the queue, lookahead keeps it from stranding the next jobs
    admit.py     4. admit against its queue's guaranteed and burst quota
    resize.py    5. start an elastic job smaller when that finishes sooner than waiting
    preempt.py   6. free a topology-valid placement at the least lost work, when that beats
                    waiting; victims are evicted (or shrunk) in the same pass
    reserve.py   7. the first blocked jobs get a when-and-where reservation
    wait.py      8. every other job carries its reason, position and, near the head, an estimate
    resize.py    9. running elastic jobs grow into what no waiting job can use, when that pays

``restart.py`` restarts a job on the GPUs held for it after a host failure, before it meets
the phases; ``tail.py`` ends a pass nobody reads the reasons of once no job left can start;
``snapshot.py`` is what a cycle sees. Each module's docstring states its contract: what it
reads from the pass's state, what it may change, what it returns. The names below are the
package's interface; names with a leading underscore are the package's own, which its modules
import from one another and nothing outside it uses.

The same inputs always give the same decisions: nothing here reads a clock or draws a random
number, and every tie is broken by job id. ``schedule_arrival`` is the incremental pass for one
new job against the reservations of the last full pass.
"""

from __future__ import annotations

from boltforge.core.cycle.order import promised_first
from boltforge.core.cycle.run import run_cycle, schedule_arrival
from boltforge.core.cycle.snapshot import Snapshot, count_holding, gpus_by_pool, holdings_of
from boltforge.core.decisions import Bind, CycleResult, Evict, Reserve, Waiting

__all__ = [
    "Bind",
    "CycleResult",
    "Evict",
    "Reserve",
    "Snapshot",
    "Waiting",
    "count_holding",
    "gpus_by_pool",
    "holdings_of",
    "promised_first",
    "run_cycle",
    "schedule_arrival",
]
