"""gang_jobs: a job's GPU count (`job.gpus`), a worker's pid (its liveness on its host), and
`gang_seat`, the GPUs of a several-GPU job held by workers other than its leader.

Revision ID: 20261206_gang_jobs
Revises: 20261205_webhook_delivery
Create Date: 2026-12-06
"""

from alembic import op
import sqlalchemy as sa

revision = "20261206_gang_jobs"
down_revision = "20261205_webhook_delivery"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=False, server_default="1"))
    with op.batch_alter_table("worker") as batch:
        batch.add_column(sa.Column("pid", sa.Integer(), nullable=True))
    op.create_table(
        "gang_seat",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("device", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name="fk_gang_seat_job_id_job", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_gang_seat"),
        sa.UniqueConstraint("worker", name="uq_gang_seat_worker"),
    )
    op.create_index("ix_gang_seat_job_id", "gang_seat", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_gang_seat_job_id", table_name="gang_seat")
    op.drop_table("gang_seat")
    with op.batch_alter_table("worker") as batch:
        batch.drop_column("pid")
    with op.batch_alter_table("job") as batch:
        batch.drop_column("gpus")
