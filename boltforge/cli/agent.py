"""``bolt agent``: run the node agent that registers this machine with the control plane."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from boltforge.cli.common import EXIT_BAD_INPUT, errors, spec_errors


def agent_command(
    server: Annotated[str, typer.Option(help="Control plane URL, e.g. http://10.0.0.1:8080.")],
    token: Annotated[
        str, typer.Option(envvar="BOLT_TOKEN", help="Bearer token for the agent API.")
    ] = "",
    inventory: Annotated[
        Path | None,
        typer.Option(help="Declared inventory (YAML); without it GPUs are found through NVML."),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(help="Logs, progress files and checkpoints; default: per node, user data."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Node name (overrides the inventory's).")] = None,
) -> None:
    """Run the node agent: register this node, run the replicas the server assigns to it and
    report their output, progress and exit.

    SIGTERM or SIGINT stops the replicas gracefully (checkpoint signal, grace, kill) and exits 0.
    Exits 2 on a bad inventory, a missing token, or when the server refuses the node.
    """
    from boltforge.agent.inventory import detect
    from boltforge.agent.serve import default_work_dir, serve

    if not token:
        errors.print(
            "[bold red]error[/] --token: is required. To fix: pass --token T or set BOLT_TOKEN",
            highlight=False,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    with spec_errors():
        node = detect(inventory, name)
    raise typer.Exit(serve(server, token, node, work_dir or default_work_dir(node.name)))
