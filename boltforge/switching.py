"""How often CPython hands the GIL from a busy thread to one that waits for it, in the
long-running processes whose event loop answers requests while worker threads compute:
``bolt server`` (scheduling passes, the store's writer and the planner beside the HTTP loop),
``bolt kube-scheduler`` and ``bolt slurm-bridge`` (blocking client calls on worker threads
beside the loop that follows the server's intent).

A thread that wants the GIL asks the holder to drop it and waits up to the switch interval
(CPython: 5 ms) for it. An answer that is ready (a long-poll woken by a pass's decisions, a
binding's reply) then waits for whatever computes beside it: 5 ms at each hand-over, several
times along one gang's path from submission to bound pods. At 1 ms a busy thread gives way
sooner; the hand-overs cost the computing threads little, since they happen only while
another thread is waiting."""

from __future__ import annotations

import sys

SWITCH_S = 0.001  # CPython: 0.005


def responsive() -> None:
    """Hand the GIL over at ``SWITCH_S`` (see the module docstring). Idempotent."""
    sys.setswitchinterval(SWITCH_S)
