"""The consuming Celery app: the configuration of `app.broker` plus our task modules.

Queues: `control` (cycle steps, the reaper), `prepare` (venvs, worktrees, preflight: slow and
GPU-free), `gpu.<kind>` (one worker per GPU, concurrency 1). The reliability settings are in
`app.broker.celery_config`, each with the reason it is set.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import setup_logging

from app.broker import celery_config
from app.logs import configure_logging
from app.settings import get_settings

celery = Celery("autopilot", include=["workers.tasks"])
celery.conf.update(celery_config(get_settings()))
# Celery's own logging set-up is skipped: our JSON handler (with secret masking) is used.
setup_logging.connect(lambda **_: configure_logging(get_settings()), weak=False)
