"""Project autopilot schedules.

Revision ID: 20261202_schedule
Revises: 20261202_cycles
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "20261202_schedule"
down_revision = "20261202_cycles"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("project") as batch:
        batch.add_column(sa.Column("schedule", sa.String(length=64), nullable=True))
        batch.add_column(
            sa.Column("autopilot_enabled", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("last_scheduled_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("project") as batch:
        batch.drop_column("last_scheduled_at")
        batch.drop_column("autopilot_enabled")
        batch.drop_column("schedule")
