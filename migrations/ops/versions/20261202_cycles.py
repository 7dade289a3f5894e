"""Research cycles and their steps.

Revision ID: 20261202_cycles
Revises: 20261202_jobs
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "20261202_cycles"
down_revision = "20261202_jobs"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "cycle",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("agent", sa.String(length=16), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("idempotency_key", sa.String(length=128), nullable=True),
        sa.Column("experiment", sa.String(length=64), nullable=True),
        sa.Column("parameters", sa.JSON(), nullable=True),
        sa.Column("hypothesis", sa.Text(), nullable=True),
        sa.Column("changed_hypothesis", sa.Text(), nullable=True),
        sa.Column("proposal", sa.JSON(), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("repeat_of", sa.String(length=32), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("worktree", sa.String(length=1024), nullable=True),
        sa.Column("branch", sa.String(length=255), nullable=True),
        sa.Column("base_sha", sa.String(length=64), nullable=True),
        sa.Column("commit_sha", sa.String(length=64), nullable=True),
        sa.Column("pr_number", sa.Integer(), nullable=True),
        sa.Column("pr_url", sa.String(length=1024), nullable=True),
        sa.Column("verdict", sa.String(length=24), nullable=True),
        sa.Column("headline", sa.JSON(), nullable=True),
        sa.Column("finding_ids", sa.JSON(), nullable=True),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("agent_tokens", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name=op.f("fk_cycle_project_id_project"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cycle")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_cycle_idempotency_key")),
    )
    op.create_index(op.f("ix_cycle_fingerprint"), "cycle", ["fingerprint"], unique=False)
    op.create_index(op.f("ix_cycle_state"), "cycle", ["state"], unique=False)
    op.create_table(
        "cycle_step",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cycle_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=24), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        sa.ForeignKeyConstraint(
            ["cycle_id"],
            ["cycle.id"],
            name=op.f("fk_cycle_step_cycle_id_cycle"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cycle_step")),
    )
    op.create_index(op.f("ix_cycle_step_cycle_id"), "cycle_step", ["cycle_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_cycle_step_cycle_id"), table_name="cycle_step")
    op.drop_table("cycle_step")
    op.drop_index(op.f("ix_cycle_state"), table_name="cycle")
    op.drop_index(op.f("ix_cycle_fingerprint"), table_name="cycle")
    op.drop_table("cycle")
