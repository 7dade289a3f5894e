"""job.environment and job_preparation.environment: a job's environment record (its venv's key,
installer and lock, `uv pip freeze`), and a preparing host's venv build progress (issue 19).

Revision ID: 20261204_job_environment
Revises: 20261204_signin_sessions
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "20261204_job_environment"
down_revision = "20261204_signin_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("job", "job_preparation"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("environment", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table in ("job_preparation", "job"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("environment")
