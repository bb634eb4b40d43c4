"""Stop on SIGTERM as on Ctrl-C. The kubelet stops a pod with SIGTERM, and a Python process
that is a container's PID 1 gets no default handler for it (the kernel drops signals a PID 1
does not handle), so without one the scheduler is killed at the end of its grace without
giving up its Lease, and the standby waits out a whole lease duration. ``run_until_stopped``
turns SIGTERM and SIGINT into a request to stop: the scheduler finishes its pass and leaves
its loop, and its cleanup releases the Lease (``KubeScheduler.run``), so a standby takes
over at its next try."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

log = logging.getLogger("boltforge.kube")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def run_until_stopped(run: Callable[[], Awaitable[None]], stop: Callable[[], None]) -> None:
    """Run ``run()`` until it returns; SIGTERM or SIGINT calls ``stop()`` (which must make
    ``run`` return, its cleanup done). The handlers are removed on the way out."""
    loop = asyncio.get_running_loop()

    def stopping(sig: signal.Signals) -> None:
        log.info("%s: stopping; the Lease is released for the standby", sig.name)
        stop()

    for sig in SIGNALS:
        loop.add_signal_handler(sig, stopping, sig)
    try:
        await run()
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
