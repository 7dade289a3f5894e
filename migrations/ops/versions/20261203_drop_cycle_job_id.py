"""Drop cycle.job_id: a cycle's job is the one whose job.cycle_id names it.

Revision ID: 20261203_drop_cycle_job_id
Revises: 20261202_schedule
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa

revision = "20261203_drop_cycle_job_id"
down_revision = "20261202_schedule"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.drop_column("job_id")


def downgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.add_column(sa.Column("job_id", sa.Integer(), nullable=True))
    # Each cycle's job is its first job naming it (merge re-validation jobs name no cycle).
    op.execute(
        "UPDATE cycle SET job_id = "
        "(SELECT MIN(job.id) FROM job WHERE job.cycle_id = cycle.id)"
    )
