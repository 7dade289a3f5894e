"""Findings in full: provenance, evidence, content hash, audit trail and the search index.

SQLite gets an FTS5 table with the trigram tokenizer, kept in sync by triggers; PostgreSQL
gets pg_trgm and a GIN trigram index. Neither is in the SQLAlchemy metadata (see
app.memory.models.include_object). A later batch migration of `finding` on SQLite recreates
the table and so drops the triggers: it must create them again (see `_sqlite_triggers`).

Revision ID: 20261202_memory_findings
Revises: 20261202_initial_memory
Create Date: 2026-12-02
"""

import hashlib
import json
import unicodedata

from alembic import op
import sqlalchemy as sa

revision = "20261202_memory_findings"
down_revision = "20261202_initial_memory"
branch_labels = None
depends_on = None

_TRIGGERS = ("finding_fts_ai", "finding_fts_ad", "finding_fts_au")


def _content_hash(project, kind, statement):  # type: ignore[no-untyped-def]
    # A frozen copy of app.memory.service.content_hash at this revision.
    normalised = " ".join(unicodedata.normalize("NFC", statement).split())
    identity = json.dumps([project, kind, normalised], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()


def _sqlite_triggers() -> None:
    op.execute(
        "CREATE TRIGGER finding_fts_ai AFTER INSERT ON finding BEGIN "
        "INSERT INTO finding_fts(finding_id, statement) VALUES (new.id, new.statement); END"
    )
    op.execute(
        "CREATE TRIGGER finding_fts_ad AFTER DELETE ON finding BEGIN "
        "DELETE FROM finding_fts WHERE finding_id = old.id; END"
    )
    op.execute(
        "CREATE TRIGGER finding_fts_au AFTER UPDATE OF statement ON finding BEGIN "
        "DELETE FROM finding_fts WHERE finding_id = old.id; "
        "INSERT INTO finding_fts(finding_id, statement) VALUES (new.id, new.statement); END"
    )


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table("finding") as batch:
        batch.add_column(sa.Column("language", sa.String(16), nullable=False, server_default="und"))
        batch.add_column(sa.Column("content_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("hypothesis", sa.Text(), nullable=True))
        batch.add_column(sa.Column("fingerprint", sa.String(64), nullable=True))
        batch.add_column(sa.Column("device_kind", sa.String(64), nullable=True))
        batch.add_column(sa.Column("scope", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("metrics", sa.JSON(), nullable=False, server_default="{}"))
        batch.add_column(sa.Column("source", sa.Text(), nullable=True))
        batch.add_column(
            sa.Column("source_status", sa.String(16), nullable=False, server_default="unverified")
        )
        batch.add_column(
            sa.Column(
                "publication_status", sa.String(16), nullable=False, server_default="unverified"
            )
        )
        batch.add_column(
            sa.Column("truncated", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("group_name", sa.String(64), nullable=True))
        batch.add_column(sa.Column("tags", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("cycle_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("commit_sha", sa.String(64), nullable=True))
        batch.add_column(sa.Column("pr_url", sa.String(1024), nullable=True))
        batch.add_column(sa.Column("result_path", sa.String(1024), nullable=True))
        batch.add_column(sa.Column("validated_by", sa.String(64), nullable=True))
        batch.add_column(sa.Column("validated_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("supersedes", sa.String(32), nullable=True))
        batch.create_foreign_key(
            op.f("fk_finding_supersedes_finding"),
            "finding",
            ["supersedes"],
            ["id"],
            ondelete="RESTRICT",
        )
        batch.create_index(op.f("ix_finding_kind"), ["kind"], unique=False)
        batch.create_index(op.f("ix_finding_fingerprint"), ["fingerprint"], unique=False)
        batch.create_index(op.f("ix_finding_device_kind"), ["device_kind"], unique=False)
        batch.create_index(op.f("ix_finding_supersedes"), ["supersedes"], unique=False)

    finding = sa.table(
        "finding",
        sa.column("id", sa.String),
        sa.column("project", sa.String),
        sa.column("kind", sa.String),
        sa.column("statement", sa.Text),
        sa.column("content_hash", sa.String),
    )
    rows = bind.execute(
        sa.select(finding.c.id, finding.c.project, finding.c.kind, finding.c.statement)
    ).all()
    for row in rows:
        bind.execute(
            finding.update()
            .where(finding.c.id == row.id)
            .values(content_hash=_content_hash(row.project, row.kind, row.statement))
        )
    with op.batch_alter_table("finding") as batch:
        batch.alter_column("content_hash", existing_type=sa.String(64), nullable=False)
        batch.create_unique_constraint(op.f("uq_finding_content_hash"), ["content_hash"])

    op.create_table(
        "finding_event",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("finding_id", sa.String(32), nullable=False),
        sa.Column("from_status", sa.String(16), nullable=True),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["finding_id"],
            ["finding.id"],
            name=op.f("fk_finding_event_finding_id_finding"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_finding_event")),
    )
    op.create_index(op.f("ix_finding_event_finding_id"), "finding_event", ["finding_id"])

    if bind.dialect.name == "sqlite":
        # Trigram tokens make substring search work for Korean as for English (no word breaks).
        op.execute(
            "CREATE VIRTUAL TABLE finding_fts USING fts5("
            "finding_id UNINDEXED, statement, tokenize='trigram')"
        )
        op.execute(
            "INSERT INTO finding_fts(finding_id, statement) SELECT id, statement FROM finding"
        )
        _sqlite_triggers()
    else:
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        op.execute(
            "CREATE INDEX ix_finding_statement_trgm ON finding USING gin (statement gin_trgm_ops)"
        )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        for name in _TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE IF EXISTS finding_fts")
    else:
        # pg_trgm stays: other databases' objects may use the extension.
        op.execute("DROP INDEX IF EXISTS ix_finding_statement_trgm")
    op.drop_index(op.f("ix_finding_event_finding_id"), table_name="finding_event")
    op.drop_table("finding_event")
    with op.batch_alter_table("finding") as batch:
        batch.drop_constraint(op.f("uq_finding_content_hash"), type_="unique")
        batch.drop_constraint(op.f("fk_finding_supersedes_finding"), type_="foreignkey")
        batch.drop_index(op.f("ix_finding_supersedes"))
        batch.drop_index(op.f("ix_finding_device_kind"))
        batch.drop_index(op.f("ix_finding_fingerprint"))
        batch.drop_index(op.f("ix_finding_kind"))
        for column in (
            "supersedes",
            "validated_at",
            "validated_by",
            "result_path",
            "pr_url",
            "commit_sha",
            "cycle_id",
            "tags",
            "group_name",
            "truncated",
            "publication_status",
            "source_status",
            "source",
            "metrics",
            "scope",
            "device_kind",
            "fingerprint",
            "hypothesis",
            "content_hash",
            "language",
        ):
            batch.drop_column(column)
