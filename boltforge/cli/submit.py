"""``bolt submit``: send a job spec to the server, and with --wait tell its story to the end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.markup import escape

from boltforge.cli.common import EXIT_BAD_INPUT, console, errors, print_json
from boltforge.cli.queue import ALL_STATES
from boltforge.cli.remote import CaOpt, JsonOpt, ServerOpt, TokenOpt, api_errors, connect, fail
from boltforge.cli.story import Story, describer
from boltforge.client import RETRY_FOR_S, Client
from boltforge.wire.gpuamount import gpu_amount
from boltforge.wire.jobs import TERMINAL, JobDetail, SubmitReply, SubmitRequest


def submit_command(
    file: Annotated[Path, typer.Argument(help="Job spec (YAML).", show_default=False)],
    gpus: Annotated[
        str | None, typer.Option(help="Override the GPUs, e.g. 64xH100 or 8.", show_default=False)
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(help="Override the priority: serving, high, normal, interactive, low, batch."),
    ] = None,
    team: Annotated[str | None, typer.Option(help="Override the team.")] = None,
    array: Annotated[
        str | None,
        typer.Option(help="Run as an array job: 0-99, 0-99:2 or 1,3,5 (BOLT_ARRAY_INDEX)."),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Tell the job's story until it ends; exit 1 unless ok.")
    ] = False,
    json: JsonOpt = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="A retry with the same key returns the job already made.")
    ] = None,
    retry_for: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds to keep sending it again (same key) while the server answers 503.",
        ),
    ] = RETRY_FOR_S,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Submit a job (or an array job) and print its id.

    With --wait, tell its story as it happens (placed, preempted jobs and their checkpoints,
    running, the end) and exit 0 only if it succeeded. While the server answers 503 (its
    store is away) the submission is sent again with the same idempotency key for up to
    --retry-for seconds, saying so. An invalid spec exits 2 with each problem's field and
    fix; a refusal, or no server, exits 1.
    """
    req = _request(file, gpus, priority, team, array)
    with connect(server, token) as client, api_errors(file.name):
        reply = client.submit(req, idempotency_key, retry_for, _waiting)
        if not wait:
            _print_reply(reply, json)
            return
        if reply.tasks:
            ok = _wait_array(client, reply, json)
        else:
            ok = _wait_job(client, reply.job.id, json)
    raise typer.Exit(0 if ok else 1)


def _waiting(why: str, left: float) -> None:
    """Say on stderr that the submission waits for the server, and why."""
    errors.print(
        f"waiting for the server ({escape(why.split('. To fix')[0])}); "
        f"sending it again for up to {left:.0f} s more",
        highlight=False,
    )


def _request(
    file: Path, gpus: str | None, priority: str | None, team: str | None, array: str | None
) -> SubmitRequest:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        fail(f"{file}: cannot read it ({e.strerror}). To fix: check the path", EXIT_BAD_INPUT)
    except UnicodeDecodeError:
        fail(f"{file}: is not UTF-8 text. To fix: save the job spec as UTF-8 YAML", EXIT_BAD_INPUT)
    try:
        return SubmitRequest(
            yaml=text,
            source=file.name[:200],
            gpus=gpus,
            priority=priority,
            team=team,
            array=array,
            workdir=str(Path.cwd()),
        )
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        fail(f"--{where}: {first['msg']}. To fix: shorten it", EXIT_BAD_INPUT)


def _print_reply(reply: SubmitReply, json: bool) -> None:
    if json:
        print_json(reply.model_dump(mode="json"))
        return
    for warning in reply.warnings:
        errors.print(f"[bold yellow]warning[/] {escape(warning)}", highlight=False, soft_wrap=True)
    job = reply.job
    amount = gpu_amount(job.gpus, job.gpu_part)
    again = "" if reply.created else " (already submitted with this idempotency key)"
    if reply.tasks:
        array_id = reply.tasks[0].partition("_")[0]
        console.print(
            f"submitted array job {array_id}: {len(reply.tasks)} task(s) "
            f"{array_id}_[{job.array}] of {amount} each{again}",
            highlight=False,
        )
        return
    amount = gpu_amount(job.gpus, job.gpu_part, job.replicas)
    console.print(f"submitted job {job.id} ({job.name}, {amount}){again}", highlight=False)


def _wait_job(client: Client, job_id: str, json: bool) -> bool:
    """Follow ``job_id`` (and the jobs it preempts) until it ends; True if it succeeded."""
    detail = client.job(job_id)
    story = Story(console, client.server, client.token, detail.submitted_at)
    story.follow(job_id)
    describe = describer(client)
    try:
        while True:
            told = story.next(timeout=5.0)
            if told is None:
                continue
            if not json:
                story.tell(told, describe)
            if told.error and told.job == job_id:
                fail(told.error)
            if told.job == job_id and told.event is None:
                break
    except KeyboardInterrupt:
        errors.print(f"stopped following job {job_id}; it carries on (`bolt status {job_id}`)")
        raise typer.Exit(130) from None
    finally:
        story.close()
    final = client.job(job_id)
    _print_end(final, json)
    return final.state == "succeeded"


def _print_end(final: JobDetail, json: bool) -> None:
    if json:
        print_json(final.model_dump(mode="json"))
        return
    code = "" if final.exit_code is None else f", exit code {final.exit_code}"
    steps = "" if final.last_step is None else f", {final.last_step} step(s)"
    color = "green" if final.state == "succeeded" else "red"
    console.print(
        f"[bold {color}]job {final.id} {final.state}[/]{code}{steps}, "
        f"{final.gpu_hours:.3f} GPU-h (${final.dollars:.2f})",
        highlight=False,
    )


def _wait_array(client: Client, reply: SubmitReply, json: bool) -> bool:
    """Poll the tasks of an array job until every one has ended; True if all succeeded."""
    ids = set(reply.tasks)
    done: dict[str, str] = {}
    while len(done) < len(ids):
        for job in client.jobs(state=ALL_STATES).jobs:
            if job.id in ids and job.state in TERMINAL and job.id not in done:
                done[job.id] = job.state
                if not json:
                    code = "" if job.exit_code is None else f" (exit code {job.exit_code})"
                    console.print(f"task {job.id} {job.state}{code}", highlight=False)
        time.sleep(1.0)
    failed = sorted(j for j, s in done.items() if s != "succeeded")
    if json:
        print_json({"tasks": done, "failed": failed})
    else:
        console.print(f"{len(ids) - len(failed)} of {len(ids)} task(s) succeeded", highlight=False)
    return not failed
