"""Jobs: submit, list, inspect, follow and cancel."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, get_args

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from boltforge.control.api.deps import Actors, People, Rt, actor
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.api.headers import header
from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.jobs import budgets
from boltforge.control.jobs.budgets import Admission
from boltforge.control.jobs.cancel import cancel_jobs
from boltforge.control.jobs.intake import Order
from boltforge.control.jobs.submit import check_fit, check_images, find_by_key, parse_request
from boltforge.control.outlook import with_outlook
from boltforge.control.runtime import Runtime
from boltforge.control.scheduling.lifecycle import LIVE
from boltforge.control.store.models import HELD, EventRow, JobRow, LogRow, ReplicaRow
from boltforge.control.views.jobs import detail, event_out, stored_summary, summary
from boltforge.spec.job import JobSpec
from boltforge.spec.teams import Budget
from boltforge.wire.jobs import (
    TERMINAL,
    EventPage,
    JobDetail,
    JobList,
    JobState,
    JobSummary,
    LogPage,
    Problem,
    SubmitReply,
    SubmitRequest,
    TeamLoad,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=ERRORS)
MAX_WAIT_S = 60.0
MAX_KEY = 200  # characters in an idempotency key
KNOWN_STATES: tuple[str, ...] = get_args(JobState)


KEY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": MAX_KEY},
    "description": "A retry with the same key returns the first job (200) instead of a new one.",
}


@router.post(
    "", status_code=201, response_model=SubmitReply, openapi_extra={"parameters": [KEY_HEADER]}
)
async def submit(req: SubmitRequest, request: Request) -> Response:
    """Validate and queue a job (or an array job). Bad input: 422 naming each field and its
    fix, and nothing is stored. A repeated idempotency key (the body's ``idempotency_key``
    or the ``Idempotency-Key`` header) returns the first job (200): the store's unique key
    refuses the second insert, and the first job is read then, so a key costs a first
    submission nothing. Validation runs on the event loop (it is quick and reads no store);
    the writer thread stores the job and wakes the scheduler (``Runtime._stored``).

    The busiest route: it checks its caller itself rather than through a dependency, whose
    per-request bookkeeping in FastAPI costs more than the check."""
    who = await actor(request)
    rt: Runtime = request.app.state.runtime
    key = req.idempotency_key or _key_header(request)
    spec, tasks = parse_request(req)
    if not who.acts_for_team(spec.team):
        raise ApiError(
            403,
            f"you may submit only for team {who.team}, not {spec.team}. "
            f"To fix: set `team: {who.team}`",
        )
    check_images(spec, rt.config.teams, req.source)
    fleet = rt.known_fleet() or await run_in_threadpool(rt.fleet)
    gang = check_fit(spec, fleet, req.source)
    warnings = await _budget_warnings(rt, spec)
    order = Order(spec, tasks, gang, who, rt.clock(), key, tuple(warnings))
    try:
        rows = await rt.intake.write_async(order)
    except IntegrityError:
        again = await run_in_threadpool(_existing, rt, key, who) if key else None
        if again is None:
            raise
        return _reply(again, 200)
    rt.notifier.notify(["jobs", *(f"job:{r['id']}" for r in rows)])
    tasks_ids = [r["id"] for r in rows] if tasks else []
    reply = SubmitReply(job=stored_summary(rows[0]), tasks=tasks_ids, warnings=warnings)
    return _reply(reply, 201)


def _key_header(request: Request) -> str | None:
    """The ``Idempotency-Key`` header; 422 naming it when it is too long."""
    key = header(request.scope, b"idempotency-key")
    if key is not None and len(key) > MAX_KEY:
        fix = f"is longer than {MAX_KEY} characters. To fix: send a shorter key"
        problem = Problem(field="header.Idempotency-Key", value=key[:40] + "...", message=fix)
        raise ApiError(422, "invalid request: 1 problem(s)", [problem])
    return key


def _reply(reply: SubmitReply, status: int) -> Response:
    """``reply`` as JSON, serialized once (FastAPI's response model pass is skipped)."""
    return Response(reply.model_dump_json(), status, media_type="application/json")


async def _budget_warnings(rt: Runtime, spec: JobSpec) -> list[str]:
    """The team budget's warning for this submission, if any; a refusal (the hard limit,
    for non-production work) is a 403 naming the team, its spend and its limit."""
    budget = rt.config.budgets.get(spec.team)
    if budget is None:
        return []
    word = await run_in_threadpool(_admission, rt, spec, budget)
    if word.refusal is not None:
        raise ApiError(403, word.refusal)
    return [word.warning] if word.warning else []


def _admission(rt: Runtime, spec: JobSpec, budget: Budget) -> Admission:
    with rt.db.session() as s:
        return budgets.check(s, spec.team, spec.priority_class, budget, rt.clock())


def _existing(rt: Runtime, key: str, who: Caller) -> SubmitReply | None:
    with rt.db.session() as s:
        row = find_by_key(s, key)
        if row is None:
            return None
        if not who.acts_for_team(row.team):
            raise ApiError(
                409, "this idempotency key was used for another team's job. To fix: use a fresh key"
            )
        tasks = []
        if row.array_id:
            q = select(JobRow.id).where(JobRow.array_id == row.array_id).order_by(JobRow.num)
            tasks = list(s.scalars(q))
    return SubmitReply(job=summary(row), tasks=tasks, created=False)


MAX_LISTED_IDS = 500  # job ids one listing may name


@router.get("")
def list_jobs(
    who: People,
    rt: Rt,
    state: Annotated[
        str | None, Query(max_length=200, description="Comma-separated states.")
    ] = None,
    team: Annotated[str | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ids: Annotated[
        str | None,
        Query(
            max_length=8000,  # with the state and team, well within a request line
            pattern=r"^[A-Za-z0-9_.,\- ]*$",
            description=f"Comma-separated job ids: only these (at most {MAX_LISTED_IDS}).",
        ),
    ] = None,
) -> JobList:
    """Jobs in queue order: live ones by default, or those in ``state``; only those named in
    ``ids`` when given (a caller that follows its own jobs, such as the Slurm bridge, asks
    for them rather than reading the first ``limit`` of everyone's). A member sees the
    other teams' work only in aggregate (``others``). An unknown state, or more than
    ``MAX_LISTED_IDS`` ids, is a 422 naming the field and the fix."""
    states = [x.strip() for x in (state or "").split(",") if x.strip()] or list(LIVE)
    unknown = [x for x in states if x not in KNOWN_STATES]
    if unknown:
        fix = f"To fix: use one or more of {', '.join(KNOWN_STATES)}"
        words = f"unknown state {', '.join(map(repr, unknown))}. {fix}"
        problem = Problem(field="state", value=",".join(unknown), message=words)
        raise ApiError(422, f"state: {words}", [problem])
    wanted = [x.strip() for x in (ids or "").split(",") if x.strip()]
    if len(wanted) > MAX_LISTED_IDS:
        words = f"{len(wanted)} ids. To fix: ask for at most {MAX_LISTED_IDS} at a time"
        problem = Problem(field="ids", value=f"{len(wanted)} ids", message=words)
        raise ApiError(422, f"ids: {words}", [problem])
    with rt.db.session() as s:
        q = select(JobRow).where(JobRow.state.in_(states))
        if team:
            q = q.where(JobRow.team == team)
        if wanted:
            q = q.where(JobRow.id.in_(wanted))
        rows = list(s.scalars(q.order_by(JobRow.priority, JobRow.num, JobRow.id).limit(limit)))
        nodes = _nodes_of(s, [r.id for r in rows if r.state not in TERMINAL])
    visible = [r for r in rows if who.sees_team(r.team)]
    hidden: dict[str, list[JobRow]] = defaultdict(list)
    for r in rows:
        if not who.sees_team(r.team):
            hidden[r.team].append(r)
    others = [
        TeamLoad(
            team=t,
            pending=sum(r.state in ("pending", "requeued") for r in rs),
            running=sum(r.state in ("scheduled", "running", "preempting") for r in rs),
            gpus=sum(r.gpus for r in rs if r.state in ("scheduled", "running", "preempting")),
        )
        for t, rs in sorted(hidden.items())
    ]
    return JobList(jobs=[summary(r, nodes.get(r.id)) for r in visible], others=others)


def _nodes_of(s: Session, ids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    if not ids:
        return out
    q = select(ReplicaRow.job_id, ReplicaRow.node).where(
        ReplicaRow.job_id.in_(ids), ReplicaRow.state.in_(HELD)
    )
    for job_id, node in s.execute(q):
        out[job_id].append(node)
    return out


def visible_job(s: Session, job_id: str, who: Caller) -> JobRow:
    """The job ``job_id`` if ``who`` may see it in detail: 404 if there is none, 403 if it is
    another team's and ``who`` is a member."""
    row = s.get(JobRow, job_id)
    if row is None:
        tasks = s.scalar(select(JobRow.id).where(JobRow.array_id == job_id).limit(1))
        hint = f" (array job: name a task, e.g. {tasks})" if tasks else ""
        raise ApiError(404, f"no job {job_id}{hint}. To fix: check the id with `bolt queue`")
    if not who.sees_team(row.team):
        raise ApiError(
            403,
            f"job {job_id} belongs to team {row.team}; members see other teams' "
            "work only in aggregate. To fix: ask that team or an admin",
        )
    return row


@router.get("/{job_id}")
def get_job(job_id: str, who: People, rt: Rt) -> JobDetail:
    """One job: where it runs and why, or why it waits; its timeline, its meter and, while it
    waits or runs, its deadline outlook (judged here, from the world kept for replies)."""
    now = rt.clock()
    with rt.db.session() as s:
        found = detail(s, visible_job(s, job_id, who), now)
    return with_outlook(found, lambda at: rt.world(at, [job_id]), now, rt.mirror.estimate)


@router.post("/{job_id}/cancel")
def cancel(job_id: str, who: Actors, rt: Rt) -> JobList:
    """Cancel a job, or every live task of an array job. Its processes get the checkpoint
    signal and their GPUs are freed once they exit."""
    now = rt.clock()
    with rt.scheduler.lock, rt.db.session() as s:
        rows = (
            [s.get(JobRow, job_id)]
            if s.get(JobRow, job_id)
            else list(s.scalars(select(JobRow).where(JobRow.array_id == job_id)))
        )
        jobs = [r for r in rows if r is not None]
        if not jobs:
            raise ApiError(404, f"no job {job_id}. To fix: check the id with `bolt queue`")
        if not who.acts_for_team(jobs[0].team):
            raise ApiError(
                403,
                f"job {job_id} belongs to team {jobs[0].team}; you may cancel "
                "only your team's jobs",
            )
        touched = cancel_jobs(s, jobs, who.name, now)
        audit(s, who, "cancel", job_id, now, jobs=len(jobs))
        out = JobList(jobs=[summary(r) for r in jobs])
    rt.scheduler.announce(touched)
    rt.scheduler.wake()
    return out


@router.get("/{job_id}/events")
async def events(
    job_id: str,
    who: People,
    rt: Rt,
    after: Annotated[int, Query(ge=0)] = 0,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> EventPage:
    """Timeline entries after ``after``; with ``wait``, held open until there is one."""
    key = f"job:{job_id}"
    deadline = rt.clock() + wait
    while True:
        seen = rt.notifier.count(key)
        page = await run_in_threadpool(_event_page, rt, job_id, who, after)
        left = deadline - rt.clock()
        if page.events or page.state in TERMINAL or left <= 0 or rt.notifier.closed:
            return page
        await rt.notifier.wait(key, seen, left)


def _event_page(rt: Runtime, job_id: str, who: Caller, after: int) -> EventPage:
    """The events after ``after`` and the job's state, read after them: on a store where
    each statement sees its own moment (PostgreSQL), the state is never older than the
    events it comes with, so a follower that sees ``placed`` also sees ``scheduled``."""
    with rt.db.reading() as s:  # on SQLite, a long-poll's page waits for no writer
        visible_job(s, job_id, who)
        q = select(EventRow).where(EventRow.job_id == job_id, EventRow.id > after)
        found = [event_out(e) for e in s.scalars(q.order_by(EventRow.id).limit(500))]
        return EventPage(job=job_id, state=_state_now(s, job_id), events=found)


def _state_now(s: Session, job_id: str) -> str:
    """The job's state as the store has it now (not as the session first read it)."""
    return str(s.scalar(select(JobRow.state).where(JobRow.id == job_id)))


@router.get("/{job_id}/logs")
async def logs(
    job_id: str,
    who: People,
    rt: Rt,
    after: Annotated[int, Query(ge=0)] = 0,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> LogPage:
    """Output after position ``after`` (``next`` is where the following page starts)."""
    key = f"logs:{job_id}"
    deadline = rt.clock() + wait
    while True:
        seen = rt.notifier.count(key)
        page = await run_in_threadpool(_log_page, rt, job_id, who, after)
        left = deadline - rt.clock()
        if page.lines or page.state in TERMINAL or left <= 0 or rt.notifier.closed:
            return page
        await rt.notifier.wait(key, seen, min(left, 1.0))


def _log_page(rt: Runtime, job_id: str, who: Caller, after: int) -> LogPage:
    with rt.db.session() as s:
        visible_job(s, job_id, who)
        q = select(LogRow).where(LogRow.job_id == job_id, LogRow.id > after)
        chunks = list(s.scalars(q.order_by(LogRow.id).limit(1000)))
        text = "".join(c.data for c in chunks)
        lines = text.splitlines()
        return LogPage(
            job=job_id,
            state=_state_now(s, job_id),
            next=chunks[-1].id if chunks else after,
            lines=lines,
        )


def summaries(rows: list[JobRow]) -> list[JobSummary]:
    return [summary(r) for r in rows]
