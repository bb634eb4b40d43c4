"""Backups of the store: every row, read in one snapshot while a server keeps writing, into
one portable file; and restores of such a file into a store a new server carries on from.
Either side may be SQLite or PostgreSQL (a SQLite backup restores into PostgreSQL and back).

The file is gzip-compressed JSON Lines (format version 1). The first line is the header::

    {"format": "boltforge-backup", "version": 1, "revision": "0006", "created_at": ISO-8601,
     "engine": "sqlite", "tables": {name: rows}, "columns": {name: [column, ...]}}

``revision`` is the store's Alembic revision (the ``alembic_version`` table is not copied as
rows, nor is ``leader``, the lease of the servers on the store). Then one line per row,
table by table in dependency order (parents first)::

    {"t": "jobs", "r": {"id": "...", "spec": {...}, "submitted_at": 1800000000.25, ...}}

Values are JSON as they are. In a column that is not a JSON column, a value JSON cannot
carry exactly is an object with one marker key: ``{"$float": "nan"}`` (NaN and infinities),
``{"$bytes": BASE64}``, ``{"$datetime": ISO}``, ``{"$date": ISO}``, ``{"$decimal": TEXT}``.
JSON columns hold any JSON, so their values are never read as markers.

The modules: ``fileformat`` (the file: header, records, checks, values), ``snapshot`` (taking
a backup), ``load`` (restoring) and ``target`` (making room in the store restored into),
``engines`` (opening and reaching a store, its migrations and tables), ``batches`` (rows a
batch at a time, and progress), ``errors``.
"""

from boltforge.control.store.backups.batches import Progress
from boltforge.control.store.backups.errors import BackupError, StoreNotEmpty
from boltforge.control.store.backups.fileformat import Header, check_file
from boltforge.control.store.backups.load import RestoreSummary, restore
from boltforge.control.store.backups.snapshot import BackupSummary, backup

__all__ = [
    "BackupError",
    "BackupSummary",
    "Header",
    "Progress",
    "RestoreSummary",
    "StoreNotEmpty",
    "backup",
    "check_file",
    "restore",
]
