"""The backup file: its header, reading its lines, checking the whole file before a restore
touches a store, and the values of its rows (JSON, with markers for what JSON cannot carry
exactly). The format itself is described in this package's docstring."""

from __future__ import annotations

import base64
import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import JSON, Table

from boltforge.control.store.backups.engines import known_revisions
from boltforge.control.store.backups.errors import RETAKE, BackupError

FORMAT = "boltforge-backup"
VERSION = 1
FROM_BACKUP = "To fix: pass the file `bolt admin backup` wrote"


@dataclass(frozen=True, slots=True)
class Header:
    """A backup file's first line, checked."""

    revision: str
    created_at: str
    tables: dict[str, int]
    columns: dict[str, list[str]]


# -- reading and checking the file -------------------------------------------------------------


def check_file(path: Path) -> Header:
    """The header of the backup at ``path`` once the whole file is read and found complete
    (every line a row of a table the header lists, as many rows as it promises); raises
    ``BackupError`` naming what is wrong otherwise."""
    records = read_records(path)
    header = _header(path, next(records, None))
    seen = dict.fromkeys(header.tables, 0)
    for record in records:
        table, _row = _row_of(path, header, record)
        seen[table] += 1
    if seen != header.tables:
        found, listed = sum(seen.values()), sum(header.tables.values())
        raise BackupError(
            f"{path} is truncated or damaged: it holds {found} rows where its header lists "
            f"{listed}. {RETAKE}"
        )
    return header


def read_records(path: Path) -> Iterator[Any]:
    """Each line of the gzip file at ``path``, parsed as JSON."""
    number = 0
    try:
        with gzip.open(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                yield _parsed(path, line, number)
    except FileNotFoundError:
        raise BackupError(f"no file at {path}. {FROM_BACKUP}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        if number == 0 and isinstance(e, gzip.BadGzipFile):
            raise BackupError(
                f"{path} is not a Boltforge backup (not gzip). {FROM_BACKUP}"
            ) from None
        raise BackupError(f"{path} is truncated or damaged ({e}). {RETAKE}") from None
    except OSError as e:
        raise BackupError(f"cannot read {path}: {e.strerror or e}. {FROM_BACKUP}") from None


def _parsed(path: Path, line: bytes, number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        if number == 1:
            raise BackupError(f"{path} is not a Boltforge backup. {FROM_BACKUP}") from None
        raise BackupError(f"{path} is damaged: line {number} is not JSON. {RETAKE}") from None


def _header(path: Path, first: Any) -> Header:
    """``first`` (the file's first line) checked as a backup header this software reads."""
    if not isinstance(first, dict) or first.get("format") != FORMAT:
        raise BackupError(f"{path} is not a Boltforge backup. {FROM_BACKUP}")
    version = first.get("version")
    if isinstance(version, int) and version > VERSION:
        raise BackupError(
            f"{path} is a backup of format version {version}, newer than this bolt reads "
            f"({VERSION}). To fix: restore it with the Boltforge version that wrote it, or newer"
        )
    tables: Any = first.get("tables")
    columns: Any = first.get("columns")
    revision, created = first.get("revision"), first.get("created_at")
    if (
        version != VERSION
        or not isinstance(revision, str)
        or not _counts(tables)
        or not _column_lists(columns, tables)
    ):
        raise BackupError(f"{path} is damaged: its header is not valid. {RETAKE}")
    if revision not in known_revisions():
        raise BackupError(
            f"{path} is a store at schema revision {revision}, which this bolt's migrations do "
            "not know. To fix: restore it with the Boltforge version of the server it was "
            "taken from, or newer"
        )
    return Header(revision, str(created), tables, columns)


def _counts(tables: Any) -> bool:
    return isinstance(tables, dict) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in tables.values()
    )


def _column_lists(columns: Any, tables: dict[str, int]) -> bool:
    return (
        isinstance(columns, dict)
        and set(columns) == set(tables)
        and all(
            isinstance(c, list) and all(isinstance(n, str) for n in c) for c in columns.values()
        )
    )


def _row_of(path: Path, header: Header, record: Any) -> tuple[str, dict[str, Any]]:
    """A row line's table and row, checked against the header's tables and columns."""
    table = record.get("t") if isinstance(record, dict) else None
    row = record.get("r") if isinstance(record, dict) else None
    if table not in header.tables or not isinstance(row, dict):
        raise BackupError(f"{path} is damaged: a line is not a row of a table it lists. {RETAKE}")
    if sorted(row) != sorted(header.columns[table]):
        raise BackupError(f"{path} is damaged: a row of {table} has other columns. {RETAKE}")
    return table, row


# -- lines and values --------------------------------------------------------------------------


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


def encoded_row(table: Table, row: Any) -> dict[str, Any]:
    return {c.name: _encode(row[c.name], isinstance(c.type, JSON)) for c in table.columns}


def decoded_row(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    return {
        name: _decode(value, isinstance(table.c[name].type, JSON)) for name, value in row.items()
    }


def _encode(value: Any, is_json: bool) -> Any:
    """``value`` as JSON that ``_decode`` turns back into exactly it."""
    if is_json or value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    raise BackupError(
        f"cannot back up a value of type {type(value).__name__}. To fix: report this to "
        "Boltforge's maintainers with the column it came from"
    )


DECODERS: dict[str, Callable[[str], Any]] = {
    "$float": float,
    "$bytes": base64.b64decode,
    "$datetime": datetime.fromisoformat,
    "$date": date.fromisoformat,
    "$decimal": Decimal,
}


def _decode(value: Any, is_json: bool) -> Any:
    if is_json or not isinstance(value, dict):
        return value
    [(marker, text)] = value.items()
    return DECODERS[marker](text)
