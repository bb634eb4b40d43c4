"""What a Slurm user reads in ``squeue -o "%i %T %k"``: the comment the bridge writes on each
job it manages. Pure functions of what the server and Slurm say about the job.

Every comment fits Slurm's 250 characters with its fix whole: when one must be cut, the
reason is shortened, never the ``To fix:`` part. Refusals speak the ``sbatch`` options the
user typed, not the job spec's field names."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

LIMIT = 250  # the longest comment the bridge writes
TAG = "boltforge"
FIX = "To fix:"
ELLIPSIS = "..."

WAITING = frozenset({"pending", "requeued"})  # states in which a job waits for a place
PLACED = frozenset({"scheduled", "running"})

# What rules preemption out, as the server's waiting detail words it (core/preempt/text.py).
_PREEMPT_RULED_OUT = (
    "churn budget",  # the churn budget
    "in its first",  # the minimum runtime
    "in their first",
    "preempted in the last",  # the cooldown
    "not preemptible",
    "never preempted",  # serving jobs
    "can be preempted only by",  # class-1 jobs
    "cannot be displaced",  # no cascades
)

# The job spec's words, as the sbatch options they came from (slurm/translate.py).
_SBATCH_WORDS = (
    (re.compile(r"\bper_node\b"), "GPUs per node (--gres=gpu:N)"),
    (re.compile(r"\broles\[\d+\]\.?"), ""),
    (re.compile(r"\brole worker\b"), "the job"),
    (re.compile(r"\bmemory_gb\b"), "--mem"),
    (re.compile(r"\btime_limit\b"), "-t"),
)


@dataclass(frozen=True, slots=True)
class JobView:
    """What the bridge knows of one managed job: the server's ``state``, waiting ``reason``,
    ``nodes`` and ``position``; the server's waiting ``detail`` (``bolt explain``'s lines,
    may be empty); whether Slurm runs it yet (``slurm_running``); and ``notes`` the bridge
    adds itself, each a sentence that may end in its own ``To fix:``."""

    state: str
    reason: str = ""
    nodes: str = ""
    position: int | None = None
    detail: tuple[str, ...] = ()
    slurm_running: bool = False
    notes: tuple[str, ...] = ()


def fit(head: str, reason: str = "", fix: str = "") -> str:
    """``boltforge: head: reason To fix: fix`` within ``LIMIT`` characters: the fix is kept
    whole and the reason shortened, ending in ``...``, when the whole does not fit (a fix
    too long for the limit on its own is cut last)."""
    prefix = f"{TAG}: {head}" + (": " if reason or fix else "")
    if not fix:
        return prefix + _shorten(reason, LIMIT - len(prefix))
    tail = f"{FIX} {fix}"
    reason = _shorten(reason, LIMIT - len(prefix) - len(tail) - 2)
    stop = "" if not reason else " " if reason.endswith(".") else ". "
    return f"{prefix}{reason}{stop}{tail}"[:LIMIT]


def _shorten(text: str, room: int) -> str:
    """``text`` within ``room`` characters, ending in ``...`` when cut."""
    if len(text) <= room:
        return text
    return text[: max(room - len(ELLIPSIS), 0)].rstrip() + ELLIPSIS


def split_fix(text: str) -> tuple[str, str]:
    """``text`` as (reason, fix): the fix is what follows its first ``To fix:`` ('' if none);
    the reason ends in a full stop when there is a fix after it."""
    reason, _, fix = text.partition(FIX)
    reason = reason.strip().rstrip(";.,:").strip()
    return (f"{reason}." if reason and fix.strip() else reason), fix.strip()


def sbatch_words(text: str) -> str:
    """A server refusal in the words of the ``sbatch`` options the job came from."""
    for pattern, words in _SBATCH_WORDS:
        text = pattern.sub(words, text)
    return re.sub(r"\s{2,}", " ", text).strip()


def refusal_comment(why: str) -> str:
    """The comment of a job Boltforge does not take: why, in ``sbatch``'s words, and its fix."""
    return fit("refused", *split_fix(sbatch_words(why)))


def job_comment(view: JobView) -> str:
    """The comment of a job the server holds: why it waits (a requeued job too, saying it was
    preempted), where it was placed (``, starting`` until Slurm runs it), that it is being
    preempted, or '' when the server says nothing yet (the last comment then stays)."""
    reason, fix = _notes(view.notes)
    if view.state in WAITING:
        where = f" (#{view.position} in line)" if view.position is not None else ""
        return fit(f"waiting{where}", _join(_why_waiting(view), reason), fix)
    if view.state in PLACED and view.nodes:
        starting = "" if view.state == "running" and view.slurm_running else ", starting"
        return fit(f"placed on {view.nodes}{starting}", reason, fix)
    if view.state == "preempting":
        return fit(f"preempted, stopping on {view.nodes}" if view.nodes else "preempted")
    return ""


def _why_waiting(view: JobView) -> str:
    why = view.reason or "next pass"
    ruled_out = preemption_ruled_out(view.detail)
    if ruled_out:
        why += f"; preemption ruled out: {ruled_out}"
    return f"preempted, {why}" if view.state == "requeued" else why


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _notes(notes: Sequence[str]) -> tuple[str, str]:
    """The bridge's own notes as (reasons, fixes), each joined with ``; ``."""
    split = [split_fix(n) for n in notes]
    return _join(*(r.rstrip(".") for r, _ in split)), _join(*(f for _, f in split))


def preemption_ruled_out(detail: Sequence[str]) -> str:
    """The lines of the server's waiting detail that say why preemption could not make room
    (the churn budget, victims inside their minimum runtime or cooldown, jobs that may not be
    preempted), joined with ``; ``, or '' when none does."""
    lines = [line for line in detail if any(k in line for k in _PREEMPT_RULED_OUT)]
    return "; ".join(lines)


def qos_note(qos: str, mapped_to: str | None) -> str:
    """What a job whose QOS names no priority class is told: it runs as ``normal``, and how
    an admin maps the QOS to a class. '' for a job with no QOS or a mapped one."""
    if not qos or mapped_to is not None:
        return ""
    return (
        f"QOS {qos} names no priority class, so it runs as normal. "
        f"{FIX} ask an admin for `bolt slurm-bridge --qos-class {qos}=CLASS`"
    )
