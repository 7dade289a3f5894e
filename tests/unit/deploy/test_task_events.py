"""Flower's task pages need task events (issue 20, item 11): the control worker sends them with
Redis, where docker-compose.yml runs Flower; never with the filesystem broker."""

from __future__ import annotations

from pathlib import Path

from app.broker import celery_config
from app.settings import Settings
from workers.worker_cli import control_argv


def settings(broker: str, tmp_path: Path) -> Settings:
    return Settings(_env_file=None, state_dir=tmp_path, broker_url=broker)  # type: ignore[call-arg]


def test_the_control_worker_sends_task_events_with_redis_only(tmp_path: Path) -> None:
    redis = settings("redis://:pw@redis:6379/0", tmp_path)
    fs = settings("filesystem://", tmp_path)
    assert "--task-events" in control_argv(redis, 4, "INFO", beat=False)
    assert "--task-events" not in control_argv(fs, 4, "INFO", beat=True)
    assert control_argv(fs, 4, "INFO", beat=True)[-1] == "--beat"
    assert celery_config(redis)["task_send_sent_event"] is True
    assert celery_config(fs)["task_send_sent_event"] is False
