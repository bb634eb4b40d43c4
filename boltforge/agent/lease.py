"""The agent's session with the control plane and the lease clock that fences its replicas."""

from __future__ import annotations

from dataclasses import dataclass

from boltforge.wire.agent import Lease


@dataclass(frozen=True, slots=True)
class Session:
    """One registration: the node name the server knows this agent by, the session id every
    heartbeat and report carries, and how often to heartbeat."""

    node: str
    id: str
    heartbeat_s: float
    lease_s: float

    @classmethod
    def of(cls, lease: Lease) -> Session:
        return cls(lease.node, lease.session, lease.heartbeat_s, lease.lease_s)


class LeaseClock:
    """When the lease was last renewed, on the agent's monotonic clock.

    A lease counts from when its request was *sent*, not answered, so the agent's view of it
    never outlives the server's. It survives a lost session: replicas keep running while the
    agent registers again, until the last renewal is ``lease_s`` old.
    """

    def __init__(self) -> None:
        self.renewed_at: float | None = None
        self.lease_s = 0.0

    def renew(self, lease: Lease, sent_at: float) -> None:
        self.renewed_at = sent_at if self.renewed_at is None else max(self.renewed_at, sent_at)
        self.lease_s = lease.lease_s

    def expired(self, now: float) -> bool:
        """True once no renewal has been answered for ``lease_s`` (never before the first)."""
        return self.renewed_at is not None and now - self.renewed_at > self.lease_s

    def overdue(self, now: float) -> float:
        """Seconds since the lease ran out (0 while it holds, or before the first renewal)."""
        if self.renewed_at is None:
            return 0.0
        return max(0.0, now - self.renewed_at - self.lease_s)
