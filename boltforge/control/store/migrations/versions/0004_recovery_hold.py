"""jobs remember the GPUs held for their restart after a host failure; nodes remember
until when straggler evidence marks them degraded

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("recovery_hold", sa.JSON(), nullable=True))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("degraded_until", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("degraded_until")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("recovery_hold")
