"""Preemption in a user's words: what each victim loses, why this domain, why not at all.

``Search`` records what the victim search saw (the best option, the options it beat, domains
without room, domains whose least possible loss was already too high, the churn budget); the
functions here turn that record into the explanation of ``Victims`` and the reasons of
``NoVictims``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import BoolArray
from boltforge.core.model.workload import Job
from boltforge.core.placement.answers import Outcome, Placement
from boltforge.core.placement.modes import could_ever_fit
from boltforge.core.placement.place import domain_column
from boltforge.core.preempt.freeing import Need, Option, Shortfall
from boltforge.core.preempt.victims import Action, PreemptRules, Refusal, Screening, VictimTier


@dataclass(frozen=True, slots=True)
class ChurnNote:
    """GPUs preempted in the current window (``used``) and the most allowed (``limit``)."""

    used: int
    limit: int
    window_s: float


@dataclass(slots=True)
class Search:
    """What the victim search found, for the explanation (filled in as domains are tried)."""

    churn: ChurnNote = field(default_factory=lambda: ChurnNote(0, 0, 0.0))
    best: Option | None = None
    beaten: list[Option] = field(default_factory=list)
    short: Counter[Shortfall] = field(default_factory=Counter)
    outbid: int = 0
    over_churn: int | None = None  # least churn (recent + victims) of an option over budget

    def offer(self, option: Option) -> None:
        """Keep ``option`` if it beats the best so far; remember the loser."""
        if self.best is None or option.key() < self.best.key():
            if self.best is not None:
                self.beaten.append(self.best)
            self.best = option
        else:
            self.beaten.append(option)

    def note_churn(self, total: int) -> None:
        if self.over_churn is None or total < self.over_churn:
            self.over_churn = total


def span(seconds: float) -> str:
    """A duration as a user reads it: ``45 s``, ``25 min``, ``2.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def gpu_hours(gpu_seconds: float) -> str:
    """GPU-seconds as GPU-hours: two decimals below one, else one."""
    hours = gpu_seconds / 3600
    return f"{hours:.2f}" if hours < 1 else f"{hours:.1f}"


def _tag(action: Action, job: Job) -> str:
    cand = action.cand
    if cand.tier == VictimTier.RECLAIM:
        return f" [runs on quota borrowed from {job.queue}: reclaimed first]"
    if cand.tier == VictimTier.OVER_QUOTA:
        return " [over its quota]"
    return f" [class {cand.priority}]"


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def action_line(action: Action, job: Job, now: float) -> str:
    """``j-17: 8 GPUs x (25 min since checkpoint + 60 s restart) = 3.5 GPU-hours [class 3]``."""
    cand, run = action.cand, action.cand.run
    restart = run.job.restart_overhead
    if action.drop is not None:
        after = cand.replicas - len(action.drop)
        return (
            f"{cand.id}: shrink from {cand.replicas} to {after} replica(s), {_gpus(action.gpus)} x "
            f"{span(restart)} restart = {gpu_hours(action.lost)} GPU-hours "
            f"(elastic: keeps its progress){_tag(action, job)}"
        )
    since, what = run.start_time, "start"
    saved = run.checkpoint_before(now)
    if saved is not None:
        since, what = saved, "checkpoint"
    return (
        f"{cand.id}: {_gpus(run.gpus)} x ({span(max(now - since, 0.0))} since {what} + "
        f"{span(restart)} restart) = {gpu_hours(action.lost)} GPU-hours{_tag(action, job)}"
    )


def _why_beaten(best: Option, other: Option) -> str:
    if round(other.cost, 6) > round(best.cost, 6):
        return "loses more work"
    if len(other.plan) > len(best.plan):
        return "equal loss, more victims"
    if round(other.placement.cost.total, 6) > round(best.placement.cost.total, 6):
        return f"equal loss and victims, costlier placement ({other.placement.cost.total:g})"
    return "equal in every respect; the tighter domain goes first"


def _domain_lines(best: Option, search: Search) -> list[str]:
    lines: list[str] = []
    mine = {a.cand.id for a in best.plan}
    seen: list[set[str]] = [mine]
    others: list[Option] = []
    for other in sorted(search.beaten, key=Option.key):
        victims = {a.cand.id for a in other.plan}
        if victims not in seen:  # the same victims found from a wider domain say nothing new
            seen.append(victims)
            others.append(other)
    for other in others[:3]:
        lines.append(
            f"beat {other.domain.label}: {gpu_hours(other.lost)} GPU-hours over "
            f"{len(other.plan)} victim(s), placement cost {other.placement.cost.total:g} "
            f"({_why_beaten(best, other)})"
        )
    if search.outbid:
        lines.append(
            f"{search.outbid} other domain(s) could not do better: even the least work they "
            "could lose was more"
        )
    if search.short[Shortfall.ROOM] or search.short[Shortfall.LAYOUT]:
        n = search.short[Shortfall.ROOM] + search.short[Shortfall.LAYOUT]
        lines.append(f"{n} domain(s) have no room even after evicting every eligible job")
    if search.over_churn is not None:
        lines.append("options that would exceed the churn budget were left out")
    head = f"why {best.domain.label}: no other rack, pod or fleet-wide choice loses less work"
    if any(round(o.cost, 6) == round(best.cost, 6) for o in others[:3]):
        head += " (ties go to fewer victims, then the cheaper placement)"
    return [head, *lines]


def explain_option(
    job: Job, option: Option | None, placement: Placement, search: Search, now: float
) -> tuple[str, ...]:
    """The arithmetic of a preemption: who loses what, why this domain, and the total."""
    hosts = len({g.host for g in placement.grants})
    where = f"placement cost {placement.cost.total:g} on {hosts} host(s)"
    if option is None:
        return (f"{job.id} fits now: nothing to preempt", where)
    evicted = sum(a.drop is None for a in option.plan)
    shrunk = len(option.plan) - evicted
    head = f"to place {job.id} ({job.gpus} GPUs, class {job.priority}) in {option.domain.label}"
    head += f": evict {evicted} job(s)" + (f", shrink {shrunk}" if shrunk else "")
    lines = [head, *(action_line(a, job, now) for a in option.plan), where]
    lines += _domain_lines(option, search)
    if any(a.cand.weight != 1.0 for a in option.plan):
        lines.append(
            f"compared by tier-weighted loss: {gpu_hours(option.cost)} GPU-hours (borrowed work "
            "x0.25, over quota x0.5, class 3 x1, class 2 x2, class 1 x4)"
        )
    churn = search.churn
    lines.append(
        f"total: {gpu_hours(option.lost)} GPU-hours lost; {option.gpus} GPUs preempted "
        f"({churn.used + option.gpus} of {churn.limit} GPUs per {span(churn.window_s)} "
        "churn budget)"
    )
    return tuple(lines)


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _refusal_line(why: Refusal, n: int, job: Job, rules: PreemptRules) -> str:
    p = job.priority
    if why == Refusal.SERVING:
        return _plural(n, "serving job (class 0) is", "serving jobs (class 0) are") + (
            " never preempted"
        )
    if why == Refusal.PRODUCTION:
        return _plural(n, "class-1 job", "class-1 jobs") + (
            f" can be preempted only by class 0 (this job is class {p})"
        )
    if why == Refusal.CASCADE:
        return _plural(n, "job", "jobs") + (
            f" of class {p} or more important cannot be displaced by a class-{p} job (no cascades)"
        )
    if why == Refusal.PINNED:
        return _plural(n, "job is", "jobs are") + " not preemptible"
    if why == Refusal.YOUNG:
        first = f"first {span(rules.min_runtime_s)}"
        return _plural(
            n, f"candidate victim is in its {first}", f"candidate victims are in their {first}"
        )
    if why == Refusal.COOLDOWN:
        return _plural(n, "candidate victim was", "candidate victims were") + (
            f" preempted in the last {span(rules.cooldown_s)}"
        )
    if why == Refusal.UNSAVED:
        window = span(rules.peer_window_s or 0.0)
        return _plural(n, f"job of class {p} has", f"jobs of class {p} have") + (
            f" not checkpointed in the last {window}, so bumping would lose work"
        )
    return _plural(n, "job has", "jobs have") + " no running record, so they are left alone"


def _capable(state: FleetState, job: Job) -> tuple[BoolArray, str]:
    """Usable hosts of the narrowest domains big enough for the gang, and their plural name."""
    tree = state.tree
    need = Need.of(state, job.gang)
    size = np.where(need.usable, tree.host_gpus, 0)
    required = job.gang.topology.required
    for level in (Level.RACK, Level.POD, Level.SPINE):
        if required is not None and level > max(required, Level.RACK):
            break
        column = domain_column(tree, level)
        totals = np.bincount(column, weights=size, minlength=int(column.max()) + 1)
        big = np.flatnonzero(totals >= need.gpus)
        if len(big):
            name = "fleet" if level == Level.SPINE else f"{level.label}s"
            return np.isin(column, big) & need.usable, name
    return need.usable, "fleet"


def _levels_word(job: Job) -> str:
    required = job.gang.topology.required
    if required is not None and required <= Level.RACK:
        return "rack"
    if required == Level.POD:
        return "rack/pod"
    return "rack/pod/fleet"


def no_victims_reasons(
    state: FleetState, job: Job, screening: Screening, search: Search, rules: PreemptRules
) -> tuple[str, ...]:
    """Why preemption cannot make room: the headline first, then who is left alone and why."""
    ever = could_ever_fit(state.tree, job.gang)
    if ever.outcome == Outcome.NEVER:
        return ("it could never run on this fleet, even with every job gone", *ever.reasons)
    inside, where = _capable(state, job)
    near = {
        a.job
        for a in state.allocations.values()
        if any(g.gpus and inside[g.host] for g in a.grants)
    }
    known = [*screening.refused, *screening.unknown(state, job)]
    refused = [(j, c, why) for j, c, why in known if j in near]
    lines: list[str] = []
    top = (Refusal.SERVING, Refusal.PRODUCTION)
    eligible = any(any(g.gpus and inside[g.host] for g in c.grants) for c in screening.candidates)
    if refused and not eligible and all(why in top for _, _, why in refused):
        classes = {c for _, c, _ in refused}
        names = "/".join(str(c) for c in sorted(classes))
        lines.append(f"only class {names} jobs run in the {where} that could hold it")
    if search.over_churn is not None:
        churn = search.churn
        lines.append(
            f"preempting would exceed the churn budget ({search.over_churn} of {churn.limit} "
            f"GPUs per {span(churn.window_s)})"
        )
    if search.short[Shortfall.LAYOUT]:
        lines.append(
            f"in {search.short[Shortfall.LAYOUT]} domain(s) with enough GPUs once every eligible "
            "job is gone, the gang's replicas still do not fit (NVLink islands, CPUs or memory)"
        )
    if search.over_churn is None and not search.short[Shortfall.LAYOUT]:
        lines.append(f"even evicting every eligible job leaves no {_levels_word(job)} with room")
    counts = Counter(why for _, _, why in refused)
    lines += [_refusal_line(why, counts[why], job, rules) for why in Refusal if counts[why]]
    return tuple(lines)
