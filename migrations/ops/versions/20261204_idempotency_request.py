"""cycle.idempotency_request: the hash of the request an Idempotency-Key was first used with, so
that a reuse with another body is refused (422), and keys stored as hashes of (token, key) so
that a 128-character key always fits (issue 20).

Revision ID: 20261204_idempotency_request
Revises: 20261204_cycle_agent_exchange
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "20261204_idempotency_request"
down_revision = "20261204_cycle_agent_exchange"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.add_column(sa.Column("idempotency_request", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.drop_column("idempotency_request")
