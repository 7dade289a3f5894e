"""Imports every model module, so each store's metadata is complete for Alembic and the tests."""

from app.cycles import models as cycle_models  # noqa: F401
from app.cycles.campaigns import models as campaign_models  # noqa: F401
from app.forge import models as forge_models  # noqa: F401
from app.jobs import models as job_models  # noqa: F401
from app.memory import models as memory_models  # noqa: F401
from app.projects import models as project_models  # noqa: F401
