"""Alembic environment of the memory DB. The URL comes from app.migrate, never from a file."""

import app.tables  # noqa: F401  (every model registered)
from app.memory.models import MemoryBase, include_object
from app.migrate import run_environment

# The search index (FTS5 tables, trigram index) is the migrations' own, not the models'.
run_environment(MemoryBase.metadata, include_object)
