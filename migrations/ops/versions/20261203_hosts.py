"""GPU hosts that share nothing: a job's code as a commit (repo, ref, base and head shas), its
log tail, and each host's own preparation of it.

Revision ID: 20261203_hosts
Revises: 20261203_drop_cycle_job_id
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa

revision = "20261203_hosts"
down_revision = "20261203_drop_cycle_job_id"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("repo", sa.String(1024), nullable=True))
        batch.add_column(sa.Column("ref", sa.String(255), nullable=True))
        batch.add_column(sa.Column("base_sha", sa.String(64), nullable=True))
        batch.add_column(sa.Column("head_sha", sa.String(64), nullable=True))
        batch.add_column(sa.Column("log_tail", sa.Text(), nullable=True))
    op.create_table(
        "job_preparation",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("workdir", sa.String(1024), nullable=True),
        sa.Column("venv_path", sa.String(1024), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name="fk_job_preparation_job_id_job", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_job_preparation"),
        sa.UniqueConstraint("job_id", "host", name="uq_job_preparation_job_id"),
    )
    op.create_index("ix_job_preparation_job_id", "job_preparation", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_job_preparation_job_id", table_name="job_preparation")
    op.drop_table("job_preparation")
    with op.batch_alter_table("job") as batch:
        for column in ("log_tail", "head_sha", "base_sha", "ref", "repo"):
            batch.drop_column(column)
