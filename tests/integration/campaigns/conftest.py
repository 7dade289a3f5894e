"""The real worker processes and brokers of the queue tests, for campaigns driven end to end."""

from tests.integration.queue.conftest import (  # noqa: F401 - fixtures
    broker_url,
    queue_settings,
    shared_venv_root,
    workers,
)
