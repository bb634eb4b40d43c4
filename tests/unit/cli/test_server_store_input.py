"""How ``bolt server`` refuses a ``--db`` it cannot use, before anything starts: one line that
names the setting and the fix, exit code 2, no traceback. (A wrong password and a missing
database need a real PostgreSQL: ``tests/integration/test_store_outage_postgres.py``.)"""

from __future__ import annotations

from typer.testing import CliRunner

from boltforge.cli.main import app
from boltforge.control.store.urls import store_url
from boltforge.testing.postgres import free_port

runner = CliRunner()


def refusal(db: str) -> str:
    result = runner.invoke(app, ["server", "--db", db])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = " ".join(result.output.split())
    assert line.startswith("error --db")
    return line


def test_a_url_that_names_no_server_is_refused() -> None:
    line = refusal(f"postgresql+psycopg://bolt@127.0.0.1:{free_port()}/bolt")
    assert "no PostgreSQL server answers at 127.0.0.1:" in line
    assert "To fix: start it, or correct the host and port in --db" in line


def test_every_host_of_the_multi_host_form_is_tried_and_named() -> None:
    a, b = free_port(), free_port()
    line = refusal(f"host=127.0.0.1,127.0.0.1 port={a},{b} dbname=bolt user=bolt")
    assert f"127.0.0.1:{a},127.0.0.1:{b}" in line


def test_text_that_is_no_store_url_is_refused() -> None:
    line = refusal("bolt-database")
    assert "is not a store URL. To fix: give sqlite:///PATH" in line


def test_the_multi_host_forms_become_psycopg_urls() -> None:
    keywords = "host=db1,db2 port=5432 dbname=bolt user=bolt target_session_attrs=read-write"
    uri = "postgresql://bolt@db1:5432,db2:5433/bolt?target_session_attrs=read-write"
    assert store_url(keywords) == (
        "postgresql+psycopg://bolt@/bolt?host=db1%3A5432&host=db2%3A5432"
        "&target_session_attrs=read-write"
    )
    assert store_url(uri) == (
        "postgresql+psycopg://bolt@/bolt?host=db1%3A5432&host=db2%3A5433"
        "&target_session_attrs=read-write"
    )
    plain = "postgresql+psycopg://bolt@db/bolt"
    assert store_url(plain) == plain
