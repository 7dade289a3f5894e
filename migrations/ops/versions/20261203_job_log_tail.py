"""job.log_tail: the bounded end of a job's log, kept in the DB while the job runs on a GPU host.

Revision ID: 20261203_job_log_tail
Revises: 20261203_drop_cycle_job_id
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa

revision = "20261203_job_log_tail"
down_revision = "20261203_drop_cycle_job_id"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("log_tail", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("log_tail")
