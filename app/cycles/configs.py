"""`autopilot.toml` as cycles read it from a checkout: each distinct content is parsed once.

A project's cycles keep reading the same file at the same commit (every cycle's worktree, each
retried preparation), so the parse is cached by the text itself: a changed file is a new key,
never a stale answer. Reading and parsing stay `app.projects.config`'s; a missing file still
raises its error. The cached config is shared: callers read it, never change it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from threading import Lock

from app.projects import config as project_config
from app.projects.config import ProjectConfig

_KEEP = 64
_parsed: OrderedDict[str, ProjectConfig] = OrderedDict()
_lock = Lock()


def load(checkout: Path) -> ProjectConfig:
    """The checkout's `autopilot.toml`, parsed unless the same text was parsed before."""
    path = checkout / project_config.CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return project_config.load(checkout)  # raises the config's own error for it
    key = hashlib.sha256(text.encode()).hexdigest()
    with _lock:
        hit = _parsed.get(key)
        if hit is not None:
            _parsed.move_to_end(key)
            return hit
    config = project_config.parse(text, str(path))
    with _lock:
        _parsed[key] = config
        while len(_parsed) > _KEEP:
            _parsed.popitem(last=False)
    return config
