"""Imports every model module, so each store's metadata is complete for Alembic and the tests."""

from app.forge import models as forge_models  # noqa: F401
from app.memory import models as memory_models  # noqa: F401
from app.ops import models as ops_models  # noqa: F401
