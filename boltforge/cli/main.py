"""The ``bolt`` command: every subcommand and the module it lives in (each module is imported
only when its command runs)."""

from __future__ import annotations

from typing import ClassVar

import typer

from boltforge.cli.lazy import Lazy, LazyGroup

JOBS, FLEET, DEV = "Jobs", "Fleet", "Development fleet"


class Bolt(LazyGroup):
    lazy: ClassVar[dict[str, Lazy]] = {
        "place": Lazy("boltforge.cli.place", "place"),
        "check": Lazy("boltforge.cli.place", "check"),
        "fleet": Lazy("boltforge.cli.fleet", "fleet_app"),
        "simulate": Lazy("boltforge.cli.simulate", "simulate_command"),
        "simulate-serving": Lazy("boltforge.cli.serving_sim", "simulate_serving_command"),
        "server": Lazy("boltforge.cli.server", "server_command"),
        "agent": Lazy("boltforge.cli.agent", "agent_command"),
        "slurm-bridge": Lazy("boltforge.cli.slurm", "slurm_bridge_command"),
        "slurm-release": Lazy("boltforge.cli.slurm", "slurm_release_command"),
        "kube-scheduler": Lazy("boltforge.cli.kube", "kube_scheduler_command"),
        "tour": Lazy("boltforge.cli.tour", "tour_command"),
        "submit": Lazy("boltforge.cli.submit", "submit_command", JOBS),
        "queue": Lazy("boltforge.cli.queue", "queue_command", JOBS),
        "status": Lazy("boltforge.cli.jobs", "status_command", JOBS),
        "explain": Lazy("boltforge.cli.jobs", "explain_command", JOBS),
        "cancel": Lazy("boltforge.cli.jobs", "cancel_command", JOBS),
        "logs": Lazy("boltforge.cli.jobs", "logs_command", JOBS),
        "artifacts": Lazy("boltforge.cli.artifacts", "artifacts_command", JOBS),
        "cost": Lazy("boltforge.cli.cost", "cost_command", JOBS),
        "serve": Lazy("boltforge.cli.serve", "serve_command", JOBS),
        "nodes": Lazy("boltforge.cli.nodes", "nodes_app", FLEET),
        "top": Lazy("boltforge.cli.top", "top_command", FLEET),
        "token": Lazy("boltforge.cli.tokens", "token_app", FLEET),
        "admin": Lazy("boltforge.cli.admin", "admin_app", FLEET),
        "up": Lazy("boltforge.cli.up", "up_command", DEV),
        "down": Lazy("boltforge.cli.up", "down_command", DEV),
        "demo": Lazy("boltforge.cli.demo", "demo_command", DEV),
    }


app = typer.Typer(
    cls=Bolt,
    help="Boltforge: a GPU cluster scheduler that places gangs on the tightest interconnect.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Boltforge: a GPU cluster scheduler that places gangs on the tightest interconnect."""


if __name__ == "__main__":
    app()
