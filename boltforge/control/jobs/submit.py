"""Submissions: a request becomes a validated job spec and then rows in the store.

Everything is checked before anything is written: the spec's fields, the command line's
overrides, the array range, and (when nodes have registered) whether any part of the fleet
could ever run the job. A rejected submission leaves nothing behind.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from boltforge.control.auth import Caller
from boltforge.control.scheduling.fleet import Fleet
from boltforge.control.store.models import CounterRow, JobRow
from boltforge.core.model.gang import Gang
from boltforge.core.placement.answers import Outcome
from boltforge.core.placement.modes import could_ever_fit, fits_empty
from boltforge.ranges import ranges
from boltforge.spec.errors import _MISSING, SpecError, SpecProblem
from boltforge.spec.job import PRIORITY_CLASSES, JobSpec, parse_job
from boltforge.spec.loader import parse_yaml
from boltforge.spec.resolve import to_gang
from boltforge.spec.teams import TeamsSpec
from boltforge.wire.gpuamount import gpu_amount, gpu_part
from boltforge.wire.jobs import SubmitRequest

MAX_TASKS = 10_000
MAX_INDEX = 2**31 - 1  # an array index, as every store keeps it (a 32-bit integer)
_RANGE = re.compile(r"^(\d{1,20})(?:-(\d{1,20}))?(?::(\d{1,20}))?$")
PRIORITY_NAMES = {0: "serving", 1: "high", 2: "normal", 3: "low"}


def parse_request(req: SubmitRequest) -> tuple[JobSpec, list[int] | None]:
    """The job spec a request carries, with its overrides applied, and its array indices."""
    source = req.source or "job"
    if req.spec is not None and req.yaml is not None:
        raise _error(
            source,
            "spec",
            "sent twice. To fix: send the spec once, as `spec` (JSON) or as `yaml` (text)",
        )
    data = req.spec if req.spec is not None else None
    if req.yaml is not None:
        data = parse_yaml(req.yaml, source)
    if data is None:
        raise _error(source, "spec", "is required. To fix: send the job spec as `spec` or `yaml`")
    if isinstance(data, dict):
        data = _overridden(data, req)
    spec = parse_job(data, source)
    if _command(spec) is None:
        raise _error(
            source,
            "job.command",
            "is required to run the job. To fix: add e.g. "
            "`command: [python, train.py]` (or a command on every role)",
        )
    return spec, parse_array(req.array, source) if req.array else None


def _overridden(data: dict[str, Any], req: SubmitRequest) -> dict[str, Any]:
    out = dict(data)
    if req.gpus is not None:
        out["gpus"] = int(req.gpus) if req.gpus.strip().isdigit() else req.gpus
    if req.priority is not None:
        p = req.priority.strip()
        out["priority"] = int(p) if p.isdigit() else p
    if req.team is not None:
        out["team"] = req.team
    if req.workdir is not None and not out.get("workdir") and not _has_image(out):
        out["workdir"] = req.workdir
    return out


def _has_image(data: dict[str, Any]) -> bool:
    """Whether any part of the job runs in a container (whose file system is the image's,
    where the submitting machine's directory means nothing)."""
    roles = data.get("roles")
    images = (
        [r.get("image") for r in roles if isinstance(r, dict)] if isinstance(roles, list) else []
    )
    return bool(data.get("image")) or any(images)


def _command(spec: JobSpec) -> object:
    """What the job runs: the job's command, else every role's (None when a role has none)."""
    if spec.command is None and spec.roles and all(r.command for r in spec.roles):
        return [r.command for r in spec.roles]
    return spec.command


def parse_array(text: str, source: str = "job") -> list[int]:
    """Array indices from ``0-99``, ``0-99:2`` (a step) or ``1,3,5-7``, sorted and unique;
    ``SpecError`` naming ``array`` for any other text, more than ``MAX_TASKS`` tasks, or an
    index above ``MAX_INDEX``."""
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        m = _RANGE.match(part)
        if not m:
            raise _error(
                source, "array", "must be like 0-99, 0-99:2 or 1,3,5. To fix: e.g. 0-9", text
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise _error(
                source,
                "array",
                "a range must go up with a step of 1 or more. To fix: e.g. 1-5 or 0-9:2",
                text,
            )
        too_many = _error(source, "array", f"more than {MAX_TASKS} tasks. To fix: split it", text)
        if (hi - lo) // step + 1 > MAX_TASKS:  # before making a huge range
            raise too_many
        if hi > MAX_INDEX:
            raise _error(
                source,
                "array",
                f"an index is above {MAX_INDEX}. To fix: number the tasks from 0, e.g. 0-99",
                text,
            )
        out.update(range(lo, hi + 1, step))
        if len(out) > MAX_TASKS:  # counted once each: overlapping ranges repeat indices
            raise too_many
    return sorted(out)


def check_images(spec: JobSpec, teams: TeamsSpec | None, source: str = "job") -> None:
    """Raise ``SpecError`` naming each field where ``spec`` breaks its team's image intake
    policy (``spec/images.py``); nothing when it complies or there is no policy."""
    if teams is None:
        return
    problems = teams.image_rule(spec.team).problems(spec)
    if problems:
        raise SpecError(source, problems)


def check_fit(spec: JobSpec, fleet: Fleet | None, source: str = "job") -> Gang | None:
    """The job's gang on ``fleet``; raise ``SpecError`` (with the fix) when no part of the
    fleet could ever run it. None when no node has registered yet (nothing to judge by)."""
    if fleet is None or not fleet.names:
        return None
    gang = to_gang(spec, fleet.tree, source)
    if fits_empty(fleet.tree, gang):
        return gang
    decision = could_ever_fit(fleet.tree, gang)
    assert decision.outcome == Outcome.NEVER
    problems = [
        SpecProblem("job", _MISSING, f"can never run on this fleet: {r}") for r in decision.reasons
    ]
    problems += [SpecProblem("job", _MISSING, f"To fix: {f}") for f in decision.fixes]
    raise SpecError(source, problems or [SpecProblem("job", _MISSING, "can never run here")])


def job_rows(
    spec: JobSpec,
    tasks: list[int] | None,
    gang: Gang | None,
    caller: Caller,
    at: float,
    key: str | None,
    num: int,
    service: str | None = None,
) -> list[dict[str, Any]]:
    """The ``jobs`` rows (as column values) of one submission numbered ``num``: the job, or
    one row per array task, all pending; ``service``: the service it is a replica of."""
    gpus, replicas = _size(spec, gang)
    base: dict[str, Any] = {
        "num": num,
        "name": spec.name,
        "team": spec.team,
        "project": spec.project,
        "queue": f"{spec.team}/{spec.project}" if spec.project else spec.team,
        "user": caller.name,
        "priority": spec.priority_class,
        "state": "pending",
        "spec": spec.model_dump(mode="json", exclude_defaults=True),
        "gpus": gpus,
        "replicas": replicas,
        "submitted_at": at,
        "waiting": [],
        "explanation": [],
        "epoch": 0,
        "restarts": 0,
        "preemptions": 0,
        "attained_gpu_s": 0.0,
        "borrowed": False,
        "reason": "",
        "array_id": None,
        "array_index": None,
        "array_spec": None,
        "service": service,
    }
    rows = []
    for i, index in enumerate(tasks if tasks is not None else [None]):
        row = {**base, "id": str(num) if index is None else f"{num}_{index}"}
        row["idempotency_key"] = key if i == 0 else None
        if tasks is not None:
            row.update(array_id=str(num), array_index=index, array_spec=ranges(tasks))
        rows.append(row)
    return rows


def queued_message(row: dict[str, Any]) -> str:
    """The first line of a job's timeline."""
    gpus, replicas, part = row["gpus"], row["replicas"], gpu_part(row.get("spec") or {})
    amount = gpu_amount(gpus, part, replicas)
    label = f"{amount} in {replicas} replica(s)" if gpus or part else f"{replicas} replica(s)"
    word = PRIORITY_NAMES[row["priority"]]
    return f"queued: {label} for team {row['team']}, priority {word}"


def _size(spec: JobSpec, gang: Gang | None) -> tuple[int, int]:
    if gang is not None:
        return gang.total_gpus, sum(r.replicas for r in gang.roles)
    if spec.roles:
        return sum(r.replicas * r.gpus for r in spec.roles), sum(r.replicas for r in spec.roles)
    total, _ = spec.total_gpus()
    per = spec.per_node or min(total, 8) or 1
    return total, max(1, total // per) if total else 1


def next_numbers(s: Session, count: int) -> range:
    """The next ``count`` job numbers (one counter row, moved in the caller's transaction)."""
    bump = update(CounterRow).where(CounterRow.name == "job")
    last = int(
        s.scalars(bump.values(value=CounterRow.value + count).returning(CounterRow.value)).one()
    )
    return range(last - count + 1, last + 1)


def find_by_key(s: Session, key: str) -> JobRow | None:
    return s.scalar(select(JobRow).where(JobRow.idempotency_key == key))


def priority_class(word: str) -> int:
    return PRIORITY_CLASSES[word]


def _error(source: str, field: str, message: str, value: object = _MISSING) -> SpecError:
    return SpecError(source, [SpecProblem(field, value, message)])
