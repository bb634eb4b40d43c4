"""Named places where the server can be made to crash on purpose, to prove what a crash
there keeps: the crash tests arm one with ``BOLT_FAILPOINTS`` (names separated by commas),
and the server SIGKILLs itself the first time it gets there. Unarmed, a failpoint costs a
set lookup.

========== ==================================================================================
name       where
========== ==================================================================================
decided    a pass's decisions (binds, evictions) are committed; nothing is dispatched yet
dispatched gangs are committed as ``starting``; their nodes have not been told
========== ==================================================================================
"""

from __future__ import annotations

import os
import signal

ARMED = frozenset(n.strip() for n in os.environ.get("BOLT_FAILPOINTS", "").split(",") if n.strip())


def hit(name: str) -> None:
    """Crash the server here (SIGKILL, nothing cleaned up) when ``name`` is armed."""
    if name in ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
