"""Initial memory table: finding (first shape).

Revision ID: 20261202_initial_memory
Revises:
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "20261202_initial_memory"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "finding",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("statement", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_finding")),
    )
    op.create_index(op.f("ix_finding_project"), "finding", ["project"], unique=False)
    op.create_index(op.f("ix_finding_status"), "finding", ["status"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_finding_status"), table_name="finding")
    op.drop_index(op.f("ix_finding_project"), table_name="finding")
    op.drop_table("finding")
