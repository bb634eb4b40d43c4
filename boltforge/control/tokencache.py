"""The callers a server remembers, so that most requests never read the store for their token.

A remembered caller is trusted for ``ttl_s`` (5 s by default) after the server last read the
tokens' change counter (``auth.generation``); then the next request reads the counter again
(one small query for every token at once) and, when it moved (a token was revoked, or a
node was taken from one token by another, on this server or on another replica sharing the
store), every remembered caller is forgotten. So a revoked token stops working on every
replica within ``ttl_s`` and a moment, and a token past its ``expires_at`` at once. A node a
token claims is added to what this server remembers of it; another replica learns it the
first time the token acts for that node there (``claim_in``). When each token was last used
is written back at most once a minute (``USED_EVERY_S``). While the store is away, the
callers remembered when it went away keep working (``_held``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from boltforge.control import auth
from boltforge.control.auth import Caller
from boltforge.control.store import ahead
from boltforge.control.store.db import Database
from boltforge.control.store.models import TokenRow
from boltforge.control.store.outage import fault_of

log = logging.getLogger(__name__)
TTL_S = 5.0
USED_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class Authorized:
    """What ``TokenCache.claim_in`` found: the reasons for the nodes refused (empty: none),
    and, when the store was read, the caller (``caller``), its token's digest, whether a
    node was taken from another token, and the nodes it claimed."""

    refused: list[str]
    caller: Caller | None = None
    digest: str = ""
    moved: bool = False
    claimed: tuple[str, ...] = ()  # the nodes it may act for now that it could not before


class TokenCache:
    """Callers by token digest, checked against the store's change counter every ``ttl_s``
    (``monotonic`` seconds); ``clock`` is the server's time, against which tokens expire.
    When tokens were last used is written back every ``used_every_s`` at most."""

    def __init__(
        self,
        db: Database,
        clock: Callable[[], float],
        ttl_s: float = TTL_S,
        monotonic: Callable[[], float] = time.monotonic,
        used_every_s: float = USED_EVERY_S,
    ) -> None:
        self.db, self.clock, self.ttl_s, self.monotonic = db, clock, ttl_s, monotonic
        self.used_every_s = used_every_s
        self._lock = threading.Lock()
        self._by_digest: dict[str, Caller] = {}
        self._by_id: dict[int, Caller] = {}
        self._generation: int | None = None
        self._checked = float("-inf")
        self._used: dict[int, float] = {}
        self._written = monotonic()

    def known(self, token: str) -> Caller | None:
        """The caller remembered for ``token``, current or not (no store access)."""
        return self._by_digest.get(auth.digest(token))

    def current(self, token: str) -> Caller | None:
        """The caller remembered for ``token`` while that memory is current and the token has
        not expired (no store access); None: ask ``lookup``."""
        if self.monotonic() - self._checked > self.ttl_s:
            return None
        found = self._by_digest.get(auth.digest(token))
        if found is None:
            return None
        now = self.clock()
        if found.expired(now):
            return None
        if found.token_id is not None:
            self._used[found.token_id] = now
        return found

    def lookup(self, token: str) -> Caller | str:
        """The caller holding ``token`` (read from the store when not remembered), or why
        there is none: ``unknown``, ``revoked`` or ``expired``. Reads the store: call it
        from a worker thread."""
        try:
            self._revalidate()
        except Exception as e:
            held = self._held(token) if fault_of(e) is not None else None
            if held is None:
                raise
            return held
        found = self.current(token)
        if found is not None:
            return found
        key = auth.digest(token)
        with self.db.session() as s:
            loaded = auth.load(s, key, self.clock())
        if isinstance(loaded, Caller):
            self._remember(key, loaded)
            if loaded.token_id is not None:
                self._used[loaded.token_id] = self.clock()
        return loaded

    def _held(self, token: str) -> Caller | None:
        """The caller remembered for ``token``, unexpired, however long ago the memory was
        checked: while the store is away no token can be revoked, so the callers known
        when it went away keep working (agents' heartbeats among them)."""
        found = self._by_digest.get(auth.digest(token))
        return found if found is not None and not found.expired(self.clock()) else None

    def latest(self, who: Caller) -> Caller:
        """The newest remembered form of ``who`` (its claims may have grown since)."""
        return self._by_id.get(who.token_id, who) if who.token_id is not None else who

    def claim_in(
        self, s: Session, who: Caller, nodes: Sequence[str], registering: bool = False
    ) -> Authorized:
        """Let ``who`` act for ``nodes``, claiming those it may claim (see ``auth.claim``),
        after checking in session ``s`` that its token still works: reads the token's row
        and the named nodes' claims, and may write those claims. Remembers nothing: it is a
        function of the session and its arguments (a group commit may apply it again when
        the group rolls back). Hand what it returns to ``settle`` once ``s`` committed."""
        latest = self.latest(who)
        if registering and latest.nodes is not None:  # already its own: nothing to record
            nodes = [n for n in nodes if n not in latest.nodes.claimed]
            if not nodes:
                return Authorized([])
        now = self.clock()
        row = ahead.get(s, TokenRow, who.token_id) if who.token_id is not None else None
        if row is None or auth.state_of(row, now) != "active":
            return Authorized(
                [f"token {who.name} no longer works. To fix: ask an admin for a token"]
            )
        refused: list[str] = []
        moved = False
        claimed: list[str] = []
        for node in nodes:
            if not registering and latest.acts_for_node(node):
                continue
            done = auth.claim(s, latest, node, now, registering)
            moved = moved or done.moved
            if done.refused is not None:
                refused.append(done.refused)
            elif latest.nodes is not None:
                claimed.append(node)
        return Authorized(refused, latest, row.digest, moved, tuple(claimed))

    def settle(self, found: Authorized) -> list[str]:
        """Remember what a committed ``claim_in`` found; the reasons for the nodes ``who``
        may not act for (empty: it may act for all)."""
        if found.moved:  # the token it was taken from may not act for it any more
            self.forget()
        if found.caller is not None:
            self._add_claims(found.digest, replace(found.caller, source=""), found.claimed)
        return found.refused

    def forget(self) -> None:
        """Forget every remembered caller and read the change counter at the next request
        (after this server changed a token)."""
        with self._lock:
            self._by_digest.clear()
            self._by_id.clear()
            self._checked = float("-inf")

    def _remember(self, key: str, who: Caller, claimed: Sequence[str] = ()) -> None:
        """Remember ``who`` by token digest ``key``, with the nodes it ``claimed`` since it
        was read, in a claimed set of its own that ``_add_claims`` grows."""
        if who.nodes is not None:
            who = replace(who, nodes=who.nodes.growing(claimed))
        with self._lock:
            self._by_digest[key] = who
            if who.token_id is not None:
                self._by_id[who.token_id] = who

    def _add_claims(self, key: str, who: Caller, claimed: Sequence[str]) -> None:
        """``who`` (digest ``key``) claimed ``claimed``: added in place to what is
        remembered of its token (claims settle in any order, and only grow until every
        caller is forgotten), else ``who`` is remembered with them."""
        with self._lock:
            known = self._by_id.get(who.token_id) if who.token_id is not None else None
            scope = known.nodes if known is not None else None
            if scope is not None and isinstance(scope.claimed, set):  # made by ``growing``
                scope.claimed.update(claimed)
                return
        self._remember(key, who, claimed)

    def _revalidate(self) -> None:
        """Read the change counter when ``ttl_s`` passed since the last read; forget every
        remembered caller when it moved. Writes back when tokens were last used, at most
        every ``USED_EVERY_S``."""
        with self._lock:
            if self.monotonic() - self._checked <= self.ttl_s:
                return
            with self.db.session() as s:
                seen = auth.generation(s)
            if seen != self._generation:
                self._by_digest.clear()
                self._by_id.clear()
                self._generation = seen
            self._checked = self.monotonic()
            used = self._take_used()
        if used:
            self._write_used(used)

    def _take_used(self) -> dict[int, float]:
        if self.monotonic() - self._written < self.used_every_s or not self._used:
            return {}
        used, self._used = self._used, {}
        self._written = self.monotonic()
        return used

    def _write_used(self, used: dict[int, float]) -> None:
        """Store when each token was last used; a failure only loses that (logged)."""
        try:
            with self.db.session() as s:
                s.execute(
                    update(TokenRow),
                    [{"id": i, "last_used_at": at} for i, at in sorted(used.items())],
                )
        except SQLAlchemyError as e:
            if fault_of(e) is None:  # the store away: its status says so
                log.warning("could not store when tokens were last used: %s", e)
