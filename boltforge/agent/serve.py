"""Running the agent as a process: its work dir, logging, signals and the event loop."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from boltforge.agent.client import ServerClient
from boltforge.agent.loop import Agent
from boltforge.agent.processes import safe_name
from boltforge.wire.agent import Inventory


def default_work_dir(node: str) -> Path:
    """The agent's work dir for ``node`` under the user data dir (logs, progress files and
    default checkpoint dirs live there)."""
    import platformdirs

    return platformdirs.user_data_path("boltforge") / "agent" / safe_name(node)


def serve(server: str, token: str, inventory: Inventory, work_dir: Path) -> int:
    """Run the agent for ``inventory`` against ``server`` until SIGTERM or SIGINT, which stop
    the replicas gracefully and return 0; 2 when the server refuses the node."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            stream=sys.stderr,
            level=logging.INFO,
            format="%(asctime)s agent %(levelname)s %(message)s",
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
    work_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_serve(server, token, inventory, work_dir))


async def _serve(server: str, token: str, inventory: Inventory, work_dir: Path) -> int:
    agent = Agent(ServerClient(server, token), inventory, work_dir)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.request_stop)
    logging.getLogger("boltforge.agent").info(
        "agent for %s (%d x %s) against %s, work dir %s",
        inventory.name,
        inventory.gpus,
        inventory.gpu,
        server,
        work_dir,
    )
    return await agent.run()
