"""tokens bound to nodes, expiring and revocable (new columns), and which token each node
belongs to (a new table); the tokens' change counter (``counters`` row ``tokens``) is made at
its first change

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("nodes", sa.JSON(none_as_null=True), nullable=True))
        batch.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("revoked_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))
    op.create_table(
        "node_claims",
        sa.Column("node", sa.String(63), primary_key=True),
        sa.Column("token_id", sa.Integer(), sa.ForeignKey("tokens.id"), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_node_claims_token_id", "node_claims", ["token_id"])


def downgrade() -> None:
    op.execute("DELETE FROM counters WHERE name = 'tokens'")
    op.drop_index("ix_node_claims_token_id", "node_claims")
    op.drop_table("node_claims")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("last_used_at")
        batch.drop_column("revoked_at")
        batch.drop_column("expires_at")
        batch.drop_column("nodes")
