"""job.state `reserved`: a job a busy worker runs next on its GPU has a state of its own. Until
now it stayed `queued` with a lease row; a reservation held while this runs is moved to the new
state, so its worker's hand-over (which expects `reserved`) still finds it. The column is a plain
string with no CHECK constraint: no schema change. Downgrade: back to `queued` (its lease row
still says it is reserved).

Revision ID: 20261207_job_reserved_state
Revises: 20261207_campaigns
Create Date: 2026-12-07
"""

from alembic import op

revision = "20261207_job_reserved_state"
down_revision = "20261207_campaigns"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "UPDATE job SET state = 'reserved' WHERE state = 'queued' "
        "AND EXISTS (SELECT 1 FROM lease WHERE lease.job_id = job.id)"
    )


def downgrade() -> None:
    op.execute("UPDATE job SET state = 'queued' WHERE state = 'reserved'")
