"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("who", sa.String(length=63), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("action", sa.String(length=63), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=False),
        sa.Column("source", sa.String(length=100), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_at"), ["at"], unique=False)

    counters = op.create_table(
        "counters",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.bulk_insert(counters, [{"name": "job", "value": 0}])
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("num", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("project", sa.String(length=63), nullable=True),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("user", sa.String(length=63), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("array_id", sa.String(length=64), nullable=True),
        sa.Column("array_spec", sa.String(length=200), nullable=True),
        sa.Column("array_index", sa.Integer(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("bound_at", sa.Float(), nullable=True),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("last_preempted_at", sa.Float(), nullable=True),
        sa.Column("last_checkpoint_at", sa.Float(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=True),
        sa.Column("attained_gpu_s", sa.Float(), nullable=False),
        sa.Column("borrowed", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.String(length=40), nullable=False),
        sa.Column("position", sa.Integer(), nullable=True),
        sa.Column("estimated_start", sa.Float(), nullable=True),
        sa.Column("waiting", sa.JSON(), nullable=False),
        sa.Column("explanation", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_array_id"), ["array_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_num"), ["num"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_team"), ["team"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("inventory", sa.JSON(), nullable=False),
        sa.Column("pool", sa.String(length=63), nullable=False),
        sa.Column("pod", sa.String(length=63), nullable=False),
        sa.Column("rack", sa.String(length=63), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.Column("session", sa.String(length=64), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.Column("last_heartbeat", sa.Float(), nullable=True),
        sa.Column("lease_expires_at", sa.Float(), nullable=True),
        sa.Column("desired_version", sa.Integer(), nullable=False),
        sa.Column("health", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=True),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index("ix_events_job_id_id", ["job_id", "id"], unique=False)

    op.create_table(
        "logs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("replica", sa.String(length=120), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("logs", schema=None) as batch_op:
        batch_op.create_index("ix_logs_job_id_id", ["job_id", "id"], unique=False)

    op.create_table(
        "rank_progress",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("step_times", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("job_id", "rank"),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(length=120), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=63), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=63), nullable=False),
        sa.Column("gpus", sa.JSON(), nullable=False),
        sa.Column("cpus", sa.Float(), nullable=False),
        sa.Column("memory_gb", sa.Float(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("dispatched_at", sa.Float(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("stop_requested_at", sa.Float(), nullable=True),
        sa.Column("exited_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("checkpoint_s", sa.Float(), nullable=True),
        sa.Column("log_seq", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.ForeignKeyConstraint(
            ["node"],
            ["nodes.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_replicas_job_id"), ["job_id"], unique=False)
        batch_op.create_index("ix_replicas_node_state", ["node", "state"], unique=False)
        batch_op.create_index(batch_op.f("ix_replicas_state"), ["state"], unique=False)

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("dollars_per_hour", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_runs_ended_at"), ["ended_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_runs_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_job_id"))
        batch_op.drop_index(batch_op.f("ix_runs_ended_at"))

    op.drop_table("runs")
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_replicas_state"))
        batch_op.drop_index("ix_replicas_node_state")
        batch_op.drop_index(batch_op.f("ix_replicas_job_id"))

    op.drop_table("replicas")
    op.drop_table("rank_progress")
    with op.batch_alter_table("logs", schema=None) as batch_op:
        batch_op.drop_index("ix_logs_job_id_id")

    op.drop_table("logs")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_job_id_id")

    op.drop_table("events")
    op.drop_table("tokens")
    op.drop_table("nodes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_team"))
        batch_op.drop_index(batch_op.f("ix_jobs_state"))
        batch_op.drop_index(batch_op.f("ix_jobs_num"))
        batch_op.drop_index(batch_op.f("ix_jobs_array_id"))

    op.drop_table("jobs")
    op.drop_table("counters")
    with op.batch_alter_table("audit", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_at"))

    op.drop_table("audit")
