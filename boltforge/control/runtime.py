"""Everything a running server holds: the store, the loop, the wake-ups and its settings."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from sqlalchemy import select

from boltforge.control.auth import Caller, create_token, digest
from boltforge.control.jobs.artifacts import open_store
from boltforge.control.jobs.intake import Intake, Rows
from boltforge.control.nodes.agents import LeaseTerms, extend_leases
from boltforge.control.nodes.feed import Feed, read_ahead
from boltforge.control.notify import Notifier
from boltforge.control.scheduling.actuate import Settings
from boltforge.control.scheduling.fleet import Fleet
from boltforge.control.scheduling.loop import Scheduler
from boltforge.control.scheduling.quotas import TeamQuotas
from boltforge.control.scheduling.world import (
    Caches,
    World,
    add_waiting,
    fleet_of,
    load_world,
    refresh_world,
)
from boltforge.control.store.batch import Batcher
from boltforge.control.store.db import Database
from boltforge.control.store.leadership import LeaseTimes
from boltforge.control.store.mirror import Mirror
from boltforge.control.store.models import TokenRow
from boltforge.control.store.outage import StoreStatus
from boltforge.control.tokencache import TTL_S, TokenCache
from boltforge.control.views.utilization import History, fragmentation_index, sample
from boltforge.core.health import HealthRules
from boltforge.core.policy import Policy, named
from boltforge.core.preempt.victims import PreemptRules
from boltforge.spec.teams import Budget, TeamsSpec

VIEW_FRESH_S = 1.0  # how long a reply may reuse the world it read, while nothing changed


@dataclass(frozen=True)
class ServerConfig:
    """How a server is set up. ``admin_token`` / ``agent_token`` are stored on start when
    given (so ``bolt up`` can hand them to its agents and to the user). ``budgets`` are the
    teams' monthly budgets by team name (``bolt server --teams``). ``recovery_hold_s``: how
    long a job that lost a host keeps its healthy hosts' GPUs for its restart. ``teams``: the
    teams file, whose quotas and lending rules the scheduler applies (None: no quotas).
    ``reports_dir``: where the console finds ``bolt simulate --report`` folders (None: none).
    ``artifacts_dir``: where jobs' artifacts are kept (None: ``artifacts`` beside the
    checkpoint root); ``artifacts_url``, when given, an S3-compatible bucket instead
    (``s3://bucket/prefix``, at ``artifacts_endpoint`` when given).
    ``sample_every_s``: how often the console's utilization history takes a sample.
    ``scale_every_s``: how often the services' autoscaler looks at their load.
    ``overlap``: full passes are planned in a thread of their own while arrivals, reports
    and heartbeats go on, and applied when done, keeping the decisions that still hold
    (``control/scheduling/planning.py``); off, each is planned and applied inside one pass."""

    db_url: str
    checkpoint_root: str
    policy: str = "default"
    preempt: PreemptRules = field(default_factory=PreemptRules)
    terms: LeaseTerms = field(default_factory=LeaseTerms)
    health: HealthRules = field(default_factory=HealthRules)
    tick_s: float = 1.0
    full_every_s: float = 10.0
    admin_token: str | None = None
    agent_token: str | None = None
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    recovery_hold_s: float = 60.0
    teams: TeamsSpec | None = None
    reports_dir: str | None = None
    artifacts_dir: str | None = None
    artifacts_url: str | None = None
    artifacts_endpoint: str | None = None
    sample_every_s: float = 5.0
    scale_every_s: float = 5.0
    overlap: bool = True
    # Overload limits (boltforge/control/api/overload.py; 0 turns one off): people's requests
    # in flight per token or address, and in all; agent calls in flight per node, and in all;
    # people's requests per second per caller (0: no rate limit) and the bucket's burst.
    max_in_flight_per_caller: int = 256
    max_in_flight: int = 1024
    max_in_flight_per_node: int = 16
    max_in_flight_agents: int = 4096
    rate_per_caller: float = 0.0
    rate_burst: float = 0.0
    # Request bodies (boltforge/control/api/bodies.py): the most bytes of a person's request
    # and of an agent-protocol request (batched heartbeats and reports of many nodes).
    max_body: int = 2 << 20
    max_agent_body: int = 64 << 20
    # Replicas on one store (``control/replicas.py``): this replica's name (empty: no leader
    # election, this server acts alone), the address the others send clients to, the lease.
    replica: str = ""
    advertise_url: str = ""
    leader_lease: LeaseTimes = field(default_factory=LeaseTimes)
    # How long a server trusts a token it remembers before it checks the store for
    # revocations (``control/tokencache.py``): a revoked token stops working within this.
    token_cache_s: float = TTL_S


class Runtime:
    """The server's state, built once per process."""

    def __init__(self, config: ServerConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        beside = Path(config.checkpoint_root).parent / "artifacts"
        self.artifacts = open_store(  # first: a bucket that cannot be used stops the start
            Path(config.artifacts_dir) if config.artifacts_dir else beside,
            config.artifacts_url,
            config.artifacts_endpoint,
        )
        self.db = Database(config.db_url, StoreStatus(clock))
        self.notifier = Notifier()
        self.mirror = Mirror()
        self.mirror.watch(self.db.sessions)
        self.scheduler = Scheduler(
            self.db,
            server_policy(config.policy, config.preempt),
            self.notifier,
            Settings(config.checkpoint_root),
            config.terms,
            clock,
            config.tick_s,
            config.full_every_s,
            config.health,
            config.recovery_hold_s,
            TeamQuotas.of(config.teams, clock()) if config.teams else None,
            self.mirror,
            overlap=config.overlap,
        )
        self.intake = Intake(self.db, self._stored)
        self.agent_writes = Batcher(self.db, self.scheduler.lock, "agent-writes", read_ahead)
        self.feed = Feed(self.agent_writes, self.scheduler, config.terms)
        self.tokens = TokenCache(self.db, clock, config.token_cache_s)
        self._views = Caches()  # the fleet and worlds built for replies, not for passes
        self._views_lock = threading.Lock()
        self._view: tuple[int, World | None] = (-1, None)
        self.history = History(config.sample_every_s)

    def _stored(self, rows: Rows) -> None:
        """Jobs the intake committed: into the mirror, and the scheduler woken from the
        intake's thread at once, before their submitters are even answered (each plain job
        an arrival; array tasks ask for a full pass)."""
        self.mirror.add_jobs(rows)
        arrivals = [r["id"] for r in rows if r.get("array_id") is None]
        if arrivals:
            self.scheduler.wake(*arrivals)
        if len(arrivals) < len(rows):
            self.scheduler.wake()

    def take_sample(self) -> None:
        """Add the fleet's utilization now to the console's history (a worker thread's job)."""
        now = self.clock()
        world = self.world(now)
        with self.db.session() as s:
            point = sample(s, world, now)
        self.history.add(point)

    def fragmentation(self, now: float) -> float:
        """The fleet's fragmentation index now, as a pass would see it (from the mirror)."""
        return fragmentation_index(self.world(now))

    def world(self, now: float, waiting: Iterable[str] = ()) -> World:
        """What holds the fleet's GPUs now, as a pass would see it, with only the jobs named
        in ``waiting`` pending (for replies such as ``/v1/fleet``, a job's outlook and the
        console's samples; from the mirror, never the store). The last one is reused while
        nothing changed and it is under ``VIEW_FRESH_S`` old; otherwise a copy of it is
        brought up to date by the mirror's changes (``refresh_world``), read whole only when
        that cannot be done. Callers must not change it; later calls never change one
        already handed out."""
        with self._views_lock:
            world = self._held_view(now)
            if waiting:
                world = world.copy()
                add_waiting(world, self.mirror, waiting, self._views)
            return world

    def _held_view(self, now: float) -> World:
        """``world`` without the jobs waiting (under ``_views_lock``)."""
        version, world = self._view
        current = version == self.mirror.version
        if world is not None and current and now - world.now <= VIEW_FRESH_S:
            return world
        hold = self.config.recovery_hold_s
        if world is not None:
            fresh = world.copy()
            fresh.now = now
            known = refresh_world(fresh, self.mirror, self._views, version, hold)
            if known is not None:
                self._view = (known, fresh)
                return fresh
        version = self.mirror.version
        world = load_world(self.mirror, now, self._views, waiting=(), hold_s=hold)
        self._view = (version, world)
        return world

    def start(self) -> None:
        """Migrate the store, store the bootstrap tokens, and give every live node a full
        lease (the agents have had no server to heartbeat to)."""
        self.db.migrate()
        with self.db.session() as s:
            self.mirror.load(s)
        with self.db.session() as s:
            extend_leases(s, self.config.terms, self.clock())
            for token, name, role in (
                (self.config.admin_token, "admin", "admin"),
                (self.config.agent_token, "agents", "agent"),
            ):
                if (
                    token
                    and s.scalar(select(TokenRow).where(TokenRow.digest == digest(token))) is None
                ):
                    create_token(s, name, role, None, self.clock(), token)

    def known_caller(self, token: str) -> Caller | None:
        """Who holds ``token``, if already looked up (no store access; it may since have
        been revoked: ``tokens.current`` says whether it still works)."""
        return self.tokens.known(token)

    def caller(self, token: str) -> Caller | None:
        """Who holds ``token``, if it still works (remembered after the first lookup, for
        ``config.token_cache_s`` at a time; reads the store: call it from a thread)."""
        found = self.tokens.lookup(token)
        return found if isinstance(found, Caller) else None

    def fleet(self) -> Fleet:
        """The fleet over the registered nodes, for checks at submit (from the mirror,
        rebuilt only after an inventory changed)."""
        with self._views_lock:
            return fleet_of(self.mirror, self._views)

    def known_fleet(self) -> Fleet | None:
        """The fleet if it is already built for the nodes registered now (no building)."""
        return self._views.fleets.get(("mirror", self.mirror.fleet_version))


def server_policy(name: str, preempt: PreemptRules) -> Policy:
    """The policy called ``name`` preempting by the server's ``preempt`` rules (its minimum
    runtime, cooldown and churn budget); where those set no peer window, the policy's own
    (``PreemptRules.peer_window_s``) holds, so the server bumps as the simulator does."""
    policy = named(name)
    if policy.preemption is None or preempt.peer_window_s is not None:
        return policy.with_preempt_rules(preempt)
    window = policy.preemption.rules.peer_window_s
    return policy.with_preempt_rules(replace(preempt, peer_window_s=window))
