"""A job's story as it happens: long-polled timelines of the jobs being followed (and of the
jobs a placement preempts), told one line per event."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape

from boltforge.client import ApiFailure, Client
from boltforge.wire.gpuamount import gpu_amount
from boltforge.wire.jobs import TERMINAL, EventOut

POLL_S = 20.0
SETTLE_S = 0.1  # how long to gather events arriving together before telling them
# After these a preempted job's part in someone else's story is over.
VICTIM_DONE = frozenset({"checkpointed", "requeued", "lost", *TERMINAL})


@dataclass(frozen=True, slots=True)
class Told:
    """One event of one followed job, or the end of following it (``event`` None)."""

    job: str
    event: EventOut | None
    error: str = ""


@dataclass
class Story:
    """Follows jobs on one server, each in a thread that long-polls its events, and prints
    each event as a line stamped with seconds since ``base`` (server time)."""

    console: Console
    server: str
    token: str | None
    base: float
    inbox: queue.Queue[Told] = field(default_factory=queue.Queue)
    followed: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    submitted: dict[str, float] = field(default_factory=dict)
    held: list[Told] = field(default_factory=list)

    def follow(self, job: str, since: float = 0.0, until: frozenset[str] = TERMINAL) -> None:
        """Start telling ``job``'s events from time ``since`` until one of kind ``until``."""
        if job in self.followed:
            return
        self.followed.add(job)
        args = (job, since, until)
        threading.Thread(target=self._poll, args=args, daemon=True, name=f"follow-{job}").start()

    def next(self, timeout: float = 1.0) -> Told | None:
        """The next thing to tell, or None after ``timeout``. Events that arrive together from
        different jobs come out in the order the server recorded them."""
        if not self.held:
            try:
                self.held.append(self.inbox.get(timeout=timeout))
            except queue.Empty:
                return None
        settle = time.monotonic() + SETTLE_S
        while (left := settle - time.monotonic()) > 0:
            try:
                self.held.append(self.inbox.get(timeout=left))
            except queue.Empty:
                break
        self.held.sort(key=_order)
        return self.held.pop(0)

    def close(self) -> None:
        self.stop.set()

    def _poll(self, job: str, since: float, until: frozenset[str]) -> None:
        after = 0
        with Client(self.server, self.token) as client:
            while not self.stop.is_set():
                try:
                    page = client.events(job, after=after, wait=POLL_S)
                except ApiFailure as e:
                    self.inbox.put(Told(job, None, e.message))
                    return
                except Exception as e:  # a reply it cannot read: say so, never hang
                    self.inbox.put(Told(job, None, f"following job {job} failed: {e!r}"))
                    return
                for ev in page.events:
                    after = max(after, ev.seq)
                    if ev.at + 1e-6 < since:
                        continue
                    self.inbox.put(Told(job, ev))
                    if ev.kind in until:
                        self.inbox.put(Told(job, None))
                        return
                if page.state in TERMINAL and not page.events:
                    self.inbox.put(Told(job, None))
                    return

    def say(self, at: float, text: str) -> None:
        """Print one line of the story at server time ``at``."""
        stamp = f"[dim]\\[{max(at - self.base, 0.0):6.1f}s][/]"
        self.console.print(f"{stamp} {text}", highlight=False, soft_wrap=True)

    def tell(self, told: Told, lookup: Callable[[str], str]) -> None:
        """Print ``told``; a placement that preempted jobs names them (``lookup`` describes
        a job, e.g. ``1 (research, 32 GPU(s))``) and starts following them to their checkpoint."""
        ev = told.event
        if ev is None:
            return
        if ev.kind == "queued":
            self.submitted[told.job] = ev.at
        if ev.kind == "note":
            self.say(ev.at, f"[dim]job {told.job} why: {escape(ev.message)}[/]")
            return
        self.say(ev.at, f"job {told.job} {escape(ev.message)}")
        if ev.kind == "placed":
            self._placed(told.job, ev, lookup)

    def _placed(self, job: str, ev: EventOut, lookup: Callable[[str], str]) -> None:
        victims = [str(v) for v in ev.data.get("preempted") or []]
        if victims:
            names = ", ".join(lookup(v) for v in victims)
            self.say(ev.at, f"job {job} preempted {len(victims)} job(s): {escape(names)}")
            for v in victims:
                self.follow(v, since=ev.at, until=VICTIM_DONE)
        if int(ev.data.get("epoch", 1)) <= 1 and job in self.submitted:
            took = (ev.at - self.submitted[job]) * 1000
            self.say(ev.at, f"job {job} scheduled in {took:.0f} ms")


def _order(told: Told) -> float:
    """Events by the server's sequence; a job's end after everything gathered with it."""
    return float("inf") if told.event is None else float(told.event.seq)


def describer(client: Client) -> Callable[[str], str]:
    """``1 (research, 32 GPU(s))`` for a job this caller may see; just the id otherwise."""

    def describe(job: str) -> str:
        try:
            d = client.job(job)
        except ApiFailure:
            return f"{job} (another team)"
        return f"{job} ({d.team}, {gpu_amount(d.gpus, d.gpu_part, d.replicas)})"

    return describe
