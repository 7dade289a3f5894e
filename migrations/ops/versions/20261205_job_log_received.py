"""job.log_received_at: when a job's whole log, uploaded by its GPU host, was recorded on the
control host (a cycle waits for it before it reads the job, within a bounded grace).

Revision ID: 20261205_job_log_received
Revises: 20261204_job_environment
Create Date: 2026-12-05
"""

from alembic import op
import sqlalchemy as sa

revision = "20261205_job_log_received"
down_revision = "20261204_job_environment"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("log_received_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("log_received_at")
