"""campaigns: research lines (`campaign`, `campaign_step`) and a cycle's place in one
(`cycle.campaign_id`, `cycle.role`, `cycle.candidate_sha`).

Revision ID: 20261207_campaigns
Revises: 20261206_gang_jobs
Create Date: 2026-12-07
"""

from alembic import op
import sqlalchemy as sa

revision = "20261207_campaigns"
down_revision = "20261206_gang_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "campaign",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("agent", sa.String(16), nullable=True),
        sa.Column("experiment", sa.String(64), nullable=True),
        sa.Column("max_cycles", sa.Integer(), nullable=False),
        sa.Column("parallel", sa.Integer(), nullable=False),
        sa.Column("stop_after_no_gain", sa.Integer(), nullable=True),
        sa.Column("max_hours", sa.Float(), nullable=True),
        sa.Column("line_branch", sa.String(255), nullable=True),
        sa.Column("start_sha", sa.String(64), nullable=True),
        sa.Column("tip_sha", sa.String(64), nullable=True),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("end_reason", sa.Text(), nullable=True),
        sa.Column("final_cycle_id", sa.Integer(), nullable=True),
        sa.Column("cumulative", sa.JSON(), nullable=True),
        sa.Column("finding_ids", sa.JSON(), nullable=True),
        sa.Column("pr_number", sa.Integer(), nullable=True),
        sa.Column("pr_url", sa.String(1024), nullable=True),
        sa.Column("decision", sa.String(16), nullable=True),
        sa.Column("decided_by", sa.String(64), nullable=True),
        sa.Column("decision_note", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["project.id"],
            name="fk_campaign_project_id_project",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_campaign"),
    )
    op.create_index("ix_campaign_state", "campaign", ["state"])
    op.create_table(
        "campaign_step",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("cycle_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("tip_sha", sa.String(64), nullable=False),
        sa.Column("confirmation_cycle_id", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("reason", sa.String(24), nullable=True),
        sa.Column("sentence", sa.Text(), nullable=True),
        sa.Column("ratio", sa.Float(), nullable=True),
        sa.Column("ci_low", sa.Float(), nullable=True),
        sa.Column("ci_high", sa.Float(), nullable=True),
        sa.Column("kept_sha", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["campaign_id"],
            ["campaign.id"],
            name="fk_campaign_step_campaign_id_campaign",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["cycle_id"], ["cycle.id"], name="fk_campaign_step_cycle_id_cycle", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_campaign_step"),
        sa.UniqueConstraint("cycle_id", name="uq_campaign_step_cycle_id"),
        sa.UniqueConstraint(
            "confirmation_cycle_id", name="uq_campaign_step_confirmation_cycle_id"
        ),
    )
    op.create_index("ix_campaign_step_campaign_id", "campaign_step", ["campaign_id"])
    with op.batch_alter_table("cycle") as batch:
        batch.add_column(sa.Column("campaign_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("role", sa.String(16), nullable=True))
        batch.add_column(sa.Column("candidate_sha", sa.String(64), nullable=True))
        batch.create_index("ix_cycle_campaign_id", ["campaign_id"])


def downgrade() -> None:
    with op.batch_alter_table("cycle") as batch:
        batch.drop_index("ix_cycle_campaign_id")
        batch.drop_column("candidate_sha")
        batch.drop_column("role")
        batch.drop_column("campaign_id")
    op.drop_index("ix_campaign_step_campaign_id", table_name="campaign_step")
    op.drop_table("campaign_step")
    op.drop_index("ix_campaign_state", table_name="campaign")
    op.drop_table("campaign")
