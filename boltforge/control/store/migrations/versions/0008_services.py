"""inference services (a new table), the service a job is a replica of, and the parts of
GPUs a run held (new columns)

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "services",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("team", sa.String(63), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("load", sa.JSON(), nullable=False),
        sa.Column("scaler", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("scaled_at", sa.Float(), nullable=True),
        sa.Column("scale_events", sa.Integer(), nullable=False),
    )
    op.create_index("ix_services_team", "services", ["team"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("service", sa.String(63), nullable=True))
        batch.create_index("ix_jobs_service", ["service"])
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("gpu_share", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("gpu_share")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_service")
        batch.drop_column("service")
    op.drop_index("ix_services_team", "services")
    op.drop_table("services")
