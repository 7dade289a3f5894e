"""GPU handoff queue: job, lease, worker, queue_lock; project budgets.

Revision ID: 20261202_jobs
Revises: 20261202_pull_requests
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "20261202_jobs"
down_revision = "20261202_pull_requests"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("project") as batch:
        batch.add_column(sa.Column("budget_gpu_hours_per_day", sa.Float(), nullable=True))
        batch.add_column(sa.Column("budget_concurrent_gpus", sa.Integer(), nullable=True))
    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cycle_id", sa.Integer(), nullable=True),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("experiment", sa.String(length=64), nullable=False),
        sa.Column("parameters", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("time_limit_s", sa.Float(), nullable=False),
        sa.Column("order_key", TZ, nullable=False),
        sa.Column("submitted_at", TZ, nullable=False),
        sa.Column("prepared_at", TZ, nullable=True),
        sa.Column("leased_at", TZ, nullable=True),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("first_line_at", TZ, nullable=True),
        sa.Column("finished_at", TZ, nullable=True),
        sa.Column("idle_gap_s", sa.Float(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("workdir", sa.String(length=1024), nullable=True),
        sa.Column("venv_path", sa.String(length=1024), nullable=True),
        sa.Column("result_path", sa.String(length=1024), nullable=True),
        sa.Column("log_path", sa.String(length=1024), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("wait_reason", sa.String(length=255), nullable=True),
        sa.Column("cancel_requested_at", TZ, nullable=True),
        sa.Column("cancelled_by", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_job_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
    )
    op.create_index(op.f("ix_job_cycle_id"), "job", ["cycle_id"], unique=False)
    op.create_index(op.f("ix_job_order_key"), "job", ["order_key"], unique=False)
    op.create_index(op.f("ix_job_queue"), "job", ["queue"], unique=False)
    op.create_index(op.f("ix_job_state"), "job", ["state"], unique=False)
    op.create_table(
        "lease",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("heartbeat_at", TZ, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_lease_job_id_job"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lease")),
        sa.UniqueConstraint("job_id", name=op.f("uq_lease_job_id")),
    )
    op.create_index(op.f("ix_lease_expires_at"), "lease", ["expires_at"], unique=False)
    op.create_table(
        "worker",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("devices", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("last_seen", TZ, nullable=False),
        sa.Column("current_job_id", sa.Integer(), nullable=True),
        sa.Column("last_job_finished_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker")),
        sa.UniqueConstraint("name", name=op.f("uq_worker_name")),
    )
    op.create_table(
        "queue_lock",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("counter", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_queue_lock")),
    )
    op.bulk_insert(
        sa.table("queue_lock", sa.column("name", sa.String), sa.column("counter", sa.Integer)),
        [{"name": "lease", "counter": 0}],
    )


def downgrade() -> None:
    op.drop_table("queue_lock")
    op.drop_table("worker")
    op.drop_index(op.f("ix_lease_expires_at"), table_name="lease")
    op.drop_table("lease")
    op.drop_index(op.f("ix_job_state"), table_name="job")
    op.drop_index(op.f("ix_job_queue"), table_name="job")
    op.drop_index(op.f("ix_job_order_key"), table_name="job")
    op.drop_index(op.f("ix_job_cycle_id"), table_name="job")
    op.drop_table("job")
    with op.batch_alter_table("project") as batch:
        batch.drop_column("budget_concurrent_gpus")
        batch.drop_column("budget_gpu_hours_per_day")
