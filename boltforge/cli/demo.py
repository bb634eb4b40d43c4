"""``bolt demo``: the end-to-end story on a fleet started for it: a low-priority training job
runs, a high-priority one preempts it, it checkpoints, requeues, resumes from its last step and
finishes; then the fleet stops."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.rule import Rule

from boltforge.cli import localfleet
from boltforge.cli.localfleet import FleetError, LocalFleet
from boltforge.cli.story import Story, Told, describer
from boltforge.cli.up import identity_line
from boltforge.client import ApiFailure, Client
from boltforge.wire.jobs import TERMINAL, SubmitRequest

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "examples" / "jobs"
HOSTS = 4
STEPS_FIRST = 20  # steps the low job reports before the high one arrives
MIN_RUNTIME_S = 5.5  # the fleet's --min-runtime (5 s), and a little more
STORY_LIMIT_S = 240.0


class DemoError(Exception):
    """The story could not be told; the message says what went wrong."""


@dataclass
class Demo:
    """The two jobs' story, told from their events, progress and logs."""

    console: Console
    client: Client
    story: Story
    jobs: dict[str, str] = field(default_factory=dict)  # "low"/"high" -> job id
    step_at_checkpoint: int | None = None
    log_after: int = 0
    resumed_from: int | None = None
    resumed_seen: bool = False
    ended: set[str] = field(default_factory=set)

    def submit(self, file: str, who: str) -> str:
        text = (JOBS / file).read_text()
        req = SubmitRequest(yaml=text, source=file, workdir=str(ROOT))
        reply = self.client.submit(req)
        self.console.print(
            f"[bold]{who} submits examples/jobs/{file}[/]: job {reply.job.id}", highlight=False
        )
        self.story.follow(reply.job.id)
        return reply.job.id

    def pump(self, seconds: float) -> None:
        """Tell whatever happens in the next ``seconds``."""
        end = time.monotonic() + seconds
        describe = describer(self.client)
        while (left := end - time.monotonic()) > 0:
            told = self.story.next(timeout=min(left, 0.25))
            if told is not None:
                self.story.tell(told, describe)
                self._noticed(told)
                self._ended(told)
            self._scan_logs()

    def _noticed(self, told: Told) -> None:
        ev = told.event
        if told.error:
            raise DemoError(f"lost job {told.job}: {told.error}")
        if ev is None or told.job != self.jobs.get("low"):
            return
        if ev.kind == "checkpointed":
            self.step_at_checkpoint = self.client.job(told.job).last_step
            step = "?" if self.step_at_checkpoint is None else self.step_at_checkpoint
            self.story.say(ev.at, f"job {told.job} last reported step before the stop: {step}")
        if ev.kind == "resumed":
            self.resumed_seen = True

    def _scan_logs(self) -> None:
        """After the low job resumes, find its ``resumed from step N`` line."""
        low = self.jobs.get("low")
        if low is None or not self.resumed_seen or self.resumed_from is not None:
            return
        page = self.client.logs(low, after=self.log_after)
        self.log_after = page.next
        for line in page.lines:
            if line.startswith("resumed from step "):
                self.resumed_from = int(line.split()[-1])
                self.story.say(time.time(), f"job {low} log: {line}")
                return

    def _ended(self, told: Told) -> None:
        if told.event is None and not told.error:
            self.ended.add(told.job)

    def until(self, done: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
        """Keep telling the story until ``done()``; ``DemoError`` after ``limit_s``."""
        deadline = time.monotonic() + limit_s
        while not done():
            if time.monotonic() > deadline:
                raise DemoError(f"gave up waiting for {what} after {limit_s:.0f} s")
            self.pump(0.5)

    def low_warmed_up(self) -> bool:
        """The low job runs, has reported a few steps and is past the minimum run time."""
        d = self.client.job(self.jobs["low"])
        if d.state in TERMINAL:
            raise DemoError(f"job {d.id} ended early ({d.state}); see `bolt logs {d.id}`")
        if d.state != "running" or d.started_at is None or (d.last_step or 0) < STEPS_FIRST:
            return False
        if time.time() - d.started_at < MIN_RUNTIME_S:
            return False
        self.story.say(time.time(), f"job {d.id} is at step {d.last_step}")
        return True

    def finished(self) -> bool:
        return set(self.jobs.values()) <= self.ended


def run_demo(console: Console) -> int:
    """Start a fleet in a temporary directory, tell the story, stop the fleet. Returns the
    exit code: 0 when both jobs succeeded and the low one resumed from its checkpoint."""
    console.print(Rule("Boltforge demo: preemption with checkpoint and resume", align="left"))
    return in_fleet(console, lambda root: _start(console, root), lambda f: _tell(console, f))


def in_fleet(
    console: Console,
    start: Callable[[Path], LocalFleet],
    tell: Callable[[LocalFleet], bool],
) -> int:
    """``start`` a fleet in a temporary directory, ``tell`` a story on it, stop it (its logs
    are kept when the story fails). Returns 0 when ``tell`` says the story went as told."""
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="bolt-demo-"))
    fleet: LocalFleet | None = None
    ok = False
    try:
        fleet = start(root)
        ok = tell(fleet)
    except (FleetError, DemoError, ApiFailure) as e:
        console.print(f"[bold red]error[/] {escape(str(e))}", highlight=False)
    except KeyboardInterrupt:
        console.print("interrupted", highlight=False)
    finally:
        if fleet is not None:
            stop_fleet(console, fleet)
        if ok:
            shutil.rmtree(root, ignore_errors=True)
        else:
            console.print(f"logs kept in {root / 'logs'}", highlight=False)
    console.print(f"the demo took {time.monotonic() - began:.0f} s", highlight=False)
    return 0 if ok else 1


def _start(console: Console, root: Path) -> LocalFleet:
    port = localfleet.free_port()
    console.print(
        f"starting a server and {HOSTS} agents (8 x H100-80GB each, declared) on port {port}",
        highlight=False,
    )
    t0 = time.monotonic()
    fleet = localfleet.start(root, HOSTS, port)
    try:
        localfleet.wait_ready(fleet)
    except BaseException:
        stop_fleet(console, fleet)
        raise
    took = time.monotonic() - t0
    console.print(f"fleet up in {took:.1f} s: {HOSTS} nodes, {8 * HOSTS} GPUs", highlight=False)
    console.print(identity_line(fleet), highlight=False, markup=False)
    return fleet


def _tell(console: Console, fleet: LocalFleet) -> bool:
    with Client(fleet.url, fleet.admin_token) as client:
        story = Story(console, fleet.url, fleet.admin_token, base=time.time())
        demo = Demo(console, client, story)
        try:
            console.print(Rule(style="dim"))
            demo.jobs["low"] = demo.submit("train-low.yaml", "research")
            demo.until(demo.low_warmed_up, "the low-priority job to run")
            demo.jobs["high"] = demo.submit("train-high.yaml", "nlp")
            demo.until(demo.finished, "both jobs to finish", STORY_LIMIT_S)
            demo.until(lambda: demo.resumed_from is not None, "the resume line", 10.0)
        finally:
            story.close()
        console.print(Rule(style="dim"))
        return _summary(console, demo)


def _summary(console: Console, demo: Demo) -> bool:
    ok = True
    for job in demo.jobs.values():
        d = demo.client.job(job)
        ok &= d.state == "succeeded"
        console.print(
            f"job {d.id} {d.name} ({d.team}, {d.priority_name}): {d.state}, exit code "
            f"{d.exit_code}, {d.last_step} steps, {d.preemptions} preemption(s), "
            f"{d.gpu_hours:.3f} GPU-h",
            highlight=False,
        )
    low = demo.jobs["low"]
    console.print(
        f"job {low} resumed from step {demo.resumed_from} "
        f"(last step reported before the preemption: {demo.step_at_checkpoint})",
        highlight=False,
    )
    return ok and demo.resumed_from is not None


def stop_fleet(console: Console, fleet: LocalFleet) -> None:
    t0 = time.monotonic()
    console.print("stopping the agents, then the server ...", highlight=False)
    localfleet.stop(fleet)
    console.print(f"fleet stopped in {time.monotonic() - t0:.1f} s", highlight=False)


def demo_command(
    forge: Annotated[
        bool,
        typer.Option(
            "--forge",
            help="Containers instead: a training container, a CPU batch job and a data "
            "pipeline on GPU, CPU and storage nodes with their artifacts and the bill (needs "
            "podman and deploy/images/build.sh; see docs/forge.md).",
        ),
    ] = False,
) -> None:
    """Tell the end-to-end story on a 4-host fleet started for it.

    A low-priority training job runs; a high-priority one preempts it; it checkpoints,
    requeues, resumes from its last step and finishes; then the fleet stops (it runs in a
    temporary directory on a free port). Exits 0 when both jobs succeed.
    """
    from boltforge.cli.common import console

    if forge:
        from boltforge.cli.forgedemo import run_forge_demo

        raise typer.Exit(run_forge_demo(console))
    raise typer.Exit(run_demo(console))
