"""The consuming Celery app: the configuration of `app.broker` plus our task modules.

Queues: `control` (cycle steps, the reaper), `prepare` (venvs, worktrees, preflight: slow and
GPU-free), `gpu.<kind>` (one worker per GPU, concurrency 1). The reliability settings are in
`app.broker.celery_config`, each with the reason it is set.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import setup_logging

from app.broker import celery_config
from app.logs import configure_logging
from app.settings import Settings, get_settings

#: Beat's check of the PRs awaiting review on GitHub (a no-op with the local forge).
RECONCILE_GITHUB = "autopilot.reconcile_github"


def beat_schedule(config: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The beat schedule of `config`, with the reconciliation of decisions taken on GitHub:
    a merge or close whose webhook never arrived is applied within one interval."""
    interval = settings.github_reconcile_interval_s
    return {
        **config["beat_schedule"],
        "reconcile-github": {
            "task": RECONCILE_GITHUB,
            "schedule": interval,
            "options": {"queue": "control", "expires": interval * 2},
        },
    }


celery = Celery("autopilot", include=["workers.tasks"])
_config = celery_config(get_settings())
celery.conf.update({**_config, "beat_schedule": beat_schedule(_config, get_settings())})
# Celery's own logging set-up is skipped: our JSON handler (with secret masking) is used.
setup_logging.connect(lambda **_: configure_logging(get_settings()), weak=False)
