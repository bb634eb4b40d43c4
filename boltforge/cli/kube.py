"""``bolt kube-scheduler``: run Boltforge as a scheduler of a Kubernetes cluster, beside the
default one, for the pods that name ``schedulerName: boltforge``."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from boltforge.cli.common import EXIT_BAD_INPUT, errors
from boltforge.cli.credentials import BRIDGE_TOKEN, forget_env, read_token


def kube_scheduler_command(
    server: Annotated[str, typer.Option(help="Control plane URL, e.g. http://boltforge:8080.")],
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="BOLT_TOKEN_FILE",
            metavar="PATH",
            help="File holding an admin token (it acts for every node; read once, e.g. a "
            "mounted Secret). Or set BOLT_TOKEN.",
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
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            envvar="KUBECONFIG", help="kubeconfig; default: in-cluster, else ~/.kube/config."
        ),
    ] = None,
    scheduler_name: Annotated[
        str, typer.Option(help="The schedulerName of the pods it places.")
    ] = "boltforge",
    node_selector: Annotated[
        str, typer.Option(help="Label selector of the nodes it owns, e.g. pool=gpu; default: all.")
    ] = "",
    rack_label: Annotated[str, typer.Option(help="Node label naming its rack.")] = (
        "topology.boltforge.io/rack"
    ),
    pod_label: Annotated[
        str, typer.Option(help="Node label naming its pod (the racks under one spine).")
    ] = "topology.boltforge.io/pod",
    spine_label: Annotated[
        str, typer.Option(help="Node label naming its spine (its pod when it has no pod label).")
    ] = "topology.boltforge.io/spine",
    pool_label: Annotated[
        str, typer.Option(help="Node label naming its pool; default: pool by GPU model.")
    ] = "boltforge.io/pool",
    lease_namespace: Annotated[
        str, typer.Option(help="Namespace of the leader-election Lease.")
    ] = "boltforge-system",
    lease_name: Annotated[str, typer.Option(help="Name of the leader-election Lease.")] = (
        "boltforge-scheduler"
    ),
    identity: Annotated[
        str, typer.Option(envvar="POD_NAME", help="This replica's name in the Lease.")
    ] = "",
    no_leader_election: Annotated[
        bool, typer.Option(help="Act at once, without a Lease (one replica only).")
    ] = False,
    lease_duration: Annotated[
        float, typer.Option(metavar="SECONDS", help="How long a silent leader keeps the lead.")
    ] = 15.0,
    renew_deadline: Annotated[
        float, typer.Option(metavar="SECONDS", help="A leader that cannot renew stops after.")
    ] = 10.0,
    retry_period: Annotated[
        float, typer.Option(metavar="SECONDS", help="How often the Lease is tried.")
    ] = 2.0,
    grace: Annotated[
        float, typer.Option(metavar="SECONDS", help="Grace of pods that set none.")
    ] = 30.0,
    tolerate_taint: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY[=VALUE]:EFFECT",
            help="A taint every pod is taken to tolerate (repeat for more); default: "
            "nvidia.com/gpu, any value and effect.",
        ),
    ] = None,
) -> None:
    """Place pods that name schedulerName: boltforge as gangs (a PodGroup's minMember, or a
    boltforge.io/gang annotation) on the topology, all or nothing; preempt through the
    Eviction API; explain every waiting pod in its PodScheduled condition and events
    (kubectl describe pod). Run two replicas: one acts, the other waits on the Lease.
    See docs/kubernetes.md."""
    import asyncio
    import contextlib
    import logging

    from kubernetes.client import CoordinationV1Api
    from kubernetes.config import ConfigException

    from boltforge import switching
    from boltforge.agent.client import ServerClient
    from boltforge.client import Client
    from boltforge.kube.connect import api_client
    from boltforge.kube.leader import LeaderElector
    from boltforge.kube.scheduler import KubeScheduler, Options
    from boltforge.kube.shutdown import run_until_stopped
    from boltforge.kube.taints import parse as parse_toleration
    from boltforge.kube.translate import Labels

    token = read_token(BRIDGE_TOKEN, token, token_file) or ""
    forget_env()
    if not token:
        errors.print(
            "[bold red]error[/] --token-file: a token is required. To fix: pass --token-file "
            "PATH or set BOLT_TOKEN",
            highlight=False,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    tolerated = tuple(tolerate_taint) if tolerate_taint else Labels().tolerated
    for text in tolerated:
        try:
            parse_toleration(text)
        except ValueError as e:
            errors.print(f"[bold red]error[/] --tolerate-taint: {escape(str(e))}", highlight=False)
            raise typer.Exit(EXIT_BAD_INPUT) from None
    try:
        kube = api_client(kubeconfig)
    except ConfigException as e:
        errors.print(
            f"[bold red]error[/] --kubeconfig: {escape(str(e))}. To fix: pass --kubeconfig PATH, "
            "set KUBECONFIG, or run in a pod with a service account",
            highlight=False,
        )
        raise typer.Exit(EXIT_BAD_INPUT) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    me = identity or socket.gethostname()
    labels = Labels(rack_label, pod_label, spine_label, pool_label, tolerated)
    options = Options(scheduler_name, labels, node_selector, grace)
    elector = None
    if not no_leader_election:
        if not retry_period < renew_deadline < lease_duration:
            errors.print(
                "[bold red]error[/] --renew-deadline: must lie between --retry-period and "
                "--lease-duration. To fix: e.g. --lease-duration 15 --renew-deadline 10 "
                "--retry-period 2",
                highlight=False,
            )
            raise typer.Exit(EXIT_BAD_INPUT)
        elector = LeaderElector(
            CoordinationV1Api(kube),
            lease_namespace,
            lease_name,
            me,
            lease_s=lease_duration,
            renew_s=renew_deadline,
            retry_s=retry_period,
        )

    async def serve() -> None:
        scheduler = KubeScheduler(
            kube, ServerClient(server, token), Client(server, token), me, options, elector
        )
        await run_until_stopped(scheduler.run, scheduler.stop)  # SIGTERM releases the Lease

    switching.responsive()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
