"""What ``--db`` accepts, and the check that it names a store the server can use.

``store_url`` turns each accepted form into a SQLAlchemy URL:

* a SQLAlchemy URL (``sqlite:///path``, ``postgresql+psycopg://user@host/db``), as it is;
* a libpq URI naming several hosts (``postgresql://user@a:5432,b:5432/db?...``);
* a libpq keyword string (``host=a,b port=5432 dbname=db user=u
  target_session_attrs=read-write``).

Several hosts become psycopg's multi-host form (``?host=a:5432&host=b:5432``): libpq tries
them in turn, and with ``target_session_attrs=read-write`` connects only to the one that takes
writes, so a standby promoted after its primary died is found on the next connection.

``check_store`` connects once before anything starts and says, in one line naming ``--db``
and the fix, why the store cannot be used: no server answers, the password (or user) is
refused, the database does not exist.
"""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from boltforge.control.store.outage import fault_of

PSYCOPG = "postgresql+psycopg"
LIBPQ_SCHEMES = ("postgresql://", "postgres://")
_NAMED = {"user", "password", "dbname", "host", "port"}


def store_url(given: str) -> str:
    """The SQLAlchemy URL for ``given`` (see the module docstring); raises ``ValueError``
    with the fix for text that is none of the accepted forms."""
    given = given.strip()
    if given.startswith(LIBPQ_SCHEMES) and "," in given.split("/")[2]:
        return _from_libpq(given)
    if "://" in given:
        make_url(given)  # raises ArgumentError (a ValueError) when it cannot be parsed
        return given
    if "=" in given:
        return _from_libpq(given)
    raise ValueError(
        f"--db {given!r} is not a store URL. To fix: give sqlite:///PATH, "
        "postgresql+psycopg://USER@HOST/DB or libpq's 'host=A,B dbname=DB user=USER "
        "target_session_attrs=read-write'"
    )


def _from_libpq(conninfo: str) -> str:
    """A libpq URI or keyword string as a psycopg SQLAlchemy URL."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = {k: str(v) for k, v in conninfo_to_dict(conninfo).items()}
    except Exception as e:  # psycopg's ProgrammingError: libpq could not parse it
        raise ValueError(f"--db: {' '.join(str(e).split())}. To fix: correct it") from None
    hosts = params.get("host", "").split(",") if params.get("host") else []
    ports = params.get("port", "").split(",") if params.get("port") else []
    if len(ports) == 1:
        ports = ports * len(hosts)
    ports += [""] * (len(hosts) - len(ports))
    query: dict[str, str | list[str]] = {k: v for k, v in params.items() if k not in _NAMED}
    if len(hosts) > 1:
        query["host"] = [f"{h}:{p}" if p else h for h, p in zip(hosts, ports, strict=False)]
        host, port = None, None
    else:
        host = hosts[0] if hosts else None
        port = int(ports[0]) if ports and ports[0] else None
    url = URL.create(
        PSYCOPG,
        username=params.get("user"),
        password=params.get("password"),
        host=host,
        port=port,
        database=params.get("dbname"),
        query=query,
    )
    return url.render_as_string(hide_password=False)


def check_store(url: str) -> str | None:
    """None when the store at ``url`` answers a query; else one line naming ``--db``, what
    is wrong and the fix. SQLite files are not checked here (they are made on first use)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return None
    engine = create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as e:
        return _why(e, parsed)
    finally:
        engine.dispose()
    return None


def _why(error: Exception, parsed: URL) -> str:
    """The one line for a failed first connection."""
    orig = getattr(error, "orig", None) or error
    said = " ".join(str(orig).split())
    state = getattr(orig, "sqlstate", None)
    where = _where(parsed)
    if state in ("28P01", "28000") or "password" in said or "authentication" in said:
        return (
            f"--db: {where} refused user {parsed.username or '(none)'}: {_last(said)}. "
            "To fix: correct the user and password in --db, or set them in BOLT_DB or "
            "~/.pgpass (a command line is visible to every user of the host)"
        )
    if state == "3D000" or ("database" in said and "does not exist" in said):
        name = parsed.database or "(none)"
        return (
            f"--db: the database {name} does not exist on {where}. To fix: create it "
            f"(createdb {name}) or name an existing one in --db"
        )
    if fault_of(error) is not None or "connection" in said.lower():
        return (
            f"--db: no PostgreSQL server answers at {where} ({_last(said)}). To fix: start "
            "it, or correct the host and port in --db"
        )
    return f"--db: cannot use the store at {where}: {_last(said)}. To fix: correct --db"


def _where(parsed: URL) -> str:
    """The server(s) a URL names, for a message (no password)."""
    hosts = parsed.query.get("host")
    if hosts:
        return ",".join([hosts] if isinstance(hosts, str) else list(hosts))
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}"


def _last(said: str) -> str:
    """The most telling part of libpq's message (it lists every host it tried)."""
    text = said.split("FATAL: ")[-1] if "FATAL: " in said else said
    return text if len(text) <= 160 else text[:157] + "..."
