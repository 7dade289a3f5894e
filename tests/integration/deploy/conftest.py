"""The real worker processes, brokers and API of the queue tests (tests/integration/queue)."""

from tests.integration.queue.conftest import (  # noqa: F401 - fixtures
    broker_url,
    queue_settings,
    shared_venv_root,
    workers,
)
