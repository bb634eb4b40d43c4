"""``bolt agent``: run the node agent that registers this machine with the control plane."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from boltforge.agent.cleanup import LEFTOVER_GRACE_S
from boltforge.agent.hooks import DEFAULT_TIMEOUT_S
from boltforge.cli.common import EXIT_BAD_INPUT, errors, spec_errors
from boltforge.cli.credentials import TokenSource, forget_env, read_token

if TYPE_CHECKING:
    from boltforge.agent.containers import Engine
    from boltforge.agent.identity import Identities
    from boltforge.agent.preflight import NodeHooks


AGENT_TOKEN = TokenSource("--token", "--token-file", "BOLT_TOKEN")


class ReplicaRuntime(StrEnum):
    """What runs a replica whose job names an image."""

    PROCESS = "process"
    PODMAN = "podman"
    DOCKER = "docker"


def agent_command(
    server: Annotated[str, typer.Option(help="Control plane URL, e.g. http://10.0.0.1:8080.")],
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="BOLT_TOKEN_FILE",
            metavar="PATH",
            help="File holding the agent token (read once; keep it mode 600). Or set "
            "BOLT_TOKEN. Neither reaches the replicas.",
            show_default=False,
        ),
    ] = None,
    token: Annotated[
        str,
        typer.Option(
            hidden=True,
            help="Deprecated: visible to every user of the host; use --token-file.",
        ),
    ] = "",
    allow_shared_identity: Annotated[
        bool,
        typer.Option(
            "--allow-shared-identity",
            help="Run every team's replicas without an image as the agent's own user (a "
            "single-user fleet). Without it, an agent that is not root refuses them (teams "
            "sharing a Unix user can read each other's files and environment) and a root "
            "agent runs each team as a user of its own.",
        ),
    ] = False,
    user_prefix: Annotated[
        str,
        typer.Option(
            metavar="PREFIX",
            help="As root: replicas without an image run as the user PREFIX<team>, made on "
            "first use (see docs/forge.md).",
        ),
    ] = "bolt-",
    team_user: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TEAM=USER",
            help="As root: run TEAM's replicas without an image as the existing USER instead "
            "(never root). Repeatable.",
        ),
    ] = None,
    inventory: Annotated[
        Path | None,
        typer.Option(help="Declared inventory (YAML); without it GPUs are found through NVML."),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(help="Logs, progress files and checkpoints; default: per node, user data."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Node name (overrides the inventory's).")] = None,
    prolog: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="PATH",
            help="Script (or directory of executables) run before each replica starts, with "
            "its environment; a failure keeps it from starting here and drains the node. "
            "Repeatable.",
        ),
    ] = None,
    epilog: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="PATH",
            help="Script (or directory of executables) run after each replica ended and its "
            "leftover processes and /dev/shm files were cleaned up. Repeatable.",
        ),
    ] = None,
    hook_timeout: Annotated[
        float,
        typer.Option(
            min=0.1, metavar="SECONDS", help="Seconds a prolog or epilog may run before it fails."
        ),
    ] = DEFAULT_TIMEOUT_S,
    leftover_grace: Annotated[
        float,
        typer.Option(
            min=0,
            metavar="SECONDS",
            help="Longest checkpoint grace for the replicas a killed agent left running, "
            "which a restarted agent ends before it registers (never past the node's lease).",
        ),
    ] = LEFTOVER_GRACE_S,
    runtime: Annotated[
        ReplicaRuntime,
        typer.Option(
            help="How replicas whose job names an `image` run: as containers on podman or "
            "docker (isolated, limited; see docs/forge.md). With `process` they fail to "
            "start on this node; replicas without an image run as processes either way.",
        ),
    ] = ReplicaRuntime.PROCESS,
    ca: Annotated[
        Path | None,
        typer.Option(
            envvar="BOLT_CA",
            metavar="PATH",
            help="CA certificate(s) (PEM) to verify an https server's certificate with; "
            "default: the system's trusted CAs.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the node agent: register this node, run the replicas the server assigns to it and
    report their output, progress and exit.

    Before each replica starts, the node checks itself (NVML, where the inventory comes from
    it: GPU count, uncorrected ECC errors, NVLink links; then the prologs); after each ends,
    it ends the processes the replica left behind and removes its /dev/shm files, then runs
    the epilogs. SIGTERM or SIGINT stops the replicas gracefully (checkpoint signal, grace,
    kill) and exits 0. Started again after it was killed (SIGKILL, a crash), it first ends
    the replicas it left running (checkpoint signal, grace, kill): their jobs requeue and
    resume from their last checkpoint. Exits 2 on a bad inventory, prolog or epilog path, a
    missing token or container engine, a --ca file with no CA certificate, or when the
    server refuses the node.
    """
    from boltforge.agent.inventory import detect
    from boltforge.agent.serve import default_work_dir, serve

    secret = read_token(AGENT_TOKEN, token, token_file)
    forget_env()
    if not secret:
        errors.print(
            "[bold red]error[/] --token-file: a token is required. To fix: pass --token-file "
            "PATH or set BOLT_TOKEN",
            highlight=False,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    identities = _identities(allow_shared_identity, user_prefix, team_user or [])
    hooks = _hooks(prolog or [], epilog or [], hook_timeout)
    engine = _engine(runtime)
    _check_ca(ca)
    with spec_errors():
        node = detect(inventory, name)
    work = work_dir or default_work_dir(node.name)
    code = serve(server, secret, node, work, hooks, leftover_grace, engine, ca, identities)
    raise typer.Exit(code)


def _identities(allow_shared: bool, prefix: str, pairs: list[str]) -> Identities:
    """The users replicas without an image run as (``agent/identity.py``); exits 2 naming
    the option for a bad --team-user or --user-prefix. Says so when the agent runs every
    team as itself."""
    from boltforge.agent.identity import SHARED_FLAG, Identities, IdentityRefused, parse_team_users

    try:
        users = parse_team_users(pairs)
    except IdentityRefused as e:
        errors.print(f"[bold red]error[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if not re.fullmatch(r"[a-z][a-z0-9_-]{0,15}", prefix):
        errors.print(
            f"[bold red]error[/] --user-prefix {escape(repr(prefix))}: up to 16 lowercase "
            "letters, digits, - and _, starting with a letter. To fix: e.g. --user-prefix bolt-",
            highlight=False,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    identities = Identities(prefix=prefix, users=users, allow_shared=allow_shared)
    if allow_shared:
        who = "root" if identities.can_switch else "this agent's user"
        errors.print(
            f"[yellow]note[/] {SHARED_FLAG}: every team's replicas without an image run as "
            f"{who} and can read each other's files and environment; fit for a "
            "single-user fleet only",
            highlight=False,
            soft_wrap=True,
        )
    return identities


def _engine(runtime: ReplicaRuntime) -> Engine | None:
    """The container engine ``--runtime`` names (None for processes); exits 2 when it is not
    installed."""
    from boltforge.agent.containers import Engine, EngineMissing

    if runtime is ReplicaRuntime.PROCESS:
        return None
    try:
        return Engine.find(runtime.value)
    except EngineMissing as e:
        errors.print(f"[bold red]error[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _check_ca(ca: Path | None) -> None:
    """Exits 2 naming --ca when ``ca`` is given and holds no CA certificate."""
    from boltforge.tls import BadCA, client_context

    if ca is None:
        return
    try:
        client_context(ca)
    except BadCA as e:
        errors.print(
            f"[bold red]error[/] --ca {escape(str(e))}. To fix: pass the PEM file of the CA "
            "that signed the server's certificate",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _hooks(prologs: list[Path], epilogs: list[Path], timeout_s: float) -> NodeHooks:
    """The agent's prolog and epilog scripts; a bad path exits 2 naming its option."""
    from boltforge.agent.hooks import BadHook, check_paths
    from boltforge.agent.preflight import NodeHooks

    try:
        return NodeHooks(
            prologs=check_paths("--prolog", prologs),
            epilogs=check_paths("--epilog", epilogs),
            timeout_s=timeout_s,
        )
    except BadHook as e:
        errors.print(f"[bold red]error[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
