"""the leader lease of server replicas sharing one store (a new table: older servers ignore it)

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("url", sa.String(500), nullable=False),
        sa.Column("term", sa.Integer(), nullable=False),
        sa.Column("renewals", sa.Integer(), nullable=False),
        sa.Column("lease_s", sa.Float(), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader")
