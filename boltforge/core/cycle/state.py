"""The state of one pass (``PassState``), which every phase reads and changes.

Contract. A ``PassState`` is made by ``run.py`` at the start of a pass and never leaves the
cycle. Its fields fall into four groups:

- inputs, set once: ``policy``, ``now``, ``running``, ``quota``, ``routing``, ``explain``,
  ``rules``, ``max_class``, ``borrowing``;
- the scratch fleet and the quota count the pass fills in: ``work`` (a copy of the snapshot's
  state, the only state any phase allocates on) and ``holdings`` (GPUs per queue and pool);
- the decisions, appended to in order: ``binds``, ``evictions``, ``reservations``,
  ``waiting``, and ``recent`` (preemptions, for the churn budget);
- budgets and caches, each cleared by whatever changes what it summarizes:
  ``estimates_left``, ``preempt_attempts``, ``failed_shapes``, ``last_host``, ``head_blocked``,
  ``unseen``, ``open_gpus``, ``standing``, ``spread``, ``alive``, ``fences``, ``churn``,
  ``margins``.

``count_open_gpus`` is the one cache read here: free GPUs on hosts taking work, counted again after
``bind``, ``_evict`` or a restart hold cleared it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from boltforge.core.decisions import Bind, Evict, Reserve, Waiting, WaitReason
from boltforge.core.model.state import FleetState
from boltforge.core.model.workload import Running
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.routing import RoutingFacts
from boltforge.core.policy import Policy
from boltforge.core.preempt.bump import Margins
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.queueing.quota import QuotaTree

if TYPE_CHECKING:
    from boltforge.core.cycle.preempt import Alive
    from boltforge.core.cycle.reserve import Fences


@dataclass
class PassState:
    """Everything one pass knows and has decided so far; made by ``run.py``, read and changed
    by the phases, never seen outside the cycle."""

    # What the pass was given, set when it begins and never changed: the policy, the time,
    # the running jobs by id, the queue tree (None: no quotas), cost-aware routing's facts
    # (None: routing off), whether anybody reads the reasons (``explain``), the policy's
    # preemption rules as this pass applies them (``preempt_rules``), the most important class
    # running (``max_class``) and whether any running job borrows quota.
    policy: Policy
    now: float
    work: FleetState  # the snapshot's fleet state, copied: every start and eviction lands here
    running: dict[str, Running]
    quota: QuotaTree | None = None
    holdings: dict[str, dict[str, int]] = field(default_factory=dict)  # GPUs per queue, pool
    routing: RoutingFacts | None = None
    explain: bool = True
    rules: PreemptRules = field(default_factory=PreemptRules)
    max_class: int | None = None
    borrowing: bool = False

    # The decisions, in the order they were made (``recent`` also holds the snapshot's
    # recent preemptions, for the churn budget).
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    reservations: list[Reserve] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    recent: list[tuple[float, int]] = field(default_factory=list)
    unseen: int = 0  # jobs left waiting unlooked-at (``tail.py``)

    # Budgets, spent as the pass goes: start estimates for waiting jobs, victim searches.
    estimates_left: int = 0
    preempt_attempts: int = 0
    # Strict order: the job everyone behind now waits for (None: not blocked).
    head_blocked: str | None = None

    # What the pass remembers to skip work it already did; each is cleared (or checked
    # against what it was made from) when what it summarizes changes.
    failed_shapes: dict[tuple[object, ...], tuple[WaitReason, tuple[str, ...]]] = field(
        default_factory=dict
    )  # a shape (gang, class, fenced hosts) that did not start, and why
    last_host: tuple[tuple[object, ...], Placement] | None = None  # ``repeat``
    open_gpus: int | None = None  # free GPUs on hosts taking work; None: count again
    standing: dict[str, tuple[int, ...]] | None = None  # finer standings by job id
    spread: dict[str, Counter[int]] | None = None  # jobs per host per spread group (``apart``)
    alive: Alive | None = None  # the running jobs as victim searches see them (``_alive``)
    fences: Fences | None = None  # the reservations' hosts, for ``blocked_hosts``
    churn: tuple[int, bool] | None = None  # ``_churn_spent``, as of that many ``recent``
    margins: Margins | None = None  # the running jobs' time left, under bumping (``_margins``)


def count_open_gpus(p: PassState) -> int:
    """Free GPUs on hosts that take work, counted once per change of the pass's state (every
    change goes through ``bind``, ``_evict`` or a restart hold, which clear the count)."""
    if p.open_gpus is None:
        p.open_gpus = int(p.work.host_free[~p.work.cordoned].sum())
    return p.open_gpus
