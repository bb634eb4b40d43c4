"""Running the agent as a process: its work dir, logging, signals and the event loop. The work
dir also holds the launch record (``leftovers``), through which an agent restarted after it
was killed finds and ends the replicas it left running, before it registers."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from boltforge.agent.cleanup import LEFTOVER_GRACE_S
from boltforge.agent.client import ServerClient
from boltforge.agent.containers import Engine
from boltforge.agent.identity import Identities
from boltforge.agent.loop import Agent
from boltforge.agent.preflight import NodeHooks
from boltforge.agent.processes import SHARED_DIR_MODE, safe_name
from boltforge.wire.agent import Inventory

SYSTEM_WORK_ROOT = Path("/var/lib/boltforge/agent")


def default_work_dir(node: str) -> Path:
    """The agent's work dir for ``node`` (logs, progress files, default checkpoint dirs and
    the launch record live there): under ``/var/lib/boltforge/agent`` for root (whose home
    its replicas' users cannot reach), else under the user data dir."""
    import platformdirs

    if os.geteuid() == 0:
        return SYSTEM_WORK_ROOT / safe_name(node)
    return platformdirs.user_data_path("boltforge") / "agent" / safe_name(node)


def serve(
    server: str,
    token: str,
    inventory: Inventory,
    work_dir: Path,
    hooks: NodeHooks | None = None,
    leftover_grace_s: float = LEFTOVER_GRACE_S,
    engine: Engine | None = None,
    ca: Path | None = None,
    identities: Identities | None = None,
) -> int:
    """Run the agent for ``inventory`` against ``server`` until SIGTERM or SIGINT, which stop
    the replicas gracefully and return 0; 2 when the server refuses the node. ``hooks``: the
    prolog and epilog scripts run around each replica. ``leftover_grace_s``: the longest
    checkpoint grace for the replicas a killed run of the agent left running, which are
    ended before it registers. ``engine``: the container engine for replicas with an image
    (None: they fail to start here). ``ca``: the CA bundle an https server's certificate is
    verified against (None: the system's trusted CAs). ``identities``: the users replicas
    without an image run as (``identity``; None: the agent's own)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            stream=sys.stderr,
            level=logging.INFO,
            format="%(asctime)s agent %(levelname)s %(message)s",
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
    work_dir.mkdir(parents=True, exist_ok=True)
    if identities is not None and identities.isolates:
        work_dir.chmod(SHARED_DIR_MODE)  # its replicas' users reach their own files only
    return asyncio.run(
        _serve(server, token, inventory, work_dir, hooks, leftover_grace_s, engine, ca, identities)
    )


async def _serve(
    server: str,
    token: str,
    inventory: Inventory,
    work_dir: Path,
    hooks: NodeHooks | None,
    leftover_grace_s: float,
    engine: Engine | None,
    ca: Path | None,
    identities: Identities | None,
) -> int:
    client = ServerClient(server, token, ca=ca)
    agent = Agent(
        client,
        inventory,
        work_dir,
        hooks=hooks,
        leftover_grace_s=leftover_grace_s,
        engine=engine,
        identities=identities,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.request_stop)
    logging.getLogger("boltforge.agent").info(
        "agent for %s (%d x %s) against %s, work dir %s, replicas with an image run %s",
        inventory.name,
        inventory.gpus,
        inventory.gpu,
        server,
        work_dir,
        f"on {engine.binary}" if engine else "nowhere (no --runtime engine)",
    )
    _say_checks(agent, hooks or NodeHooks())
    logging.getLogger("boltforge.agent").info(
        "replicas without an image run %s", agent.runtime.identities.describe()
    )
    return await agent.run()


def _say_checks(agent: Agent, hooks: NodeHooks) -> None:
    """Log what the preflight checks and what it skips."""
    say = logging.getLogger("boltforge.agent").info
    preflight = agent.runtime.preflight
    for note in preflight.skipped if preflight else ():
        say("preflight: %s", note)
    for kind, paths in (("prolog", hooks.prologs), ("epilog", hooks.epilogs)):
        for path in paths:
            say("%s: %s (timeout %g s)", kind, path, hooks.timeout_s)
