"""Drop cycle.worktree: the control host keeps no checkout of a cycle; its files are read from
its commit in the project's mirror (issue 15, lesson 9).

Revision ID: 20261203_drop_cycle_worktree
Revises: 20261203_hosts
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa

revision = "20261203_drop_cycle_worktree"
down_revision = "20261203_hosts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.drop_column("worktree")


def downgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.add_column(sa.Column("worktree", sa.String(length=1024), nullable=True))
