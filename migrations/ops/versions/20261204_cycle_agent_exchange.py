"""cycle.agent_exchange: the LLM agent's whole exchange (messages, replies, errors) kept with
the cycle, shown on its dashboard page (issue 17).

Revision ID: 20261204_cycle_agent_exchange
Revises: 20261203_drop_cycle_worktree
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "20261204_cycle_agent_exchange"
down_revision = "20261203_drop_cycle_worktree"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.add_column(sa.Column("agent_exchange", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.drop_column("agent_exchange")
