"""Local forge: pull_request and pull_request_comment.

Revision ID: 20261202_pull_requests
Revises: 20261202_initial_ops
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "20261202_pull_requests"
down_revision = "20261202_initial_ops"
branch_labels = None
depends_on = None

_OPEN = sa.text("state = 'open'")


def upgrade() -> None:
    op.create_table(
        "pull_request",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("project", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("head", sa.String(length=255), nullable=False),
        sa.Column("base", sa.String(length=255), nullable=False),
        sa.Column("title", sa.String(length=512), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("head_sha", sa.String(length=64), nullable=True),
        sa.Column("base_sha", sa.String(length=64), nullable=True),
        sa.Column("merge_sha", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pull_request")),
        sa.UniqueConstraint("project", "number", name="uq_pull_request_project_number"),
    )
    with op.batch_alter_table("pull_request") as batch:
        batch.create_index(op.f("ix_pull_request_project"), ["project"], unique=False)
        batch.create_index(
            "uq_pull_request_open_head",
            ["project", "head"],
            unique=True,
            sqlite_where=_OPEN,
            postgresql_where=_OPEN,
        )
    op.create_table(
        "pull_request_comment",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("pull_request_id", sa.Integer(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["pull_request_id"],
            ["pull_request.id"],
            name=op.f("fk_pull_request_comment_pull_request_id_pull_request"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pull_request_comment")),
    )
    with op.batch_alter_table("pull_request_comment") as batch:
        batch.create_index(
            op.f("ix_pull_request_comment_pull_request_id"), ["pull_request_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("pull_request_comment") as batch:
        batch.drop_index(op.f("ix_pull_request_comment_pull_request_id"))
    op.drop_table("pull_request_comment")
    with op.batch_alter_table("pull_request") as batch:
        batch.drop_index("uq_pull_request_open_head")
        batch.drop_index(op.f("ix_pull_request_project"))
    op.drop_table("pull_request")
