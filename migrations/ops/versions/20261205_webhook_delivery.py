"""webhook_delivery: the GitHub webhook deliveries acted on, so that a delivery seen again
(GitHub's redelivery, a replay) is answered without acting twice.

Revision ID: 20261205_webhook_delivery
Revises: 20261205_job_log_received
Create Date: 2026-12-05
"""

from alembic import op
import sqlalchemy as sa

revision = "20261205_webhook_delivery"
down_revision = "20261205_job_log_received"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_delivery",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.String(64), nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_delivery"),
        sa.UniqueConstraint("delivery_id", name="uq_webhook_delivery_delivery_id"),
    )
    op.create_index("ix_webhook_delivery_received_at", "webhook_delivery", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_delivery_received_at", table_name="webhook_delivery")
    op.drop_table("webhook_delivery")
