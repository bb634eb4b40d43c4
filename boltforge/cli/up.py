"""``bolt up`` and ``bolt down``: start and stop a development fleet on this machine (a server
on SQLite plus local agents standing in for 8-GPU hosts)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from platformdirs import user_data_dir

from boltforge.cli import localfleet
from boltforge.cli.common import EXIT_BAD_INPUT, console
from boltforge.cli.localfleet import FleetError, LocalFleet
from boltforge.cli.remote import fail
from boltforge.client import config_path

SYSTEM_DIR = Path("/var/lib/boltforge/up")


def default_dir() -> Path:
    """Where ``bolt up`` keeps its fleet: under the user's data dir, or for root under
    ``/var/lib/boltforge`` (root's home is closed to the users its replicas run as)."""
    if os.geteuid() == 0:
        return SYSTEM_DIR
    return Path(user_data_dir("boltforge")) / "up"


DataDirOpt = Annotated[
    Path | None,
    typer.Option(help="Store, logs, inventories and checkpoints.", show_default=False),
]


def up_command(
    hosts: Annotated[int, typer.Option(help="Local agents, each an 8 x H100 host.", min=1)] = 4,
    port: Annotated[int, typer.Option(help="Port for the server.", min=1, max=65535)] = 8600,
    data_dir: DataDirOpt = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Return once it is up; stop it with `bolt down`.")
    ] = False,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Serve HTTPS with a certificate for 127.0.0.1 and localhost signed by a "
            "local CA made in DATA_DIR/tls (and reused next time); the agents and later "
            "`bolt` commands verify the server with that CA.",
        ),
    ] = False,
) -> None:
    """Start a development fleet on this machine: a server and local agents.

    The server keeps its store in SQLite under DATA_DIR; each agent stands in for an
    8 x H100-80GB host (declared inventories, two hosts per rack, one pod), and both get
    fresh admin and agent tokens.

    The server runs with demo preemption settings (--min-runtime 5 --churn 1): on a 4-host
    fleet the production defaults (a job is safe for its first 10 minutes, at most 5% of the
    GPUs preempted per 10 minutes) would never let one job preempt another.

    Once every node is registered, the address and admin token (with --tls, also the CA
    certificate) are saved for later `bolt` commands. It stays in the foreground until
    Ctrl-C (agents stop first, then the server), or with --detach returns at once. Logs go
    to DATA_DIR/logs.
    """
    root = (data_dir or default_dir()).expanduser().resolve()
    running = LocalFleet.load(root)
    if running is not None and running.alive():
        fail(f"a fleet is already up in {root} ({running.url}). To fix: `bolt down` first")
    try:
        fleet = localfleet.start(root, hosts, port, tls)
    except (FleetError, OSError) as e:
        fail(f"cannot start the fleet: {e}", EXIT_BAD_INPUT if isinstance(e, FleetError) else 1)
    _bring_up(fleet)
    if detach:
        save_client_config(fleet.url, fleet.admin_token, fleet.ca)
        _print_usage(fleet, detach)
    else:
        _foreground(fleet)


def _bring_up(fleet: LocalFleet) -> None:
    console.print(
        f"starting a server and {fleet.hosts} agent(s) in {fleet.data_dir} ...", highlight=False
    )
    began = time.monotonic()
    try:
        localfleet.wait_ready(fleet)
    except (FleetError, KeyboardInterrupt) as e:
        localfleet.stop(fleet)
        fail(str(e) if isinstance(e, FleetError) else "interrupted; the fleet is stopped")
    took = time.monotonic() - began
    console.print(f"[green]up[/] in {took:.1f} s: {fleet.hosts} node(s) ready", highlight=False)


def save_client_config(url: str, token: str, ca: str = "") -> None:
    """Where later commands find the server and token (``client.resolve``) and, when ``ca``
    is given, the CA certificate they verify that server with (``client.resolve_ca``);
    mode 0600."""
    saved = {"server": url, "token": token} | ({"ca": ca} if ca else {})
    localfleet.write_private(config_path(), json.dumps(saved, indent=2) + "\n")


def _print_usage(fleet: LocalFleet, detach: bool) -> None:
    gpus = 8 * fleet.hosts
    lines = [
        f"fleet: {fleet.hosts} host(s), {gpus} x H100-80GB, server {fleet.url}",
        f"console: {fleet.url}/console/ (sign in with the admin token {fleet.admin_token})",
        f"logs: {fleet.root / 'logs'}",
        identity_line(fleet),
        *_tls_lines(fleet),
        f"saved the address and admin token in {config_path()}; try:",
        "  bolt submit examples/jobs/train-low.yaml --wait",
        "  bolt queue    bolt nodes    bolt top",
        "stop it with `bolt down`" if detach else "Ctrl-C stops it",
    ]
    if detach and fleet.root != default_dir():
        lines[-1] = f"stop it with `bolt down --data-dir {fleet.root}`"
    for line in lines:
        console.print(line, highlight=False, markup=False)


def identity_line(fleet: LocalFleet) -> str:
    """Which Unix user the fleet's replicas without an image run as."""
    if fleet.shared:
        return (
            "identity: replicas without an image run as you, every team alike "
            f"({localfleet.SHARED_FLAG}, a single-user fleet: {fleet.shared_why})"
        )
    return "identity: replicas without an image run as a user per team (bolt-<team>)"


def _tls_lines(fleet: LocalFleet) -> list[str]:
    """What a TLS fleet's users need to know: the CA to trust (saved for `bolt` too)."""
    if not fleet.ca:
        return []
    return [
        f"tls: the server's certificate is signed by the local CA {fleet.ca}, saved for "
        f"`bolt` with the address; other clients need --ca {fleet.ca} (or BOLT_CA)",
    ]


def _foreground(fleet: LocalFleet) -> None:
    """Print the usage and save the client config, then wait until Ctrl-C or SIGTERM (or the
    server dies) and stop the fleet in order. An interrupt at any point after the fleet is up,
    even while the usage is still printing, stops it the same way and exits 0."""

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        _print_usage(fleet, detach=False)
        save_client_config(fleet.url, fleet.admin_token, fleet.ca)
        while fleet.alive():
            time.sleep(0.5)
        console.print("[red]the server exited[/]; see its log", highlight=False)
        code = 1
    except KeyboardInterrupt:
        pass
    console.print("stopping the agents, then the server ...", highlight=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    localfleet.stop(fleet)
    forget_client_config(fleet.url)
    console.print("stopped", highlight=False)
    raise typer.Exit(code)


def forget_client_config(url: str) -> None:
    """Drop the saved address and token when they point at the fleet that just stopped."""
    path = config_path()
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(saved, dict) and saved.get("server") == url:
        path.unlink(missing_ok=True)


def down_command(data_dir: DataDirOpt = None) -> None:
    """Stop a fleet started with `bolt up --detach`.

    The agents stop first (their jobs get the checkpoint signal), then the server.
    """
    root = (data_dir or default_dir()).expanduser().resolve()
    fleet = LocalFleet.load(root)
    if fleet is None:
        fail(f"no fleet is up in {root}. To fix: pass the --data-dir that `bolt up` used")
    if not fleet.alive():
        console.print(f"the fleet in {root} had already stopped; cleaning up", highlight=False)
    localfleet.stop(fleet)
    forget_client_config(fleet.url)
    console.print(f"stopped the fleet in {root}", highlight=False)
