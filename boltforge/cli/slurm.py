"""``bolt slurm-bridge``: run Boltforge as the scheduler of an existing Slurm cluster;
``bolt slurm-release``: take it out again."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.markup import escape

from boltforge.cli.common import EXIT_BAD_INPUT, console, errors
from boltforge.cli.credentials import BRIDGE_TOKEN, forget_env, read_token

if TYPE_CHECKING:
    from boltforge.slurm.identity import TeamUsers


def slurm_bridge_command(
    server: Annotated[str, typer.Option(help="Control plane URL, e.g. http://10.0.0.1:8080.")],
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="BOLT_TOKEN_FILE",
            metavar="PATH",
            help="File holding an admin token (the bridge acts for every node; read once). "
            "Or set BOLT_TOKEN. Neither reaches the jobs.",
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
    partition: Annotated[
        list[str] | None,
        typer.Option(help="A partition Boltforge manages (repeat for several); default: bolt."),
    ] = None,
    slurm_conf: Annotated[
        Path | None, typer.Option(envvar="SLURM_CONF", help="slurm.conf; default: Slurm's own.")
    ] = None,
    topology: Annotated[
        Path | None,
        typer.Option(
            help="topology.conf: each node's leaf switch is its rack; default: the "
            "one beside slurm.conf, else each node's rack= feature."
        ),
    ] = None,
    default_team: Annotated[
        str, typer.Option(help="The team of jobs that name no Slurm account.")
    ] = "default",
    team_user: Annotated[
        list[str] | None,
        typer.Option(
            metavar="TEAM=USER",
            help="The Slurm user that runs TEAM's `bolt submit` jobs (repeat for several), "
            "e.g. nlp=nlp_svc. A team with no user (here or by --team-user-pattern) has its "
            "jobs refused; never root. sbatch jobs stay their sender's.",
        ),
    ] = None,
    team_user_pattern: Annotated[
        str | None,
        typer.Option(
            metavar="PATTERN",
            help="The Slurm user of a team --team-user does not name: {team} is replaced by "
            "the team's name, e.g. 'bolt-{team}'. Default: none (such teams are refused).",
        ),
    ] = None,
    grace: Annotated[
        float, typer.Option(metavar="SECONDS", help="Checkpoint grace of a preempted job.")
    ] = 60.0,
    poll: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="How often squeue is read while nothing the bridge did is under way (a start "
            "not yet running, a stop not yet ended: every 0.1 s then); the wake file and the "
            "server's decisions call a read at once.",
        ),
    ] = 2.0,
    wake_file: Annotated[
        Path | None,
        typer.Option(
            help="The file job_submit.lua touches for each job it holds (its WAKE): squeue is "
            "read as soon as it changes, not only every --poll."
        ),
    ] = None,
    qos_class: Annotated[
        list[str] | None,
        typer.Option(
            metavar="QOS=CLASS",
            help="The priority class of a Slurm QOS (repeat for several), e.g. urgent=high. "
            "A QOS named like a class (high, normal, low, ...) is that class; any other runs "
            "as normal and its jobs' comments say so.",
        ),
    ] = None,
) -> None:
    """Schedule a Slurm cluster's GPU partitions: hold their jobs (deploy/slurm/job_submit.lua),
    place each on the topology, start it on exactly the chosen nodes, preempt with the
    checkpoint signal and a held requeue, and write why each job waits into its comment
    (squeue -o "%i %k"). Stopping the bridge leaves Slurm's jobs where they are; started
    again, it adopts them. See docs/slurm.md."""
    import asyncio
    import contextlib
    import logging

    from boltforge import switching
    from boltforge.agent.client import ServerClient
    from boltforge.client import Client
    from boltforge.slurm.bridge import SlurmBridge
    from boltforge.slurm.commands import Slurm
    from boltforge.slurm.model import parse_topology

    token = read_token(BRIDGE_TOKEN, token, token_file) or ""
    forget_env()
    if not token:
        errors.print(
            "[bold red]error[/] --token-file: a token is required. To fix: pass --token-file "
            "PATH or set BOLT_TOKEN",
            highlight=False,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    topo = topology or (slurm_conf.parent / "topology.conf" if slurm_conf else None)
    if topology is not None and not topology.is_file():
        where = escape(str(topology))
        errors.print(f"[bold red]error[/] --topology: no file {where}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT)
    switches = parse_topology(topo.read_text()) if topo is not None and topo.is_file() else {}
    team_users = _team_users(team_user or [], team_user_pattern)
    qos_classes = _qos_classes(qos_class or [])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def serve() -> None:
        bridge = SlurmBridge(
            Slurm(str(slurm_conf) if slurm_conf else None),
            ServerClient(server, token),
            Client(server, token),
            partition or ["bolt"],
            topology=switches,
            default_team=default_team,
            team_users=team_users,
            grace_s=grace,
            poll_s=poll,
            wake_file=wake_file,
            qos_classes=qos_classes,
        )
        await bridge.run()

    switching.responsive()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


def slurm_release_command(
    slurm_conf: Annotated[
        Path | None, typer.Option(envvar="SLURM_CONF", help="slurm.conf; default: Slurm's own.")
    ] = None,
) -> None:
    """Hand every job back to Slurm: release the jobs Boltforge held, clear their node pins
    (NodeList) and clear Boltforge's comment and admin comment on every job not finished.
    Run it as root after stopping the bridge and removing job_submit.lua (a bridge still
    running holds them again). See docs/slurm.md, "Taking it out again"."""
    import asyncio

    from boltforge.slurm.commands import Slurm, SlurmError
    from boltforge.slurm.release import release_all

    try:
        done = asyncio.run(release_all(Slurm(str(slurm_conf) if slurm_conf else None)))
    except SlurmError as e:
        errors.print(f"[bold red]error[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(1) from None
    held = " ".join(done.released) or "-"
    console.print(f"released {len(done.released)} held job(s): {held}", highlight=False)
    console.print(f"cleared Boltforge's words from {len(done.cleared)} other job(s)")


def _qos_classes(pairs: list[str]) -> dict[str, str]:
    """The QOS -> priority class map of ``--qos-class``; exits 2 naming the option when a
    pair is malformed or names no class."""
    from boltforge.spec.job import PRIORITY_CLASSES

    out: dict[str, str] = {}
    for pair in pairs:
        qos, _, cls = pair.partition("=")
        if not qos or cls not in PRIORITY_CLASSES:
            words = ", ".join(PRIORITY_CLASSES)
            errors.print(
                f"[bold red]error[/] --qos-class {escape(pair)}: expected QOS=CLASS with a "
                f"class of {words}. To fix: e.g. --qos-class urgent=high",
                highlight=False,
            )
            raise typer.Exit(EXIT_BAD_INPUT)
        out[qos] = cls
    return out


def _team_users(pairs: list[str], pattern: str | None) -> TeamUsers:
    """The team -> Slurm user map of ``--team-user`` and ``--team-user-pattern``; exits 2
    naming the option when a pair is malformed or names a missing or root user."""
    from boltforge.slurm.identity import TeamUsers, parse_team_users

    try:
        users = TeamUsers(parse_team_users(pairs), pattern)
    except ValueError as e:
        _bad("--team-user", str(e))
    if pattern is not None and "{team}" not in pattern:
        why = f"{pattern!r} has no {{team}}, so every team would share one user"
        _bad("--team-user-pattern", f"{why}. To fix: e.g. 'bolt-{{team}}', or use --team-user")
    for problem in users.problems():
        _bad("--team-user", problem)
    return users


def _bad(option: str, why: str) -> NoReturn:
    errors.print(f"[bold red]error[/] {option}: {escape(why)}", highlight=False)
    raise typer.Exit(EXIT_BAD_INPUT)
