"""Alembic environment of the ops DB. The URL comes from app.migrate, never from a file."""

import app.tables  # noqa: F401  (every model registered)
from app.migrate import run_environment
from app.db import OpsBase

run_environment(OpsBase.metadata)
