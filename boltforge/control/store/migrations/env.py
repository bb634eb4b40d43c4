"""Alembic environment: runs migrations on the connection ``Database.migrate`` hands over."""

from __future__ import annotations

from alembic import context

from boltforge.control.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through boltforge.control.store.db.Database.migrate")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
