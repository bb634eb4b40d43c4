"""``bolt server``: the control plane (API, store and scheduling loop) in one process."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from platformdirs import user_data_dir
from rich.markup import escape
from sqlalchemy import select

from boltforge import gctune, switching
from boltforge.cli.common import errors, spec_errors
from boltforge.cli.credentials import TokenSource, forget_env, read_token
from boltforge.control.auth import new_token
from boltforge.control.jobs.artifacts import StoreError
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.runtime import ServerConfig
from boltforge.control.store.db import Database, default_url
from boltforge.control.store.leadership import LeaseTimes
from boltforge.control.store.models import TokenRow
from boltforge.control.store.urls import check_store, store_url
from boltforge.core.health import HealthRules, StragglerAction
from boltforge.core.policy import POLICIES
from boltforge.core.preempt.victims import PreemptRules
from boltforge.spec import units
from boltforge.spec.images import ImagePolicy
from boltforge.spec.teams import TeamsSpec, load_teams

ADMIN_TOKEN = TokenSource("--admin-token", "--admin-token-file", "BOLT_ADMIN_TOKEN")
AGENT_TOKEN = TokenSource("--agent-token", "--agent-token-file", "BOLT_AGENT_TOKEN")
GRACEFUL_S = 3
"""Seconds open requests (the console's event streams) get to finish when the server stops."""


def server_command(
    db: Annotated[
        str | None,
        typer.Option(
            envvar="BOLT_DB",
            help="Store URL (default: SQLite under the user's data directory), e.g. "
            "postgresql+psycopg://user@host/db, or libpq's multi-host form "
            "'host=a,b dbname=db user=u target_session_attrs=read-write' (a promoted standby "
            "is found without a restart). Set BOLT_DB instead when it holds a password: "
            "a command line is visible to every user of the host.",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8600,
    policy: Annotated[str, typer.Option(help="Scheduling policy.")] = "default",
    checkpoint_root: Annotated[
        Path | None, typer.Option(help="Where jobs' checkpoint directories live.")
    ] = None,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="BOLT_ADMIN_TOKEN_FILE",
            metavar="PATH",
            help="File holding an admin token to accept (read once; keep it mode 600). Or "
            "set BOLT_ADMIN_TOKEN.",
            show_default=False,
        ),
    ] = None,
    agent_token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="BOLT_AGENT_TOKEN_FILE",
            metavar="PATH",
            help="File holding an agent token to accept (read once; keep it mode 600). Or "
            "set BOLT_AGENT_TOKEN.",
            show_default=False,
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            hidden=True,
            help="Deprecated: visible to every user of the host; use --admin-token-file.",
        ),
    ] = None,
    agent_token: Annotated[
        str | None,
        typer.Option(
            hidden=True,
            help="Deprecated: visible to every user of the host; use --agent-token-file.",
        ),
    ] = None,
    min_runtime: Annotated[
        float, typer.Option(help="Seconds a job runs before it may be preempted.")
    ] = 600.0,
    cooldown: Annotated[
        float, typer.Option(help="Seconds a preempted job is protected from another preemption.")
    ] = 3600.0,
    churn: Annotated[
        float, typer.Option(help="Largest share of the fleet's GPUs preempted per 10 minutes.")
    ] = 0.05,
    full_every: Annotated[
        float,
        typer.Option(
            min=0.5,
            help="Seconds between full scheduling passes when no event asks for one sooner.",
        ),
    ] = 10.0,
    scale_every: Annotated[
        float,
        typer.Option(min=0.2, help="Seconds between the services' autoscaling rounds."),
    ] = 5.0,
    heartbeat: Annotated[float, typer.Option(help="Seconds between agent heartbeats.")] = 2.0,
    lease: Annotated[float, typer.Option(help="Seconds of silence before a node is dead.")] = 15.0,
    straggler_action: Annotated[
        StragglerAction,
        typer.Option(
            help="What to do about a rank that straggles behind its peers: report it in the "
            "job's events, or also cordon its host and move the job off at its checkpoint."
        ),
    ] = StragglerAction.REPORT,
    straggler_ratio: Annotated[
        float,
        typer.Option(min=1.0, help="How many times its peers' median step time a rank must take."),
    ] = 1.5,
    straggler_samples: Annotated[
        int, typer.Option(min=2, help="Step times a rank must have reported to be judged.")
    ] = 10,
    progress_timeout: Annotated[
        str,
        typer.Option(
            help="Fail a running job that reported progress in its current allocation and then "
            "none for this long (e.g. 30m; 0 turns it off). A job's health.progress_timeout "
            "overrides it."
        ),
    ] = "30m",
    recovery_hold: Annotated[
        str,
        typer.Option(
            help="How long a job that lost a host keeps the GPUs of its healthy hosts for its "
            "restart, so it restarts on them with only the lost host replaced (e.g. 60s; 0 "
            "turns it off)."
        ),
    ] = "60s",
    teams: Annotated[
        Path | None,
        typer.Option(
            help="A YAML file of team quotas and budgets, e.g. `teams: {nlp: {quota: "
            "{guaranteed: 64, burst: 128}, budget: {monthly: 10000, soft: 0.8}}}` (GPUs; "
            "dollars per calendar month, UTC; see docs/quotas.md and docs/cost.md)."
        ),
    ] = None,
    require_image: Annotated[
        bool,
        typer.Option(
            "--require-image",
            help="Accept containerized work only: a job (or each of its roles) with no "
            "`image` is refused at submit. Overrides the teams file's `images:` (a team's own "
            "`images:` still wins for it).",
        ),
    ] = False,
    allowed_registry: Annotated[
        list[str] | None,
        typer.Option(
            metavar="PREFIX",
            help="Accept only images whose name starts with PREFIX (a registry such as "
            "`registry.acme.com/` or a path such as `ghcr.io/acme/`). Repeatable.",
        ),
    ] = None,
    require_digest: Annotated[
        bool,
        typer.Option(
            "--require-digest", help="Accept only images pinned by digest (NAME@sha256:...)."
        ),
    ] = False,
    artifacts_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where jobs' artifacts (their declared `outputs`) are kept; default: "
            "`artifacts` beside the checkpoint root. See docs/forge.md.",
        ),
    ] = None,
    artifacts_url: Annotated[
        str,
        typer.Option(
            metavar="URL",
            help="Keep jobs' artifacts in an S3-compatible bucket instead: s3://BUCKET/PREFIX "
            "(credentials from the AWS environment or profile; needs `boltforge[s3]`). See "
            "docs/forge.md.",
            show_default=False,
        ),
    ] = "",
    artifacts_endpoint: Annotated[
        str,
        typer.Option(
            metavar="URL",
            help="With --artifacts-url: the S3 endpoint of a store other than AWS (MinIO, "
            "Ceph...), e.g. https://minio.internal:9000. Default: AWS_ENDPOINT_URL_S3 or "
            "AWS_ENDPOINT_URL, else AWS.",
            show_default=False,
        ),
    ] = "",
    reports: Annotated[
        Path | None,
        typer.Option(
            help="A folder of `bolt simulate --report` outputs (one sub-folder each) that the "
            "console lists and opens."
        ),
    ] = None,
    max_in_flight_per_caller: Annotated[
        int,
        typer.Option(
            min=0,
            help="Requests one token (or unauthenticated address) may have in flight at once; "
            "past it the next is refused with 429 and Retry-After (0: no limit). Agent calls "
            "are limited per node instead.",
        ),
    ] = 256,
    max_in_flight: Annotated[
        int,
        typer.Option(
            min=0,
            help="People's requests in flight at once across every caller; past it the next "
            "is refused with 503 and Retry-After (0: no limit).",
        ),
    ] = 1024,
    max_in_flight_per_node: Annotated[
        int, typer.Option(min=0, help="Agent calls in flight at once per node (0: no limit).")
    ] = 16,
    max_in_flight_agents: Annotated[
        int,
        typer.Option(
            min=0,
            help="Agent calls in flight at once across every node, counted apart from "
            "people's requests (0: no limit).",
        ),
    ] = 4096,
    rate_per_caller: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="People's requests per second per token (or address), past which the next "
            "is refused with 429 and Retry-After (0: no rate limit).",
        ),
    ] = 0.0,
    rate_burst: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="Requests a caller may send in one burst under --rate-per-caller (the "
            "bucket's size; 0: one second's worth; at least 1 either way).",
        ),
    ] = 0.0,
    max_body: Annotated[
        int,
        typer.Option(
            min=1024,
            help="Bytes a person's request body may hold; a larger one is refused with 413 "
            "before it is parsed (the largest job spec intake accepts fits in 1 MiB).",
        ),
    ] = 2 << 20,
    max_agent_body: Annotated[
        int,
        typer.Option(
            min=1024,
            help="Bytes an agent-protocol request body may hold (batched heartbeats of 10,000 "
            "nodes of 8 replicas are about 8 MiB).",
        ),
    ] = 64 << 20,
    replica: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="Run as one of several replicas on one PostgreSQL store, named NAME (unique "
            "among them): one leads, the others forward callers to it and take over when "
            "it goes (docs/operations.md). Needs --advertise.",
            show_default=False,
        ),
    ] = "",
    advertise: Annotated[
        str,
        typer.Option(
            metavar="URL",
            help="With --replica: the address the other replicas forward callers to while "
            "this one leads (http://host:port).",
            show_default=False,
        ),
    ] = "",
    leader_lease: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="With --replica: seconds a leader's lease lasts unrenewed before another "
            "replica takes over (it renews every sixth of it and stops acting after two "
            "thirds).",
        ),
    ] = 3.0,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Serve HTTPS with this certificate (PEM; the server's certificate first, then "
            "any intermediate CA certificates). Needs --tls-key.",
            show_default=False,
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="The private key (PEM, not encrypted) of --tls-cert.",
            show_default=False,
        ),
    ] = None,
    forwarded_allow_ips: Annotated[
        str,
        typer.Option(
            metavar="IPS",
            help="Behind a reverse proxy: the proxies' addresses (comma-separated, or `*`) "
            "whose X-Forwarded-For and X-Forwarded-Proto name the client. Without it those "
            "headers are ignored and the peer's address is the caller's.",
            show_default=False,
        ),
    ] = "",
) -> None:
    """Run the control plane: the HTTP API, the web console (at /console/), the store and
    the scheduling loop.

    On a store with no admin token yet (and none given), one is made, printed once and saved
    in the data directory (admin-token, readable by you only). With --tls-cert and --tls-key
    it serves HTTPS only; clients verify it with `--ca` (see docs/control-plane.md, TLS).
    """

    from boltforge.control import closing
    from boltforge.control.app import create_app

    if policy not in POLICIES:
        errors.print(
            f"[bold red]error[/] --policy {escape(repr(policy))}: known: {', '.join(POLICIES)}",
            highlight=False,
        )
        raise typer.Exit(2)
    certfile, keyfile = _tls(tls_cert, tls_key)
    advertise_url = _advertised(replica, advertise)
    health = _health(straggler_action, straggler_ratio, straggler_samples, progress_timeout)
    teams_spec = _with_images(_teams(teams), require_image, allowed_registry, require_digest)
    hold_s = _seconds("--recovery-hold", recovery_hold)
    if artifacts_url:
        _bucket(artifacts_url)
    admin_token = read_token(ADMIN_TOKEN, admin_token, admin_token_file)
    agent_token = read_token(AGENT_TOKEN, agent_token, agent_token_file)
    forget_env()
    url = _store(db) if db else default_url()
    home = Path(user_data_dir("boltforge"))
    admin_token = admin_token or _first_admin_token(url, home)
    config = ServerConfig(
        db_url=url,
        checkpoint_root=str(checkpoint_root or home / "checkpoints"),
        policy=policy,
        preempt=PreemptRules(min_runtime_s=min_runtime, cooldown_s=cooldown, churn_fraction=churn),
        terms=LeaseTerms(heartbeat, max(3 * heartbeat, lease / 2), lease),
        full_every_s=full_every,
        scale_every_s=scale_every,
        health=health,
        admin_token=admin_token,
        agent_token=agent_token,
        budgets=teams_spec.budgets(),
        teams=teams_spec,
        recovery_hold_s=hold_s,
        reports_dir=str(reports) if reports else None,
        artifacts_dir=str(artifacts_dir) if artifacts_dir else None,
        artifacts_url=artifacts_url or None,
        artifacts_endpoint=artifacts_endpoint or None,
        max_in_flight_per_caller=max_in_flight_per_caller,
        max_in_flight=max_in_flight,
        max_in_flight_per_node=max_in_flight_per_node,
        max_in_flight_agents=max_in_flight_agents,
        rate_per_caller=rate_per_caller,
        rate_burst=rate_burst,
        max_body=max_body,
        max_agent_body=max_agent_body,
        replica=replica,
        advertise_url=advertise_url,
        leader_lease=LeaseTimes(leader_lease, leader_lease / 6, leader_lease * 2 / 3),
    )
    gctune.tune()
    switching.responsive()
    try:
        app = create_app(config)
    except StoreError as e:
        errors.print(f"[bold red]error[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    closing.serve(
        app,
        host=host,
        port=port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=GRACEFUL_S,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        proxy_headers=bool(forwarded_allow_ips),
        forwarded_allow_ips=forwarded_allow_ips or None,
    )


def _bucket(url: str) -> None:
    """Exit 2 unless ``url`` names a bucket (``s3://BUCKET[/PREFIX]``)."""
    from boltforge.control.jobs.s3store import parse_url

    try:
        parse_url(url)
    except StoreError as e:
        errors.print(f"[bold red]error[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None


def _advertised(replica: str, advertise: str) -> str:
    """--advertise, checked: needed with --replica, an http(s) URL."""
    if not replica:
        return ""
    if not advertise.startswith(("http://", "https://")):
        errors.print(
            "[bold red]error[/] --replica needs --advertise URL, the http(s) address the "
            "other replicas forward callers to. To fix: add --advertise http://HOST:PORT"
        )
        raise typer.Exit(2)
    return advertise


def _tls(cert: Path | None, key: Path | None) -> tuple[str | None, str | None]:
    """The certificate and key files to serve HTTPS with (None, None: plain HTTP); exits 2
    naming the option when only one is given, a file is missing, or the key and the
    certificate do not load as a pair."""
    if cert is None and key is None:
        return None, None
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        _tls_error(f"{given} needs {missing}. To fix: pass both, or neither to serve plain HTTP")
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not path.is_file():
            what = "not a file" if path.exists() else "no such file"
            _tls_error(f"{option} {path}: {what}. To fix: pass the path of a PEM file")
    _check_pair(cert, key)
    return str(cert), str(key)


def _check_pair(cert: Path, key: Path) -> None:
    """Exits 2 naming the option unless ``cert`` holds a certificate and ``key`` its
    private key, unencrypted (an encrypted one would make the server prompt for it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=cert)
    except (ssl.SSLError, OSError) as e:
        reason = "no PEM certificate in it" if isinstance(e, ssl.SSLError) else e.strerror
        _tls_error(f"--tls-cert {cert}: {reason}. To fix: pass the server's certificate (PEM)")
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError) as e:
        if getattr(e, "reason", None) == "KEY_VALUES_MISMATCH":
            _tls_error(
                f"--tls-key {key} is not the key of --tls-cert {cert}. To fix: pass the key "
                "the certificate was made for"
            )
        _tls_error(
            f"--tls-key {key}: not an unencrypted PEM private key. To fix: pass the "
            "certificate's private key (decrypt it with `openssl pkey -in KEY -out KEY.pem`)"
        )


def _tls_error(message: str) -> NoReturn:
    """Print ``error: message`` (which names the option and the fix) and exit 2."""
    errors.print(f"[bold red]error[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _teams(path: Path | None) -> TeamsSpec:
    """The teams file at ``path`` (no quotas or budgets without one); exits 2 naming each bad
    field."""
    if path is None:
        return TeamsSpec()
    with spec_errors():
        return load_teams(path)


def _with_images(
    teams: TeamsSpec, require: bool, registries: list[str] | None, digest: bool
) -> TeamsSpec:
    """``teams`` with the server-wide image policy the options give, when any is given."""
    if not (require or registries or digest):
        return teams
    policy = ImagePolicy(require=require, registries=registries or [], digest=digest)
    return teams.model_copy(update={"images": policy})


def _health(action: StragglerAction, ratio: float, samples: int, timeout: str) -> HealthRules:
    """The health rules from the command line; exits 2 naming the option when one is bad."""
    try:
        seconds = units.seconds(timeout)
    except ValueError as e:
        errors.print(
            f"[bold red]error[/] --progress-timeout {escape(repr(timeout))}: {escape(str(e))}. "
            "To fix: e.g. 30m",
            highlight=False,
        )
        raise typer.Exit(2) from None
    return HealthRules(
        straggler_action=action,
        straggler_ratio=ratio,
        min_samples=samples,
        window=max(20, samples),
        progress_timeout_s=seconds or None,
    )


def _seconds(option: str, text: str) -> float:
    """``text`` (e.g. 60s, 2m) in seconds; exits 2 naming ``option`` when it is bad."""
    try:
        return units.seconds(text)
    except ValueError as e:
        errors.print(
            f"[bold red]error[/] {option} {escape(repr(text))}: {escape(str(e))}. To fix: e.g. 60s",
            highlight=False,
        )
        raise typer.Exit(2) from None


def _store(db: str) -> str:
    """``--db`` as a SQLAlchemy URL, checked by connecting once; a store that cannot be used
    is one line naming the setting and the fix, exit 2, before anything starts."""
    try:
        url = store_url(db)
    except ValueError as e:
        _bad_store(str(e))
    problem = check_store(url)
    if problem is not None:
        _bad_store(problem)
    return url


def _bad_store(message: str) -> NoReturn:
    errors.print(f"[bold red]error[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _first_admin_token(url: str, home: Path) -> str | None:
    """A new admin token when the store has none (printed and saved), else None."""
    db = Database(url)
    try:
        db.migrate()
        with db.session() as s:
            if s.scalar(select(TokenRow).where(TokenRow.role == "admin").limit(1)) is not None:
                return None
    finally:
        db.close()
    token = new_token()
    home.mkdir(parents=True, exist_ok=True)
    path = home / "admin-token"
    path.write_text(token + "\n")
    os.chmod(path, 0o600)
    errors.print(f"admin token (saved in {path}): {token}", highlight=False)
    return token
