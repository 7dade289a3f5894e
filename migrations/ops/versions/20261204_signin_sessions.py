"""signin_session: a dashboard sign-in's server-side record, so that logout (and the token's
revocation) ends it, whatever happens to the cookie (issue 20).

Revision ID: 20261204_signin_sessions
Revises: 20261204_idempotency_request
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "20261204_signin_sessions"
down_revision = "20261204_idempotency_request"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signin_session",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_token.id"],
            name="fk_signin_session_token_id_api_token",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_signin_session"),
    )
    op.create_index("ix_signin_session_token_id", "signin_session", ["token_id"])


def downgrade() -> None:
    op.drop_index("ix_signin_session_token_id", table_name="signin_session")
    op.drop_table("signin_session")
